//! The QP of a CM id: [`CmId::create_qp`] (`rdma_create_qp`) and the
//! attributes the CM gives a QP of the program's own
//! ([`CmId::init_qp_attr`], [`CmId::init_qp_attr_for`]).

use super::*;

impl CmId {
    /// Creates a QP on the id (`rdma_create_qp`), whose state the CM moves:
    /// to INIT now (RC, UC) or to RTS (UD, with Q_Key
    /// [`UDP_QKEY`](crate::cm::UDP_QKEY)), to RTR and RTS on
    /// [`accept`](Self::accept) or when the connect response arrives, to
    /// ERR on a reject and on [`disconnect`](Self::disconnect). The
    /// returned QP's [`state`](QueuePair::state) follows every move.
    ///
    /// Refused before the call: an id not yet on a device, a PD of another
    /// context than [`context`](Self::context), a QP type other than the
    /// port space's ([`PortSpace::qp_type`]), an id that has a QP already,
    /// and everything [`QueuePair::new`] refuses.
    ///
    /// With [`QpInitAttr::send_ops`] the QP is an extended one
    /// (`rdma_create_qp_ex`), which posts through
    /// [`QueuePair::start_batch`] as well.
    #[doc(alias = "rdma_create_qp")]
    #[doc(alias = "rdma_create_qp_ex")]
    pub fn create_qp(&self, pd: &ProtectionDomain, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        const VERB: &str = "rdma_create_qp";
        let ctx = self.context()?;
        if !pd.context().same_as(&ctx) {
            return Err(Error::invalid(
                VERB,
                format!(
                    "the PD belongs to another context of {} than the one librdmacm opened for this id; \
                     allocate it from CmId::context()",
                    pd.context().name()
                ),
            ));
        }
        let want = self.inner.ps.qp_type();
        if attr.qp_type() != want {
            return Err(Error::invalid(
                VERB,
                format!(
                    "an {} id takes {} QPs, not {}",
                    self.inner.ps.c_name(),
                    want.short_name(),
                    attr.qp_type().short_name()
                ),
            ));
        }
        let raw_id = self.inner.raw;
        let guard = self.inner.chan.lock();
        // SAFETY: the id is live; the lock is held.
        if !unsafe { (*raw_id.as_ptr()).qp }.is_null() {
            return Err(Error::invalid(VERB, "the id has a QP already"));
        }
        // On success librdmacm set `id->qp`.
        let created = |verb| {
            // SAFETY: the id is live and the lock is held.
            NonNull::new(unsafe { (*raw_id.as_ptr()).qp }).ok_or(Error::Verb {
                verb,
                errno: libc::EINVAL,
            })
        };
        let mut qp = match attr.send_ops {
            None => QueuePair::create_with(pd, attr, VERB, |raw_attr| {
                // SAFETY: the id, PD and CQs are live and of the id's context
                // (checked above and by `create_with`); `raw_attr` is a valid
                // in/out struct; the lock is held (librdmacm sets `id->qp`).
                let rc = unsafe { sys::rdma_create_qp(raw_id.as_ptr(), pd.as_ptr(), raw_attr) };
                check_rc(VERB, rc)?;
                created(VERB)
            })?,
            Some(ops) => {
                const VERB_EX: &str = "rdma_create_qp_ex";
                crate::qp::create_ex_with(pd, attr, ops, VERB_EX, |x| {
                    // SAFETY: as above; `x` names the PD (checked to be of
                    // the id's context), which rdma_create_qp_ex requires.
                    let rc = unsafe { sys::rdma_create_qp_ex(raw_id.as_ptr(), x) };
                    check_rc(VERB_EX, rc)?;
                    created(VERB_EX)
                })?
            }
        };
        let qp_ptr = NonNull::new(qp.as_raw()).ok_or(Error::Verb {
            verb: VERB,
            errno: libc::EINVAL,
        })?;
        let (link, shared) =
            QpLink::new(self.inner.chan.clone(), raw_id, qp_ptr, qp.known().clone());
        // librdmacm took a UD QP to RTS (`ucma_init_ud_qp`), a connected
        // one to INIT (`ucma_init_conn_qp`), on the id's port.
        // SAFETY: the id is live; the lock is held.
        let port = unsafe { (*raw_id.as_ptr()).port_num };
        let state = if want == crate::qp::QpType::Ud {
            QpState::Rts
        } else {
            QpState::Init
        };
        link.set(state, Some((port != 0).then_some(port)));
        *self.inner.link.lock().unwrap_or_else(|e| e.into_inner()) = Some(shared);
        drop(guard);
        qp.set_link(link);
        Ok(qp)
    }

    /// The attributes the CM has for moving a QP of the program's own to
    /// `state` (`rdma_init_qp_attr`): INIT, RTR or RTS. Apply them with the
    /// crate's validated [`QueuePair::modify`], which checks the CM's
    /// mask like any other.
    ///
    /// ```no_run
    /// # fn f(id: &rdma_verbs::cm::CmId, qp: &mut rdma_verbs::QueuePair) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::QpState;
    /// for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
    ///     qp.modify(&id.init_qp_attr(state)?)?;
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp_attr(&self, state: QpState) -> Result<QpAttr> {
        if !matches!(state, QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(Error::invalid(
                "rdma_init_qp_attr",
                format!(
                    "the CM has attributes for INIT, RTR and RTS, not {}",
                    state.short_name()
                ),
            ));
        }
        let mut attr = sys::ibv_qp_attr {
            qp_state: state.as_raw(),
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: the id is live; `attr` and `mask` are valid out-parameters.
        self.call("rdma_init_qp_attr", After::Unchanged, |id| unsafe {
            sys::rdma_init_qp_attr(id, &mut attr, &mut mask)
        })?;
        Ok(QpAttr::from_raw(attr, mask))
    }

    /// [`init_qp_attr`](Self::init_qp_attr) for moving `qp` from its known
    /// state to `to`, keeping only the attributes that transition takes for
    /// `qp`'s type (per [`transition_rule`](crate::qp::transition_rule)).
    ///
    /// The CM hands out attributes for the id's own QP type (RC for
    /// `RDMA_PS_TCP`); this lets a UC QP of the program's own ride on an
    /// `RDMA_PS_TCP` id: the RC-only ones (`IBV_QP_MAX_DEST_RD_ATOMIC`,
    /// `IBV_QP_MIN_RNR_TIMER`, `IBV_QP_TIMEOUT`, the retry counts,
    /// `IBV_QP_MAX_QP_RD_ATOMIC`) are left out. Whatever is still missing
    /// is reported by [`QueuePair::modify`]. Both peers must then use UC QPs:
    /// the CM's messages say RC.
    ///
    /// ```no_run
    /// # fn f(id: &rdma_verbs::cm::CmId, uc: &mut rdma_verbs::QueuePair) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::QpState;
    /// for to in [QpState::Init, QpState::Rtr, QpState::Rts] {
    ///     let attr = id.init_qp_attr_for(uc, to)?;
    ///     uc.modify(&attr)?;
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp_attr_for(&self, qp: &QueuePair, to: QpState) -> Result<QpAttr> {
        let attr = self.init_qp_attr(to)?;
        let from = qp.state();
        let rule = crate::qp::transition_rule(qp.qp_type(), from, to).ok_or_else(|| {
            Error::invalid(
                "rdma_init_qp_attr",
                format!(
                    "{} QPs cannot go from {} to {}",
                    qp.qp_type().short_name(),
                    from.short_name(),
                    to.short_name()
                ),
            )
        })?;
        Ok(attr.retain(rule.required | rule.optional))
    }
}

//! `ibv_modify_qp`, checked and unchecked.

use super::attr::QpAttr;
use super::mask::QpAttrMask;
use std::time::{Duration, Instant};

use super::validate::{revalidate_fresh, validate, validate_typed, ModifyError, QpView};
use super::{QpState, QueuePair};
use crate::error::{check_rc, Error, Result};
use crate::sys;

impl QueuePair {
    /// The state the QP is known to be in: the target of the last successful
    /// modify, or what the last [`resync`](Self::resync) read, or what the
    /// device is since known to have done on its own:
    ///
    /// * reclaiming ([`reclaim`](Self::reclaim),
    ///   [`reclaim_chunks`](Self::reclaim_chunks)) a failed or flushed
    ///   completion of the QP's own queues records ERR (both prove the
    ///   device moved the QP there: flushes happen only in ERR, and an
    ///   error completion moves an RC QP, and any QP's receive queue, to
    ///   ERR). A failed send of a UD or UC QP may leave it in SQE (the
    ///   verbs' rule; rxe moves it to ERR), and a failed receive of the QP's
    ///   SRQ may be older than a RESET of the QP (SRQ receives outlive it):
    ///   for those the QP asks the device (one `ibv_query_qp`, unless the
    ///   state is known to be ERR already). A completion reclaimed with
    ///   [`SharedReceiveQueue::reclaim`](crate::SharedReceiveQueue::reclaim)
    ///   does not reach the QP (the SRQ holds no QP);
    /// * a fatal asynchronous event of the QP (`IBV_EVENT_QP_FATAL`,
    ///   `QP_REQ_ERR`, `QP_ACCESS_ERR`, `QP_LAST_WQE_REACHED`) read with
    ///   [`Context::get_async_event`](crate::Context::get_async_event) on
    ///   the context the QP was made from (or a clone of it) makes that
    ///   call read the QP's state from the device and record it, unless
    ///   the QP was modified meanwhile.
    ///
    /// Anything else the device does on its own (a QP that fails with no
    /// completion reclaimed and no event read, a `DEVICE_FATAL`) shows only
    /// after [`resync`](Self::resync). Reading the state is one atomic load.
    ///
    /// For a QP created on a connection manager id
    /// ([`CmId::create_qp`](crate::cm::CmId::create_qp)), the moves the CM
    /// makes (at creation, on accept, when a connection is established,
    /// rejected or disconnected) are followed too: the known state is
    /// updated before the call or event that made the move returns.
    #[inline]
    pub fn state(&self) -> QpState {
        self.known.state()
    }

    /// The port the QP was bound to by a modify carrying `IBV_QP_PORT`.
    pub fn port(&self) -> Option<u8> {
        #[cfg(feature = "cm")]
        if let Some(link) = &self.cm {
            return link.port();
        }
        self.port
    }

    /// Makes `state` (and `port`, when given) the known state.
    pub(crate) fn set_known(&mut self, state: QpState, port: Option<Option<u8>>) {
        self.known.set(state);
        if let Some(port) = port {
            self.port = port;
        }
        #[cfg(feature = "cm")]
        if let Some(link) = &self.cm {
            link.set_port(port);
        }
    }

    /// Reads the QP's state from the device and makes it the known state.
    #[doc(alias = "ibv_query_qp")]
    pub fn resync(&mut self) -> Result<QpState> {
        let (attrs, _) = self.query()?;
        let port = (attrs.state != QpState::Reset && attrs.port_num != 0).then_some(attrs.port_num);
        self.set_known(attrs.state, port.map(Some));
        Ok(attrs.state)
    }

    /// Validates `attr`, then applies it with `ibv_modify_qp`.
    ///
    /// Before any call it checks, from the QP's known [`state`](Self::state):
    /// that the transition is legal for the QP's type; that the mask holds
    /// every required attribute and nothing the transition does not take,
    /// per the kernel's table ([`transition_rule`](super::transition_rule)),
    /// including the `IBV_QP_CUR_STATE` rules, attribute-only modifies
    /// (checked as a transition from the state to itself) and `IBV_QP_AV`
    /// outside INIT->RTR (for which the kernel adds `IBV_QP_PORT`); and the
    /// values against the device and port: the port exists, P_Key and GID
    /// indexes are inside their tables, the path MTU is at most the port's
    /// max MTU, rd_atomic counts are within the device's limits, address
    /// vectors carry a GRH where the port needs one, `IBV_QP_CAP` only with
    /// `IBV_DEVICE_RESIZE_MAX_WR`, `IBV_QP_ALT_PATH` only with
    /// `IBV_DEVICE_AUTO_PATH_MIG` and never on RoCE, `IBV_QP_RATE_LIMIT`
    /// only with packet pacing for RAW_PACKET.
    ///
    /// A path MTU above the port's *active* MTU is accepted, as the kernel
    /// accepts it (the active MTU can change, and the peer's may differ);
    /// on RoCE, messages are then cut into packets the link may drop.
    /// [`connect`](Self::connect) picks the active MTU.
    ///
    /// Leaving SQD for anything but ERR while the send queue still drains
    /// is refused ([`ModifyError::SqDraining`]) after asking the device
    /// (`sq_draining`); [`wait_sq_drained`](Self::wait_sq_drained) waits
    /// for the drain. The source GID a GRH names must be a used entry of
    /// the port's table and, for a RoCE v2 GID, of the destination's
    /// family (an IPv4-mapped source for an IPv4-mapped `dgid`).
    ///
    /// # Where the crate refuses more than the kernel
    ///
    /// Most refusals are the kernel's own rules, made earlier and with a
    /// clearer message. These go beyond them, to protect the caller:
    ///
    /// | modify | what the kernel does | what the crate does | why |
    /// |---|---|---|---|
    /// | `IBV_QP_CUR_STATE` naming another state than the known one | accepts it, and checks the table from the state given, so required attributes of the real transition can be skipped (rxe takes it unchecked) | refuses ([`ModifyError::CurStateMismatch`]) | a lying `cur_state` moves a QP with attributes missing; [`resync`](Self::resync) first if the device moved it |
    /// | `max_dest_rd_atomic` above the device's `max_qp_rd_atom` | accepts, and `ibv_query_qp` then reads back 0 (rxe) | refuses | the responder would take no RDMA reads or atomics at all |
    /// | `max_rd_atomic` above `max_qp_init_rd_atom` | rxe refuses above 128 only | refuses above the device's limit | the limit the device advertises |
    /// | `pkey_index` or `alt_pkey_index` past the port's P_Key table | rxe does not check it | refuses | an index past the table names no P_Key |
    /// | attribute-only modify (no `IBV_QP_STATE`) | rxe on 6.1 and 6.12 checks it as `state -> state`; on 7.2 it does not (an empty mask in RTR is taken, and changes nothing) | checks it as `state -> state` ([`ModifyError::AttributeOnly`]) | the stricter rule holds on every kernel |
    /// | path MTU above the port's max MTU | rxe refuses; other drivers differ | refuses | no link carries it |
    /// | `IBV_QP_ALT_PATH` on RoCE, or without `IBV_DEVICE_AUTO_PATH_MIG` | refuses on RoCE; rxe advertises the flag anyway | refuses | alternate paths are InfiniBand-only |
    ///
    /// A refusal is [`Error::Modify`] naming the
    /// transition, the QP type and each missing or forbidden flag, every
    /// reason when there are several ([`ModifyError::Several`]); nothing
    /// reaches the device. A refusal from the kernel is
    /// [`Error::Verb`] with its errno. Either way the
    /// known state is unchanged, as is the QP (`ibv_modify_qp` is all or
    /// nothing).
    ///
    /// # Port attributes and GID entries: what is cached, how a change is noticed
    ///
    /// The checks make no kernel call of their own once the context's
    /// per-port cache is warm, so a modify costs what `ibv_modify_qp` costs
    /// (and allocates nothing when it succeeds). The cache (see
    /// [`Context`](crate::Context#what-a-context-caches)) holds only
    ///
    /// * of each port, attributes fixed while a context is open: the P_Key
    ///   and GID table lengths (the kernel's immutable port data), the link
    ///   layer and `IBV_QPF_GRH_REQUIRED`, and the max MTU; read by the
    ///   first [`Context::query_port`](crate::Context::query_port) of the
    ///   port (the validator's own, or yours; every query refreshes it);
    /// * of each GID entry read (by the validator,
    ///   [`Context::query_gid`](crate::Context::query_gid),
    ///   [`query_gid_entry`](crate::Context::query_gid_entry) or
    ///   [`gid_table`](crate::Context::gid_table)), whether it was used
    ///   and its RoCE v2 family. GID entries *do* change (an IP address
    ///   added or removed on RoCE).
    ///
    /// What changes with the link (port state, active MTU, LIDs) is not
    /// checked at all: the kernel judges it. Cached data is used only to
    /// *accept*: a check that would refuse first re-reads the port
    /// (`ibv_query_port`) and the GID entry (`ibv_query_gid_ex`), and
    /// refuses only on what it read. A cached GID entry that changed since
    /// it was read can thus let through a modify the kernel then refuses;
    /// the checks then run again on freshly read data, and when they now
    /// refuse, that [`Error::Modify`] is returned in place of the kernel's
    /// errno (the device saw the call and refused it; the QP is unchanged).
    ///
    /// ```no_run
    /// use rdma_verbs::qp::{QpAttr, QpState};
    /// use rdma_verbs::{AccessFlags, Context, QpInitAttr, QpType};
    /// let ctx = Context::open_first()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(16)?;
    /// let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    /// // Forgot IBV_QP_ACCESS_FLAGS:
    /// let err = qp.modify(&QpAttr::new().state(QpState::Init).pkey_index(0).port(1)).unwrap_err();
    /// assert_eq!(err.to_string(), "RC RESET->INIT is missing IBV_QP_ACCESS_FLAGS");
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify(&mut self, attr: &QpAttr) -> Result<()> {
        let to = validate(&self.view(), attr)?;
        self.modify_validated(Pass::Copy(attr), to)
    }

    /// [`modify`](Self::modify) of a typed transition to `to` from the
    /// known state (which [`Qp::apply`](crate::qp::Qp::apply) checked):
    /// the table part of the checks is the builder's type.
    pub(crate) fn modify_typed(&mut self, attr: &mut QpAttr, to: QpState) -> Result<()> {
        let to = validate_typed(&self.view(), attr, to)?;
        self.modify_validated(Pass::InPlace(attr), to)
    }

    /// What the validator needs to know about this QP.
    fn view(&self) -> QpView<'_> {
        QpView {
            ctx: self.pd().context(),
            qp_type: self.qp_type,
            state: self.state(),
            port: self.port(),
        }
    }

    /// The rest of a checked modify to `to`, once `attr` passed the
    /// checks: the drain check out of SQD, the call, and a look again at
    /// fresh port data when the kernel refuses.
    fn modify_validated(&mut self, mut pass: Pass<'_>, to: QpState) -> Result<()> {
        let attr = pass.attr();
        if self.state() == QpState::Sqd && attr.get_state().is_some() && to != QpState::Err {
            // The kernel refuses this while the send queue drains; ask the
            // device rather than let the user meet a bare EINVAL.
            if self.query()?.0.sq_draining {
                return Err(ModifyError::SqDraining {
                    qp_type: self.qp_type,
                    to,
                }
                .into());
            }
        }
        match self.modify_call(&mut pass) {
            Err(e @ Error::Verb { .. }) => {
                // The checks may have accepted on a cached GID entry that
                // has changed since: look again, and give the reason if
                // there is one now. The QP is unchanged either way. (An
                // in-place set is read as the call left it: the verbs
                // only read it, and what is read here names a reason only.)
                match revalidate_fresh(&self.view(), pass.attr()) {
                    Some(reason) => Err(reason.into()),
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// Waits until the send queue of a QP in SQD has drained (`sq_draining`
    /// in `ibv_query_qp` turned false), polling the device with growing
    /// pauses (up to 10 ms). Until then the kernel refuses every move out
    /// of SQD except to ERR, and [`modify`](Self::modify) refuses it with
    /// [`ModifyError::SqDraining`].
    ///
    /// A send that cannot finish (a peer with no receive and infinite RNR
    /// retries, say) keeps the queue draining forever: after `timeout` this
    /// returns [`Error::Timeout`], and the QP can
    /// still go to ERR. Refused for a QP not known to be in SQD.
    ///
    /// This polls rather than reading `IBV_EVENT_SQ_DRAINED` from the
    /// context's asynchronous event queue, which belongs to the whole
    /// program (consuming events here would take them from their reader).
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::qp::{QpAttr, QpState};
    /// use std::time::Duration;
    /// qp.modify(&QpAttr::new().state(QpState::Sqd))?;
    /// qp.wait_sq_drained(Duration::from_secs(5))?;
    /// qp.modify(&QpAttr::new().state(QpState::Rts))?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_query_qp")]
    #[doc(alias = "IBV_EVENT_SQ_DRAINED")]
    pub fn wait_sq_drained(&self, timeout: Duration) -> Result<()> {
        if self.state() != QpState::Sqd {
            return Err(Error::invalid(
                "ibv_query_qp",
                format!(
                    "the QP is known to be in {}, not SQD: there is no drain to wait for",
                    self.state().short_name()
                ),
            ));
        }
        let start = Instant::now();
        let mut pause = Duration::from_micros(100);
        while self.query()?.0.sq_draining {
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: "the send queue to drain (sq_draining)",
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Applies `attr` with `ibv_modify_qp` without any check of this crate:
    /// for experts, drivers with rules of their own, and tests of the kernel.
    ///
    /// The kernel still checks everything it checks; on success the known
    /// state follows the modify, on failure nothing changes.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_unchecked(&mut self, attr: &QpAttr) -> Result<()> {
        self.modify_call(&mut Pass::Copy(attr))
    }

    /// The `ibv_modify_qp` call of a modify, and what the QP records of
    /// it when it succeeds (the state, the port, the requests a RESET
    /// ended). What is recorded is read from the set before the call.
    fn modify_call(&mut self, pass: &mut Pass<'_>) -> Result<()> {
        let attr = pass.attr();
        let mask = attr.mask();
        let to = attr.get_state();
        let port = match attr.get_port() {
            Some(p) => Some(p),
            // The QP has no port yet, or loses it with this RESET.
            None if mask.contains(QpAttrMask::AV)
                && (self.port().is_none() || to == Some(QpState::Reset)) =>
            {
                attr.get_av().map(|av| av.port())
            }
            None => None,
        };
        let qp = self.as_ptr();
        let rc = match pass {
            Pass::Copy(attr) => {
                let mut raw = *attr.raw();
                // SAFETY: the QP is live; `raw` is a fully initialised
                // attribute struct that the kernel only reads the masked
                // fields of (and may write back: it is a copy).
                unsafe { sys::ibv_modify_qp(qp, &mut raw, mask.to_c()) }
            }
            // SAFETY: as above, on the set itself, which the caller owns
            // and gives up (a builder that `Qp::apply` consumes).
            Pass::InPlace(attr) => unsafe { sys::ibv_modify_qp(qp, attr.raw_mut(), mask.to_c()) },
        };
        check_rc("ibv_modify_qp", rc)?;
        if let Some(to) = to {
            self.set_known(to, (to == QpState::Reset).then_some(None));
            if to == QpState::Reset {
                // RESET discards outstanding requests without completions:
                // the device no longer uses their buffers, which go to
                // `take_released` for the caller.
                self.pending_mut().release_all();
            }
        }
        if let Some(p) = port {
            self.set_known(self.state(), Some(Some(p)));
        }
        Ok(())
    }
}

/// An attribute set on its way to `ibv_modify_qp`, which takes it by a
/// mutable pointer: borrowed (the call gets a copy) or owned by a builder
/// the caller consumes (the call gets the set itself: no 150-byte copy).
enum Pass<'a> {
    Copy(&'a QpAttr),
    InPlace(&'a mut QpAttr),
}

impl Pass<'_> {
    #[inline]
    fn attr(&self) -> &QpAttr {
        match self {
            Pass::Copy(a) => a,
            Pass::InPlace(a) => a,
        }
    }
}

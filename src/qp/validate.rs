//! Checking a modify before it reaches the kernel.

use std::cell::Cell;
use std::fmt;

use super::attr::QpAttr;
use super::mask::QpAttrMask as M;
use super::table::transition_rule;
use super::{QpState, QpType};
use crate::context::Context;
use crate::device_attr::DeviceCapFlags;
use crate::error::table_of;
use crate::port::{GidKind, PortFixed};

/// Why [`QueuePair::modify`](super::QueuePair::modify) refused a modify
/// without calling the kernel (or, once, after: when the kernel refused a
/// modify accepted on a cached GID entry that has changed since; see
/// [`Error::Modify`](crate::Error::Modify)). The QP is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModifyError {
    /// The kernel allows no transition from `from` to `to` for this type.
    IllegalTransition {
        /// The QP's type.
        qp_type: QpType,
        /// Its known state.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// Required attributes are missing, or attributes the transition does not
    /// take are present.
    Attributes {
        /// The QP's type.
        qp_type: QpType,
        /// Its known state.
        from: QpState,
        /// The state asked for (`from` for an attribute-only modify).
        to: QpState,
        /// Required attributes that were not set.
        missing: M,
        /// Attributes set that this transition does not take.
        forbidden: M,
        /// `IBV_QP_PORT` is among `forbidden` only because `IBV_QP_AV` was
        /// set: outside INIT->RTR the kernel adds `IBV_QP_PORT` itself.
        port_implied_by_av: bool,
    },
    /// `IBV_QP_CUR_STATE` names a state other than the one the QP is known
    /// to be in (call [`QueuePair::resync`](super::QueuePair::resync) if the
    /// device may have moved it).
    CurStateMismatch {
        /// The state the QP is known to be in.
        known: QpState,
        /// The state `cur_state` names.
        given: QpState,
    },
    /// A typed transition was applied to a QP known to be in another state
    /// than the one it starts from.
    UnexpectedState {
        /// The transition, e.g. `"RtrToRts<Rc>"`.
        transition: &'static str,
        /// The state it starts from.
        expected: QpState,
        /// The state the QP is known to be in.
        known: QpState,
    },
    /// A modify without `IBV_QP_STATE` (an attribute-only modify, which
    /// the kernel checks as a transition from the state to itself) carries
    /// attributes the state does not take, or the state takes none at all.
    AttributeOnly {
        /// The QP's type.
        qp_type: QpType,
        /// Its known state.
        state: QpState,
        /// Attributes set that the state does not take.
        forbidden: M,
        /// What an attribute-only modify in this state may carry; `None`
        /// when the kernel refuses every attribute-only modify here (there
        /// is no `state -> state` entry in its table, so even an empty mask
        /// is refused).
        allowed: Option<M>,
    },
    /// Leaving SQD (for anything but ERR) while the send queue is still
    /// draining: the kernel refuses it (rxe with EINVAL). Wait for the
    /// drain ([`QueuePair::wait_sq_drained`](super::QueuePair::wait_sq_drained)
    /// or `IBV_EVENT_SQ_DRAINED`), or move to ERR.
    SqDraining {
        /// The QP's type.
        qp_type: QpType,
        /// The state asked for.
        to: QpState,
    },
    /// More than one reason, each of which alone refuses the modify.
    Several(Vec<ModifyError>),
    /// An attribute's value cannot be taken by this device or port.
    Value {
        /// The QP's type.
        qp_type: QpType,
        /// Its known state.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// The attribute.
        attr: M,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = |f: &mut fmt::Formatter<'_>, t: &QpType, a: &QpState, b: &QpState| {
            write!(
                f,
                "{} {}->{}",
                t.short_name(),
                a.short_name(),
                b.short_name()
            )
        };
        let list = |m: M| m.c_names().collect::<Vec<_>>().join(", ");
        match self {
            ModifyError::IllegalTransition { qp_type, from, to } => {
                head(f, qp_type, from, to)?;
                f.write_str(" is not a legal transition")
            }
            ModifyError::Attributes {
                qp_type,
                from,
                to,
                missing,
                forbidden,
                port_implied_by_av,
            } => {
                head(f, qp_type, from, to)?;
                if !missing.is_empty() {
                    write!(f, " is missing {}", list(*missing))?;
                }
                if !forbidden.is_empty() {
                    if !missing.is_empty() {
                        f.write_str(" and")?;
                    }
                    write!(f, " does not take {}", list(*forbidden))?;
                    if *port_implied_by_av {
                        f.write_str(" (IBV_QP_AV outside INIT->RTR makes the kernel add IBV_QP_PORT)")?;
                    }
                }
                Ok(())
            }
            ModifyError::CurStateMismatch { known, given } => write!(
                f,
                "IBV_QP_CUR_STATE says {} but the QP is known to be in {} (call QueuePair::resync() if the device moved it)",
                given.short_name(),
                known.short_name()
            ),
            ModifyError::AttributeOnly {
                qp_type,
                state,
                forbidden,
                allowed,
            } => {
                let (t, st) = (qp_type.short_name(), state.short_name());
                write!(f, "{t} attribute-only modify in {st} (no IBV_QP_STATE)")?;
                match allowed {
                    None => {
                        write!(
                            f,
                            " is refused by the kernel whatever it carries: there is no {st}->{st} rule for {t}"
                        )?;
                        if !forbidden.is_empty() {
                            write!(f, " (it carries {})", list(*forbidden))?;
                        }
                        f.write_str("; set IBV_QP_STATE to change state")
                    }
                    Some(allowed) => {
                        write!(f, " does not take {}", list(*forbidden))?;
                        if allowed.is_empty() {
                            write!(f, "; it may carry nothing")
                        } else {
                            write!(f, "; it may carry {}", list(*allowed))
                        }
                    }
                }
            }
            ModifyError::SqDraining { qp_type, to } => write!(
                f,
                "{} SQD->{} refused: the send queue is still draining (sq_draining); \
                 wait for the drain (QueuePair::wait_sq_drained, or IBV_EVENT_SQ_DRAINED) \
                 or move the QP to ERR",
                qp_type.short_name(),
                to.short_name()
            ),
            ModifyError::Several(all) => {
                for (i, e) in all.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; and ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
            ModifyError::UnexpectedState {
                transition,
                expected,
                known,
            } => write!(
                f,
                "{transition} starts from {} but the QP is known to be in {}",
                expected.short_name(),
                known.short_name()
            ),
            ModifyError::Value {
                qp_type,
                from,
                to,
                attr,
                reason,
            } => {
                head(f, qp_type, from, to)?;
                write!(f, ": {attr}: {reason}")
            }
        }
    }
}

impl std::error::Error for ModifyError {}

/// What the validator needs to know about the QP.
pub(crate) struct QpView<'a> {
    pub ctx: &'a Context,
    pub qp_type: QpType,
    pub state: QpState,
    /// The port set at RESET->INIT, once known.
    pub port: Option<u8>,
}

/// Checks `attr` against the transition table and the device, returning the
/// target state.
///
/// The port attributes and GID entries the value checks read come from the
/// context's cache ([`PortFixed`], [`GidKind`]), filled by the first read;
/// a value check that would refuse re-reads them (one `ibv_query_port` per
/// port it looks at, and the GID entry), so that only fresh data refuses.
pub(crate) fn validate(qp: &QpView<'_>, attr: &QpAttr) -> Result<QpState, ModifyError> {
    let from = qp.state;
    let dev = qp.ctx.attr();
    let cap_refused =
        attr.mask().contains(M::CAP) && !dev.capabilities.contains(DeviceCapFlags::RESIZE_MAX_WR);
    if !cap_refused {
        // The usual case: at most one reason (the table's, or else the
        // values'), so no list of them. First against the context's cache
        // (no call when it is warm); a refusal is never made on cached
        // data: the checks run again against freshly read port attributes
        // and GID entries, and only that verdict counts.
        let to = check_transition(qp.qp_type, from, attr)?;
        return match check_values(qp, attr, from, to, Read::Cached) {
            Ok(()) => Ok(to),
            Err(_) => check_values(qp, attr, from, to, Read::Fresh).map(|()| to),
        };
    }
    // CAP is refused. Every reason is reported, not just the first: the
    // device's (CAP) and the table's or values' are independent.
    let to = attr.get_state().unwrap_or(from);
    let cap = ModifyError::Value {
        qp_type: qp.qp_type,
        from,
        to,
        attr: M::CAP,
        reason: format!(
            "{} cannot resize queues (no IBV_DEVICE_RESIZE_MAX_WR)",
            qp.ctx.name()
        ),
    };
    let other = match check_transition(qp.qp_type, from, attr) {
        // As above: a refusal rests on fresh data only.
        Ok(_) => check_values(qp, attr, from, to, Read::Cached)
            .or_else(|_| check_values(qp, attr, from, to, Read::Fresh))
            .err(),
        Err(e) => Some(e),
    };
    Err(match other {
        None => cap,
        Some(e) => ModifyError::Several(vec![cap, e]),
    })
}

/// After the kernel refused a modify that [`validate`] accepted: the value
/// checks again against freshly read port attributes and GID entries (which
/// refreshes the cache). `Some` when they now refuse: the cache was stale
/// (a GID entry changed since it was read), and this is the reason.
pub(crate) fn revalidate_fresh(qp: &QpView<'_>, attr: &QpAttr) -> Option<ModifyError> {
    let from = qp.state;
    let to = attr.get_state().unwrap_or(from);
    check_values(qp, attr, from, to, Read::Fresh).err()
}

/// Checks a modify of a `qp_type` QP in state `from` against the kernel's
/// transition table alone (no device needed) and returns the target state.
///
/// This is the table part of [`QueuePair::modify`](super::QueuePair::modify):
/// the transition must be legal; the mask must hold every required and no
/// other attribute than the optional ones (`IBV_QP_STATE` aside); an
/// attribute-only modify (no `IBV_QP_STATE`) is checked as `from -> from`;
/// `IBV_QP_CUR_STATE` must name `from`; and `IBV_QP_AV` outside INIT->RTR
/// counts as carrying `IBV_QP_PORT` too, since the kernel adds it.
///
/// ```
/// use rdma_verbs::qp::{check_transition, MinRnrTimer, Psn, QpAttr, QpNum, QpState, QpType, AddressVector};
/// use rdma_verbs::Mtu;
/// let rtr = QpAttr::new()
///     .state(QpState::Rtr)
///     .av(AddressVector::new(1))
///     .path_mtu(Mtu::Mtu1024)
///     .dest_qpn(QpNum::new(0x12)?)
///     .rq_psn(Psn::new(0)?);
/// assert!(check_transition(QpType::Uc, QpState::Init, &rtr).is_ok());
/// let err = check_transition(QpType::Rc, QpState::Init, &rtr).unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "RC INIT->RTR is missing IBV_QP_MIN_RNR_TIMER, IBV_QP_MAX_DEST_RD_ATOMIC"
/// );
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
pub fn check_transition(
    qp_type: QpType,
    from: QpState,
    attr: &QpAttr,
) -> Result<QpState, ModifyError> {
    if let Some(given) = attr.get_cur_state() {
        if given != from {
            return Err(ModifyError::CurStateMismatch { known: from, given });
        }
    }
    let to = attr.get_state().unwrap_or(from);
    let illegal = ModifyError::IllegalTransition { qp_type, from, to };
    if from == QpState::Unknown || to == QpState::Unknown {
        return Err(illegal);
    }
    if attr.get_state().is_none() {
        return check_attribute_only(qp_type, from, attr.mask());
    }
    let rule = transition_rule(qp_type, from, to).ok_or(illegal)?;
    let mut mask = attr.mask() - M::STATE;
    let av_adds_port = mask.contains(M::AV) && !(from == QpState::Init && to == QpState::Rtr);
    let port_given = mask.contains(M::PORT);
    if av_adds_port {
        mask |= M::PORT;
    }
    let missing = rule.required - mask;
    let forbidden = mask - rule.required - rule.optional;
    if !missing.is_empty() || !forbidden.is_empty() {
        return Err(ModifyError::Attributes {
            qp_type,
            from,
            to,
            missing,
            forbidden,
            port_implied_by_av: av_adds_port && !port_given && forbidden.contains(M::PORT),
        });
    }
    Ok(to)
}

/// Where the value checks read port attributes and GID entries from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// The context's cache, reading (and filling it) only what it lacks.
    Cached,
    /// The device: every port looked at is queried once, every GID entry
    /// read (both refresh the cache).
    Fresh,
}

/// The source GID entry a GRH names must exist (the kernel: ENODATA), and
/// on RoCE v2 be of the destination's family: an IPv4-mapped GID sends
/// IPv4 packets, any other IPv6 (the kernel: EINVAL). The caller checked
/// the index against the port's table (no second port query here).
///
/// With [`Read::Cached`], an entry last seen used and of a fitting kind is
/// accepted without a call (the kernel judges the entry anyway); anything
/// else reads the entry, so a refusal always rests on a fresh read.
fn check_sgid(
    ctx: &Context,
    port: u8,
    g: &super::values::GlobalRoute,
    read: Read,
) -> Result<(), String> {
    const VERB: &str = "ibv_query_gid_ex";
    let index = g.sgid_index();
    if read == Read::Cached
        && ctx
            .cached_gid(port, index.into())
            .is_some_and(|kind| kind.reaches(g.dgid()))
    {
        return Ok(());
    }
    let entry = ctx
        .raw_gid_entry(VERB, port, index.into())
        .map(|raw| crate::gid::GidEntry::from_raw(&raw))
        .map_err(|e| match e {
            crate::Error::InvalidArgument { reason, .. } => format!("sgid_index {index}: {reason}"),
            other => format!("sgid_index {index}: cannot read the GID entry: {other}"),
        })?;
    if !GidKind::of(&entry).reaches(g.dgid()) {
        let v4 = |gid: crate::gid::Gid| gid.as_ipv6().to_ipv4_mapped().is_some();
        let family = |ipv4: bool| if ipv4 { "IPv4" } else { "IPv6" };
        return Err(format!(
            "sgid_index {index} is the RoCE v2 {} GID {}, which cannot reach the {} dgid {}: \
             pick a source GID of the same family",
            family(v4(entry.gid)),
            entry.gid,
            family(v4(g.dgid())),
            g.dgid()
        ));
    }
    Ok(())
}

/// An attribute-only modify (no `IBV_QP_STATE`): the kernel checks it as
/// `state -> state`, which has no required attributes where it exists.
fn check_attribute_only(qp_type: QpType, state: QpState, mask: M) -> Result<QpState, ModifyError> {
    let refuse = |forbidden, allowed| {
        Err(ModifyError::AttributeOnly {
            qp_type,
            state,
            forbidden,
            allowed,
        })
    };
    let Some(rule) = transition_rule(qp_type, state, state) else {
        return refuse(mask, None);
    };
    // IBV_QP_AV outside INIT->RTR brings IBV_QP_PORT with it.
    let mut given = mask;
    if given.contains(M::AV) {
        given |= M::PORT;
    }
    let allowed = rule.required | rule.optional;
    let forbidden = given - allowed;
    if forbidden.is_empty() {
        Ok(state)
    } else {
        refuse(forbidden, Some(allowed))
    }
}

/// The facts of `port` from the device (or, with [`Read::Cached`], from
/// the cache when it has them): the slow part of the value checks' port
/// lookups. `queried` has a bit per port already queried by this round of
/// [`Read::Fresh`] checks, which then reads the cache.
#[cold]
fn port_read(
    ctx: &Context,
    port: u8,
    read: Read,
    queried: &Cell<[u64; 4]>,
) -> Result<PortFixed, String> {
    if let Some(reason) = ctx.port_problem(port) {
        return Err(reason);
    }
    let (word, bit) = (usize::from(port / 64), 1u64 << (port % 64));
    let mut seen = queried.get();
    let fresh = read == Read::Fresh && seen[word] & bit == 0;
    let pa = ctx
        .port_fixed(port, fresh)
        .map_err(|e| format!("cannot query port {port}: {e}"))?;
    seen[word] |= bit;
    queried.set(seen);
    Ok(pa)
}

/// The value checks, reading port attributes and GID entries as `read`
/// says. Allocates nothing unless it refuses.
fn check_values(
    qp: &QpView<'_>,
    attr: &QpAttr,
    from: QpState,
    to: QpState,
    read: Read,
) -> Result<(), ModifyError> {
    let value_err = |attr: M, reason: String| ModifyError::Value {
        qp_type: qp.qp_type,
        from,
        to,
        attr,
        reason,
    };
    let ctx = qp.ctx;
    let dev = ctx.attr();
    let mask = attr.mask();
    let raw = attr.raw();

    // Several checks look at the same port. With Read::Cached a port's
    // facts are one load from the context's cache (a hit also proves that
    // the port exists); only a port never read goes to `port_read`. With
    // Read::Fresh each port is queried once (a bit per port number), after
    // which the cache holds what the query returned.
    let queried = Cell::new([0u64; 4]);
    let port_attr = |flag: M, port: u8| -> Result<PortFixed, ModifyError> {
        if read == Read::Cached {
            if let Some(f) = ctx.cached_port(port) {
                return Ok(f);
            }
        }
        port_read(ctx, port, read, &queried).map_err(|reason| value_err(flag, reason))
    };
    // The port the QP uses after this modify.
    let port = attr.get_port().or(qp.port);

    if let Some(p) = attr.get_port() {
        port_attr(M::PORT, p)?;
    }
    if mask.contains(M::PKEY_INDEX) {
        if let Some(p) = port {
            let len = port_attr(M::PKEY_INDEX, p)?.pkey_tbl_len;
            if raw.pkey_index >= len {
                return Err(value_err(
                    M::PKEY_INDEX,
                    format!(
                        "P_Key index {} is outside port {p}'s {}",
                        raw.pkey_index,
                        table_of(len)
                    ),
                ));
            }
        }
    }
    if let Some(mtu) = attr.get_path_mtu() {
        if let Some(p) = port {
            let pa = port_attr(M::PATH_MTU, p)?;
            // Above the active MTU is allowed, as the kernel allows it: see
            // the `QueuePair::modify` docs.
            if mtu > pa.max_mtu {
                return Err(value_err(
                    M::PATH_MTU,
                    format!(
                        "{} bytes is above port {p}'s max MTU of {}",
                        mtu.bytes(),
                        pa.max_mtu.bytes()
                    ),
                ));
            }
        }
    } else if mask.contains(M::PATH_MTU) {
        return Err(value_err(
            M::PATH_MTU,
            format!("{} is not an MTU", raw.path_mtu),
        ));
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && u32::from(raw.max_rd_atomic) > dev.max_qp_init_rd_atom
    {
        return Err(value_err(
            M::MAX_QP_RD_ATOMIC,
            format!(
                "{} is above the device's max_qp_init_rd_atom of {}",
                raw.max_rd_atomic, dev.max_qp_init_rd_atom
            ),
        ));
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC)
        && u32::from(raw.max_dest_rd_atomic) > dev.max_qp_rd_atom
    {
        return Err(value_err(
            M::MAX_DEST_RD_ATOMIC,
            format!(
                "{} is above the device's max_qp_rd_atom of {}",
                raw.max_dest_rd_atomic, dev.max_qp_rd_atom
            ),
        ));
    }
    let check_av = |flag: M, av: &super::values::AddressVector| -> Result<PortFixed, ModifyError> {
        let pa = port_attr(flag, av.port())?;
        match av.grh() {
            None if pa.grh_required() => Err(value_err(
                flag,
                format!(
                    "port {} {}: the address vector needs a GRH (AddressVector::global)",
                    av.port(),
                    if pa.is_roce() {
                        "is RoCE"
                    } else {
                        "requires a GRH (IBV_QPF_GRH_REQUIRED)"
                    }
                ),
            )),
            Some(g) if u32::from(g.sgid_index()) >= pa.gid_tbl_len => Err(value_err(
                flag,
                format!(
                    "sgid_index {} is outside port {}'s GID {}",
                    g.sgid_index(),
                    av.port(),
                    table_of(pa.gid_tbl_len)
                ),
            )),
            Some(g) => {
                check_sgid(ctx, av.port(), g, read).map_err(|reason| value_err(flag, reason))?;
                Ok(pa)
            }
            None => Ok(pa),
        }
    };
    if let Some(av) = attr.get_av() {
        check_av(M::AV, &av)?;
        if from == QpState::Init && to == QpState::Rtr {
            if let Some(p) = port {
                if av.port() != p {
                    return Err(value_err(
                        M::AV,
                        format!(
                            "the address vector's port {} is not the QP's port {p}",
                            av.port()
                        ),
                    ));
                }
            }
        }
    }
    if let Some(alt) = attr.get_alt_path() {
        if !dev.capabilities.contains(DeviceCapFlags::AUTO_PATH_MIG) {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "{} has no automatic path migration (IBV_DEVICE_AUTO_PATH_MIG)",
                    ctx.name()
                ),
            ));
        }
        let alt_pa = check_av(M::ALT_PATH, &alt.av)?;
        let primary_roce = match port {
            Some(p) => port_attr(M::ALT_PATH, p)?.is_roce(),
            None => false,
        };
        if alt_pa.is_roce() || primary_roce {
            return Err(value_err(
                M::ALT_PATH,
                "alternate paths are InfiniBand-only: the kernel refuses them on RoCE ports".into(),
            ));
        }
        if alt.port != alt.av.port() {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "alt_port_num {} differs from the alternate AV's port {}",
                    alt.port,
                    alt.av.port()
                ),
            ));
        }
        let len = port_attr(M::ALT_PATH, alt.port)?.pkey_tbl_len;
        if alt.pkey_index >= len {
            return Err(value_err(
                M::ALT_PATH,
                format!(
                    "alt_pkey_index {} is outside port {}'s {}",
                    alt.pkey_index,
                    alt.port,
                    table_of(len)
                ),
            ));
        }
    }
    if mask.contains(M::RATE_LIMIT) {
        let pacing = dev.packet_pacing;
        let raw_bit = 1u32 << QpType::RawPacket.as_raw();
        if pacing.supported_qp_types & raw_bit == 0 || pacing.rate_limit_max_kbps == 0 {
            return Err(value_err(
                M::RATE_LIMIT,
                format!("{} has no packet pacing for RAW_PACKET QPs", ctx.name()),
            ));
        }
        let r = raw.rate_limit;
        if r != 0 && !(pacing.rate_limit_min_kbps..=pacing.rate_limit_max_kbps).contains(&r) {
            return Err(value_err(
                M::RATE_LIMIT,
                format!(
                    "{r} kbit/s is outside the device's {}..={} kbit/s",
                    pacing.rate_limit_min_kbps, pacing.rate_limit_max_kbps
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mr::AccessFlags;
    use crate::port::Mtu;
    use crate::qp::values::*;

    fn rc_rtr() -> QpAttr {
        QpAttr::new()
            .state(QpState::Rtr)
            .av(AddressVector::new(1))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(QpNum::new(1).unwrap())
            .rq_psn(Psn::new(0).unwrap())
            .max_dest_rd_atomic(1)
            .min_rnr_timer(MinRnrTimer::new(12).unwrap())
    }

    #[test]
    fn names_missing_flags_like_the_issue_says() {
        let attr = QpAttr::new()
            .state(QpState::Rtr)
            .av(AddressVector::new(1))
            .path_mtu(Mtu::Mtu1024)
            .dest_qpn(QpNum::new(1).unwrap())
            .rq_psn(Psn::new(0).unwrap());
        let e = check_transition(QpType::Rc, QpState::Init, &attr).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RC INIT->RTR is missing IBV_QP_MIN_RNR_TIMER, IBV_QP_MAX_DEST_RD_ATOMIC"
        );
        assert_eq!(
            check_transition(QpType::Rc, QpState::Init, &rc_rtr()),
            Ok(QpState::Rtr)
        );
    }

    #[test]
    fn names_forbidden_flags() {
        let e = check_transition(QpType::Ud, QpState::Init, &rc_rtr()).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("UD INIT->RTR does not take IBV_QP_AV, IBV_QP_PATH_MTU"),
            "{s}"
        );
        match e {
            ModifyError::Attributes {
                missing, forbidden, ..
            } => {
                assert!(missing.is_empty());
                assert_eq!(forbidden, rc_rtr().mask() - M::STATE);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_and_forbidden_together() {
        let attr = QpAttr::new()
            .state(QpState::Init)
            .pkey_index(0)
            .port(1)
            .qkey(QKey(1));
        let e = check_transition(QpType::Rc, QpState::Reset, &attr).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RC RESET->INIT is missing IBV_QP_ACCESS_FLAGS and does not take IBV_QP_QKEY"
        );
    }

    #[test]
    fn illegal_transitions() {
        let e = check_transition(
            QpType::Rc,
            QpState::Reset,
            &QpAttr::new().state(QpState::Rts),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "RC RESET->RTS is not a legal transition");
        // RESET->ERR is refused: go through INIT.
        assert!(check_transition(
            QpType::Ud,
            QpState::Reset,
            &QpAttr::new().state(QpState::Err)
        )
        .is_err());
        for from in [
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Sqe,
            QpState::Err,
        ] {
            for to in [QpState::Reset, QpState::Err] {
                assert_eq!(
                    check_transition(QpType::Rc, from, &QpAttr::new().state(to)),
                    Ok(to)
                );
            }
        }
    }

    #[test]
    fn attribute_only_modifies_are_checked_as_state_to_itself() {
        // RTS->RTS takes ACCESS_FLAGS for RC ...
        let a = QpAttr::new().access_flags(AccessFlags::REMOTE_READ);
        assert_eq!(
            check_transition(QpType::Rc, QpState::Rts, &a),
            Ok(QpState::Rts)
        );
        // ... RTR->RTR is no transition at all, even with an empty mask,
        // and the message says so in the user's terms.
        let e = check_transition(QpType::Rc, QpState::Rtr, &QpAttr::new()).unwrap_err();
        assert!(matches!(
            e,
            ModifyError::AttributeOnly {
                state: QpState::Rtr,
                allowed: None,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "RC attribute-only modify in RTR (no IBV_QP_STATE) is refused by the kernel \
             whatever it carries: there is no RTR->RTR rule for RC; set IBV_QP_STATE to change state"
        );
        // RESET->RESET takes nothing.
        let e = check_transition(QpType::Rc, QpState::Reset, &a).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RC attribute-only modify in RESET (no IBV_QP_STATE) does not take \
             IBV_QP_ACCESS_FLAGS; it may carry nothing"
        );
        // RTS->RTS on UD does not take ACCESS_FLAGS, and says what it takes.
        let e = check_transition(QpType::Ud, QpState::Rts, &a).unwrap_err();
        assert_eq!(
            e.to_string(),
            "UD attribute-only modify in RTS (no IBV_QP_STATE) does not take \
             IBV_QP_ACCESS_FLAGS; it may carry IBV_QP_CUR_STATE, IBV_QP_QKEY"
        );
    }

    #[test]
    fn messages_name_the_crate_s_method_and_count_right() {
        let e = ModifyError::CurStateMismatch {
            known: QpState::Rts,
            given: QpState::Rtr,
        };
        assert!(e.to_string().contains("QueuePair::resync()"), "{e}");
        assert!(!e.to_string().contains("query_qp"), "{e}");
        assert_eq!(crate::error::table_of(1u32), "table of 1 entry");
        assert_eq!(crate::error::table_of(16u32), "table of 16 entries");
        let both = ModifyError::Several(vec![
            ModifyError::SqDraining {
                qp_type: QpType::Rc,
                to: QpState::Rts,
            },
            ModifyError::IllegalTransition {
                qp_type: QpType::Rc,
                from: QpState::Sqd,
                to: QpState::Init,
            },
        ]);
        let text = both.to_string();
        assert!(
            text.contains("still draining") && text.contains("; and RC SQD->INIT is not a legal"),
            "{text}"
        );
    }

    #[test]
    fn cur_state_rules() {
        let rts = QpAttr::new()
            .state(QpState::Rts)
            .sq_psn(Psn::new(0).unwrap());
        assert!(check_transition(QpType::Ud, QpState::Rtr, &rts.cur_state(QpState::Rtr)).is_ok());
        let e =
            check_transition(QpType::Ud, QpState::Rtr, &rts.cur_state(QpState::Init)).unwrap_err();
        assert_eq!(
            e,
            ModifyError::CurStateMismatch {
                known: QpState::Rtr,
                given: QpState::Init
            }
        );
        // CUR_STATE is not taken outside *->RTS (the kernel: only from RTR, RTS, SQD, SQE).
        let init = QpAttr::new().state(QpState::Init).cur_state(QpState::Init);
        assert!(matches!(
            check_transition(QpType::Ud, QpState::Init, &init),
            Err(ModifyError::Attributes {
                forbidden: M::CUR_STATE,
                ..
            })
        ));
    }

    #[test]
    fn av_outside_init_to_rtr_implies_port() {
        let av = QpAttr::new().state(QpState::Sqd).av(AddressVector::new(1));
        // RC SQD->SQD takes PORT: fine.
        assert!(check_transition(QpType::Rc, QpState::Sqd, &av).is_ok());
        // UC SQD->SQD lists AV but not PORT: the kernel refuses it.
        let e = check_transition(QpType::Uc, QpState::Sqd, &av).unwrap_err();
        assert!(matches!(
            e,
            ModifyError::Attributes {
                forbidden: M::PORT,
                port_implied_by_av: true,
                ..
            }
        ));
        assert!(
            e.to_string().contains("makes the kernel add IBV_QP_PORT"),
            "{e}"
        );
    }

    #[test]
    fn cap_and_rate_limit_are_in_no_ordinary_entry() {
        let cap = QpAttr::new().cap(crate::qp::QpCaps::default());
        for (t, s) in [
            (QpType::Rc, QpState::Rts),
            (QpType::Ud, QpState::Init),
            (QpType::Uc, QpState::Sqd),
        ] {
            assert!(check_transition(t, s, &cap).is_err());
            assert!(check_transition(t, s, &QpAttr::new().rate_limit(RateLimit(10))).is_err());
        }
        assert!(check_transition(
            QpType::RawPacket,
            QpState::Rts,
            &QpAttr::new().rate_limit(RateLimit(10))
        )
        .is_ok());
    }
}

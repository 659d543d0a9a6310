//! Checking a modify before it reaches the kernel: the table part
//! ([`transition`]), the value part against the device and the port cache
//! ([`values`]), and why a modify is refused ([`error`]).

mod error;
mod transition;
mod values;

pub use error::ModifyError;
pub use transition::check_transition;

use super::attr::QpAttr;
use super::mask::QpAttrMask as M;
use super::QpState;
use super::QpType;
use crate::context::Context;
use crate::device_attr::DeviceCapFlags;
use values::{check_values, Read};

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
/// context's cache ([`PortFixed`](crate::port::PortFixed), [`GidKind`](crate::port::GidKind)), filled by the first read;
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

/// [`validate`] for a typed transition ([`Qp::apply`](crate::qp::Qp::apply))
/// from the known state to `to`: the builder's mask passes the table (the
/// tests of `typed` check every builder), and no builder sets
/// `IBV_QP_CAP`, so only `IBV_QP_CUR_STATE` and the values are checked.
pub(crate) fn validate_typed(
    qp: &QpView<'_>,
    attr: &QpAttr,
    to: QpState,
) -> Result<QpState, ModifyError> {
    let from = qp.state;
    transition::check_cur_state(from, attr)?;
    debug_assert_eq!(check_transition(qp.qp_type, from, attr), Ok(to));
    match check_values(qp, attr, from, to, Read::Cached) {
        Ok(()) => Ok(to),
        Err(_) => check_values(qp, attr, from, to, Read::Fresh).map(|()| to),
    }
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

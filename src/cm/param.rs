//! Connection parameters (`struct rdma_conn_param`) and what a peer sent
//! (`struct rdma_conn_param`, `struct rdma_ud_param` in events).

use std::ffi::c_void;

use super::addr::PortSpace;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::qp::{AddressVector, QpNum};
use crate::sys;

/// Which CM message private data rides in, for [`max_private_data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrivateDataOp {
    /// [`CmId::connect`](super::CmId::connect) (REQ, or SIDR REQ for UD).
    Connect,
    /// [`CmId::accept`](super::CmId::accept) (REP, or SIDR REP).
    Accept,
    /// [`CmId::reject`](super::CmId::reject) (REJ, or SIDR REP).
    Reject,
}

/// The most private data `op` carries in port space `ps`, in bytes: what
/// the InfiniBand CM message holds less the RDMA CM's own header
/// (rdma_connect(3), rdma_accept(3), the kernel's `IB_CM_*_PRIVATE_DATA_SIZE`).
///
/// | | connected (TCP, IB) | UD (UDP, IPoIB) |
/// |---|---|---|
/// | connect | 56 | 180 |
/// | accept | 196 | 136 |
/// | reject | 148 | 136 |
pub fn max_private_data(op: PrivateDataOp, ps: PortSpace) -> usize {
    match (op, ps.is_connected()) {
        (PrivateDataOp::Connect, true) => 56,
        (PrivateDataOp::Connect, false) => 180,
        (PrivateDataOp::Accept, true) => 196,
        (PrivateDataOp::Accept, false) => 136,
        (PrivateDataOp::Reject, true) => 148,
        (PrivateDataOp::Reject, false) => 136,
    }
}

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "the device's maximum".
const DEVICE_MAX: u8 = 0xFF;

/// Connection parameters for [`CmId::connect`](super::CmId::connect) and
/// [`CmId::accept`](super::CmId::accept) (`struct rdma_conn_param`).
///
/// Checked before the call: private data within
/// [`max_private_data`], retry counts within 3 bits, and the RDMA read
/// and atomic depths within the device's `max_qp_rd_atom` and
/// `max_qp_init_rd_atom`.
///
/// ```
/// use rdma_verbs::cm::ConnParam;
/// let hello = *b"hello";
/// let p = ConnParam::new()
///     .private_data(&hello)
///     .responder_resources(1)
///     .initiator_depth(1)
///     .retry_count(7)
///     .rnr_retry_count(7);
/// ```
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, Copy)]
pub struct ConnParam<'a> {
    private_data: &'a [u8],
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: bool,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: Option<u32>,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> ConnParam<'a> {
    /// No private data; RDMA read and atomic depths at the device's
    /// maximum (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`; on accept,
    /// the smaller of that and what the peer asked for); flow control off;
    /// 7 retries and 7 RNR retries (7: retry forever on RNR).
    pub fn new() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: DEVICE_MAX,
            initiator_depth: DEVICE_MAX,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: None,
        }
    }

    /// Private data for the peer (its connect request or accept event).
    pub fn private_data(mut self, data: &'a [u8]) -> Self {
        self.private_data = data;
        self
    }

    /// `responder_resources`: RDMA reads and atomics the peer may have
    /// outstanding towards this side (at most the device's `max_qp_rd_atom`).
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = n;
        self
    }

    /// `initiator_depth`: RDMA reads and atomics this side may have
    /// outstanding (at most the device's `max_qp_init_rd_atom`).
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = n;
        self
    }

    /// `flow_control`: whether the hardware does end-to-end flow control.
    pub fn flow_control(mut self, on: bool) -> Self {
        self.flow_control = on;
        self
    }

    /// `retry_count`: transport retries on timeout, 0..=7.
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    /// `rnr_retry_count`: retries on receiver-not-ready, 0..=7 (7: forever).
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n;
        self
    }

    /// `srq`: the QP receives through a shared receive queue (only for a
    /// QP of the program's own; a CM QP says so itself).
    pub fn srq(mut self, on: bool) -> Self {
        self.srq = on;
        self
    }

    /// `qp_num`: the QP of the program's own that the connection is for
    /// (needed when the id has no QP made by
    /// [`CmId::create_qp`](super::CmId::create_qp)).
    pub fn qp_num(mut self, qpn: QpNum) -> Self {
        self.qp_num = Some(qpn.get());
        self
    }

    /// The C struct, after the checks. It borrows `self`'s private data.
    pub(crate) fn to_raw(
        self,
        verb: &'static str,
        op: PrivateDataOp,
        ps: PortSpace,
        ctx: &Context,
        has_cm_qp: bool,
    ) -> Result<sys::rdma_conn_param> {
        let limit = max_private_data(op, ps);
        if self.private_data.len() > limit {
            return Err(Error::invalid(
                verb,
                format!(
                    "{} bytes of private data is more than the {limit} {} carries",
                    self.private_data.len(),
                    describe(op, ps),
                ),
            ));
        }
        for (what, n) in [
            ("retry_count", self.retry_count),
            ("rnr_retry_count", self.rnr_retry_count),
        ] {
            if n > 7 {
                return Err(Error::OutOfRange {
                    what,
                    value: n.into(),
                    range: "0..=7",
                });
            }
        }
        let dev = ctx.attr();
        for (what, n, max, limit) in [
            (
                "responder_resources",
                self.responder_resources,
                dev.max_qp_rd_atom,
                "max_qp_rd_atom",
            ),
            (
                "initiator_depth",
                self.initiator_depth,
                dev.max_qp_init_rd_atom,
                "max_qp_init_rd_atom",
            ),
        ] {
            if n != DEVICE_MAX && u32::from(n) > max {
                return Err(Error::invalid(
                    verb,
                    format!("{what} {n} is more than {}'s {limit} of {max}", ctx.name()),
                ));
            }
        }
        let qp_num = match (self.qp_num, has_cm_qp) {
            (Some(_), true) => {
                return Err(Error::invalid(
                    verb,
                    "the id has a QP of its own (rdma_create_qp); qp_num names a QP only for ids without one",
                ))
            }
            (Some(q), false) if q > 0xFF_FFFF => {
                return Err(Error::OutOfRange {
                    what: "qp_num",
                    value: q.into(),
                    range: "0..=0xffffff",
                })
            }
            (Some(q), false) => q,
            (None, false) if ps.is_connected() => {
                return Err(Error::invalid(
                    verb,
                    "the id has no QP: create one with CmId::create_qp, or name the program's own with ConnParam::qp_num",
                ))
            }
            (None, _) => 0,
        };
        Ok(sys::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast::<c_void>()
            },
            // Fits: checked against a limit below 256 above.
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control.into(),
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: self.srq.into(),
            qp_num,
        })
    }
}

/// "an RDMA_PS_TCP connect".
pub(crate) fn describe(op: PrivateDataOp, ps: PortSpace) -> String {
    let op = match op {
        PrivateDataOp::Connect => "connect",
        PrivateDataOp::Accept => "accept",
        PrivateDataOp::Reject => "reject",
    };
    format!("an {} {op}", ps.c_name())
}

/// The connection parameters in an event: what the peer asked for (connect
/// request) or agreed to (established).
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// `responder_resources`: RDMA reads and atomics the peer accepts.
    pub responder_resources: u8,
    /// `initiator_depth`: RDMA reads and atomics the peer issues.
    pub initiator_depth: u8,
    /// `flow_control`.
    pub flow_control: bool,
    /// `retry_count`.
    pub retry_count: u8,
    /// `rnr_retry_count`.
    pub rnr_retry_count: u8,
    /// `srq`: the peer's QP receives through an SRQ.
    pub srq: bool,
    /// `qp_num`: the peer's QP number.
    pub qp_num: QpNum,
}

impl ConnInfo {
    pub(crate) fn from_raw(p: &sys::rdma_conn_param) -> Self {
        ConnInfo {
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control != 0,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq != 0,
            qp_num: QpNum::truncate(p.qp_num),
        }
    }
}

/// Where UD sends go, from an event (`struct rdma_ud_param`): the peer's
/// (or the multicast group's) address vector, QP number and Q_Key.
///
/// ```no_run
/// # fn f(event: &rdma_verbs::cm::CmEvent, pd: &rdma_verbs::ProtectionDomain) -> rdma_verbs::Result<()> {
/// let ud = event.ud_info().expect("a UD event");
/// let ah = pd.create_ah(&ud.av)?;
/// // post UD sends with (ah, ud.qp_num, ud.qkey)
/// # Ok(()) }
/// ```
#[doc(alias = "rdma_ud_param")]
#[derive(Debug, Clone, Copy)]
pub struct UdInfo {
    /// `ah_attr`: the address vector to make an address handle from.
    pub av: AddressVector,
    /// `qp_num`: the remote QP number (0xFFFFFF for a multicast group).
    pub qp_num: QpNum,
    /// `qkey`: the Q_Key to send with.
    pub qkey: u32,
}

impl UdInfo {
    pub(crate) fn from_raw(p: &sys::rdma_ud_param) -> Self {
        UdInfo {
            av: AddressVector::from_raw(&p.ah_attr),
            qp_num: QpNum::truncate(p.qp_num),
            qkey: p.qkey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_limits_follow_the_man_pages() {
        assert_eq!(max_private_data(PrivateDataOp::Connect, PortSpace::Tcp), 56);
        assert_eq!(max_private_data(PrivateDataOp::Accept, PortSpace::Tcp), 196);
        assert_eq!(max_private_data(PrivateDataOp::Accept, PortSpace::Udp), 136);
        assert_eq!(
            max_private_data(PrivateDataOp::Connect, PortSpace::Udp),
            180
        );
        assert_eq!(
            describe(PrivateDataOp::Connect, PortSpace::Tcp),
            "an RDMA_PS_TCP connect"
        );
    }
}

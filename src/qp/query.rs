//! Reading a queue pair's attributes back (`ibv_query_qp`).

use super::values::{
    AckTimeout, AddressVector, MinRnrTimer, PathMigState, Psn, QKey, QpNum, RateLimit, RetryCount,
    RnrRetry,
};
use super::{QpCaps, QpState, QpType, QueuePair};
use crate::error::{check_rc, Error, Result};
use crate::mr::AccessFlags;
use crate::port::Mtu;
use crate::sys;

/// A queue pair's current attributes (`struct ibv_qp_attr`), as
/// `ibv_query_qp` reports them, in the same types [`QpAttr`](super::QpAttr)
/// takes.
///
/// Fields that do not apply to the QP's type or state read as the device
/// reports them (usually 0). Devices may adjust what was set: rxe rounds
/// `max_rd_atomic` and `max_dest_rd_atomic` up to a power of two (12 reads
/// back as 16), and the kernel overwrites the GRH hop limit on RoCE.
#[doc(alias = "ibv_qp_attr")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpAttributes {
    /// `qp_state`: the state the device reports.
    pub state: QpState,
    /// `cur_qp_state`.
    pub cur_state: QpState,
    /// `path_mtu`; `None` before INIT->RTR set it.
    pub path_mtu: Option<Mtu>,
    /// `path_mig_state`; `None` for a value this crate does not know.
    pub path_mig_state: Option<PathMigState>,
    /// `qkey` (UD).
    pub qkey: QKey,
    /// `rq_psn`: the receive queue's packet sequence number.
    pub rq_psn: Psn,
    /// `sq_psn`: the send queue's packet sequence number.
    pub sq_psn: Psn,
    /// `dest_qp_num`: the remote QP (connected types).
    pub dest_qp_num: QpNum,
    /// `qp_access_flags`: remote access allowed to incoming operations.
    pub access: AccessFlags,
    /// `cap`: the queue sizes.
    pub cap: QpCaps,
    /// `ah_attr`: the primary path's address vector.
    pub av: AddressVector,
    /// `alt_ah_attr`: the alternate path's address vector.
    pub alt_av: AddressVector,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `alt_pkey_index`.
    pub alt_pkey_index: u16,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: bool,
    /// `sq_draining`: the send queue is draining (SQD).
    pub sq_draining: bool,
    /// `max_rd_atomic`: outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`: outstanding RDMA reads/atomics as target.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: MinRnrTimer,
    /// `port_num`.
    pub port_num: u8,
    /// `timeout`: the local ACK timeout.
    pub timeout: AckTimeout,
    /// `retry_cnt`.
    pub retry_cnt: RetryCount,
    /// `rnr_retry`.
    pub rnr_retry: RnrRetry,
    /// `alt_port_num`.
    pub alt_port_num: u8,
    /// `alt_timeout`.
    pub alt_timeout: AckTimeout,
    /// `rate_limit` (RAW_PACKET).
    pub rate_limit: RateLimit,
}

/// The attributes a queue pair was created with (`struct ibv_qp_init_attr`),
/// as `ibv_query_qp` reports them.
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpInitAttributes {
    /// `qp_type`.
    pub qp_type: QpType,
    /// `cap`.
    pub cap: QpCaps,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
}

/// Every `IBV_QP_*` attribute bit up to `IBV_QP_DEST_QPN` (bit 20).
const QUERY_ALL: std::ffi::c_int = (1 << 21) - 1;

impl QueuePair {
    /// Queries the QP's current attributes and its creation attributes.
    #[doc(alias = "ibv_query_qp")]
    pub fn query(&self) -> Result<(QpAttributes, QpInitAttributes)> {
        const VERB: &str = "ibv_query_qp";
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: the QP is live; both out-structs are valid for writing.
        let rc = unsafe { sys::ibv_query_qp(self.as_ptr(), &mut a, QUERY_ALL, &mut init) };
        check_rc(VERB, rc)?;
        let state = |field, raw| {
            QpState::from_raw(raw).ok_or(Error::Unexpected {
                verb: VERB,
                field,
                value: raw.into(),
            })
        };
        let attrs = QpAttributes {
            state: state("qp_state", a.qp_state)?,
            cur_state: state("cur_qp_state", a.cur_qp_state)?,
            path_mtu: Mtu::from_raw(a.path_mtu),
            path_mig_state: PathMigState::from_raw(a.path_mig_state),
            qkey: QKey(a.qkey),
            rq_psn: Psn::truncate(a.rq_psn),
            sq_psn: Psn::truncate(a.sq_psn),
            dest_qp_num: QpNum::new(a.dest_qp_num & 0xff_ffff).unwrap_or_default(),
            access: AccessFlags::from_bits_retain(a.qp_access_flags),
            cap: QpCaps::from_raw(&a.cap),
            av: AddressVector::from_raw(&a.ah_attr),
            alt_av: AddressVector::from_raw(&a.alt_ah_attr),
            pkey_index: a.pkey_index,
            alt_pkey_index: a.alt_pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            sq_draining: a.sq_draining != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            // The kernel stores these in 5 and 3 bits: masking loses nothing.
            min_rnr_timer: MinRnrTimer::new(a.min_rnr_timer & 31).unwrap_or_default(),
            port_num: a.port_num,
            timeout: AckTimeout::new(a.timeout & 31).unwrap_or_default(),
            retry_cnt: RetryCount::new(a.retry_cnt & 7).unwrap_or_default(),
            rnr_retry: RnrRetry::new(a.rnr_retry & 7).unwrap_or_default(),
            alt_port_num: a.alt_port_num,
            alt_timeout: AckTimeout::new(a.alt_timeout & 31).unwrap_or_default(),
            rate_limit: RateLimit(a.rate_limit),
        };
        let init = QpInitAttributes {
            // Some providers leave qp_type at 0 here; the QP knows its type.
            qp_type: QpType::from_raw(init.qp_type).unwrap_or(self.qp_type),
            cap: QpCaps::from_raw(&init.cap),
            sq_sig_all: init.sq_sig_all != 0,
        };
        Ok((attrs, init))
    }

    /// The QP's current state, as the device reports it.
    #[doc(alias = "ibv_query_qp")]
    pub fn query_state(&self) -> Result<QpState> {
        Ok(self.query()?.0.state)
    }
}

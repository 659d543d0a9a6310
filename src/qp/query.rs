//! Reading a queue pair's attributes back (`ibv_query_qp`).

use super::{QpCaps, QpState, QpType, QueuePair};
use crate::error::{check_rc, Error, Result};
use crate::mr::AccessFlags;
use crate::port::Mtu;
use crate::sys;

/// A queue pair's current attributes (`struct ibv_qp_attr`), as
/// `ibv_query_qp` reports them.
///
/// Fields that do not apply to the QP's type or state read as the device
/// reports them (usually 0).
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
    /// `path_mig_state` (`enum ibv_mig_state`).
    pub path_mig_state: u32,
    /// `qkey` (UD).
    pub qkey: u32,
    /// `rq_psn`: the receive queue's packet sequence number.
    pub rq_psn: u32,
    /// `sq_psn`: the send queue's packet sequence number.
    pub sq_psn: u32,
    /// `dest_qp_num`: the remote QP (connected types).
    pub dest_qp_num: u32,
    /// `qp_access_flags`: remote access allowed to incoming operations.
    pub access: AccessFlags,
    /// `cap`: the queue sizes.
    pub cap: QpCaps,
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
    /// `min_rnr_timer` (encoded, see the IB spec's table).
    pub min_rnr_timer: u8,
    /// `port_num`.
    pub port_num: u8,
    /// `timeout`: local ACK timeout (4.096 us * 2^timeout; 0 = infinite).
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry` (7 = infinite).
    pub rnr_retry: u8,
    /// `alt_port_num`.
    pub alt_port_num: u8,
    /// `alt_timeout`.
    pub alt_timeout: u8,
    /// `rate_limit`, in kbit/s (RAW_PACKET).
    pub rate_limit: u32,
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
            path_mig_state: a.path_mig_state,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            access: AccessFlags::from_bits_retain(a.qp_access_flags),
            cap: QpCaps::from_raw(&a.cap),
            pkey_index: a.pkey_index,
            alt_pkey_index: a.alt_pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            sq_draining: a.sq_draining != 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: a.alt_port_num,
            alt_timeout: a.alt_timeout,
            rate_limit: a.rate_limit,
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

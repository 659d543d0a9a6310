//! `QpAttr`: a dynamic set of QP attributes for `ibv_modify_qp`, where every
//! setter sets its own mask bit.

use std::fmt;

use super::mask::QpAttrMask;
use super::values::{
    AckTimeout, AddressVector, AltPath, MinRnrTimer, PathMigState, Psn, QKey, QpNum, RateLimit,
    RetryCount, RnrRetry,
};
use super::{QpCaps, QpState};
use crate::mr::AccessFlags;
use crate::port::Mtu;
use crate::sys;

/// The attributes of one `ibv_modify_qp` call (`struct ibv_qp_attr` plus its
/// `attr_mask`).
///
/// Each setter stores its value *and* sets its [`QpAttrMask`] bit, so a bit
/// is never set without its value nor a value without its bit.
/// [`QueuePair::modify`](super::QueuePair::modify) validates the set against
/// the QP's type and state before calling the kernel.
///
/// ```
/// use rdma_verbs::qp::{QpAttr, QpAttrMask, QpState};
/// use rdma_verbs::AccessFlags;
/// let init = QpAttr::new()
///     .state(QpState::Init)
///     .pkey_index(0)
///     .port(1)
///     .access_flags(AccessFlags::REMOTE_WRITE);
/// assert_eq!(
///     init.mask(),
///     QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
/// );
/// ```
#[doc(alias = "ibv_qp_attr")]
#[derive(Clone, Copy, Default)]
pub struct QpAttr {
    raw: sys::ibv_qp_attr,
    mask: QpAttrMask,
}

impl QpAttr {
    /// An empty set: nothing is changed.
    pub fn new() -> Self {
        Self::default()
    }

    /// The attributes that are set.
    pub fn mask(&self) -> QpAttrMask {
        self.mask
    }

    pub(crate) fn raw(&self) -> &sys::ibv_qp_attr {
        &self.raw
    }

    /// The C struct, for an `ibv_modify_qp` on a set the caller owns (it
    /// may be written by the call).
    pub(crate) fn raw_mut(&mut self) -> &mut sys::ibv_qp_attr {
        &mut self.raw
    }

    /// The same set with only the attributes in `keep` (and the state).
    #[cfg(feature = "cm")]
    pub(crate) fn retain(mut self, keep: QpAttrMask) -> Self {
        self.mask &= keep | QpAttrMask::STATE;
        self
    }

    /// A set read back from C (`rdma_init_qp_attr`): every bit the mask
    /// holds is kept, known or not, so that the validator sees all of them.
    #[cfg(feature = "cm")]
    pub(crate) fn from_raw(raw: sys::ibv_qp_attr, mask: std::ffi::c_int) -> Self {
        QpAttr {
            raw,
            mask: QpAttrMask::from_bits_retain(mask as u32),
        }
    }

    fn set(mut self, bit: QpAttrMask, f: impl FnOnce(&mut sys::ibv_qp_attr)) -> Self {
        f(&mut self.raw);
        self.mask |= bit;
        self
    }

    /// `IBV_QP_STATE`: the state to move to.
    pub fn state(self, state: QpState) -> Self {
        self.set(QpAttrMask::STATE, |r| r.qp_state = state.as_raw())
    }

    /// `IBV_QP_CUR_STATE`: the state the QP is assumed to be in.
    pub fn cur_state(self, state: QpState) -> Self {
        self.set(QpAttrMask::CUR_STATE, |r| r.cur_qp_state = state.as_raw())
    }

    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: an async event when SQD draining ends.
    pub fn en_sqd_async_notify(self, on: bool) -> Self {
        self.set(QpAttrMask::EN_SQD_ASYNC_NOTIFY, |r| {
            r.en_sqd_async_notify = on.into()
        })
    }

    /// `IBV_QP_ACCESS_FLAGS`: what incoming RDMA operations may do
    /// (`REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`).
    pub fn access_flags(self, access: AccessFlags) -> Self {
        self.set(QpAttrMask::ACCESS_FLAGS, |r| {
            r.qp_access_flags = access.bits()
        })
    }

    /// `IBV_QP_PKEY_INDEX`: the P_Key table index.
    pub fn pkey_index(self, index: u16) -> Self {
        self.set(QpAttrMask::PKEY_INDEX, |r| r.pkey_index = index)
    }

    /// `IBV_QP_PORT`: the physical port (from 1).
    pub fn port(self, port: u8) -> Self {
        self.set(QpAttrMask::PORT, |r| r.port_num = port)
    }

    /// `IBV_QP_QKEY`: the Q_Key (UD).
    pub fn qkey(self, qkey: QKey) -> Self {
        self.set(QpAttrMask::QKEY, |r| r.qkey = qkey.0)
    }

    /// `IBV_QP_AV`: the primary path's address vector.
    pub fn av(self, av: AddressVector) -> Self {
        self.set(QpAttrMask::AV, |r| r.ah_attr = av.to_raw())
    }

    /// `IBV_QP_PATH_MTU`.
    pub fn path_mtu(self, mtu: Mtu) -> Self {
        self.set(QpAttrMask::PATH_MTU, |r| r.path_mtu = mtu.as_raw())
    }

    /// `IBV_QP_TIMEOUT`: the local ACK timeout.
    pub fn timeout(self, timeout: AckTimeout) -> Self {
        self.set(QpAttrMask::TIMEOUT, |r| r.timeout = timeout.get())
    }

    /// `IBV_QP_RETRY_CNT`.
    pub fn retry_cnt(self, count: RetryCount) -> Self {
        self.set(QpAttrMask::RETRY_CNT, |r| r.retry_cnt = count.get())
    }

    /// `IBV_QP_RNR_RETRY`.
    pub fn rnr_retry(self, count: RnrRetry) -> Self {
        self.set(QpAttrMask::RNR_RETRY, |r| r.rnr_retry = count.get())
    }

    /// `IBV_QP_RQ_PSN`: the first PSN expected from the peer.
    pub fn rq_psn(self, psn: Psn) -> Self {
        self.set(QpAttrMask::RQ_PSN, |r| r.rq_psn = psn.get())
    }

    /// `IBV_QP_MAX_QP_RD_ATOMIC`: RDMA reads/atomics outstanding as initiator.
    pub fn max_rd_atomic(self, n: u8) -> Self {
        self.set(QpAttrMask::MAX_QP_RD_ATOMIC, |r| r.max_rd_atomic = n)
    }

    /// `IBV_QP_ALT_PATH`: the alternate path (sets `alt_ah_attr`,
    /// `alt_pkey_index`, `alt_port_num` and `alt_timeout` together).
    pub fn alt_path(self, alt: AltPath) -> Self {
        self.set(QpAttrMask::ALT_PATH, |r| {
            r.alt_ah_attr = alt.av.to_raw();
            r.alt_pkey_index = alt.pkey_index;
            r.alt_port_num = alt.port;
            r.alt_timeout = alt.timeout.get();
        })
    }

    /// `IBV_QP_MIN_RNR_TIMER`.
    pub fn min_rnr_timer(self, timer: MinRnrTimer) -> Self {
        self.set(QpAttrMask::MIN_RNR_TIMER, |r| r.min_rnr_timer = timer.get())
    }

    /// `IBV_QP_SQ_PSN`: the first PSN this QP sends.
    pub fn sq_psn(self, psn: Psn) -> Self {
        self.set(QpAttrMask::SQ_PSN, |r| r.sq_psn = psn.get())
    }

    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: RDMA reads/atomics outstanding as target.
    pub fn max_dest_rd_atomic(self, n: u8) -> Self {
        self.set(QpAttrMask::MAX_DEST_RD_ATOMIC, |r| r.max_dest_rd_atomic = n)
    }

    /// `IBV_QP_PATH_MIG_STATE`.
    pub fn path_mig_state(self, state: PathMigState) -> Self {
        self.set(QpAttrMask::PATH_MIG_STATE, |r| {
            r.path_mig_state = state.as_raw()
        })
    }

    /// `IBV_QP_CAP`: new queue sizes (needs `IBV_DEVICE_RESIZE_MAX_WR`).
    pub fn cap(self, caps: QpCaps) -> Self {
        self.set(QpAttrMask::CAP, |r| r.cap = caps.to_raw())
    }

    /// `IBV_QP_DEST_QPN`: the remote QP number.
    pub fn dest_qpn(self, qpn: QpNum) -> Self {
        self.set(QpAttrMask::DEST_QPN, |r| r.dest_qp_num = qpn.get())
    }

    /// `IBV_QP_RATE_LIMIT`: the send rate limit (RAW_PACKET with packet pacing).
    pub fn rate_limit(self, limit: RateLimit) -> Self {
        self.set(QpAttrMask::RATE_LIMIT, |r| r.rate_limit = limit.0)
    }

    // Typed reads of what was set, for validation.

    pub(crate) fn get_state(&self) -> Option<QpState> {
        self.mask
            .contains(QpAttrMask::STATE)
            .then(|| QpState::from_raw(self.raw.qp_state).unwrap_or(QpState::Unknown))
    }

    pub(crate) fn get_cur_state(&self) -> Option<QpState> {
        self.mask
            .contains(QpAttrMask::CUR_STATE)
            .then(|| QpState::from_raw(self.raw.cur_qp_state).unwrap_or(QpState::Unknown))
    }

    pub(crate) fn get_port(&self) -> Option<u8> {
        self.mask
            .contains(QpAttrMask::PORT)
            .then_some(self.raw.port_num)
    }

    pub(crate) fn get_av(&self) -> Option<AddressVector> {
        self.mask
            .contains(QpAttrMask::AV)
            .then(|| AddressVector::from_raw(&self.raw.ah_attr))
    }

    pub(crate) fn get_alt_path(&self) -> Option<AltPath> {
        self.mask.contains(QpAttrMask::ALT_PATH).then(|| AltPath {
            av: AddressVector::from_raw(&self.raw.alt_ah_attr),
            pkey_index: self.raw.alt_pkey_index,
            port: self.raw.alt_port_num,
            timeout: AckTimeout::new(self.raw.alt_timeout).unwrap_or(AckTimeout::INFINITE),
        })
    }

    pub(crate) fn get_path_mtu(&self) -> Option<Mtu> {
        self.mask
            .contains(QpAttrMask::PATH_MTU)
            .then(|| Mtu::from_raw(self.raw.path_mtu))
            .flatten()
    }
}

impl fmt::Debug for QpAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpAttr")
            .field("mask", &format_args!("{}", self.mask))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setter_sets_exactly_its_bit() {
        let av = AddressVector::new(1);
        let one: Vec<(QpAttrMask, QpAttr)> = vec![
            (QpAttrMask::STATE, QpAttr::new().state(QpState::Init)),
            (QpAttrMask::CUR_STATE, QpAttr::new().cur_state(QpState::Rts)),
            (
                QpAttrMask::EN_SQD_ASYNC_NOTIFY,
                QpAttr::new().en_sqd_async_notify(true),
            ),
            (
                QpAttrMask::ACCESS_FLAGS,
                QpAttr::new().access_flags(AccessFlags::REMOTE_READ),
            ),
            (QpAttrMask::PKEY_INDEX, QpAttr::new().pkey_index(0)),
            (QpAttrMask::PORT, QpAttr::new().port(1)),
            (QpAttrMask::QKEY, QpAttr::new().qkey(QKey(5))),
            (QpAttrMask::AV, QpAttr::new().av(av)),
            (QpAttrMask::PATH_MTU, QpAttr::new().path_mtu(Mtu::Mtu1024)),
            (
                QpAttrMask::TIMEOUT,
                QpAttr::new().timeout(AckTimeout::new(14).unwrap()),
            ),
            (
                QpAttrMask::RETRY_CNT,
                QpAttr::new().retry_cnt(RetryCount::new(7).unwrap()),
            ),
            (
                QpAttrMask::RNR_RETRY,
                QpAttr::new().rnr_retry(RnrRetry::INFINITE),
            ),
            (
                QpAttrMask::RQ_PSN,
                QpAttr::new().rq_psn(Psn::new(1).unwrap()),
            ),
            (QpAttrMask::MAX_QP_RD_ATOMIC, QpAttr::new().max_rd_atomic(1)),
            (
                QpAttrMask::ALT_PATH,
                QpAttr::new().alt_path(AltPath {
                    av,
                    pkey_index: 0,
                    port: 1,
                    timeout: AckTimeout::INFINITE,
                }),
            ),
            (
                QpAttrMask::MIN_RNR_TIMER,
                QpAttr::new().min_rnr_timer(MinRnrTimer::new(12).unwrap()),
            ),
            (
                QpAttrMask::SQ_PSN,
                QpAttr::new().sq_psn(Psn::new(2).unwrap()),
            ),
            (
                QpAttrMask::MAX_DEST_RD_ATOMIC,
                QpAttr::new().max_dest_rd_atomic(1),
            ),
            (
                QpAttrMask::PATH_MIG_STATE,
                QpAttr::new().path_mig_state(PathMigState::Armed),
            ),
            (QpAttrMask::CAP, QpAttr::new().cap(QpCaps::default())),
            (
                QpAttrMask::DEST_QPN,
                QpAttr::new().dest_qpn(QpNum::new(3).unwrap()),
            ),
            (
                QpAttrMask::RATE_LIMIT,
                QpAttr::new().rate_limit(RateLimit(1000)),
            ),
        ];
        assert_eq!(one.len(), 22);
        for (bit, attr) in one {
            assert_eq!(attr.mask(), bit);
        }
        assert_eq!(QpAttr::new().mask(), QpAttrMask::empty());
    }

    #[test]
    fn values_land_in_the_c_struct() {
        let a = QpAttr::new()
            .state(QpState::Rtr)
            .path_mtu(Mtu::Mtu2048)
            .dest_qpn(QpNum::new(0x1234).unwrap())
            .rq_psn(Psn::new(0xabcdef).unwrap())
            .alt_path(AltPath {
                av: AddressVector::new(2).dlid(9),
                pkey_index: 3,
                port: 2,
                timeout: AckTimeout::new(18).unwrap(),
            });
        let r = a.raw();
        assert_eq!(r.qp_state, sys::ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(r.path_mtu, sys::ibv_mtu::IBV_MTU_2048);
        assert_eq!((r.dest_qp_num, r.rq_psn), (0x1234, 0xabcdef));
        assert_eq!(
            (r.alt_pkey_index, r.alt_port_num, r.alt_timeout),
            (3, 2, 18)
        );
        assert_eq!((r.alt_ah_attr.dlid, r.alt_ah_attr.port_num), (9, 2));
        assert_eq!(a.get_state(), Some(QpState::Rtr));
        assert_eq!(a.get_path_mtu(), Some(Mtu::Mtu2048));
        assert_eq!(a.get_alt_path().unwrap().timeout.get(), 18);
        assert_eq!(a.get_port(), None);
    }
}

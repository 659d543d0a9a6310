//! `QpAttrMask`: the `attr_mask` of `ibv_modify_qp` (`enum ibv_qp_attr_mask`).

use std::fmt;

use crate::sys::ibv_qp_attr_mask as m;

bitflags::bitflags! {
    /// Which attributes of a `struct ibv_qp_attr` a modify carries
    /// (`enum ibv_qp_attr_mask`): the `attr_mask` of `ibv_modify_qp`.
    ///
    /// With [`QpAttr`](super::QpAttr) each setter sets its own bit, so a bit
    /// never goes without its value. `Display` lists the C names:
    ///
    /// ```
    /// use rdma_verbs::qp::QpAttrMask;
    /// let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX;
    /// assert_eq!(m.to_string(), "IBV_QP_STATE | IBV_QP_PKEY_INDEX");
    /// ```
    #[doc(alias = "ibv_qp_attr_mask")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: the target state (`qp_state`).
        const STATE = m::IBV_QP_STATE.0;
        /// `IBV_QP_CUR_STATE`: the assumed current state (`cur_qp_state`).
        const CUR_STATE = m::IBV_QP_CUR_STATE.0;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: ask for an event when SQD draining ends (`en_sqd_async_notify`).
        const EN_SQD_ASYNC_NOTIFY = m::IBV_QP_EN_SQD_ASYNC_NOTIFY.0;
        /// `IBV_QP_ACCESS_FLAGS`: remote access rights (`qp_access_flags`).
        const ACCESS_FLAGS = m::IBV_QP_ACCESS_FLAGS.0;
        /// `IBV_QP_PKEY_INDEX`: the P_Key index (`pkey_index`).
        const PKEY_INDEX = m::IBV_QP_PKEY_INDEX.0;
        /// `IBV_QP_PORT`: the physical port (`port_num`).
        const PORT = m::IBV_QP_PORT.0;
        /// `IBV_QP_QKEY`: the Q_Key (`qkey`, UD).
        const QKEY = m::IBV_QP_QKEY.0;
        /// `IBV_QP_AV`: the primary address vector (`ah_attr`).
        const AV = m::IBV_QP_AV.0;
        /// `IBV_QP_PATH_MTU`: the path MTU (`path_mtu`).
        const PATH_MTU = m::IBV_QP_PATH_MTU.0;
        /// `IBV_QP_TIMEOUT`: the local ACK timeout (`timeout`).
        const TIMEOUT = m::IBV_QP_TIMEOUT.0;
        /// `IBV_QP_RETRY_CNT`: the transport retry count (`retry_cnt`).
        const RETRY_CNT = m::IBV_QP_RETRY_CNT.0;
        /// `IBV_QP_RNR_RETRY`: the RNR retry count (`rnr_retry`).
        const RNR_RETRY = m::IBV_QP_RNR_RETRY.0;
        /// `IBV_QP_RQ_PSN`: the receive queue PSN (`rq_psn`).
        const RQ_PSN = m::IBV_QP_RQ_PSN.0;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: outstanding RDMA reads/atomics as initiator (`max_rd_atomic`).
        const MAX_QP_RD_ATOMIC = m::IBV_QP_MAX_QP_RD_ATOMIC.0;
        /// `IBV_QP_ALT_PATH`: the alternate path (`alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`).
        const ALT_PATH = m::IBV_QP_ALT_PATH.0;
        /// `IBV_QP_MIN_RNR_TIMER`: the minimum RNR NAK timer (`min_rnr_timer`).
        const MIN_RNR_TIMER = m::IBV_QP_MIN_RNR_TIMER.0;
        /// `IBV_QP_SQ_PSN`: the send queue PSN (`sq_psn`).
        const SQ_PSN = m::IBV_QP_SQ_PSN.0;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: outstanding RDMA reads/atomics as target (`max_dest_rd_atomic`).
        const MAX_DEST_RD_ATOMIC = m::IBV_QP_MAX_DEST_RD_ATOMIC.0;
        /// `IBV_QP_PATH_MIG_STATE`: the path migration state (`path_mig_state`).
        const PATH_MIG_STATE = m::IBV_QP_PATH_MIG_STATE.0;
        /// `IBV_QP_CAP`: the queue sizes (`cap`).
        const CAP = m::IBV_QP_CAP.0;
        /// `IBV_QP_DEST_QPN`: the remote QP number (`dest_qp_num`).
        const DEST_QPN = m::IBV_QP_DEST_QPN.0;
        /// `IBV_QP_RATE_LIMIT`: the send rate limit (`rate_limit`, RAW_PACKET).
        const RATE_LIMIT = m::IBV_QP_RATE_LIMIT.0;
    }
}

impl QpAttrMask {
    /// The C name of each set flag, lowest bit first (`"IBV_QP_STATE"`, ...).
    pub fn c_names(self) -> impl Iterator<Item = &'static str> {
        self.iter_names().map(|(name, _)| {
            C_NAMES
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(name, |(_, c)| *c)
        })
    }

    /// The C mask (`int attr_mask`).
    pub fn to_c(self) -> std::ffi::c_int {
        self.bits() as std::ffi::c_int
    }
}

const C_NAMES: &[(&str, &str)] = &[
    ("STATE", "IBV_QP_STATE"),
    ("CUR_STATE", "IBV_QP_CUR_STATE"),
    ("EN_SQD_ASYNC_NOTIFY", "IBV_QP_EN_SQD_ASYNC_NOTIFY"),
    ("ACCESS_FLAGS", "IBV_QP_ACCESS_FLAGS"),
    ("PKEY_INDEX", "IBV_QP_PKEY_INDEX"),
    ("PORT", "IBV_QP_PORT"),
    ("QKEY", "IBV_QP_QKEY"),
    ("AV", "IBV_QP_AV"),
    ("PATH_MTU", "IBV_QP_PATH_MTU"),
    ("TIMEOUT", "IBV_QP_TIMEOUT"),
    ("RETRY_CNT", "IBV_QP_RETRY_CNT"),
    ("RNR_RETRY", "IBV_QP_RNR_RETRY"),
    ("RQ_PSN", "IBV_QP_RQ_PSN"),
    ("MAX_QP_RD_ATOMIC", "IBV_QP_MAX_QP_RD_ATOMIC"),
    ("ALT_PATH", "IBV_QP_ALT_PATH"),
    ("MIN_RNR_TIMER", "IBV_QP_MIN_RNR_TIMER"),
    ("SQ_PSN", "IBV_QP_SQ_PSN"),
    ("MAX_DEST_RD_ATOMIC", "IBV_QP_MAX_DEST_RD_ATOMIC"),
    ("PATH_MIG_STATE", "IBV_QP_PATH_MIG_STATE"),
    ("CAP", "IBV_QP_CAP"),
    ("DEST_QPN", "IBV_QP_DEST_QPN"),
    ("RATE_LIMIT", "IBV_QP_RATE_LIMIT"),
];

impl fmt::Display for QpAttrMask {
    /// The C names joined by `" | "`; `0` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("0");
        }
        for (i, name) in self.c_names().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag of the man page, paired with the C constant bindgen read
    /// from the installed verbs.h.
    const ALL: &[(QpAttrMask, m)] = &[
        (QpAttrMask::STATE, m::IBV_QP_STATE),
        (QpAttrMask::CUR_STATE, m::IBV_QP_CUR_STATE),
        (
            QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            m::IBV_QP_EN_SQD_ASYNC_NOTIFY,
        ),
        (QpAttrMask::ACCESS_FLAGS, m::IBV_QP_ACCESS_FLAGS),
        (QpAttrMask::PKEY_INDEX, m::IBV_QP_PKEY_INDEX),
        (QpAttrMask::PORT, m::IBV_QP_PORT),
        (QpAttrMask::QKEY, m::IBV_QP_QKEY),
        (QpAttrMask::AV, m::IBV_QP_AV),
        (QpAttrMask::PATH_MTU, m::IBV_QP_PATH_MTU),
        (QpAttrMask::TIMEOUT, m::IBV_QP_TIMEOUT),
        (QpAttrMask::RETRY_CNT, m::IBV_QP_RETRY_CNT),
        (QpAttrMask::RNR_RETRY, m::IBV_QP_RNR_RETRY),
        (QpAttrMask::RQ_PSN, m::IBV_QP_RQ_PSN),
        (QpAttrMask::MAX_QP_RD_ATOMIC, m::IBV_QP_MAX_QP_RD_ATOMIC),
        (QpAttrMask::ALT_PATH, m::IBV_QP_ALT_PATH),
        (QpAttrMask::MIN_RNR_TIMER, m::IBV_QP_MIN_RNR_TIMER),
        (QpAttrMask::SQ_PSN, m::IBV_QP_SQ_PSN),
        (QpAttrMask::MAX_DEST_RD_ATOMIC, m::IBV_QP_MAX_DEST_RD_ATOMIC),
        (QpAttrMask::PATH_MIG_STATE, m::IBV_QP_PATH_MIG_STATE),
        (QpAttrMask::CAP, m::IBV_QP_CAP),
        (QpAttrMask::DEST_QPN, m::IBV_QP_DEST_QPN),
        (QpAttrMask::RATE_LIMIT, m::IBV_QP_RATE_LIMIT),
    ];

    #[test]
    fn all_22_flags_round_trip_with_the_c_mask() {
        assert_eq!(ALL.len(), 22);
        assert_eq!(QpAttrMask::all().iter().count(), 22);
        let mut union = 0;
        for &(flag, c) in ALL {
            assert_eq!(flag.bits(), c.0, "{flag:?}");
            assert_eq!(QpAttrMask::from_bits(c.0), Some(flag));
            assert_eq!(flag.to_c(), c.0 as std::ffi::c_int);
            assert_eq!(flag.c_names().collect::<Vec<_>>().len(), 1);
            assert_eq!(union & c.0, 0, "{flag:?} overlaps another flag");
            union |= c.0;
        }
        assert_eq!(QpAttrMask::from_bits(union), Some(QpAttrMask::all()));
        // Bits 21-24 are unused by libibverbs: not accepted as known flags.
        assert_eq!(QpAttrMask::from_bits(1 << 21), None);
    }

    #[test]
    fn display_uses_c_names() {
        assert_eq!(QpAttrMask::empty().to_string(), "0");
        let two = QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        assert_eq!(
            two.to_string(),
            "IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_DEST_RD_ATOMIC"
        );
        assert_eq!(QpAttrMask::RATE_LIMIT.to_string(), "IBV_QP_RATE_LIMIT");
    }
}

//! The kernel's QP state transition table: which attributes each transition
//! requires and allows, per QP type.
//!
//! Transcribed from Linux `drivers/infiniband/core/verbs.c` (`qp_state_table`,
//! checked by `ib_modify_qp_is_ok`), which rxe applies to every modify and
//! hardware drivers mirror. `IBV_QP_STATE` is always allowed and is not
//! listed; `IBV_QP_CAP` appears in no entry.

use super::mask::QpAttrMask as M;
use super::{QpState, QpType};

/// What one transition requires and allows for one QP type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransitionRule {
    /// Attributes the modify must carry.
    pub required: M,
    /// Attributes it may carry besides the required ones and `IBV_QP_STATE`.
    pub optional: M,
}

const fn rule(required: M, optional: M) -> Option<TransitionRule> {
    Some(TransitionRule { required, optional })
}

const NONE: M = M::empty();

/// What RC/UC-style transitions into RTS may change about the path.
const PATH_OPTS: M = M::CUR_STATE
    .union(M::ALT_PATH)
    .union(M::ACCESS_FLAGS)
    .union(M::PATH_MIG_STATE);

/// The rule for moving a QP of type `qp_type` from `from` to `to`, or `None`
/// when the kernel does not allow that transition at all. Attribute-only
/// modifies (no `IBV_QP_STATE`) are the transition from a state to itself.
///
/// Only the types user space can create are covered (RC, UC, UD,
/// RAW_PACKET, XRC send and receive); `Driver` QPs have no kernel table.
///
/// ```
/// use rdma_verbs::qp::{transition_rule, QpAttrMask as M, QpState, QpType};
/// let r = transition_rule(QpType::Ud, QpState::Reset, QpState::Init).unwrap();
/// assert_eq!(r.required, M::PKEY_INDEX | M::PORT | M::QKEY);
/// assert!(transition_rule(QpType::Rc, QpState::Reset, QpState::Rts).is_none());
/// ```
pub fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    use QpState::*;
    use QpType::*;
    let t = qp_type;
    if matches!(t, Driver) {
        return None;
    }
    let connected_ini = matches!(t, Uc | Rc | XrcSend | XrcRecv);
    match (from, to) {
        (Reset, Reset) => rule(NONE, NONE),
        (Init | Rtr | Rts | Sqd | Sqe | Err, Reset | Err) => rule(NONE, NONE),
        (Reset, Init) => match t {
            Ud => rule(M::PKEY_INDEX.union(M::PORT).union(M::QKEY), NONE),
            RawPacket => rule(M::PORT, NONE),
            _ if connected_ini => rule(M::PKEY_INDEX.union(M::PORT).union(M::ACCESS_FLAGS), NONE),
            _ => None,
        },
        (Init, Init) => match t {
            Ud => rule(NONE, M::PKEY_INDEX.union(M::PORT).union(M::QKEY)),
            RawPacket => rule(NONE, NONE),
            _ => rule(NONE, M::PKEY_INDEX.union(M::PORT).union(M::ACCESS_FLAGS)),
        },
        (Init, Rtr) => {
            let path = M::AV.union(M::PATH_MTU).union(M::DEST_QPN).union(M::RQ_PSN);
            let opt = M::ALT_PATH.union(M::ACCESS_FLAGS).union(M::PKEY_INDEX);
            let resp = M::MAX_DEST_RD_ATOMIC.union(M::MIN_RNR_TIMER);
            match t {
                Ud => rule(NONE, M::PKEY_INDEX.union(M::QKEY)),
                RawPacket => rule(NONE, NONE),
                Uc | XrcSend => rule(path, opt),
                _ => rule(path.union(resp), opt),
            }
        }
        (Rtr, Rts) => {
            let rc_req = M::TIMEOUT
                .union(M::RETRY_CNT)
                .union(M::RNR_RETRY)
                .union(M::SQ_PSN)
                .union(M::MAX_QP_RD_ATOMIC);
            match t {
                Ud => rule(M::SQ_PSN, M::CUR_STATE.union(M::QKEY)),
                Uc => rule(M::SQ_PSN, PATH_OPTS),
                Rc => rule(rc_req, PATH_OPTS.union(M::MIN_RNR_TIMER)),
                XrcSend => rule(rc_req, PATH_OPTS),
                XrcRecv => rule(
                    M::TIMEOUT.union(M::SQ_PSN),
                    PATH_OPTS.union(M::MIN_RNR_TIMER),
                ),
                _ => rule(NONE, M::RATE_LIMIT), // RawPacket
            }
        }
        (Rts | Sqd, Rts) => match t {
            Ud => rule(NONE, M::CUR_STATE.union(M::QKEY)),
            Uc | XrcSend => rule(NONE, PATH_OPTS),
            Rc | XrcRecv => rule(NONE, PATH_OPTS.union(M::MIN_RNR_TIMER)),
            _ if from == Rts => rule(NONE, M::RATE_LIMIT), // RawPacket RTS->RTS
            _ => rule(NONE, NONE),                         // RawPacket SQD->RTS
        },
        (Rts, Sqd) => match t {
            RawPacket => rule(NONE, NONE),
            _ => rule(NONE, M::EN_SQD_ASYNC_NOTIFY),
        },
        (Sqd, Sqd) => {
            let common = M::AV
                .union(M::ALT_PATH)
                .union(M::ACCESS_FLAGS)
                .union(M::PKEY_INDEX)
                .union(M::PATH_MIG_STATE);
            let rc_like = common.union(M::PORT).union(M::TIMEOUT);
            match t {
                Ud => rule(NONE, M::PKEY_INDEX.union(M::QKEY)),
                Uc => rule(NONE, common),
                Rc => rule(
                    NONE,
                    rc_like
                        .union(M::RETRY_CNT)
                        .union(M::RNR_RETRY)
                        .union(M::MAX_QP_RD_ATOMIC)
                        .union(M::MAX_DEST_RD_ATOMIC)
                        .union(M::MIN_RNR_TIMER),
                ),
                XrcSend => rule(
                    NONE,
                    rc_like
                        .union(M::RETRY_CNT)
                        .union(M::RNR_RETRY)
                        .union(M::MAX_QP_RD_ATOMIC),
                ),
                XrcRecv => rule(
                    NONE,
                    rc_like.union(M::MAX_DEST_RD_ATOMIC).union(M::MIN_RNR_TIMER),
                ),
                _ => rule(NONE, NONE), // RawPacket
            }
        }
        (Sqe, Rts) => match t {
            Ud => rule(NONE, M::CUR_STATE.union(M::QKEY)),
            Uc => rule(NONE, M::CUR_STATE.union(M::ACCESS_FLAGS)),
            _ => rule(NONE, NONE),
        },
        _ => None,
    }
}

//! The table part of the checks: the transition, the attribute mask,
//! `IBV_QP_CUR_STATE` and attribute-only modifies, per the kernel's table.

use super::ModifyError;
use crate::qp::attr::QpAttr;
use crate::qp::mask::QpAttrMask as M;
use crate::qp::table::transition_rule;
use crate::qp::{QpState, QpType};

/// Checks a modify of a `qp_type` QP in state `from` against the kernel's
/// transition table alone (no device needed) and returns the target state.
///
/// This is the table part of [`QueuePair::modify`](crate::qp::QueuePair::modify):
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
    check_cur_state(from, attr)?;
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

/// `IBV_QP_CUR_STATE`, when given, must name `from` (the known state).
#[inline]
pub(super) fn check_cur_state(from: QpState, attr: &QpAttr) -> Result<(), ModifyError> {
    match attr.get_cur_state() {
        Some(given) if given != from => Err(ModifyError::CurStateMismatch { known: from, given }),
        _ => Ok(()),
    }
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

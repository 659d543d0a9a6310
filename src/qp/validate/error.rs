//! Why a modify is refused: [`ModifyError`] and its messages.

use std::fmt;

use crate::qp::mask::QpAttrMask as M;
use crate::qp::{QpState, QpType};

/// Why [`QueuePair::modify`](crate::qp::QueuePair::modify) refused a modify
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
    /// to be in (call [`QueuePair::resync`](crate::qp::QueuePair::resync) if the
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
    /// drain ([`QueuePair::wait_sq_drained`](crate::qp::QueuePair::wait_sq_drained)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

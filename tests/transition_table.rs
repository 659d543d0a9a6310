//! The validator's table against the kernel's, for every QP type and every
//! (from, to) pair.
//!
//! The expectation below is a second, independent transcription of
//! `qp_state_table` in Linux `drivers/infiniband/core/verbs.c` (the table
//! `ib_modify_qp_is_ok` checks, and rxe applies), written as data rather than
//! code so that a slip in one is caught by the other. Device tests
//! (`tests/device/modify.rs`, `modify_values.rs`) check the same rules against the real kernel.

use rdma_verbs::qp::{transition_rule, QpAttrMask, QpState, QpType};

/// `FROM TO TYPES : REQUIRED | OPTIONAL`; `*` is every type; `-` is nothing.
/// A (from, to) pair that is absent is invalid. The kernel marks a
/// transition valid for all types at once and leaves the masks of the types
/// it does not list empty: a `*` row says so, and the rows after it give the
/// listed types' masks.
const KERNEL_TABLE: &str = "
RESET RESET *       : - | -
RESET INIT  *       : - | -
RESET INIT  UD      : PKEY_INDEX PORT QKEY | -
RESET INIT  RAW_PACKET : PORT | -
RESET INIT  UC RC XRC_INI XRC_TGT : PKEY_INDEX PORT ACCESS_FLAGS | -

INIT RESET  *       : - | -
INIT ERR    *       : - | -
INIT INIT   *       : - | -
INIT INIT   UD      : - | PKEY_INDEX PORT QKEY
INIT INIT   UC RC XRC_INI XRC_TGT : - | PKEY_INDEX PORT ACCESS_FLAGS
INIT RTR    *       : - | -
INIT RTR    UC XRC_INI : AV PATH_MTU DEST_QPN RQ_PSN | ALT_PATH ACCESS_FLAGS PKEY_INDEX
INIT RTR    RC XRC_TGT : AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER | ALT_PATH ACCESS_FLAGS PKEY_INDEX
INIT RTR    UD      : - | PKEY_INDEX QKEY

RTR RESET   *       : - | -
RTR ERR     *       : - | -
RTR RTS     *       : - | -
RTR RTS     UD      : SQ_PSN | CUR_STATE QKEY
RTR RTS     UC      : SQ_PSN | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
RTR RTS     XRC_INI : TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
RTR RTS     RC      : TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
RTR RTS     XRC_TGT : TIMEOUT SQ_PSN | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
RTR RTS     RAW_PACKET : - | RATE_LIMIT

RTS RESET   *       : - | -
RTS ERR     *       : - | -
RTS RTS     *       : - | -
RTS RTS     UD      : - | CUR_STATE QKEY
RTS RTS     UC XRC_INI : - | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE
RTS RTS     RC XRC_TGT : - | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER
RTS RTS     RAW_PACKET : - | RATE_LIMIT
RTS SQD     *       : - | -
RTS SQD     UD UC RC XRC_INI XRC_TGT : - | EN_SQD_ASYNC_NOTIFY

SQD RESET   *       : - | -
SQD ERR     *       : - | -
SQD RTS     *       : - | -
SQD RTS     UD      : - | CUR_STATE QKEY
SQD RTS     UC XRC_INI : - | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
SQD RTS     RC XRC_TGT : - | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
SQD SQD     *       : - | -
SQD SQD     UD      : - | PKEY_INDEX QKEY
SQD SQD     UC      : - | AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
SQD SQD     RC      : - | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE
SQD SQD     XRC_INI : - | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
SQD SQD     XRC_TGT : - | PORT AV TIMEOUT MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE

SQE RESET   *       : - | -
SQE ERR     *       : - | -
SQE RTS     *       : - | -
SQE RTS     UD      : - | CUR_STATE QKEY
SQE RTS     UC      : - | CUR_STATE ACCESS_FLAGS

ERR RESET   *       : - | -
ERR ERR     *       : - | -
";

const TYPES: &[(&str, QpType)] = &[
    ("RC", QpType::Rc),
    ("UC", QpType::Uc),
    ("UD", QpType::Ud),
    ("RAW_PACKET", QpType::RawPacket),
    ("XRC_INI", QpType::XrcSend),
    ("XRC_TGT", QpType::XrcRecv),
];

const STATES: &[(&str, QpState)] = &[
    ("RESET", QpState::Reset),
    ("INIT", QpState::Init),
    ("RTR", QpState::Rtr),
    ("RTS", QpState::Rts),
    ("SQD", QpState::Sqd),
    ("SQE", QpState::Sqe),
    ("ERR", QpState::Err),
];

fn mask(words: &str) -> QpAttrMask {
    words
        .split_whitespace()
        .filter(|w| *w != "-")
        .map(|w| QpAttrMask::from_name(w).unwrap_or_else(|| panic!("unknown flag {w}")))
        .fold(QpAttrMask::empty(), |a, b| a | b)
}

/// (from, to, type) -> (required, optional), later rows overriding `*` rows.
fn expected() -> Vec<(QpState, QpState, QpType, QpAttrMask, QpAttrMask)> {
    let mut out: Vec<(QpState, QpState, QpType, QpAttrMask, QpAttrMask)> = Vec::new();
    for line in KERNEL_TABLE
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        let (head, masks) = line.split_once(':').expect("a colon");
        let (req, opt) = masks.split_once('|').expect("a bar");
        let mut words = head.split_whitespace();
        let state = |w: &str| STATES.iter().find(|(n, _)| *n == w).expect("a state").1;
        let from = state(words.next().unwrap());
        let to = state(words.next().unwrap());
        let types: Vec<QpType> = words
            .flat_map(|w| {
                if w == "*" {
                    TYPES.iter().map(|t| t.1).collect::<Vec<_>>()
                } else {
                    vec![TYPES.iter().find(|(n, _)| *n == w).expect("a type").1]
                }
            })
            .collect();
        for t in types {
            out.retain(|e| !(e.0 == from && e.1 == to && e.2 == t));
            out.push((from, to, t, mask(req), mask(opt)));
        }
    }
    out
}

#[test]
fn validator_table_equals_the_kernel_table() {
    let expected = expected();
    let mut checked = 0;
    for &(_, from) in STATES {
        for &(_, to) in STATES {
            for &(tname, t) in TYPES {
                let want = expected
                    .iter()
                    .find(|e| e.0 == from && e.1 == to && e.2 == t)
                    .map(|e| (e.3, e.4));
                let got = transition_rule(t, from, to).map(|r| (r.required, r.optional));
                assert_eq!(got, want, "{tname} {from:?}->{to:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 7 * 7 * 6);
    // A quick count, so that an empty transcription cannot pass.
    assert_eq!(
        expected.iter().filter(|e| e.2 == QpType::Rc).count(),
        22,
        "RC has 22 valid transitions"
    );
}

#[test]
fn state_is_never_listed_and_cap_is_in_no_entry() {
    for &(_, from) in STATES {
        for &(_, to) in STATES {
            for &(_, t) in TYPES {
                if let Some(r) = transition_rule(t, from, to) {
                    assert!(!(r.required | r.optional).contains(QpAttrMask::STATE));
                    assert!(!(r.required | r.optional).contains(QpAttrMask::CAP));
                    assert!((r.required & r.optional).is_empty());
                }
            }
        }
    }
}

#[test]
fn driver_qps_have_no_table() {
    assert!(transition_rule(QpType::Driver, QpState::Reset, QpState::Init).is_none());
}

// ---------------------------------------------------------------------------
// Property tests (proptest, with shrinking): `check_transition` on random
// QP types, states and attribute masks against the table above.
// ---------------------------------------------------------------------------

mod properties {
    use super::*;
    use proptest::prelude::*;
    use rdma_verbs::qp::{
        check_transition, AckTimeout, AddressVector, AltPath, MinRnrTimer, ModifyError,
        PathMigState, Psn, QKey, QpAttr, QpNum, RateLimit, RetryCount, RnrRetry,
    };
    use rdma_verbs::{AccessFlags, Mtu, QpCaps};
    use std::sync::OnceLock;

    /// One row of the kernel table: (from, to, type, required, optional).
    type Row = (QpState, QpState, QpType, QpAttrMask, QpAttrMask);

    /// The kernel table, read once.
    fn table() -> &'static [Row] {
        static T: OnceLock<Vec<Row>> = OnceLock::new();
        T.get_or_init(expected)
    }

    /// (required, optional) of the kernel table, `None`: no such
    /// transition (every pair of a `Driver` QP, or with `Unknown`).
    fn kernel_rule(t: QpType, from: QpState, to: QpState) -> Option<(QpAttrMask, QpAttrMask)> {
        table()
            .iter()
            .find(|e| e.0 == from && e.1 == to && e.2 == t)
            .map(|e| (e.3, e.4))
    }

    /// A `QpAttr` carrying exactly `mask`, through the public setters;
    /// `cur` is the value of `IBV_QP_CUR_STATE` if the mask has it.
    fn attr_with(mask: QpAttrMask, to: QpState, cur: QpState) -> QpAttr {
        let mut a = QpAttr::new();
        for (_, flag) in mask.iter_names() {
            a = match flag {
                QpAttrMask::STATE => a.state(to),
                QpAttrMask::CUR_STATE => a.cur_state(cur),
                QpAttrMask::EN_SQD_ASYNC_NOTIFY => a.en_sqd_async_notify(true),
                QpAttrMask::ACCESS_FLAGS => a.access_flags(AccessFlags::REMOTE_WRITE),
                QpAttrMask::PKEY_INDEX => a.pkey_index(0),
                QpAttrMask::PORT => a.port(1),
                QpAttrMask::QKEY => a.qkey(QKey(0x11)),
                QpAttrMask::AV => a.av(AddressVector::new(1)),
                QpAttrMask::PATH_MTU => a.path_mtu(Mtu::Mtu1024),
                QpAttrMask::TIMEOUT => a.timeout(AckTimeout::new(14).unwrap()),
                QpAttrMask::RETRY_CNT => a.retry_cnt(RetryCount::new(7).unwrap()),
                QpAttrMask::RNR_RETRY => a.rnr_retry(RnrRetry::INFINITE),
                QpAttrMask::RQ_PSN => a.rq_psn(Psn::new(1).unwrap()),
                QpAttrMask::MAX_QP_RD_ATOMIC => a.max_rd_atomic(1),
                QpAttrMask::ALT_PATH => a.alt_path(AltPath {
                    av: AddressVector::new(1),
                    pkey_index: 0,
                    port: 1,
                    timeout: AckTimeout::new(14).unwrap(),
                }),
                QpAttrMask::MIN_RNR_TIMER => a.min_rnr_timer(MinRnrTimer::new(12).unwrap()),
                QpAttrMask::SQ_PSN => a.sq_psn(Psn::new(1).unwrap()),
                QpAttrMask::MAX_DEST_RD_ATOMIC => a.max_dest_rd_atomic(1),
                QpAttrMask::PATH_MIG_STATE => a.path_mig_state(PathMigState::Armed),
                QpAttrMask::CAP => a.cap(QpCaps::default()),
                QpAttrMask::DEST_QPN => a.dest_qpn(QpNum::new(0x12).unwrap()),
                QpAttrMask::RATE_LIMIT => a.rate_limit(RateLimit(10)),
                other => panic!("no setter for {other}"),
            };
        }
        assert_eq!(a.mask(), mask, "the setters set other bits");
        a
    }

    /// The verdict `check_transition` must give, from the kernel table
    /// and the documented extra rules (CUR_STATE must name the known state;
    /// no state is Unknown; an attribute-only modify is `from -> from`;
    /// AV outside INIT->RTR brings PORT with it).
    fn model(
        t: QpType,
        from: QpState,
        mask: QpAttrMask,
        to: QpState,
        cur: QpState,
    ) -> Result<QpState, ModifyError> {
        if mask.contains(QpAttrMask::CUR_STATE) && cur != from {
            return Err(ModifyError::CurStateMismatch {
                known: from,
                given: cur,
            });
        }
        let state_given = mask.contains(QpAttrMask::STATE);
        let to = if state_given { to } else { from };
        let illegal = ModifyError::IllegalTransition {
            qp_type: t,
            from,
            to,
        };
        if from == QpState::Unknown || to == QpState::Unknown {
            return Err(illegal);
        }
        let rule = kernel_rule(t, from, to);
        let av_port = |m: QpAttrMask, init_rtr: bool| {
            if m.contains(QpAttrMask::AV) && !init_rtr {
                m | QpAttrMask::PORT
            } else {
                m
            }
        };
        if !state_given {
            let Some((req, opt)) = rule else {
                return Err(ModifyError::AttributeOnly {
                    qp_type: t,
                    state: from,
                    forbidden: mask,
                    allowed: None,
                });
            };
            let forbidden = av_port(mask, false) - req - opt;
            return if forbidden.is_empty() {
                Ok(from)
            } else {
                Err(ModifyError::AttributeOnly {
                    qp_type: t,
                    state: from,
                    forbidden,
                    allowed: Some(req | opt),
                })
            };
        }
        let (req, opt) = rule.ok_or(illegal)?;
        let init_rtr = from == QpState::Init && to == QpState::Rtr;
        let given = mask - QpAttrMask::STATE;
        let eff = av_port(given, init_rtr);
        // required ⊆ mask ⊆ required ∪ optional ∪ STATE
        let missing = req - eff;
        let forbidden = eff - req - opt;
        if missing.is_empty() && forbidden.is_empty() {
            return Ok(to);
        }
        Err(ModifyError::Attributes {
            qp_type: t,
            from,
            to,
            missing,
            forbidden,
            port_implied_by_av: eff != given && forbidden.contains(QpAttrMask::PORT),
        })
    }

    fn flags() -> Vec<QpAttrMask> {
        QpAttrMask::all().iter().collect()
    }

    /// A mask as a set of bits, each chosen with probability `p`; shrinks
    /// by dropping bits.
    fn bits(p: f64) -> impl Strategy<Value = QpAttrMask> {
        proptest::collection::vec(proptest::bool::weighted(p), flags().len()).prop_map(|v| {
            flags()
                .into_iter()
                .zip(v)
                .filter(|(_, on)| *on)
                .fold(QpAttrMask::empty(), |m, (f, _)| m | f)
        })
    }

    fn qp_type() -> impl Strategy<Value = QpType> {
        proptest::sample::select(QpType::ALL.to_vec())
    }

    fn state() -> impl Strategy<Value = QpState> {
        proptest::sample::select(QpState::ALL.to_vec())
    }

    /// A modify near a legal one, so that both verdicts come up often:
    /// each required bit of the (type, from, to) rule kept with
    /// probability 0.9, each optional bit with 0.5, and every other bit
    /// with 0.05; STATE with 0.9, CUR_STATE naming `from` with 0.8.
    fn near_legal() -> impl Strategy<Value = (QpType, QpState, QpState, QpAttrMask, QpState)> {
        (
            qp_type(),
            state(),
            state(),
            bits(0.9),
            bits(0.5),
            bits(0.05),
            proptest::bool::weighted(0.9),
            proptest::option::weighted(0.2, state()),
        )
            .prop_map(
                |(t, from, to, keep_req, keep_opt, noise, state_given, cur)| {
                    let (req, opt) = kernel_rule(t, from, if state_given { to } else { from })
                        .unwrap_or_default();
                    let mut mask = (req & keep_req) | (opt & keep_opt) | noise;
                    mask.set(QpAttrMask::STATE, state_given);
                    (t, from, to, mask, cur.unwrap_or(from))
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// For every QP type, state pair and mask, `check_transition` gives
        /// the model's verdict, error included.
        #[test]
        fn check_transition_follows_the_kernel_table(
            (t, from, to, mask, cur) in near_legal()
        ) {
            let attr = attr_with(mask, to, cur);
            prop_assert_eq!(
                check_transition(t, from, &attr),
                model(t, from, mask, to, cur),
                "{:?} {:?}->{:?} mask {}", t, from, to, mask
            );
        }

        /// Any mask at all (each bit with probability one half).
        #[test]
        fn check_transition_on_arbitrary_masks(
            t in qp_type(), from in state(), to in state(), mask in bits(0.5), cur in state()
        ) {
            let attr = attr_with(mask, to, cur);
            prop_assert_eq!(
                check_transition(t, from, &attr),
                model(t, from, mask, to, cur),
                "{:?} {:?}->{:?} mask {}", t, from, to, mask
            );
        }

        /// A legal modify stays legal when an optional attribute is added,
        /// and becomes illegal when a required one is dropped.
        #[test]
        fn optional_bits_are_optional_and_required_bits_required(
            t in qp_type(), from in state(), to in state(),
            opt_subset in bits(0.5), drop in 0usize..32
        ) {
            let Some((req, opt)) = kernel_rule(t, from, to) else {
                return Ok(());
            };
            let init_rtr = from == QpState::Init && to == QpState::Rtr;
            // AV outside INIT->RTR needs PORT to be allowed as well.
            let mut extra = opt & opt_subset;
            if !init_rtr && !(req | opt).contains(QpAttrMask::PORT) {
                extra -= QpAttrMask::AV;
            }
            let ok = QpAttrMask::STATE | req | extra;
            prop_assert_eq!(check_transition(t, from, &attr_with(ok, to, from)), Ok(to));
            let reqs: Vec<QpAttrMask> = req.iter().collect();
            if !reqs.is_empty() {
                let gone = reqs[drop % reqs.len()];
                let e = check_transition(t, from, &attr_with(ok - gone, to, from));
                let missing_named = matches!(
                    &e,
                    Err(ModifyError::Attributes { missing, .. }) if missing.contains(gone)
                );
                prop_assert!(missing_named, "dropping {} gave {:?}", gone, e);
            }
        }
    }
}

//! The validator's table against the kernel's, for every QP type and every
//! (from, to) pair.
//!
//! The expectation below is a second, independent transcription of
//! `qp_state_table` in Linux `drivers/infiniband/core/verbs.c` (the table
//! `ib_modify_qp_is_ok` checks, and rxe applies), written as data rather than
//! code so that a slip in one is caught by the other. Device tests
//! (`tests/device/modify.rs`) check the same rules against the real kernel.

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

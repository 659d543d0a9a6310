//! Property tests of [`Ledger`] with shrinking: proptest generates a
//! sequence of operations on five queues (two send queues, two receive
//! queues, an SRQ, of random small capacities), runs it against both the
//! ledgers and a plain model (per queue, the outstanding requests in post
//! order), and on a failure shrinks the sequence to a short one that still
//! fails.
//!
//! What is checked, after and during every operation:
//!
//! * every tag `insert` gives is nonzero, carries the ledger's kind and was
//!   never given before, by any ledger of the process (the model keeps all
//!   of them), except a tag of an undone request (one that never reached a
//!   device), which the ledger may issue again;
//! * `insert` refuses exactly when the model is at capacity, and gives the
//!   payload back;
//! * a completion is accepted only with a tag this very ledger issued and
//!   has outstanding (not another queue's, not one of a previous ledger of
//!   the same queue, not one with other kind bits, not a random number),
//!   and only once: afterwards the same tag ends nothing;
//! * a send queue's completion hands back every earlier request too, oldest
//!   first, only the named one marked `own`; a receive or SRQ completion
//!   hands back just its request;
//! * `undo_last` on a send queue takes back only the newest outstanding
//!   request; on a receive queue or SRQ any outstanding one (as the code
//!   does; its callers always undo newest first);
//! * `drain` hands back everything outstanding, oldest first, none `own`;
//! * every request comes back with its own `wr_id` and payload, exactly
//!   once (payloads are tokens that cannot be copied), and `len`, `room`
//!   and `holds` agree with the model after every step;
//! * a queue crossing from one stamp block to the next (forced by moving
//!   its next stamp near the block's end) changes none of the above.
//!
//! The runner repeats until at least `RDMA_VERBS_LEDGER_STEPS` (default
//! 200 000, the step count of the older randomized test) operations have
//! run in passing cases.

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

use super::any::AnyLedger as Ledger;
use super::*;

/// The kinds of the five queues; their capacities are generated.
const KINDS: [Kind; 5] = [Kind::Send, Kind::Send, Kind::Recv, Kind::Recv, Kind::Srq];

/// Which tag an operation names.
#[derive(Debug, Clone)]
enum Pick {
    /// The newest outstanding request of the queue.
    Last,
    /// The `i`-th outstanding request (modulo how many there are).
    Outstanding(usize),
    /// A tag of this queue that already ended (completed, undone,
    /// drained, or of a previous ledger of the queue).
    Ended(usize),
    /// A tag another queue issued (outstanding there or not).
    Foreign(usize),
    /// An outstanding tag of this queue with other kind bits.
    Forged(usize, u8),
    /// Any number.
    Raw(u64),
}

#[derive(Debug, Clone)]
enum Op {
    /// Post `n` requests one after the other (some may not fit).
    Post { q: usize, n: usize },
    /// A completion naming `pick` is reclaimed on queue `q` (`quiet`:
    /// through `complete_quiet`, which may skip inert payloads).
    Complete { q: usize, pick: Pick, quiet: bool },
    /// `undo_last(pick)` on queue `q`.
    Undo { q: usize, pick: Pick },
    /// The queue is reset: everything comes back.
    Drain { q: usize },
    /// The queue is destroyed (drained) and a new one of the same kind
    /// and capacity takes its place.
    Recreate { q: usize },
    /// The queue's next stamp moves to `left` stamps before the end of its
    /// block, so that the next inserts take a fresh block.
    NearBlockEnd { q: usize, left: u64 },
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        3 => Just(Pick::Last),
        6 => any::<usize>().prop_map(Pick::Outstanding),
        3 => any::<usize>().prop_map(Pick::Ended),
        2 => any::<usize>().prop_map(Pick::Foreign),
        1 => (any::<usize>(), 0u8..3).prop_map(|(i, k)| Pick::Forged(i, k)),
        1 => any::<u64>().prop_map(Pick::Raw),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let q = 0..KINDS.len();
    prop_oneof![
        30 => (q.clone(), 0usize..=4).prop_map(|(q, n)| Op::Post { q, n }),
        40 => (q.clone(), pick(), any::<bool>())
            .prop_map(|(q, pick, quiet)| Op::Complete { q, pick, quiet }),
        10 => (q.clone(), pick()).prop_map(|(q, pick)| Op::Undo { q, pick }),
        3 => q.clone().prop_map(|q| Op::Drain { q }),
        2 => q.clone().prop_map(|q| Op::Recreate { q }),
        2 => (q, 0u64..4).prop_map(|(q, left)| Op::NearBlockEnd { q, left }),
    ]
}

/// A case: the capacities of the five queues and the operations.
fn case() -> impl Strategy<Value = (Vec<usize>, Vec<Op>)> {
    (
        proptest::collection::vec(1usize..=8, KINDS.len()),
        proptest::collection::vec(op(), 1..=200),
    )
}

/// A lent chunk: made once, cannot be copied, must come back exactly once.
#[derive(Debug, PartialEq, Eq)]
struct Token(u64);

impl Payload for Token {
    /// Three tokens in four are inert: a quiet completion may skip them
    /// (never the others).
    fn inert(&self) -> bool {
        self.0 % 4 != 0
    }
}

/// The caller's `wr_id` of the request that lent token `t` (not `t`
/// itself, so that a mixed-up `wr_id` and payload shows).
fn wr_id_of(t: u64) -> u64 {
    t ^ 0x5a5a_0000
}

/// The model of one queue.
struct QModel {
    kind: Kind,
    cap: usize,
    /// (tag, token) of the outstanding requests, in post order.
    out: VecDeque<(u64, u64)>,
    /// Tags of this queue (any of its ledgers) that ended.
    ended: Vec<u64>,
}

/// What a ledger handed back: (wr_id, own, token).
type Back = Vec<(u64, bool, u64)>;

struct World {
    ledgers: Vec<Ledger<Token>>,
    model: Vec<QModel>,
    /// Every tag any ledger of this case issued, with its queue.
    issued: Vec<(u64, usize)>,
    issued_set: HashSet<u64>,
    next_token: u64,
}

impl World {
    fn new(caps: &[usize]) -> Self {
        World {
            ledgers: KINDS
                .iter()
                .zip(caps)
                .map(|(&k, &c)| Ledger::new(k, c))
                .collect(),
            model: KINDS
                .iter()
                .zip(caps)
                .map(|(&kind, &cap)| QModel {
                    kind,
                    cap,
                    out: VecDeque::new(),
                    ended: Vec::new(),
                })
                .collect(),
            issued: Vec::new(),
            issued_set: HashSet::new(),
            next_token: 0,
        }
    }

    /// The tag `pick` names on queue `q` (`None`: nothing to name; the
    /// operation is skipped).
    fn resolve(&self, q: usize, pick: &Pick) -> Option<u64> {
        let m = &self.model[q];
        let nth = |v: &[u64], i: usize| (!v.is_empty()).then(|| v[i % v.len()]);
        match *pick {
            Pick::Last => m.out.back().map(|e| e.0),
            Pick::Outstanding(i) => (!m.out.is_empty()).then(|| m.out[i % m.out.len()].0),
            Pick::Ended(i) => nth(&m.ended, i),
            Pick::Foreign(i) => {
                let other: Vec<u64> = self
                    .issued
                    .iter()
                    .filter(|(_, iq)| *iq != q)
                    .map(|e| e.0)
                    .collect();
                nth(&other, i)
            }
            Pick::Forged(i, k) => {
                let tag = m.out.get(i % m.out.len().max(1))?.0;
                let own = tag >> KIND_SHIFT;
                let kinds: Vec<u64> = (0..4).filter(|&b| b != own).collect();
                Some((tag & STAMP_MASK) | (kinds[k as usize % kinds.len()] << KIND_SHIFT))
            }
            Pick::Raw(t) => Some(t),
        }
    }

    /// Takes what came back in the model's terms, checking each request's
    /// `wr_id` against its token.
    fn collect(r: Released<Token>, back: &mut Back) {
        let Token(t) = r.payload;
        assert_eq!(
            r.wr_id,
            wr_id_of(t),
            "wr_id and payload of different requests"
        );
        back.push((r.wr_id, r.own, t));
    }

    fn end_in_model(&mut self, q: usize, taken: &[(u64, u64)], own: Option<u64>) -> Back {
        let m = &mut self.model[q];
        taken
            .iter()
            .map(|&(tag, t)| {
                m.ended.push(tag);
                (wr_id_of(t), Some(tag) == own, t)
            })
            .collect()
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Post { q, n } => {
                for _ in 0..n {
                    let t = self.next_token;
                    self.next_token += 1;
                    let full = self.model[q].out.len() >= self.model[q].cap;
                    match self.ledgers[q].insert(wr_id_of(t), Token(t)) {
                        Ok(tag) => {
                            prop_assert!(!full, "insert accepted past capacity");
                            prop_assert_ne!(tag, 0);
                            prop_assert_eq!(Kind::of(tag), Some(self.model[q].kind));
                            prop_assert!(
                                self.issued_set.insert(tag),
                                "tag {:#x} issued twice",
                                tag
                            );
                            self.issued.push((tag, q));
                            self.model[q].out.push_back((tag, t));
                        }
                        Err(Token(back)) => {
                            prop_assert!(full, "insert refused with room left");
                            prop_assert_eq!(back, t, "another payload came back");
                        }
                    }
                }
            }
            Op::Complete { q, ref pick, quiet } => {
                let Some(tag) = self.resolve(q, pick) else {
                    return Ok(());
                };
                let pos = self.model[q].out.iter().position(|e| e.0 == tag);
                prop_assert_eq!(self.ledgers[q].holds(tag), pos.is_some());
                let want = match pos {
                    None => Vec::new(),
                    Some(i) if self.model[q].kind == Kind::Send => {
                        let taken: Vec<_> = self.model[q].out.drain(..=i).collect();
                        self.end_in_model(q, &taken, Some(tag))
                    }
                    Some(i) => {
                        let e = self.model[q].out.remove(i).expect("in range");
                        self.end_in_model(q, &[e], Some(tag))
                    }
                };
                let mut got = Vec::new();
                let l = &mut self.ledgers[q];
                let n = if quiet {
                    l.complete_quiet(tag, |r| Self::collect(r, &mut got))
                } else {
                    l.complete(tag, |r| Self::collect(r, &mut got))
                };
                if quiet && got.is_empty() && n > 0 {
                    // Skipped: only when every request outstanding before
                    // was inert (those it ended and those left).
                    let inert = |t: u64| Token(t).inert();
                    prop_assert!(
                        want.iter().all(|e| inert(e.2))
                            && self.model[q].out.iter().all(|e| inert(e.1)),
                        "a quiet completion skipped a payload that is not inert"
                    );
                    QUIET_SKIPS.with(|c| c.set(c.get() + 1));
                } else {
                    prop_assert_eq!(n, got.len(), "count and callbacks differ");
                    prop_assert_eq!(&got, &want, "completion of {:#x} on queue {}", tag, q);
                }
                prop_assert_eq!(n, want.len(), "count of ended requests");
                // Accepted once only: the same completion again ends nothing.
                if n > 0 {
                    prop_assert_eq!(self.ledgers[q].complete(tag, |_| ()), 0);
                    prop_assert_eq!(self.ledgers[q].complete_quiet(tag, |_| ()), 0);
                }
            }
            Op::Undo { q, ref pick } => {
                let Some(tag) = self.resolve(q, pick) else {
                    return Ok(());
                };
                let m = &self.model[q];
                let pos = if m.kind == Kind::Send {
                    (m.out.back().map(|e| e.0) == Some(tag)).then(|| m.out.len() - 1)
                } else {
                    m.out.iter().position(|e| e.0 == tag)
                };
                let want = pos.map(|i| {
                    let (tag, t) = self.model[q].out.remove(i).expect("in range");
                    // An undone request never reached a device: its tag may
                    // be issued again (the ledger rewinds its stamps).
                    self.issued.retain(|e| e.0 != tag);
                    self.issued_set.remove(&tag);
                    t
                });
                let got = self.ledgers[q].undo_last(tag).map(|Token(t)| t);
                prop_assert_eq!(got, want, "undo_last({:#x}) on queue {}", tag, q);
            }
            Op::Drain { q } => {
                let taken: Vec<_> = self.model[q].out.drain(..).collect();
                let want = self.end_in_model(q, &taken, None);
                let mut got = Vec::new();
                let n = self.ledgers[q].drain(|r| Self::collect(r, &mut got));
                prop_assert_eq!(n, got.len());
                prop_assert_eq!(&got, &want, "drain of queue {}", q);
            }
            Op::Recreate { q } => {
                self.step(&Op::Drain { q })?;
                let m = &self.model[q];
                self.ledgers[q] = Ledger::new(m.kind, m.cap);
            }
            Op::NearBlockEnd { q, left } => {
                self.ledgers[q].near_block_end(left);
            }
        }
        self.check_invariants()
    }

    fn check_invariants(&self) -> Result<(), TestCaseError> {
        for (q, (l, m)) in self.ledgers.iter().zip(&self.model).enumerate() {
            prop_assert_eq!(l.len(), m.out.len(), "queue {} len", q);
            prop_assert_eq!(l.room(), m.cap - m.out.len(), "queue {} room", q);
            prop_assert_eq!(l.cap(), m.cap);
            for &(tag, _) in &m.out {
                prop_assert!(l.holds(tag), "queue {} lost {:#x}", q, tag);
            }
            for &tag in m.ended.iter().rev().take(8) {
                prop_assert!(!l.holds(tag), "queue {} still holds ended {:#x}", q, tag);
            }
        }
        Ok(())
    }

    /// Runs the case to its end: then everything still outstanding is
    /// drained, and every token must have come back exactly once.
    fn finish(mut self) -> Result<(), TestCaseError> {
        for q in 0..KINDS.len() {
            self.step(&Op::Drain { q })?;
        }
        let ended: usize = self.model.iter().map(|m| m.ended.len()).sum();
        prop_assert_eq!(ended, self.issued.len(), "a request never came back");
        Ok(())
    }
}

thread_local! {
    /// How many quiet completions skipped their slots (reported, and
    /// required to happen, so that the skip is exercised).
    static QUIET_SKIPS: Cell<usize> = const { Cell::new(0) };
}

fn run_case(caps: &[usize], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = World::new(caps);
    for op in ops {
        w.step(op)?;
    }
    w.finish()
}

#[test]
fn ledger_agrees_with_the_model_on_random_operation_sequences() {
    let target: usize = std::env::var("RDMA_VERBS_LEDGER_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let steps = Cell::new(0usize);
    let mut cases = 0;
    while steps.get() < target {
        // A runner runs its cases once; each round takes a fresh one
        // (with a fresh random seed).
        let mut runner = TestRunner::new(Config {
            cases: 64,
            // The sequences are random each run; a failure prints its
            // minimal case (no regression file: this runner has no source
            // file to name).
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&case(), |(caps, ops)| {
            run_case(&caps, &ops)?;
            steps.set(steps.get() + ops.len());
            Ok(())
        });
        match result {
            Ok(()) => cases += 64,
            Err(TestError::Fail(why, (caps, ops))) => panic!(
                "{why}\nminimal failing case: capacities {caps:?}, {} operations:\n{ops:#?}",
                ops.len()
            ),
            Err(e) => panic!("{e}"),
        }
    }
    let skips = QUIET_SKIPS.with(Cell::get);
    eprintln!(
        "ledger properties: {cases} cases, {} operations, {skips} quiet completions that skipped their slots",
        steps.get()
    );
    assert!(
        skips > 0,
        "no quiet completion skipped: the skip went untested"
    );
}

//! Unit tests of the ledger, and the randomized state-machine test.

use super::any::AnyLedger as Ledger;
use super::*;
use std::collections::BTreeMap;
use std::collections::VecDeque;

#[test]
fn slot_arrays_are_never_empty_and_every_number_names_one_of_their_slots() {
    // `Slots::at` skips the bounds check: any number, with any array
    // length a caller may pass (0 included), must name a slot of it.
    for len in [0, 1, 2, 8] {
        let mut s: Slots<()> = Slots::new(len);
        assert_eq!(s.len(), len.max(1));
        for x in [0, 1, 7, 8, 1 << 40, u64::MAX] {
            s.at_mut(x).stamp = x;
            assert_eq!(s.at(x).stamp, x);
            assert_eq!(s.at(x & s.mask()).stamp, x);
        }
    }
}

#[test]
fn tags_carry_their_kind_and_are_never_zero() {
    for kind in [Kind::Send, Kind::Recv, Kind::Srq] {
        let mut l = Ledger::new(kind, 4);
        let t = l.insert(7, ()).unwrap();
        assert_ne!(t, 0);
        assert_eq!(Kind::of(t), Some(kind));
    }
    assert_eq!(Kind::of(0), None);
    assert_eq!(Kind::of(12345), None);
}

#[test]
fn blocks_are_never_handed_out_twice() {
    let a = take_block().unwrap();
    let b = take_block().unwrap();
    assert!(b >= a + BLOCK);
    assert!(b + BLOCK <= 1 << KIND_SHIFT);
}

#[test]
fn a_queue_moves_to_a_fresh_block_when_one_is_used_up() {
    let mut l: Ledger<()> = Ledger::new(Kind::Recv, 1);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..(BLOCK + 10) {
        let t = l.insert(0, ()).unwrap();
        assert!(seen.insert(t), "tag {t:#x} issued twice");
        assert_eq!(l.complete(t, |_| ()), 1);
    }
}

#[test]
fn no_room_gives_the_payload_back() {
    let mut l = Ledger::new(Kind::Recv, 2);
    l.insert(1, "a").unwrap();
    l.insert(2, "b").unwrap();
    assert_eq!(l.insert(3, "c"), Err("c"));
    assert_eq!(l.len(), 2);
}

#[test]
fn the_one_refusal_names_the_queue_and_the_counts_or_the_stamps() {
    let names = [
        (Kind::Send, "send queue"),
        (Kind::Recv, "receive queue"),
        (Kind::Srq, "shared receive queue"),
    ];
    for (kind, name) in names {
        let mut l = Ledger::new(kind, 3);
        l.insert(1, ()).unwrap();
        // Two fit: three do not.
        match l.refusal("verb", 3) {
            Error::QueueFull {
                verb: "verb",
                queue,
                requests: 3,
                room: 2,
                outstanding: 1,
            } => assert_eq!(queue, name),
            e => panic!("{kind:?}: {e:?}"),
        }
        // With room, a refused insert ran out of stamps.
        assert!(matches!(
            l.refusal("verb", 2),
            Error::TagsExhausted { verb: "verb" }
        ));
    }
}

#[test]
fn send_completions_end_everything_before_them() {
    let mut l = Ledger::new(Kind::Send, 8);
    let tags: Vec<u64> = (0..5).map(|i| l.insert(i, i).unwrap()).collect();
    let mut got = Vec::new();
    assert_eq!(l.complete(tags[2], |r| got.push((r.wr_id, r.own))), 3);
    assert_eq!(got, [(0, false), (1, false), (2, true)]);
    assert_eq!(l.complete(tags[1], |_| ()), 0, "already ended");
    assert_eq!(l.complete(tags[2], |_| ()), 0, "accepted once only");
    assert_eq!(l.len(), 2);
}

#[test]
fn wrong_kind_or_queue_ends_nothing() {
    let mut s = Ledger::new(Kind::Send, 4);
    let mut r = Ledger::new(Kind::Recv, 4);
    let mut q = Ledger::new(Kind::Srq, 4);
    let ts = s.insert(1, ()).unwrap();
    let tr = r.insert(2, ()).unwrap();
    let tq = q.insert(3, ()).unwrap();
    // Same stamp, other kind bits: refused.
    let forged = (ts & STAMP_MASK) | ((Kind::Recv as u64) << KIND_SHIFT);
    assert_eq!(r.complete(forged, |_| ()), 0);
    assert_eq!(s.complete(tr, |_| ()), 0);
    assert_eq!(q.complete(ts, |_| ()), 0);
    assert_eq!(r.complete(tq, |_| ()), 0);
    let mut other = Ledger::new(Kind::Recv, 4);
    other.insert(9, ()).unwrap();
    assert_eq!(other.complete(tr, |_| ()), 0, "another queue's tag");
    assert_eq!((s.len(), r.len(), q.len()), (1, 1, 1));
}

#[test]
fn undo_only_takes_back_the_last_insert() {
    let mut l = Ledger::new(Kind::Send, 4);
    let a = l.insert(1, 'a').unwrap();
    let b = l.insert(2, 'b').unwrap();
    assert_eq!(l.undo_last(a), None);
    assert_eq!(l.undo_last(b), Some('b'));
    assert_eq!(l.undo_last(a), Some('a'));
    assert_eq!(l.len(), 0);
}

#[test]
fn drain_hands_back_everything_oldest_first() {
    let mut l = Ledger::new(Kind::Srq, 8);
    let tags: Vec<u64> = (0..6).map(|i| l.insert(i, i).unwrap()).collect();
    l.complete(tags[3], |_| ());
    let mut got = Vec::new();
    assert_eq!(l.drain(|r| got.push(r.wr_id)), 5);
    assert_eq!(got, [0, 1, 2, 4, 5]);
    assert_eq!(l.len(), 0);
    assert_eq!(l.complete(tags[0], |_| ()), 0, "drained tags are dead");
}

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A token standing for a lent chunk: each is created once, and must
/// come back exactly once.
#[derive(Debug, PartialEq, Eq)]
struct Token(u64);

impl Payload for Token {
    fn inert(&self) -> bool {
        false
    }
}

/// Plain values in the unit tests: never inert, so every request is
/// handed back.
macro_rules! heavy {
    ($($t:ty),*) => {$(
        impl Payload for $t {
            fn inert(&self) -> bool {
                false
            }
        }
    )*};
}
heavy!((), u64, char, &str);

/// The device's view of one queue: what it has been given and not yet
/// completed, in order.
#[derive(Default)]
struct DeviceQueue {
    queued: VecDeque<(u64, bool)>, // (tag, signalled)
}

/// The randomized state-machine test: three queues (a QP's send queue,
/// its receive queue, an SRQ) driven by random posts, failed posts that
/// the "device" may or may not have queued, completions (in order on
/// the send queue, any order on the SRQ), flushes, reclaims on the right
/// and the wrong queue, twice, late, and resets. The model checks that
/// every token comes back exactly once, and never while the device may
/// still use it.
#[test]
fn random_state_machine_hands_every_token_back_exactly_once() {
    let steps: usize = std::env::var("RDMA_VERBS_LEDGER_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let kinds = [Kind::Send, Kind::Recv, Kind::Srq];
    let caps = [5usize, 4, 7];
    let mut ledgers: Vec<Ledger<Token>> = (0..3).map(|q| Ledger::new(kinds[q], caps[q])).collect();
    let mut device: Vec<DeviceQueue> = (0..3).map(|_| DeviceQueue::default()).collect();
    // Completions polled but not yet reclaimed (some kept for replays).
    let mut cq: Vec<(usize, u64)> = Vec::new();
    let mut seen_cq: Vec<(usize, u64)> = Vec::new();
    // token -> (queue, tag) while lent; the model's truth.
    let mut lent: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    // tags the device may still touch: queued and not completed.
    let mut busy: BTreeMap<u64, usize> = BTreeMap::new();
    let mut next_token = 0u64;
    let mut returned = 0u64;
    let mut stats = [0usize; 8];

    let mut give_back = |r: Released<Token>,
                         lent: &mut BTreeMap<u64, (usize, u64)>,
                         busy: &BTreeMap<u64, usize>| {
        let Token(t) = r.payload;
        let (_, tag) = lent.remove(&t).expect("a token came back twice");
        assert!(
            !busy.contains_key(&tag),
            "token {t} came back while the device may still use it"
        );
        assert_eq!(r.wr_id, t, "wr_id does not match the request");
        returned += 1;
    };

    for step in 0..steps {
        let q = rng.below(3);
        match rng.below(10) {
            // Post a chain of 0..=3 requests; sometimes the provider fails.
            0..=2 => {
                let n = rng.below(4);
                if n > ledgers[q].room() {
                    stats[0] += 1;
                    continue; // the crate refuses before the call
                }
                let mut tags = Vec::new();
                for _ in 0..n {
                    let t = next_token;
                    next_token += 1;
                    let tag = ledgers[q].insert(t, Token(t)).expect("room was checked");
                    lent.insert(t, (q, tag));
                    tags.push(tag);
                }
                // 1 in 5: the provider fails; it may have queued any
                // prefix (or all) of the chain anyway.
                let queued = if rng.below(5) == 0 {
                    stats[1] += 1;
                    rng.below(n + 1)
                } else {
                    n
                };
                for &tag in &tags[..queued] {
                    let signalled = q != 0 || rng.below(3) != 0;
                    device[q].queued.push_back((tag, signalled));
                    busy.insert(tag, q);
                }
            }
            // The device completes the oldest request (send, RQ) or any (SRQ).
            3..=5 => {
                let dq = &mut device[q];
                if dq.queued.is_empty() {
                    continue;
                }
                let i = if q == 2 {
                    rng.below(dq.queued.len())
                } else {
                    0
                };
                let (tag, signalled) = dq.queued.remove(i).unwrap();
                busy.remove(&tag);
                if signalled {
                    cq.push((q, tag));
                }
                stats[2] += 1;
            }
            // Reclaim a polled completion on the right queue (mostly),
            // or replay an old one, or try it on a wrong queue.
            6..=7 => {
                if cq.is_empty() && seen_cq.is_empty() {
                    continue;
                }
                let (from_q, tag) = if !cq.is_empty() && rng.below(4) != 0 {
                    let c = cq.swap_remove(rng.below(cq.len()));
                    seen_cq.push(c);
                    if seen_cq.len() > 64 {
                        seen_cq.swap_remove(rng.below(seen_cq.len()));
                    }
                    c
                } else if !seen_cq.is_empty() {
                    stats[3] += 1;
                    seen_cq[rng.below(seen_cq.len())] // late or twice
                } else {
                    continue;
                };
                let target = if rng.below(5) == 0 {
                    stats[4] += 1;
                    rng.below(3) // possibly the wrong queue
                } else {
                    from_q
                };
                let held_before = ledgers[target].holds(tag);
                let n = ledgers[target].complete(tag, |r| give_back(r, &mut lent, &busy));
                if target != from_q {
                    assert_eq!(n, 0, "a wrong queue accepted a completion");
                }
                assert_eq!(n > 0, held_before);
            }
            // Flush: the queue goes to ERR; everything queued completes
            // (with error), in order, all signalled.
            8 => {
                if q == 2 || rng.below(4) != 0 {
                    continue;
                }
                stats[5] += 1;
                while let Some((tag, _)) = device[q].queued.pop_front() {
                    busy.remove(&tag);
                    cq.push((q, tag));
                }
            }
            // Reset (QP queues) or destroy and recreate (SRQ): the
            // device forgets its queue, the ledger hands everything back.
            _ => {
                if rng.below(3) != 0 {
                    continue;
                }
                stats[6] += 1;
                for (tag, _) in device[q].queued.drain(..) {
                    busy.remove(&tag);
                }
                ledgers[q].drain(|r| give_back(r, &mut lent, &busy));
                assert_eq!(ledgers[q].len(), 0);
                if q == 2 && rng.below(2) == 0 {
                    ledgers[q] = Ledger::new(Kind::Srq, caps[q]);
                }
            }
        }
        // Invariants after every step.
        for (q, l) in ledgers.iter().enumerate() {
            let in_model = lent.values().filter(|(lq, _)| *lq == q).count();
            assert_eq!(l.len(), in_model, "step {step}: queue {q} count");
            assert!(l.len() <= l.cap());
            // `any_live` (the pool pins' look-up) sees exactly the lent
            // tokens of a receive queue or SRQ, and nothing on a ring.
            let ring = kinds[q] == Kind::Send;
            for (&t, _) in lent.iter().filter(|(_, (lq, _))| *lq == q) {
                assert_eq!(
                    l.any_live(|_, tok| tok.0 == t),
                    !ring,
                    "step {step}: token {t}"
                );
            }
            assert!(
                !l.any_live(|_, tok| !lent.contains_key(&tok.0)),
                "step {step}: queue {q} holds a returned token"
            );
        }
        for (&tag, &q) in &busy {
            assert!(ledgers[q].holds(tag), "step {step}: a busy request left");
        }
        stats[7] = step;
    }
    // Finally the device finishes and everything is reset: all back.
    for (q, l) in ledgers.iter_mut().enumerate() {
        for (tag, _) in device[q].queued.drain(..) {
            busy.remove(&tag);
        }
        l.drain(|r| give_back(r, &mut lent, &busy));
    }
    assert!(lent.is_empty(), "{} tokens never came back", lent.len());
    assert_eq!(returned, next_token);
    eprintln!(
        "ledger: {} random steps, {next_token} requests, every one handed back once \
         (refused {} chains, {} failed posts, {} device completions, {} replays, \
         {} wrong-queue tries, {} flushes, {} resets)",
        stats[7] + 1,
        stats[0],
        stats[1],
        stats[2],
        stats[3],
        stats[4],
        stats[5],
        stats[6]
    );
}

/// A payload that holds a handle, so that its drops can be counted.
struct Held {
    _handle: std::rc::Rc<()>,
    inert: bool,
}

impl Payload for Held {
    fn inert(&self) -> bool {
        self.inert
    }
}

/// `n` requests, each holding a handle of `rc`, into `l`: their tags.
fn insert_held(l: &mut Ledger<Held>, n: u64, rc: &std::rc::Rc<()>, inert: bool) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let held = Held {
                _handle: rc.clone(),
                inert,
            };
            l.insert(i, held).ok().unwrap()
        })
        .collect()
}

#[test]
fn a_dropped_ledger_drops_each_outstanding_payload_once_and_nothing_else() {
    let rc = std::rc::Rc::new(());
    // A free list: five in, two taken, one undone, two left for the drop;
    // then the slots freed are used again before the ledger goes.
    let mut r = Ledger::new(Kind::Recv, 8);
    let tags = insert_held(&mut r, 5, &rc, false);
    drop(r.take_tag(tags[1], |_, p| p).unwrap());
    drop(r.take_tag(tags[3], |_, p| p).unwrap());
    drop(r.undo_last(tags[4]).unwrap());
    assert_eq!(std::rc::Rc::strong_count(&rc), 1 + 2);
    let again = insert_held(&mut r, 4, &rc, false);
    assert_eq!(r.len(), 6);
    drop(r.take_tag(again[0], |_, p| p).unwrap());
    drop(r);
    assert_eq!(std::rc::Rc::strong_count(&rc), 1, "the free list's drop");
    // A ring: six in, a completion ends three, three left for the drop.
    let mut s = Ledger::new(Kind::Send, 8);
    let tags = insert_held(&mut s, 6, &rc, false);
    assert_eq!(s.complete(tags[2], drop), 3);
    drop(s);
    assert_eq!(std::rc::Rc::strong_count(&rc), 1, "the ring's drop");
    // Inert payloads that a quiet completion passed are forgotten (never
    // dropped, never read); the ones still outstanding drop with the ledger.
    let mut s = Ledger::new(Kind::Send, 4);
    let tags = insert_held(&mut s, 4, &rc, true);
    assert_eq!(s.complete_quiet(tags[1], |_| panic!("visited")), 2);
    let more = insert_held(&mut s, 2, &rc, true);
    assert_eq!(s.len(), 4);
    assert_eq!(std::rc::Rc::strong_count(&rc), 1 + 6);
    assert!(s.outstanding(more[1]) && !s.outstanding(tags[0]));
    drop(s);
    assert_eq!(
        std::rc::Rc::strong_count(&rc),
        1 + 2,
        "the two passed by the quiet completion are forgotten, the four outstanding dropped"
    );
}

//! The bookkeeping of outstanding work requests, apart from any verbs call:
//! which `wr_id` the device is handed for each request, what the request
//! lent (its chunks), and which completion gives it back.
//!
//! # Tags
//!
//! Every `wr_id` this crate hands a device is a *tag*:
//!
//! ```text
//!  63 62 61                                                        0
//! +-----+-----------------------------------------------------------+
//! |kind |                        stamp (62 bits)                    |
//! +-----+-----------------------------------------------------------+
//! ```
//!
//! * `kind` says which sort of queue the request was posted to: `01` a QP's
//!   send queue, `10` a QP's receive queue, `11` a shared receive queue.
//!   (`00` is never issued: a zeroed or raw `wr_id` is no tag.)
//! * `stamp` is unique in the process: stamps are handed out in blocks of
//!   [`BLOCK`] from one process-wide counter that only goes up and refuses
//!   to go past 2^62 (it would take 2^46 blocks; at a billion posts a
//!   second that is over a hundred years). A block belongs to one queue
//!   forever, so a stamp names exactly one request of one queue, ever.
//!
//! A queue's [`Ledger`] keeps each outstanding request in slot
//! `stamp mod slots` together with its full stamp; a completion is accepted
//! only when its kind is the ledger's and its stamp is *exactly* the one in
//! that slot. Hence:
//!
//! * a completion of another queue (another QP, an SRQ, another device or
//!   context, a QP destroyed before whose number came back) names a stamp
//!   that was never this queue's: refused;
//! * a completion accepted once has left its slot, and its stamp is never
//!   issued again: the same completion reclaimed twice, or after RESET, is
//!   refused, however many requests were posted meanwhile;
//! * routing is by kind, never by "try here, then there".
//!
//! # When the device is done with a request
//!
//! A request leaves the ledger, and its chunks go back to the caller, only
//! when the device can no longer touch them:
//!
//! * its own completion (successful, failed or flushed) was polled;
//! * on a send queue, the completion of a later request: send queues
//!   complete in order, so earlier (unsignalled) requests are done too;
//! * the queue was reset (a QP moved to RESET) or destroyed.
//!
//! A provider's failure return is *not* such a proof: rxe, for one, writes
//! a request into its ring and then fails the doorbell. Requests of a post
//! call the provider failed stay in the ledger ("in doubt") until one of the
//! above happens.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many stamps a queue takes from the process-wide counter at a time.
pub(crate) const BLOCK: u64 = 1 << 16;

const KIND_SHIFT: u32 = 62;
const STAMP_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// Block numbers stay below this, so that every stamp fits in 62 bits.
const BLOCK_LIMIT: u64 = (1 << KIND_SHIFT) / BLOCK;

/// The sort of queue a tag names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A queue pair's send queue: completes in order, and a completion also
    /// ends every earlier request.
    Send = 1,
    /// A queue pair's own receive queue.
    Recv = 2,
    /// A shared receive queue.
    Srq = 3,
}

impl Kind {
    /// The kind of a tag, or `None` for a `wr_id` this crate never issues.
    pub(crate) fn of(wr_id: u64) -> Option<Kind> {
        match wr_id >> KIND_SHIFT {
            1 => Some(Kind::Send),
            2 => Some(Kind::Recv),
            3 => Some(Kind::Srq),
            _ => None,
        }
    }

    fn tag(self, stamp: u64) -> u64 {
        ((self as u64) << KIND_SHIFT) | stamp
    }
}

/// The process-wide source of stamp blocks.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);

/// The first stamp of a block no queue ever had, or `None` once all 2^46
/// are gone.
fn take_block() -> Option<u64> {
    NEXT_BLOCK
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            (b < BLOCK_LIMIT).then_some(b + 1)
        })
        .ok()
        .map(|b| b * BLOCK)
}

/// The stamps of the process are used up (after 2^62 of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted;

/// One outstanding request.
#[derive(Debug)]
pub(crate) struct Entry<T> {
    stamp: u64,
    /// The caller's own `wr_id`.
    pub(crate) wr_id: u64,
    /// What the request lent (its chunks, ...).
    pub(crate) payload: T,
}

/// A request leaving the ledger, and why.
#[derive(Debug)]
pub(crate) struct Released<T> {
    /// The caller's `wr_id`.
    pub(crate) wr_id: u64,
    /// Whether it is the request the completion names (rather than an
    /// earlier send it implies, or a request handed back by a reset).
    pub(crate) own: bool,
    /// What the request lent.
    pub(crate) payload: T,
}

/// The outstanding requests of one queue, keyed by tag.
#[derive(Debug)]
pub(crate) struct Ledger<T> {
    kind: Kind,
    /// The most requests that may be outstanding at once.
    cap: usize,
    /// `slots.len()` is a power of two at least twice `cap`; a request with
    /// stamp `s` lives in slot `s & mask`.
    slots: Box<[Option<Entry<T>>]>,
    mask: u64,
    /// Send queues: the stamps of the outstanding requests in post order.
    order: VecDeque<u64>,
    live: usize,
    /// The next unused stamp of this queue's block, and the block's end.
    next: u64,
    end: u64,
}

impl<T> Ledger<T> {
    /// An empty ledger for a queue of `kind` holding up to `cap` requests.
    /// Allocates everything it will ever need now.
    pub(crate) fn new(kind: Kind, cap: usize) -> Self {
        let len = cap.saturating_mul(2).max(2).next_power_of_two();
        Ledger {
            kind,
            cap,
            slots: (0..len).map(|_| None).collect(),
            mask: len as u64 - 1,
            order: VecDeque::with_capacity(if kind == Kind::Send { cap } else { 0 }),
            live: 0,
            next: 0,
            end: 0,
        }
    }

    /// How many requests are outstanding.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// How many more requests fit.
    pub(crate) fn room(&self) -> usize {
        self.cap - self.live
    }

    /// The capacity given at creation.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    fn next_stamp(&mut self) -> Result<u64, Exhausted> {
        if self.next == self.end {
            let start = take_block().ok_or(Exhausted)?;
            self.next = start;
            self.end = start + BLOCK;
        }
        let s = self.next;
        self.next += 1;
        Ok(s)
    }

    /// Records a request and returns the tag to hand the device as its
    /// `wr_id`. The caller checked [`room`](Self::room) first; with no room
    /// the payload comes back.
    pub(crate) fn insert(&mut self, wr_id: u64, payload: T) -> Result<u64, T> {
        if self.live >= self.cap {
            return Err(payload);
        }
        // At most `cap` of the `2 * cap` or more slots are taken, so a free
        // slot turns up within `cap + 1` stamps.
        let stamp = loop {
            match self.next_stamp() {
                Ok(s) if self.slots[(s & self.mask) as usize].is_none() => break s,
                Ok(_) => continue,
                Err(Exhausted) => return Err(payload),
            }
        };
        self.slots[(stamp & self.mask) as usize] = Some(Entry {
            stamp,
            wr_id,
            payload,
        });
        if self.kind == Kind::Send {
            self.order.push_back(stamp);
        }
        self.live += 1;
        Ok(self.kind.tag(stamp))
    }

    /// Takes back the request `tag` names if it is still outstanding (on a
    /// send queue: only if it is also the most recent one inserted, which
    /// keeps the post order of the rest): undoes an
    /// [`insert`](Self::insert) of a request that never reached the
    /// device. Callers undo a call's requests newest first.
    pub(crate) fn undo_last(&mut self, tag: u64) -> Option<T> {
        self.undo_last_entry(tag).map(|(_, payload)| payload)
    }

    /// [`undo_last`](Self::undo_last), also giving the caller's `wr_id`.
    pub(crate) fn undo_last_entry(&mut self, tag: u64) -> Option<(u64, T)> {
        let stamp = self.own_stamp(tag)?;
        if self.kind == Kind::Send {
            if self.order.back() != Some(&stamp) {
                return None;
            }
            self.order.pop_back();
        }
        self.live -= 1;
        self.slots[(stamp & self.mask) as usize]
            .take()
            .map(|e| (e.wr_id, e.payload))
    }

    /// The stamp of `tag` if it names a request outstanding here.
    fn own_stamp(&self, tag: u64) -> Option<u64> {
        if Kind::of(tag) != Some(self.kind) {
            return None;
        }
        let stamp = tag & STAMP_MASK;
        match &self.slots[(stamp & self.mask) as usize] {
            Some(e) if e.stamp == stamp => Some(stamp),
            _ => None,
        }
    }

    /// Whether `tag` names a request outstanding here.
    #[cfg(test)]
    pub(crate) fn holds(&self, tag: u64) -> bool {
        self.own_stamp(tag).is_some()
    }

    fn take(&mut self, stamp: u64, own: bool, f: &mut impl FnMut(Released<T>)) {
        let e = self.slots[(stamp & self.mask) as usize]
            .take()
            .expect("ledger: the order list names an empty slot");
        self.live -= 1;
        f(Released {
            wr_id: e.wr_id,
            own,
            payload: e.payload,
        });
    }

    /// Ends what the completion with `tag` ends, calling `f` for each
    /// request it hands back, oldest first; returns how many. A tag of
    /// another kind or queue, or one already ended, ends nothing.
    pub(crate) fn complete(&mut self, tag: u64, mut f: impl FnMut(Released<T>)) -> usize {
        let Some(stamp) = self.own_stamp(tag) else {
            return 0;
        };
        if self.kind != Kind::Send {
            self.take(stamp, true, &mut f);
            return 1;
        }
        // Send queues complete in order: everything up to `stamp` is done.
        let mut n = 0;
        while let Some(s) = self.order.pop_front() {
            self.take(s, s == stamp, &mut f);
            n += 1;
            if s == stamp {
                break;
            }
        }
        n
    }

    /// Hands back every outstanding request, oldest first (after the queue
    /// was reset or destroyed).
    pub(crate) fn drain(&mut self, mut f: impl FnMut(Released<T>)) -> usize {
        let stamps: Vec<u64> = if self.kind == Kind::Send {
            self.order.drain(..).collect()
        } else {
            let mut v: Vec<u64> = self.slots.iter().flatten().map(|e| e.stamp).collect();
            v.sort_unstable();
            v
        };
        for &s in &stamps {
            self.take(s, false, &mut f);
        }
        stamps.len()
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
        let mut ledgers: Vec<Ledger<Token>> =
            (0..3).map(|q| Ledger::new(kinds[q], caps[q])).collect();
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
}

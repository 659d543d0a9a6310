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
//!
//! # Layout, and why it is sound
//!
//! A ledger is one array of 48-byte slots, a power of two at least the
//! queue's depth: each slot a stamp, the caller's `wr_id` and a 32-byte
//! payload (what the request lent). A request with stamp `s` lives in
//! slot `s & mask`; a free slot has stamp 0, which is never issued.
//!
//! * **Every slot index is a number masked to the array.** The array has
//!   `mask + 1` slots from its creation to its drop (`Slots`,
//!   `ledger/slots.rs`, whose fields nothing else reaches), and every
//!   look-up takes its index as `x & mask`, so none can be out of bounds;
//!   that is the ledger's `unsafe` look-up (`Slots::at`, no bounds check),
//!   and the unit tests run every look-up with a debug assertion of it.
//!   The array is made in place (`Slots::new`: every slot written once,
//!   then taken as initialised), the ledger's other `unsafe`.
//! * **The order is the type's.** A [`SendLedger`] is a ring, a
//!   [`RecvLedger`] a free list (`Ledger<T, RING>`): no call chooses
//!   between them at run time.
//! * **Send queues are a ring.** Requests are inserted at `head` and, as
//!   send queues complete in order, leave from `tail`: the outstanding
//!   requests are exactly the slots `tail..head`. The stamp of the request
//!   at `head` is chosen to be `head` mod the slot count (within a block
//!   stamps simply count up; a new block starts at a multiple of the slot
//!   count), so a completion's slot is one mask away, and it is accepted
//!   only if that slot's stamp equals the completion's full 62-bit stamp.
//!   As no stamp is issued twice (below), an equal stamp proves that the
//!   slot holds exactly the request the device completed; everything from
//!   `tail` to it was posted before it and is done too.
//! * **Receive queues and SRQs use a free list.** Their requests end in
//!   any order (SRQ receives serve many QPs; callers may reclaim out of
//!   order), so free slots form a first-in first-out list through their
//!   `wr_id` field (no memory of its own). The next request takes the
//!   list's first slot, with the next unused stamp that is that slot mod
//!   the slot count: when requests end in post order (a QP's own receive
//!   queue), the list gives the slots out in turn and no stamp is skipped.
//! * **Stamps are never issued twice to requests a device may see.**
//!   Stamps only go up within a queue's blocks, and blocks are never
//!   handed out twice. The one exception is an undone insert (a refused
//!   post, a panicking iterator, an aborted batch): such a request never
//!   reached a device, so its stamp, the queue's latest, may be issued
//!   again.
//! * **Nothing is touched that is not outstanding.** On a receive queue a
//!   slot's payload is `Some` exactly when its stamp is not 0; taking it
//!   clears both. On a send queue a completion is accepted only for a slot
//!   inside the window `tail..head` (as well as with the exact stamp), so
//!   slots outside it are never read, whatever they still hold.
//! * **Inert payloads need no visit.** A payload is *inert* when dropping
//!   it does nothing ([`Payload::inert`]: no chunk, no box, no side entry;
//!   a request from a [`SendTemplate`](super::SendTemplate), whose source
//!   the QP keeps apart). A send queue's ledger counts the outstanding
//!   payloads that are not inert (a receive queue's need no count: its
//!   completions end one request each); when there are none, a send
//!   completion whose caller needs no per-request record
//!   ([`Ledger::complete_quiet`]) just moves
//!   `tail`, in constant time, and the slots it passed keep a stale stamp
//!   and an inert payload, which the window rule never reads and a later
//!   insert overwrites without dropping (it is `ManuallyDrop`: forgetting
//!   an inert payload loses nothing). The payloads are `ManuallyDrop`, so
//!   dropping an empty ledger visits no slot; a ledger dropped with
//!   requests outstanding (after its queue was destroyed) drops each slot's.
//!
//! The randomized model tests (`ledger/tests.rs`, `ledger/proptests.rs`)
//! drive both disciplines, block crossings included, against a plain
//! model of the queues.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

/// How many stamps a queue takes from the process-wide counter at a time
/// (a queue of more slots takes as many blocks as it has slots).
pub(crate) const BLOCK: u64 = 1 << 16;

const KIND_SHIFT: u32 = 62;
pub(crate) const STAMP_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// Block numbers stay below this, so that every stamp fits in 62 bits.
const BLOCK_LIMIT: u64 = (1 << KIND_SHIFT) / BLOCK;

/// What a ledger slot holds: [`inert`](Payload::inert) says whether
/// dropping it would do nothing, so that it may be forgotten (see the
/// module docs).
pub(crate) trait Payload {
    /// `true` only if dropping `self` does nothing at all.
    fn inert(&self) -> bool;
}

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
    #[inline]
    pub(crate) fn of(wr_id: u64) -> Option<Kind> {
        match wr_id >> KIND_SHIFT {
            1 => Some(Kind::Send),
            2 => Some(Kind::Recv),
            3 => Some(Kind::Srq),
            _ => None,
        }
    }

    #[inline]
    fn tag(self, stamp: u64) -> u64 {
        ((self as u64) << KIND_SHIFT) | stamp
    }
}

/// The process-wide source of stamp blocks.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);

/// The first stamp of `n` consecutive blocks no queue ever had, or `None`
/// once they are gone (after 2^46 blocks).
fn take_blocks(n: u64) -> Option<u64> {
    NEXT_BLOCK
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            b.checked_add(n).filter(|&e| e <= BLOCK_LIMIT)
        })
        .ok()
        .map(|b| b * BLOCK)
}

#[cfg(test)]
fn take_block() -> Option<u64> {
    take_blocks(1)
}

/// The stamps of the process are used up (after 2^62 of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted;

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
    /// The slot it had (the index of its side entry, if it has one).
    pub(crate) slot: usize,
}

/// The outstanding requests of one queue, keyed by tag.
///
/// A request with stamp `s` lives in slot `s & mask`; stamps are chosen so
/// that this is the slot the order gives (the ring's head, the free list's
/// first), so a completion finds its slot with one mask and proves it with
/// one compare of the full stamp. Free slots have stamp 0, which is never
/// issued (block 0 is never handed out).
///
/// The order is the type's (`RING`), so no call decides it at run time:
/// a [`SendLedger`] is a ring, a [`RecvLedger`] (a receive queue's or an
/// SRQ's) a free list.
pub(crate) struct Ledger<T, const RING: bool> {
    /// [`Kind::Send`] exactly when `RING`.
    kind: Kind,
    /// The most requests that may be outstanding at once.
    cap: usize,
    /// A power of two, at least `cap` (their count less one: `slots.mask()`).
    slots: Slots<T>,
    live: usize,
    /// How many outstanding payloads are not [inert](Payload::inert), on a
    /// send queue (the ring: its quiet completion reads it); 0 on a
    /// receive queue, whose completions end one request each.
    heavy: usize,
    /// The ring (a send queue: requests complete in post order): the
    /// outstanding requests fill the slots `tail..head` (counting inserts,
    /// mod the slot count) and a completion ends `tail` up to its own slot.
    head: u64,
    tail: u64,
    /// The free list (a receive queue or SRQ: requests end in any order):
    /// its ends, linked first to last through the free slots' `wr_id`, so
    /// that requests ending in post order give the slots out in turn.
    first: u32,
    last: u32,
    /// The next unused stamp of this queue's blocks, and their end.
    next: u64,
    end: u64,
}

/// A send queue's ledger (a ring).
pub(crate) type SendLedger<T> = Ledger<T, true>;
/// A receive queue's or an SRQ's ledger (a free list).
pub(crate) type RecvLedger<T> = Ledger<T, false>;

impl<T, const RING: bool> std::fmt::Debug for Ledger<T, RING> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("kind", &self.kind)
            .field("cap", &self.cap)
            .field("live", &self.live)
            .finish()
    }
}

impl<T: Payload, const RING: bool> Ledger<T, RING> {
    /// An empty ledger for a queue of `kind` holding up to `cap` requests
    /// (`kind` is [`Kind::Send`] exactly for a [`SendLedger`]).
    /// Allocates everything it will ever need now (one array of slots).
    pub(crate) fn new(kind: Kind, cap: usize) -> Self {
        debug_assert_eq!(RING, kind == Kind::Send, "a ring is a send queue's");
        let len = cap.max(1).next_power_of_two();
        let slots = Slots::new(len);
        Ledger {
            kind,
            cap,
            slots,
            live: 0,
            heavy: 0,
            head: 0,
            tail: 0,
            first: 0,
            last: len as u32 - 1,
            next: 0,
            end: 0,
        }
    }

    /// How many requests are outstanding.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// How many more requests fit.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        self.cap - self.live
    }

    /// The capacity given at creation.
    #[cfg(test)]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The slot count (a power of two).
    #[inline]
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The slot a tag of this ledger lives in (whether outstanding or not).
    #[inline]
    pub(crate) fn slot_of(&self, tag: u64) -> usize {
        (tag & STAMP_MASK & self.slots.mask()) as usize
    }

    /// Bytes of the slot array.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot<T>>()
    }

    /// Why `n` requests cannot all enter this ledger: the one refusal of
    /// every way in, made once the call's own requests are out again (so
    /// the room and the count are what the caller had). No room for all
    /// of them is [`Error::QueueFull`]; with room, the insert failed for
    /// want of a stamp: [`Error::TagsExhausted`].
    #[cold]
    #[inline(never)]
    pub(crate) fn refusal(&self, verb: &'static str, n: usize) -> Error {
        let room = self.room();
        if n <= room {
            return Error::TagsExhausted { verb };
        }
        let queue = match self.kind {
            Kind::Send => "send queue",
            Kind::Recv => "receive queue",
            Kind::Srq => "shared receive queue",
        };
        Error::QueueFull {
            verb,
            queue,
            requests: n,
            room,
            outstanding: self.len(),
        }
    }

    /// Takes back the newest request of a send queue (an aborted batch's,
    /// which never reached the device; its stamp is issued again); `None`
    /// when none is outstanding or on a receive queue.
    pub(crate) fn pop_newest(&mut self) -> Option<Released<T>> {
        if !RING || self.live == 0 {
            return None;
        }
        let idx = (self.head.wrapping_sub(1) & self.slots.mask()) as usize;
        let tag = self.kind.tag(self.slots.at(idx as u64).stamp);
        let (wr_id, payload) = self.undo_last_entry(tag)?;
        Some(Released {
            wr_id,
            own: false,
            payload,
            slot: idx,
        })
    }

    /// A fresh stamp that lives in slot `idx`: the first unused stamp of
    /// this queue's blocks that is `idx` mod the slot count, from new
    /// blocks when those are used up.
    #[inline(always)]
    fn stamp_for(&mut self, idx: u64) -> Result<u64, Exhausted> {
        let mut s = self.next + (idx.wrapping_sub(self.next) & self.slots.mask());
        if s >= self.end {
            let (first, end) = new_blocks(self.slots.mask(), idx)?;
            s = first;
            self.end = end;
        }
        self.next = s + 1;
        Ok(s)
    }

    /// Records a request and returns the tag to hand the device as its
    /// `wr_id`. The caller checked [`room`](Self::room) first; with no room
    /// (or no stamps left) the payload comes back.
    #[inline(always)]
    pub(crate) fn insert(&mut self, wr_id: u64, payload: T) -> Result<u64, T> {
        match self.reserve() {
            Some((idx, stamp)) => Ok(self.fill(idx, stamp, wr_id, payload)),
            None => Err(payload),
        }
    }

    /// [`insert`](Self::insert) of the payload `make` makes, once the
    /// request has its slot (so a constant payload is written straight
    /// into it): the tag, or `None` (and `make` is not called). `make`
    /// must not panic: a panic would leave the slot counted and never
    /// filled (one request of room lost for good; nothing else).
    #[inline(always)]
    pub(crate) fn insert_made(&mut self, wr_id: u64, make: impl FnOnce() -> T) -> Option<u64> {
        let (idx, stamp) = self.reserve()?;
        Some(self.fill(idx, stamp, wr_id, make()))
    }

    /// Takes the slot the order gives next and a fresh stamp for it, and
    /// counts the request in; the caller [`fill`](Self::fill)s the slot
    /// at once. `None`, with nothing changed, when there is no room or
    /// no stamp left.
    #[inline(always)]
    fn reserve(&mut self) -> Option<(usize, u64)> {
        if self.live >= self.cap {
            return None;
        }
        let idx = if RING {
            self.head & self.slots.mask()
        } else {
            u64::from(self.first)
        };
        let stamp = self.stamp_for(idx).ok()?;
        if RING {
            self.head += 1;
        } else {
            // `live < cap <= slots`: the list is not empty, and its first
            // slot links the next (the last one's link is never followed
            // while it is the only free slot: `live` stops inserts first
            // when `cap` is the slot count).
            self.first = self.slots.at(idx).wr_id as u32;
        }
        self.live += 1;
        Some((idx as usize, stamp))
    }

    /// Records the request in the slot [`reserve`](Self::reserve) gave.
    #[inline(always)]
    fn fill(&mut self, idx: usize, stamp: u64, wr_id: u64, payload: T) -> u64 {
        self.count_in(&payload);
        let slot = self.slots.at_mut(idx as u64);
        slot.stamp = stamp;
        slot.wr_id = wr_id;
        // Assigning the `ManuallyDrop` itself drops nothing: a ring slot
        // passed by a quiet completion may still hold an inert payload.
        slot.load = ManuallyDrop::new(Some(payload));
        self.kind.tag(stamp)
    }

    /// Counts `payload` in as outstanding (see `heavy`: a send queue's
    /// count only).
    #[inline(always)]
    fn count_in(&mut self, payload: &T) {
        if RING {
            self.heavy += usize::from(!payload.inert());
        }
    }

    /// Counts `payload` out of `heavy` (see [`count_in`](Self::count_in);
    /// a field, not `self`, so that a slot may stay borrowed).
    #[inline(always)]
    fn count_out(heavy: &mut usize, payload: &T) {
        if RING {
            *heavy -= usize::from(!payload.inert());
        }
    }

    /// Frees slot `idx` (its request was taken): on a receive queue it goes
    /// to the end of the free list.
    #[inline(always)]
    fn free(&mut self, idx: usize) {
        self.slots.at_mut(idx as u64).stamp = 0;
        self.unlink(idx);
    }

    /// [`free`](Self::free) of a slot whose stamp the caller cleared.
    #[inline(always)]
    fn unlink(&mut self, idx: usize) {
        self.live -= 1;
        if !RING {
            if self.live + 1 == self.slots.len() {
                // The list was empty: `idx` is all of it.
                self.first = idx as u32;
            } else {
                self.slots.at_mut(u64::from(self.last)).wr_id = idx as u64;
            }
            self.last = idx as u32;
        }
    }

    /// Takes back the request `tag` names if it is still outstanding (on a
    /// send queue: only if it is also the most recent one inserted, which
    /// keeps the post order of the rest): undoes an
    /// [`insert`](Self::insert) of a request that never reached the
    /// device. Callers undo a call's requests newest first; the stamps of
    /// undone requests are issued again (no device ever saw them).
    pub(crate) fn undo_last(&mut self, tag: u64) -> Option<T> {
        self.undo_last_entry(tag).map(|(_, payload)| payload)
    }

    /// [`undo_last`](Self::undo_last), also giving the caller's `wr_id`.
    pub(crate) fn undo_last_entry(&mut self, tag: u64) -> Option<(u64, T)> {
        let stamp = self.own_stamp(tag)?;
        let idx = (stamp & self.slots.mask()) as usize;
        if RING {
            if (self.head.wrapping_sub(1) & self.slots.mask()) as usize != idx {
                return None;
            }
            self.head -= 1;
            self.slots.at_mut(idx as u64).stamp = 0;
            self.live -= 1;
        } else {
            // Back to the front of the free list, where it came from.
            let was_empty = self.live == self.slots.len();
            let first = u64::from(self.first);
            let slot = self.slots.at_mut(idx as u64);
            slot.stamp = 0;
            let wr_id = std::mem::replace(&mut slot.wr_id, first);
            let payload = slot.load.take();
            if was_empty {
                self.last = idx as u32;
            }
            self.first = idx as u32;
            self.live -= 1;
            let payload = payload?;
            Self::count_out(&mut self.heavy, &payload);
            if stamp + 1 == self.next {
                self.next = stamp;
            }
            return Some((wr_id, payload));
        }
        if stamp + 1 == self.next {
            self.next = stamp;
        }
        let slot = self.slots.at_mut(idx as u64);
        let p = slot.load.take()?;
        Self::count_out(&mut self.heavy, &p);
        Some((slot.wr_id, p))
    }

    /// The stamp of `tag` if it names a request outstanding here.
    #[inline(always)]
    fn own_stamp(&self, tag: u64) -> Option<u64> {
        if tag >> KIND_SHIFT != self.kind as u64 {
            return None;
        }
        let stamp = tag & STAMP_MASK;
        let idx = stamp & self.slots.mask();
        let s = self.slots.at(idx);
        if stamp == 0 || s.stamp != stamp {
            return None;
        }
        if RING {
            // Only slots of the window `tail..head` hold outstanding
            // requests (the others may keep a stale stamp).
            (idx.wrapping_sub(self.tail) & self.slots.mask() < self.live as u64).then_some(stamp)
        } else {
            Some(stamp)
        }
    }

    /// Whether `tag` names a request outstanding here.
    #[cfg(test)]
    pub(crate) fn holds(&self, tag: u64) -> bool {
        self.outstanding(tag)
    }

    /// Whether `tag` names a request outstanding here.
    #[inline]
    pub(crate) fn outstanding(&self, tag: u64) -> bool {
        self.own_stamp(tag).is_some()
    }

    /// Takes slot `idx`'s request, frees the slot and hands the request
    /// to `f` (its `wr_id` and payload, moved straight out of the slot);
    /// `None` if the slot holds none.
    #[inline(always)]
    fn take_with<R>(&mut self, idx: usize, f: impl FnOnce(u64, T) -> R) -> Option<R> {
        let slot = self.slots.at_mut(idx as u64);
        let payload = slot.load.take()?;
        let wr_id = slot.wr_id;
        Self::count_out(&mut self.heavy, &payload);
        self.free(idx);
        Some(f(wr_id, payload))
    }

    /// [`take_with`](Self::take_with) as a [`Released`] record.
    #[inline(always)]
    fn take(&mut self, idx: usize, own: bool) -> Option<Released<T>> {
        self.take_with(idx, |wr_id, payload| Released {
            wr_id,
            own,
            payload,
            slot: idx,
        })
    }

    /// On a receive queue or an SRQ (free list): takes the request `tag`
    /// names if it is outstanding here and hands it to `f` (its `wr_id`
    /// and payload, moved straight out of the slot: no record built,
    /// measured 33 instructions less per receive than returning a
    /// [`Released`]). `None`, with nothing changed, if `tag` names no
    /// request outstanding here; always on a send queue, whose completions
    /// end earlier requests too (use `complete` there).
    #[inline(always)]
    pub(crate) fn take_tag<R>(&mut self, tag: u64, f: impl FnOnce(u64, T) -> R) -> Option<R> {
        if RING {
            return None;
        }
        let stamp = self.own_stamp(tag)?;
        self.take_with((stamp & self.slots.mask()) as usize, f)
    }

    /// [`complete`](Self::complete) for a caller that needs only the
    /// payloads that are not [inert](Payload::inert) (and how many
    /// requests ended): when none is outstanding, a send completion just
    /// moves the ring's tail, visiting no slot (see the module docs);
    /// otherwise `f` is called as `complete` calls it.
    #[inline(always)]
    pub(crate) fn complete_quiet(&mut self, tag: u64, f: impl FnMut(Released<T>)) -> usize {
        match self.complete_light(tag) {
            Some(n) => n,
            None => self.end(tag, f),
        }
    }

    /// [`complete_quiet`](Self::complete_quiet) of a send queue whose
    /// outstanding payloads are all inert: `Some` of how many requests the
    /// completion ended (the tail moved past them, no slot visited, no
    /// callback needed: callers build none), `None` otherwise (a receive
    /// queue, or a payload that needs its visit).
    #[inline(always)]
    pub(crate) fn complete_light(&mut self, tag: u64) -> Option<usize> {
        if !RING || self.heavy != 0 {
            return None;
        }
        let Some(stamp) = self.own_stamp(tag) else {
            return Some(0);
        };
        // As `end`: the tail up to the request's own slot.
        let n = (stamp.wrapping_sub(self.tail) & self.slots.mask()) + 1;
        self.live -= n as usize;
        self.tail += n;
        Some(n as usize)
    }

    /// Ends what the completion with `tag` ends, calling `f` for each
    /// request it hands back, oldest first; returns how many. A tag of
    /// another kind or queue, or one already ended, ends nothing.
    #[inline(always)]
    pub(crate) fn complete(&mut self, tag: u64, f: impl FnMut(Released<T>)) -> usize {
        self.end(tag, f)
    }

    /// On a receive queue or an SRQ (free list): takes the request `tag`
    /// names if it is outstanding here and `pick(payload, wr_id)` says so,
    /// returning its `wr_id` (the payload is not moved out). `pick` may
    /// accept only [inert](Payload::inert) payloads: the slot forgets it.
    /// `None`, with nothing changed, otherwise.
    #[inline(always)]
    pub(crate) fn take_if(&mut self, tag: u64, pick: impl FnOnce(&T, u64) -> bool) -> Option<u64> {
        if RING {
            return None;
        }
        let stamp = self.own_stamp(tag)?;
        let idx = (stamp & self.slots.mask()) as usize;
        let slot = self.slots.at_mut(stamp);
        let wr_id = slot.wr_id;
        match &*slot.load {
            Some(payload) if pick(payload, wr_id) => {}
            _ => return None,
        }
        // Inert (the caller's promise): forgetting it loses nothing, and
        // `heavy` did not count it.
        slot.load = ManuallyDrop::new(None);
        slot.stamp = 0;
        self.unlink(idx);
        Some(wr_id)
    }

    /// [`complete`](Self::complete), and
    /// [`complete_quiet`](Self::complete_quiet) when some payload needs
    /// its visit (the quiet case with none is
    /// [`complete_light`](Self::complete_light)'s).
    #[inline(always)]
    fn end(&mut self, tag: u64, mut f: impl FnMut(Released<T>)) -> usize {
        let Some(stamp) = self.own_stamp(tag) else {
            return 0;
        };
        let idx = (stamp & self.slots.mask()) as usize;
        if !RING {
            return self.take(idx, true).map_or(0, |r| {
                f(r);
                1
            });
        }
        let tail = self.tail;
        // Send queues complete in order: everything from the tail up to
        // the request's own slot is done (all of it outstanding: the slots
        // `tail..head` hold exactly the outstanding requests).
        let n = ((idx as u64).wrapping_sub(tail) & self.slots.mask()) + 1;
        self.live -= n as usize;
        self.tail += n;
        // One call site of `f`, so that it is inlined; the ring's slots
        // need no free list, just their stamps cleared.
        for k in 0..n {
            let i = ((tail + k) & self.slots.mask()) as usize;
            let slot = self.slots.at_mut(tail + k);
            slot.stamp = 0;
            if let Some(payload) = slot.load.take() {
                Self::count_out(&mut self.heavy, &payload);
                f(Released {
                    wr_id: slot.wr_id,
                    own: k + 1 == n,
                    payload,
                    slot: i,
                });
            }
        }
        n as usize
    }
}

impl<T, const RING: bool> Drop for Ledger<T, RING> {
    /// Drops what is still outstanding; an empty ledger visits no slot.
    fn drop(&mut self) {
        if self.live == 0 {
            return;
        }
        for s in self.slots.iter_mut() {
            drop(s.load.take());
        }
    }
}

mod slots;
mod walk;

use slots::{Slot, Slots};

#[cfg(test)]
mod any;

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests;

/// The stamp for slot `idx` of a ledger of `mask + 1` slots from fresh
/// blocks (enough that every slot has a stamp in them), and their end.
#[cold]
#[inline(never)]
fn new_blocks(mask: u64, idx: u64) -> Result<(u64, u64), Exhausted> {
    let n = (mask + 1).div_ceil(BLOCK).max(1);
    let start = take_blocks(n).ok_or(Exhausted)?;
    // `start` is a multiple of BLOCK, and so of any slot count up to it;
    // above, of the slot count too (both are powers of two).
    Ok((start + (idx.wrapping_sub(start) & mask), start + n * BLOCK))
}

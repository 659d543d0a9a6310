//! The known state of a queue pair, and how it follows the device.
//!
//! [`QueuePair::state`](super::QueuePair::state) is what the checks of the
//! data path and of `modify` read. The crate's own moves (modify, resync,
//! the CM's moves of a CM QP) set it; the device's own moves reach it in
//! three ways:
//!
//! * an error or flush completion that the QP reclaims (see
//!   [`QueuePair::reclaim`](super::QueuePair::reclaim));
//! * a fatal asynchronous event of the QP (`IBV_EVENT_QP_FATAL`,
//!   `QP_REQ_ERR`, `QP_ACCESS_ERR`, `QP_LAST_WQE_REACHED`) read with
//!   [`Context::get_async_event`](crate::Context::get_async_event) on the
//!   context the QP was created from: the event names the QP by pointer,
//!   and the context keeps a registry from pointer to the QP's [`Known`];
//! * [`QueuePair::resync`](super::QueuePair::resync).
//!
//! The state is one atomic word: the state, whether a
//! [`WrBatch`](crate::qp::WrBatch) holds the provider's send-queue lock
//! (the send path's other refusal, so that a post reads one word), and a
//! generation that every move the crate makes bumps. An event is read by
//! another thread at any later time, possibly after the owner has reset the QP and brought it
//! back up, so it never stores "ERR" blindly: it reads the QP's state from
//! the device (the QP stays alive until the event is acknowledged) and
//! stores what it read only if no move was recorded since it started
//! (compare-and-swap on the word). Whatever it stores was thus the
//! device's state at a moment after the last recorded move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::QpState;
use crate::context::Context;
use crate::sys;
use crate::users::{Tally, UserKind};

/// The low seven bits of the word: the state.
const STATE: u64 = 0x7f;

/// Set while an `ibv_wr_*` batch holds the provider's send-queue lock (for
/// good once the batch was leaked): no send may take the lock.
const SEND_LOCKED: u64 = 0x80;

/// A QP's known state, shared by the QP, its CM id (for a CM QP) and the
/// context's registry.
pub(crate) struct Known {
    /// `generation << 8 | SEND_LOCKED? | state`.
    word: AtomicU64,
    /// The first failed completion (other than a flush) reclaimed since
    /// the QP was created or last moved to RESET, for
    /// [`QueuePair::explain`](super::QueuePair::explain): 0 for none, else
    /// `FAILED | kind << 32 | status`. Written only on a failure's cold
    /// path, read only by `explain`.
    failure: AtomicU64,
}

/// The mark of a recorded failure in [`Known::failure`].
const FAILED: u64 = 1 << 63;

impl Known {
    pub(crate) fn new(state: QpState) -> Arc<Self> {
        Arc::new(Known {
            word: AtomicU64::new(u64::from(state.as_raw()) & STATE),
            failure: AtomicU64::new(0),
        })
    }

    /// The known state: one atomic load.
    #[inline]
    pub(crate) fn state(&self) -> QpState {
        let raw = (self.word.load(Ordering::Acquire) & STATE) as u32;
        QpState::from_raw(raw).unwrap_or(QpState::Unknown)
    }

    /// Whether a send may be posted: the state is RTS, SQD, SQE or ERR and
    /// no batch holds the send-queue lock. One load and one compare: the
    /// low byte is the state alone (3 to 6) only while the lock is free.
    #[inline(always)]
    pub(crate) fn sends(&self) -> bool {
        let low = self.word.load(Ordering::Acquire) & (STATE | SEND_LOCKED);
        // RTS, SQD, SQE, ERR: consecutive in `enum ibv_qp_state`.
        const RTS: u64 = sys::ibv_qp_state::IBV_QPS_RTS as u64;
        const ERR: u64 = sys::ibv_qp_state::IBV_QPS_ERR as u64;
        const _: () = assert!(ERR - RTS == 3);
        low.wrapping_sub(RTS) <= ERR - RTS
    }

    /// Whether a batch holds the provider's send-queue lock (see
    /// [`lock_sends`](Self::lock_sends)).
    pub(crate) fn sends_locked(&self) -> bool {
        self.word.load(Ordering::Acquire) & SEND_LOCKED != 0
    }

    /// An `ibv_wr_*` batch took the provider's send-queue lock
    /// (`ibv_wr_start`): sends are refused until
    /// [`unlock_sends`](Self::unlock_sends), for good if the batch is leaked.
    pub(crate) fn lock_sends(&self) {
        self.word.fetch_or(SEND_LOCKED, Ordering::AcqRel);
    }

    /// The batch released the lock (`ibv_wr_complete`, `ibv_wr_abort`).
    pub(crate) fn unlock_sends(&self) {
        self.word.fetch_and(!SEND_LOCKED, Ordering::AcqRel);
    }

    /// Records a move made by (or proved to) the crate, with a new
    /// generation (the send-queue lock is not a move: it stays).
    pub(crate) fn set(&self, state: QpState) {
        if state == QpState::Reset {
            // RESET forgets the requests, and with them their failures.
            self.failure.store(0, Ordering::Relaxed);
        }
        let s = u64::from(state.as_raw()) & STATE;
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(((w >> 8).wrapping_add(1) << 8) | (w & SEND_LOCKED) | s)
            });
    }

    /// Records a failed completion's `status` (a raw `ibv_wc_status`) and
    /// the kind of queue its request was on (`kind`: 0 send, 1 receive, 2
    /// SRQ receive), unless an earlier failure is recorded or it is a
    /// flush (which only follows a failure).
    #[cold]
    pub(crate) fn note_failure(&self, status: u32, kind: u8) {
        if status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
            return;
        }
        let v = FAILED | u64::from(kind) << 32 | u64::from(status);
        let _ = self
            .failure
            .compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The failure [`note_failure`](Self::note_failure) recorded: its raw
    /// status and kind.
    pub(crate) fn first_failure(&self) -> Option<(u32, u8)> {
        let v = self.failure.load(Ordering::Relaxed);
        (v & FAILED != 0).then_some((v as u32, (v >> 32) as u8))
    }

    /// The device may have moved the QP on its own: reads its state with
    /// `query` and stores it, unless a move was recorded meanwhile (that
    /// record is newer than the query may be). A failed query (`None`)
    /// changes nothing.
    pub(crate) fn follow_device(&self, query: impl FnOnce() -> Option<QpState>) {
        let before = self.word.load(Ordering::Acquire);
        let Some(state) = query() else { return };
        let after = (before & !STATE) | (u64::from(state.as_raw()) & STATE);
        let _ = self
            .word
            .compare_exchange(before, after, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The state of a live QP as the device reports it (`ibv_query_qp` with
/// `IBV_QP_STATE`), `None` if the query fails.
///
/// # Safety
/// `qp` is a live QP for the whole call.
pub(crate) unsafe fn query_state(qp: *mut sys::ibv_qp) -> Option<QpState> {
    let mut attr = sys::ibv_qp_attr::default();
    let mut init = sys::ibv_qp_init_attr::default();
    // SAFETY: `qp` is live (the caller's promise); the structs are valid
    // out-parameters.
    let rc = unsafe {
        sys::ibv_query_qp(
            qp,
            &mut attr,
            sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            &mut init,
        )
    };
    (rc == 0).then(|| QpState::from_raw(attr.qp_state).unwrap_or(QpState::Unknown))
}

/// One registered QP: its `ibv_qp` pointer, when it was registered (a
/// number counted up per context), and its known state.
struct Entry {
    key: usize,
    seq: u64,
    known: *const Known,
}

/// The registry's table: a slab whose slot a QP keeps for its life (its
/// [`Registration`] holds the index), so that entering and leaving cost a
/// free-list pop and push, with no hashing; a look-up by pointer walks the
/// table, which only a QP's asynchronous event does.
#[derive(Default)]
struct Table {
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// The `seq` of the next entry.
    next: u64,
}

// SAFETY: `known` is only followed under the registry's lock, while the
// entry exists, and each entry's `Known` outlives it (see `Registration`);
// `Known` itself is `Sync` (one atomic word).
unsafe impl Send for Table {}

impl Table {
    /// The newest entry under `key` (of two with the same pointer, the
    /// live QP's: see [`QpRegistry::device_moved`]).
    fn newest(&self, key: usize) -> Option<&Entry> {
        self.slots
            .iter()
            .flatten()
            .filter(|e| e.key == key)
            .max_by_key(|e| e.seq)
    }

    /// Frees slot `index` if it still holds the entry of `known`.
    fn leave(&mut self, index: u32, known: *const Known) {
        if let Some(slot) = self.slots.get_mut(index as usize) {
            if slot.as_ref().is_some_and(|e| std::ptr::eq(e.known, known)) {
                *slot = None;
                self.free.push(index);
            }
        }
    }
}

/// A context's QPs by their `ibv_qp` pointer, for the event delivery.
#[derive(Default)]
pub(crate) struct QpRegistry {
    table: Mutex<Table>,
}

impl QpRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Only whole inserts and removes happen under the lock.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The event delivery's part: the device raised an event that moves
    /// the live QP `qp` (not acknowledged yet, so not destroyed); if it is
    /// one of this context's, its known state follows the device.
    ///
    /// Two entries may name the same pointer: a destroyed QP whose keep is
    /// not dropped yet, and a live QP that malloc placed at its address
    /// since. The live one is the newer (the greater `seq`).
    ///
    /// # Safety
    /// `qp` is a live QP for the whole call.
    pub(crate) unsafe fn device_moved(&self, qp: *mut sys::ibv_qp) {
        let table = self.lock();
        if let Some(e) = table.newest(qp as usize) {
            // The lock is held, so the entry's `Registration`, which holds
            // the `Known`, has not left the table and not dropped it.
            // SAFETY: so `e.known` points to a live `Known`.
            let known = unsafe { &*e.known };
            // SAFETY: `qp` is live for the call (the caller's promise).
            known.follow_device(|| unsafe { query_state(qp) });
        }
    }

    /// How many QPs are entered (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().slots.iter().flatten().count()
    }
}

/// A QP's entry in its context's registry, removed when the QP's keep is
/// dropped (after the QP was destroyed; a QP whose destruction failed keeps
/// its entry, as it still exists).
pub(crate) struct Registration {
    /// The QP's entry in its context's user counts (the QP holds the
    /// context through this registration).
    _tally: Tally,
    ctx: Context,
    /// The entry's slot in the table.
    index: u32,
    /// What the entry points to: kept alive here until the entry is gone.
    known: Arc<Known>,
}

impl Registration {
    /// Enters the QP `qp` of `ctx` with its known state.
    pub(crate) fn new(ctx: &Context, qp: *mut sys::ibv_qp, known: &Arc<Known>) -> Self {
        let index = enter(ctx.qp_registry(), qp as usize, Arc::as_ptr(known));
        Registration {
            _tally: Tally::new(ctx.users(), UserKind::QueuePair, 1),
            ctx: ctx.clone(),
            index,
            known: Arc::clone(known),
        }
    }
}

/// Enters `key` with `known` in a free slot of `registry`'s table; its
/// index.
fn enter(registry: &QpRegistry, key: usize, known: *const Known) -> u32 {
    let mut table = registry.lock();
    let seq = table.next;
    table.next += 1;
    let entry = Some(Entry { key, seq, known });
    match table.free.pop() {
        Some(i) => {
            table.slots[i as usize] = entry;
            i
        }
        None => {
            table.slots.push(entry);
            // More QPs than a u32 counts cannot be made (each holds memory
            // and a kernel object).
            (table.slots.len() - 1) as u32
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Only this QP's own entry (the index is its own for its life).
        self.ctx
            .qp_registry()
            .lock()
            .leave(self.index, Arc::as_ptr(&self.known));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_and_read() {
        let k = Known::new(QpState::Reset);
        assert_eq!(k.state(), QpState::Reset);
        k.set(QpState::Rts);
        assert_eq!(k.state(), QpState::Rts);
        k.set(QpState::Err);
        assert_eq!(k.state(), QpState::Err);
    }

    #[test]
    fn the_device_is_followed() {
        let k = Known::new(QpState::Rts);
        k.follow_device(|| Some(QpState::Err));
        assert_eq!(k.state(), QpState::Err);
        // A failed query changes nothing.
        k.follow_device(|| None);
        assert_eq!(k.state(), QpState::Err);
    }

    #[test]
    fn a_move_recorded_during_the_query_wins() {
        // The event's query saw ERR, but the owner reset the QP and brought
        // it up meanwhile: the owner's record stands.
        let k = Known::new(QpState::Rts);
        k.follow_device(|| {
            k.set(QpState::Reset);
            k.set(QpState::Rts);
            Some(QpState::Err)
        });
        assert_eq!(k.state(), QpState::Rts);
    }

    #[test]
    fn registry_slots_are_reused_and_the_newest_entry_wins() {
        let r = QpRegistry::default();
        let (a, b, c) = (
            Known::new(QpState::Init),
            Known::new(QpState::Rts),
            Known::new(QpState::Rtr),
        );
        let ia = enter(&r, 16, Arc::as_ptr(&a));
        let ib = enter(&r, 32, Arc::as_ptr(&b));
        assert_ne!(ia, ib);
        assert_eq!(r.len(), 2);
        // `a`'s QP destroyed, its keep not dropped yet, and a new QP at the
        // same address: both entries exist, the newer is the live one.
        let ic = enter(&r, 16, Arc::as_ptr(&c));
        let newest = r.lock().newest(16).map(|e| e.known);
        assert!(newest.is_some_and(|k| std::ptr::eq(k, Arc::as_ptr(&c))));
        // Leaving with another QP's state changes nothing; with its own,
        // frees the slot for the next QP.
        r.lock().leave(ia, Arc::as_ptr(&b));
        assert_eq!(r.len(), 3);
        r.lock().leave(ia, Arc::as_ptr(&a));
        assert_eq!(r.len(), 2);
        let id = enter(&r, 48, Arc::as_ptr(&a));
        assert_eq!(id, ia);
        assert_eq!(r.len(), 3);
        assert_ne!(ic, id);
    }

    #[test]
    fn sends_are_taken_in_rts_to_err_with_the_send_queue_lock_free() {
        let k = Known::new(QpState::Reset);
        for (state, sends) in [
            (QpState::Reset, false),
            (QpState::Init, false),
            (QpState::Rtr, false),
            (QpState::Rts, true),
            (QpState::Sqd, true),
            (QpState::Sqe, true),
            (QpState::Err, true),
            (QpState::Unknown, false),
        ] {
            k.set(state);
            assert_eq!(k.sends(), sends, "{state:?}");
            // A batch's lock refuses every send and survives every move
            // the crate records or reads from the device.
            k.lock_sends();
            assert!(!k.sends() && k.sends_locked(), "{state:?} locked");
            assert_eq!(k.state(), state);
            k.set(QpState::Rts);
            k.follow_device(|| Some(QpState::Sqd));
            assert!(!k.sends() && k.sends_locked(), "{state:?}: the lock stays");
            assert_eq!(k.state(), QpState::Sqd);
            k.unlock_sends();
            assert!(k.sends() && !k.sends_locked());
        }
    }

    #[test]
    fn the_first_failure_is_kept_until_reset() {
        let k = Known::new(QpState::Rts);
        assert_eq!(k.first_failure(), None);
        let flush = sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        let retry = sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR;
        let len = sys::ibv_wc_status::IBV_WC_LOC_LEN_ERR;
        k.note_failure(flush, 1);
        assert_eq!(k.first_failure(), None, "a flush is no first failure");
        k.note_failure(retry, 0);
        k.note_failure(len, 1);
        assert_eq!(k.first_failure(), Some((retry, 0)));
        k.set(QpState::Err);
        assert_eq!(k.first_failure(), Some((retry, 0)));
        k.set(QpState::Reset);
        assert_eq!(k.first_failure(), None);
    }

    #[test]
    fn generations_wrap() {
        let k = Known::new(QpState::Init);
        k.word.store(!(STATE | SEND_LOCKED), Ordering::Relaxed);
        k.set(QpState::Rtr);
        assert_eq!(k.state(), QpState::Rtr);
        assert!(!k.sends_locked());
    }
}

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
//! The state is one atomic word: the state and a generation that every
//! move the crate makes bumps. An event is read by another thread at any
//! later time, possibly after the owner has reset the QP and brought it
//! back up, so it never stores "ERR" blindly: it reads the QP's state from
//! the device (the QP stays alive until the event is acknowledged) and
//! stores what it read only if no move was recorded since it started
//! (compare-and-swap on the word). Whatever it stores was thus the
//! device's state at a moment after the last recorded move.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::QpState;
use crate::context::Context;
use crate::sys;
use crate::users::{Tally, UserKind};

/// The low byte of the word: the state.
const STATE: u64 = 0xff;

/// A QP's known state, shared by the QP, its CM id (for a CM QP) and the
/// context's registry.
pub(crate) struct Known {
    /// `generation << 8 | state`.
    word: AtomicU64,
}

impl Known {
    pub(crate) fn new(state: QpState) -> Arc<Self> {
        Arc::new(Known {
            word: AtomicU64::new(u64::from(state.as_raw()) & STATE),
        })
    }

    /// The known state: one atomic load.
    #[inline]
    pub(crate) fn state(&self) -> QpState {
        let raw = (self.word.load(Ordering::Acquire) & STATE) as u32;
        QpState::from_raw(raw).unwrap_or(QpState::Unknown)
    }

    /// Records a move made by (or proved to) the crate, with a new
    /// generation.
    pub(crate) fn set(&self, state: QpState) {
        let s = u64::from(state.as_raw()) & STATE;
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(((w >> 8).wrapping_add(1) << 8) | s)
            });
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

/// Hashes a registry key, an `ibv_qp` pointer, with a few shifts and
/// multiplications: the keys are addresses malloc handed out, which
/// nobody outside the process chooses, so the default hasher's protection
/// against chosen keys buys nothing here and costs a QP's create and
/// destroy a few hundred instructions (SipHash of the key three times).
#[derive(Default, Clone, Copy)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by the registry (its keys are `usize`), but correct
        // for any input.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        // MurmurHash3's 64-bit finaliser: every input bit reaches every
        // output bit, so aligned addresses a fixed stride apart spread
        // over hashbrown's bucket index (low bits) and tag (high bits).
        let mut x = self.0 ^ v;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        self.0 = x;
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

type QpMap = HashMap<usize, Arc<Known>, BuildHasherDefault<PtrHasher>>;

/// A context's QPs by their `ibv_qp` pointer, for the event delivery.
#[derive(Default)]
pub(crate) struct QpRegistry {
    qps: Mutex<QpMap>,
}

impl QpRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, QpMap> {
        // Only whole inserts and removes happen under the lock.
        self.qps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The event delivery's part: the device raised an event that moves
    /// the live QP `qp` (not acknowledged yet, so not destroyed); if it is
    /// one of this context's, its known state follows the device.
    ///
    /// # Safety
    /// `qp` is a live QP for the whole call.
    pub(crate) unsafe fn device_moved(&self, qp: *mut sys::ibv_qp) {
        let known = self.lock().get(&(qp as usize)).cloned();
        if let Some(known) = known {
            // SAFETY: `qp` is live for the call (the caller's promise).
            known.follow_device(|| unsafe { query_state(qp) });
        }
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
    key: usize,
    known: Arc<Known>,
}

impl Registration {
    /// Enters the QP `qp` of `ctx` with its known state.
    pub(crate) fn new(ctx: &Context, qp: *mut sys::ibv_qp, known: &Arc<Known>) -> Self {
        let key = qp as usize;
        // A stale entry under the same pointer is a destroyed QP's whose
        // keep is not dropped yet: the live QP replaces it.
        ctx.qp_registry().lock().insert(key, Arc::clone(known));
        Registration {
            _tally: Tally::new(ctx.users(), UserKind::QueuePair, 1),
            ctx: ctx.clone(),
            key,
            known: Arc::clone(known),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.ctx.qp_registry().lock();
        // Only this QP's own entry: a new QP may have the same pointer now.
        // One probe of the table (`entry`), not a look-up and a removal.
        if let Entry::Occupied(e) = map.entry(self.key) {
            if Arc::ptr_eq(e.get(), &self.known) {
                e.remove();
            }
        }
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
    fn pointer_keys_spread_over_the_buckets() {
        use std::hash::BuildHasher;
        // malloc'd QPs: 16-byte aligned, a few hundred bytes apart.
        let b = BuildHasherDefault::<PtrHasher>::default();
        let mut low = std::collections::HashSet::new();
        for i in 0..1024usize {
            let h = b.hash_one(0x5555_0000_1000usize + i * 0x1f0);
            low.insert(h & 1023);
        }
        // As a random function would (about 630 of 1024 buckets).
        assert!(low.len() > 550, "{}", low.len());
        let mut m = QpMap::default();
        m.insert(16, Known::new(QpState::Init));
        m.insert(32, Known::new(QpState::Rts));
        assert_eq!(m.get(&32).map(|k| k.state()), Some(QpState::Rts));
        assert!(m.remove(&16).is_some() && !m.contains_key(&16));
    }

    #[test]
    fn generations_wrap() {
        let k = Known::new(QpState::Init);
        k.word.store(!STATE, Ordering::Relaxed);
        k.set(QpState::Rtr);
        assert_eq!(k.state(), QpState::Rtr);
    }
}

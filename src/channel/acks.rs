//! Acknowledging completion events in batches.
//!
//! `ibv_ack_cq_events` takes the CQ's mutex and signals its condition
//! variable (about 90 instructions an event, measured with callgrind in
//! `rc_pingpong -e`); C programs therefore acknowledge several events at
//! once (`ibv_rc_pingpong` all of them at the end). The one rule is that
//! `ibv_destroy_cq` waits until every event libibverbs reported for the CQ
//! was acknowledged: an event read and never acknowledged hangs it.
//!
//! So each CQ created on a channel carries an [`EventAcks`] as its
//! `cq_context`, which `ibv_get_cq_event` hands back with each event:
//! [`CompletionChannel::get_event`](super::CompletionChannel::get_event)
//! counts the event there and acknowledges the count once it reaches
//! [`BATCH`]; the CQ's destruction ([`close`]) acknowledges what is left
//! first.
//!
//! # Why no event is left unacknowledged (no hang)
//!
//! The count and a closing flag share one atomic word. The destroyer
//! sets the flag and takes the count in one `swap`, acknowledges what it
//! took, then calls `ibv_destroy_cq`. A reader adds its event to the count
//! with a compare-and-swap that fails if the word changed since it read
//! it; it reads again and retries. A reader that finds the flag set
//! acknowledges its own event alone; one whose event fills the batch
//! swaps the count to 0 and acknowledges the batch with its event. So
//! every event is acknowledged exactly once: by its reader, by the reader
//! that filled a batch, or by the destroyer's swap.
//!
//! # Why the reader's `EventAcks` is alive
//!
//! Only this crate creates CQs on its channels (a channel's raw pointer is
//! not public), and [`attach`] gives every one of them its `EventAcks`
//! before it can be armed. It is freed only after `ibv_destroy_cq`
//! returned, which is after every reported event was acknowledged. A
//! reader touches the `EventAcks` only while its own event is neither
//! counted nor acknowledged: its last access is the successful
//! compare-and-swap that counts it (after which the destroyer may take
//! and acknowledge it, and the CQ may go at once) or hands it to the
//! reader's own acknowledgement.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

use crate::sys;

/// Events counted before they are acknowledged together.
pub(crate) const BATCH: u32 = 64;

/// The bit of [`EventAcks`]' word that says the CQ's destruction began
/// (events are then acknowledged as they are read); the count below it
/// stays under [`BATCH`].
const CLOSING: u32 = 1 << 31;

/// The events of one CQ read from its channel and not yet acknowledged,
/// and whether its destruction began ([`CLOSING`]), in one word.
#[derive(Default)]
pub(crate) struct EventAcks {
    word: AtomicU32,
}

impl EventAcks {
    /// One event of `cq` was read: counted, or acknowledged with the
    /// batch it fills, or alone once the CQ is closing.
    ///
    /// # Safety
    /// `cq` is the live CQ whose `cq_context` is `self`, with this event
    /// read and neither counted nor acknowledged.
    #[inline]
    unsafe fn read(&self, cq: *mut sys::ibv_cq) {
        // `self` is alive until this event is counted or acknowledged (the
        // module docs): no access to it follows the successful exchange.
        let mut word = self.word.load(SeqCst);
        let n = loop {
            let (next, n) = match word {
                w if w & CLOSING != 0 => break 1,
                w if w + 1 >= BATCH => (0, w + 1),
                w => (w + 1, 0),
            };
            match self.word.compare_exchange_weak(word, next, SeqCst, SeqCst) {
                Ok(_) => break n,
                Err(now) => word = now,
            }
        };
        if n > 0 {
            // SAFETY: `cq` is live until these `n` events (this one among
            // them) are acknowledged; each was read and is acknowledged
            // here only (taken from the count, or never counted).
            unsafe { sys::ibv_ack_cq_events(cq, n) };
        }
    }
}

/// Gives a fresh CQ created on a channel its [`EventAcks`].
///
/// # Safety
/// `cq` is a live CQ owned by the caller, not yet armed, whose
/// `cq_context` nothing else uses.
pub(crate) unsafe fn attach(cq: *mut sys::ibv_cq) {
    let acks = Box::into_raw(Box::<EventAcks>::default());
    // SAFETY: the caller's promise; no event can come before the CQ is
    // armed, so nothing reads the field meanwhile.
    unsafe { (*cq).cq_context = acks.cast::<c_void>() };
}

/// An event `ibv_get_cq_event` just read for `cq`, with its `cq_context`
/// `ctx`: counted, and acknowledged with its batch.
///
/// # Safety
/// `cq` and `ctx` are what `ibv_get_cq_event` of a channel of this crate
/// just returned (see the module docs).
#[inline]
pub(crate) unsafe fn read(cq: *mut sys::ibv_cq, ctx: *mut c_void) {
    match ctx.cast::<EventAcks>().cast_const() {
        // SAFETY: a CQ of a channel without acks (none is made so): the
        // event is acknowledged alone; `cq` is live until then.
        acks if acks.is_null() => unsafe { sys::ibv_ack_cq_events(cq, 1) },
        // SAFETY: the CQ's `EventAcks`, alive until its events are
        // acknowledged (module docs); this event is read and not counted.
        acks => unsafe { (*acks).read(cq) },
    }
}

/// Before `ibv_destroy_cq`: acknowledges every event counted, and has
/// those read from now on acknowledged at once. Returns the `EventAcks`
/// (null for a CQ without a channel), to [`free`] once the CQ is gone.
///
/// # Safety
/// `cq` is a live CQ of this crate, about to be destroyed.
pub(crate) unsafe fn close(cq: *mut sys::ibv_cq) -> *mut EventAcks {
    // SAFETY: a live CQ (the caller).
    let acks = unsafe { (*cq).cq_context }.cast::<EventAcks>();
    if !acks.is_null() {
        // SAFETY: set by `attach`, freed only by `free` after the CQ is
        // destroyed.
        let n = unsafe { &*acks }.word.swap(CLOSING, SeqCst) & !CLOSING;
        if n > 0 {
            // SAFETY: `cq` is live; the swap took these `n` counted events,
            // each read and not yet acknowledged.
            unsafe { sys::ibv_ack_cq_events(cq, n) };
        }
    }
    acks
}

/// Frees what [`close`] returned, once `ibv_destroy_cq` succeeded.
///
/// # Safety
/// `acks` came from [`close`] of a CQ that was then destroyed (no event
/// of it can be read any more), or is null.
pub(crate) unsafe fn free(acks: *mut EventAcks) {
    if !acks.is_null() {
        // SAFETY: made by `attach` with `Box::into_raw`, freed once.
        drop(unsafe { Box::from_raw(acks) });
    }
}

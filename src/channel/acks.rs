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
//! A reader counts (`unacked += 1`), then reads `closing`; the destroyer
//! sets `closing`, then takes the count (`swap(0)`) and acknowledges it,
//! then calls `ibv_destroy_cq`. All four are `SeqCst`, so in their single
//! total order either the reader's count comes before the destroyer's
//! swap (which then takes and acknowledges it) or the destroyer's store
//! comes before the reader's load (and the reader acknowledges its own
//! count at once). Each count is taken by exactly one swap, so each event
//! is acknowledged once.
//!
//! # Why the reader's `EventAcks` is alive
//!
//! Only this crate creates CQs on its channels (a channel's raw pointer is
//! not public), and [`attach`] gives every one of them its `EventAcks`
//! before it can be armed. It is freed only after `ibv_destroy_cq`
//! returned, which is after every reported event, the reader's included,
//! was acknowledged, which the reader does only after its last use of it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

use crate::sys;

/// Events counted before they are acknowledged together.
pub(crate) const BATCH: u32 = 64;

/// The events of one CQ read from its channel and not yet acknowledged.
#[derive(Default)]
pub(crate) struct EventAcks {
    unacked: AtomicU32,
    /// Set once the CQ's destruction began: events are then acknowledged
    /// as they are read.
    closing: AtomicBool,
}

impl EventAcks {
    /// One event of `cq` was read.
    ///
    /// # Safety
    /// `cq` is the live CQ whose `cq_context` is `self`, with this event
    /// read and not yet counted.
    #[inline]
    unsafe fn read(&self, cq: *mut sys::ibv_cq) {
        let n = self.unacked.fetch_add(1, SeqCst) + 1;
        if n >= BATCH || self.closing.load(SeqCst) {
            // SAFETY: the caller's promise.
            unsafe { self.ack_all(cq) };
        }
    }

    /// Acknowledges every event counted so far.
    ///
    /// # Safety
    /// `cq` is the live CQ whose `cq_context` is `self`.
    #[cold]
    unsafe fn ack_all(&self, cq: *mut sys::ibv_cq) {
        let n = self.unacked.swap(0, SeqCst);
        if n > 0 {
            // SAFETY: `cq` is live (the caller); these `n` events were read
            // and counted once each, and the swap took them from the count.
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
        let a = unsafe { &*acks };
        a.closing.store(true, SeqCst);
        // SAFETY: `cq` is live and `a` is its `EventAcks`.
        unsafe { a.ack_all(cq) };
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

//! Completions, device events and connection-manager events on tokio
//! (feature `tokio`, off by default).
//!
//! The crate's event sources are file descriptors: a completion channel
//! (`struct ibv_comp_channel`), the context's async-event descriptor and
//! the CM's event channel. This module registers them with tokio's reactor
//! ([`tokio::io::unix::AsyncFd`]) and offers futures and streams over them:
//!
//! | source | type | waits | stream of |
//! |---|---|---|---|
//! | a CQ with its own completion channel, one consumer | [`AsyncCq`] | [`AsyncCq::poll`] (at least one completion into the caller's buffer) | [`WorkCompletion`](crate::WorkCompletion)s |
//! | a CQ shared by many QPs, one task per QP | [`SharedCq`], [`QpCompletions`] | [`QpCompletions::poll`] (the QP's completions only) | the QP's completions |
//! | the device's async events (`ibv_get_async_event`) | [`AsyncEvents`] | [`AsyncEvents::next`] | [`AsyncEvent`](crate::AsyncEvent)s |
//! | the CM's event channel (`cm` feature) | [`AsyncCmChannel`] | `connect`, `accept`, `resolve_addr`, `resolve_route`, per-id events | [`CmEvent`](crate::cm::CmEvent)s |
//!
//! Completions come back as the same [`WorkCompletion`](crate::WorkCompletion)s
//! as from [`CompletionQueue::poll`](crate::CompletionQueue::poll), and the
//! requests' buffers come back through the same
//! [`QueuePair::reclaim`](crate::QueuePair::reclaim) family: nothing about
//! posting or reclaiming changes.
//!
//! # Arming, and the race it must not lose
//!
//! A CQ signals its channel only once per `ibv_req_notify_cq`, and only
//! for a completion that arrives *after* the request. A completion that
//! arrived between the last empty poll and the request would wait forever
//! if the waiter went to sleep then. Every wait here is therefore: poll;
//! if empty, arm (`ibv_req_notify_cq`); poll again; only if that is empty
//! too, sleep on the descriptor. Whatever arrived before the arm is found by
//! the second poll, whatever arrives after it makes the descriptor readable.
//! Events are read without blocking and acknowledged in the CQ's batches
//! (`ibv_ack_cq_events` takes a mutex; the CQ cannot be destroyed with
//! events unacknowledged, so its destruction acknowledges the rest first:
//! `src/channel/acks.rs`).
//!
//! # Cancellation
//!
//! Every future here may be dropped at any await point without losing a
//! completion or an event: each waits only for readiness (or, for
//! [`QpCompletions`], for a notification), and whatever it read from the
//! device it either returned in the same poll or left in a queue that the
//! next call reads first. Each method's docs say so again; the device
//! tests drop futures at every await point and check that the completion
//! is still delivered.
//!
//! # Runtime
//!
//! Constructors register a descriptor with the tokio runtime they are
//! called in, and fail with [`crate::Error::InvalidArgument`]
//! outside one. The runtime must have its I/O driver enabled
//! (`enable_io`/`enable_all`), as for any tokio socket. The types are
//! `Send`, so tasks on a multi-threaded runtime may own them.

#[cfg(feature = "cm")]
mod cm;
mod cq;
mod events;
mod shared;

#[cfg(feature = "cm")]
pub use cm::{AsyncCmChannel, CmEvents};
pub use cq::AsyncCq;
pub use events::AsyncEvents;
pub use shared::{QpCompletions, SharedCq};

use std::os::fd::AsRawFd;

use ::tokio::io::unix::AsyncFd;
use ::tokio::io::Interest;

use crate::error::{Error, Result};

/// The crate's objects whose descriptor tokio may watch: each owns its
/// descriptor (through a handle that keeps the object alive), which stays
/// open and the same for as long as the value lives.
///
/// # Safety
/// `as_raw_fd` returns an open descriptor, the same one every time, that
/// stays open for as long as the value lives.
unsafe trait OwnsFd: AsRawFd {}

// SAFETY: the channel's descriptor is set at creation, never changes, and
// is closed only when the last handle (this one among them) is dropped.
unsafe impl OwnsFd for crate::CompletionChannel {}

/// Registers `inner`'s descriptor with the current runtime's reactor for
/// reading; a typed error outside a runtime or when the reactor refuses.
fn register<T: OwnsFd>(inner: T, verb: &'static str) -> Result<AsyncFd<T>> {
    in_runtime(verb)?;
    // SAFETY: `T: OwnsFd`: the descriptor is open, stays open and the same
    // while the `AsyncFd` owns `inner`, which is never swapped out.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| {
        let (_, e) = e.into_parts();
        io_error("epoll_ctl", &e)
    })
}

/// Refuses (typed, on behalf of `verb`) to go on outside a tokio runtime:
/// what constructors check before they create anything.
fn in_runtime(verb: &'static str) -> Result<()> {
    match ::tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::invalid(
            verb,
            "not called from within a tokio runtime (AsyncFd needs its reactor)",
        )),
    }
}

/// An `io::Error` from the reactor as the crate's error.
fn io_error(verb: &'static str, e: &std::io::Error) -> Error {
    Error::Verb {
        verb,
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// Clears the `O_NONBLOCK` that `set_nonblocking` set (best effort: on
/// the way out of a failed constructor).
fn restore_blocking(fd: std::os::fd::RawFd) {
    let _ = crate::fd::set_nonblocking(fd, false);
}

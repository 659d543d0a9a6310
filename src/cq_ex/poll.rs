//! Polling: [`CompletionQueueEx::start_poll`] and the batch it opens,
//! [`CqPoll`] (between `ibv_start_poll` and `ibv_end_poll`), a lending
//! iterator over the CQ's completions, with the rxe rule of when
//! `ibv_end_poll` is due and the refusal after a leaked batch.

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;

use super::{last_errno, CompletionQueueEx, FieldSet, PolledWc};
use crate::error::{Error, Result};
use crate::sys;

/// The errno of a poll verb's result: `None` for 0; the value itself when
/// positive (rxe and mlx5 return `ENOENT`), `errno` for -1, `-rc` otherwise.
fn poll_errno(rc: c_int) -> Option<i32> {
    match rc {
        0 => None,
        1.. => Some(rc),
        -1 => Some(last_errno()),
        _ => Some(-rc),
    }
}

impl<F: FieldSet> CompletionQueueEx<F> {
    /// Opens a batch (`ibv_start_poll`): `None` when the CQ is empty
    /// (`ENOENT`; nothing to end), else a batch whose first
    /// [`next`](CqPoll::next) yields the completion found.
    ///
    /// # Errors
    /// A batch that was leaked while open (`std::mem::forget` of a
    /// [`CqPoll`]) left the provider's CQ lock held, so another
    /// `ibv_start_poll` would spin forever: then this is refused with
    /// [`Error::GuardLeaked`], now and for good (the CQ can only be closed,
    /// once its queue pairs are gone). [`Error::Verb`] when
    /// `ibv_start_poll` fails otherwise than with `ENOENT`.
    #[doc(alias = "ibv_start_poll")]
    #[inline]
    pub fn start_poll(&mut self) -> Result<Option<CqPoll<'_, F>>> {
        if self.open {
            return Err(leaked_poll());
        }
        let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
        // A live extended CQ whose start_poll the provider set (checked in
        // `build`); `attr` asks for nothing; no batch is open (a live
        // `CqPoll` borrows `self` mutably until it has ended its batch; a
        // leaked one left `open` set, which refused above).
        // SAFETY: see above.
        let rc = unsafe { sys::ibv_start_poll(self.raw.as_ptr(), &mut attr) };
        match poll_errno(rc) {
            None => {
                self.open = true;
                Ok(Some(CqPoll {
                    cq: self,
                    state: Batch::First,
                    _not_send: PhantomData,
                }))
            }
            Some(libc::ENOENT) => Ok(None),
            Some(errno) => Err(Error::Verb {
                verb: "ibv_start_poll",
                errno,
            }),
        }
    }
}

/// Where a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// `ibv_start_poll` found a completion that `next` has not yielded.
    First,
    /// `next` yielded the current completion.
    Current,
    /// The CQ had no more (or `ibv_next_poll` failed); `next` calls nothing.
    /// `released`: the provider ended the batch itself (rxe's `ENOENT`
    /// before rdma-core 55), so `ibv_end_poll` must not be called.
    Over { released: bool },
}

/// An open batch of an extended CQ (between `ibv_start_poll` and
/// `ibv_end_poll`): a lending iterator over its completions.
///
/// Dropping it (or [`end`](Self::end)) ends the batch. It holds the
/// provider's CQ lock, so it is neither `Send` nor `Sync`.
///
/// Leaking it (`std::mem::forget`) before the provider ended the batch
/// keeps that lock held for good: the CQ remembers it, and every later
/// [`start_poll`](CompletionQueueEx::start_poll) is refused with
/// [`Error::GuardLeaked`] instead of spinning forever. On rxe before
/// rdma-core 59 a batch that [`next`](Self::next) ran to its end holds no
/// lock any more, so leaking it then holds nothing (from 55 its last
/// completion, which the `ibv_end_poll` it missed would have consumed,
/// comes again in the next batch, and ends nothing there). Some providers
/// (mlx5) also take the CQ's lock when a QP using the CQ is moved to RESET
/// or destroyed: there, after such a leak, those calls would wait forever;
/// rxe's do not take it.
#[doc(alias = "ibv_start_poll")]
pub struct CqPoll<'c, F: FieldSet> {
    cq: &'c mut CompletionQueueEx<F>,
    state: Batch,
    _not_send: PhantomData<*const ()>,
}

impl<F: FieldSet> CqPoll<'_, F> {
    /// The next completion: the first call yields the one `ibv_start_poll`
    /// found, later ones call `ibv_next_poll`. `None` once the CQ is empty
    /// (and from then on, without calling anything).
    ///
    /// The completion borrows the batch, so it is gone before the next call.
    ///
    /// # Errors
    /// [`Error::Verb`] when `ibv_next_poll` fails otherwise than with
    /// `ENOENT`; the batch is over then (later calls answer `None`).
    #[doc(alias = "ibv_next_poll")]
    #[allow(clippy::should_implement_trait)] // a lending iterator: no `Iterator`
    #[inline]
    pub fn next(&mut self) -> Result<Option<PolledWc<'_, F>>> {
        match self.state {
            Batch::First => self.state = Batch::Current,
            Batch::Current => {
                // The batch is open (start_poll succeeded and neither
                // end_poll nor a final next_poll has run); the provider set
                // next_poll (checked in `build`). No `PolledWc` of the
                // batch is alive (they borrow `self`).
                // SAFETY: an open batch of a live CQ (above).
                let rc = unsafe { sys::ibv_next_poll(self.cq.raw.as_ptr()) };
                match poll_errno(rc) {
                    None => {}
                    Some(libc::ENOENT) => {
                        self.state = Batch::Over {
                            released: self.cq.enoent_ends,
                        };
                        // rxe before 59 released its lock: a leak from here
                        // on holds none.
                        self.cq.open = !self.cq.enoent_unlocks;
                        return Ok(None);
                    }
                    Some(errno) => {
                        self.state = Batch::Over { released: false };
                        return Err(Error::Verb {
                            verb: "ibv_next_poll",
                            errno,
                        });
                    }
                }
            }
            Batch::Over { .. } => return Ok(None),
        }
        Ok(Some(PolledWc {
            cq: self.cq.raw,
            _batch: PhantomData,
            _f: PhantomData,
        }))
    }

    /// Ends the batch now (what dropping it does).
    #[doc(alias = "ibv_end_poll")]
    pub fn end(self) {}
}

/// The refusal of `ibv_start_poll` on a CQ whose batch was leaked open.
#[cold]
#[inline(never)]
fn leaked_poll() -> Error {
    Error::GuardLeaked {
        verb: "ibv_start_poll",
        guard: "a CqPoll of this CQ",
        lock: "the CQ's lock (ibv_start_poll without ibv_end_poll)",
        can: "the CQ can no longer be polled; close it once no queue pair uses it",
    }
}

impl<F: FieldSet> Drop for CqPoll<'_, F> {
    fn drop(&mut self) {
        self.cq.open = false;
        if self.state != (Batch::Over { released: true }) {
            // SAFETY: the batch is open and this ends it, once (see the
            // module docs for rxe, where an ENOENT of next_poll already
            // ended it and `released` skips this).
            unsafe { sys::ibv_end_poll(self.cq.raw.as_ptr()) }
        }
    }
}

impl<F: FieldSet> fmt::Debug for CqPoll<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqPoll")
            .field("cq", &self.cq)
            .field("state", &self.state)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_results_decode_every_convention() {
        assert_eq!(poll_errno(0), None);
        assert_eq!(poll_errno(libc::ENOENT), Some(libc::ENOENT));
        assert_eq!(poll_errno(-libc::ENOENT), Some(libc::ENOENT));
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EIO };
        assert_eq!(poll_errno(-1), Some(libc::EIO));
    }
}

//! Waiting on several of the crate's event sources in one thread, without
//! an async runtime: `poll(2)` over borrowed descriptors.
//!
//! Completion channels ([`CompletionChannel`](crate::CompletionChannel)),
//! a context's async events ([`Context`](crate::Context)) and the CM's
//! event channel (`cm::EventChannel`) are all [`AsFd`]. A [`Poller`]
//! borrows any number of them and waits until one is readable; the caller
//! then reads that source without blocking (a completion channel made
//! non-blocking with [`set_nonblocking`](crate::CompletionChannel::set_nonblocking)
//! answers `EAGAIN` when empty; `EventChannel::try_get_event` returns `None`).
//!
//! A server that accepts CM connections and serves their completions in
//! one thread, with no lock and no second thread (with several
//! connections, [`cm::CmRouter`](crate::cm::CmRouter) and
//! [`CqRouter`](crate::CqRouter) hand each its own events and completions:
//! `examples/sync_echo.rs`):
//!
//! ```no_run
//! # #[cfg(feature = "cm")]
//! # fn f() -> rdma_verbs::Result<()> {
//! use std::time::Duration;
//! use rdma_verbs::cm::{EventChannel, PortSpace};
//! use rdma_verbs::wait::Poller;
//! use rdma_verbs::{CompletionChannel, Context, WorkCompletion};
//!
//! let ctx = Context::open_first()?;
//! let comp = CompletionChannel::new(&ctx)?;
//! comp.set_nonblocking(true)?;
//! let cq = ctx.create_cq_with_channel(1024, &comp, 0)?;
//! cq.req_notify(false)?;
//! let cm = EventChannel::new()?;
//! let listener = cm.create_id(PortSpace::Tcp)?;
//! listener.bind("0.0.0.0:7471".parse().unwrap())?;
//! listener.listen(64)?;
//!
//! let mut poller = Poller::new();
//! let (on_cm, on_cq) = (poller.add(&cm), poller.add(&comp));
//! loop {
//!     for ready in poller.wait(Some(Duration::from_secs(1)))? {
//!         if ready == on_cm {
//!             while let Some(event) = cm.try_get_event()? {
//!                 println!("CM: {}", event.kind()); // accept, disconnect, ...
//!             }
//!         } else if ready == on_cq {
//!             while comp.get_event().is_ok() {} // EAGAIN ends it
//!             cq.req_notify(false)?; // re-arm, then drain
//!             let mut wcs = [WorkCompletion::default(); 32];
//!             while !cq.poll(&mut wcs)?.is_empty() { /* reclaim on the QPs */ }
//!         }
//!     }
//! }
//! # }
//! ```

use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A set of borrowed descriptors to wait on together (`poll(2)`).
///
/// The borrows keep every source alive and open while the poller holds
/// it. Sources are numbered in the order [`add`](Self::add) was called.
#[doc(alias = "poll")]
#[derive(Debug, Default)]
pub struct Poller<'a> {
    fds: Vec<libc::pollfd>,
    _borrows: PhantomData<BorrowedFd<'a>>,
}

// SAFETY: `pollfd`s are plain integers; the borrowed descriptors they name
// are kept open by the `'a` borrows, which may be used from any thread.
unsafe impl Send for Poller<'_> {}
// SAFETY: `&Poller` only reads the integers.
unsafe impl Sync for Poller<'_> {}

impl<'a> Poller<'a> {
    /// An empty set.
    pub fn new() -> Self {
        Poller::default()
    }

    /// Adds `source` (readability) and returns its number.
    pub fn add(&mut self, source: &'a impl AsFd) -> usize {
        self.fds.push(libc::pollfd {
            fd: source.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.fds.len() - 1
    }

    /// How many sources the set has.
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// Whether the set has no sources.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }

    /// Waits until at least one source is readable (or has an error or
    /// hang-up, which its next read reports), or `timeout` passes (`None`:
    /// no limit). Returns the numbers of the ready sources, in order:
    /// empty when the time ran out. A signal does not end the wait early.
    ///
    /// An empty set waits out the timeout; with no timeout it is refused
    /// ([`Error::InvalidArgument`]) rather than waiting forever.
    #[doc(alias = "poll")]
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Ready<'_>> {
        if self.fds.is_empty() && timeout.is_none() {
            return Err(Error::invalid(
                "poll",
                "no sources to wait on, and no timeout: the wait would never end",
            ));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        for p in &mut self.fds {
            p.revents = 0;
        }
        loop {
            let ms = match (timeout, deadline) {
                (None, _) | (Some(_), None) => -1,
                (Some(_), Some(d)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Rounded up, so that a short wait is not a busy loop.
                    i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
                }
            };
            let n = libc::nfds_t::try_from(self.fds.len()).unwrap_or(libc::nfds_t::MAX);
            // SAFETY: `fds` holds `n` valid pollfds naming descriptors kept
            // open by the poller's borrows.
            let rc = unsafe { libc::poll(self.fds.as_mut_ptr(), n, ms) };
            if rc >= 0 {
                return Ok(Ready {
                    fds: &self.fds,
                    next: 0,
                });
            }
            let errno = crate::error::last_errno(libc::EINVAL);
            if errno != libc::EINTR {
                return Err(Error::Verb {
                    verb: "poll",
                    errno,
                });
            }
        }
    }
}

/// The numbers of the sources a [`Poller::wait`] found ready.
#[derive(Debug)]
pub struct Ready<'p> {
    fds: &'p [libc::pollfd],
    next: usize,
}

impl Iterator for Ready<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.next < self.fds.len() {
            let i = self.next;
            self.next += 1;
            if self.fds[i].revents != 0 {
                return Some(i);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn ready_sources_are_named_and_a_timeout_is_empty() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let (c, _d) = UnixStream::pair().unwrap();
        let mut p = Poller::new();
        let (ia, ic) = (p.add(&a), p.add(&c));
        assert_eq!((ia, ic), (0, 1));
        let t = Instant::now();
        assert_eq!(p.wait(Some(Duration::from_millis(30))).unwrap().count(), 0);
        assert!(t.elapsed() >= Duration::from_millis(30));
        b.write_all(b"x").unwrap();
        let ready: Vec<usize> = p.wait(None).unwrap().collect();
        assert_eq!(ready, vec![0]);
    }

    #[test]
    fn an_empty_set_without_timeout_is_refused() {
        let mut p = Poller::new();
        assert!(matches!(p.wait(None), Err(Error::InvalidArgument { .. })));
        assert_eq!(p.wait(Some(Duration::ZERO)).unwrap().count(), 0);
    }
}

//! The event channel (`struct rdma_event_channel`): where CM events arrive.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::addr::PortSpace;
use super::event::{CmEvent, CmEventKind};
use super::id::CmId;
use crate::error::{check_ptr, Error, Result};
use crate::sys;

/// The channel and the lock that serialises librdmacm's use of its ids.
pub(crate) struct ChannelInner {
    raw: NonNull<sys::rdma_event_channel>,
    /// Held around every librdmacm call that reads or writes the fields of
    /// this channel's ids (see the module docs of [`crate::cm`]).
    lock: Mutex<()>,
    /// Whether the last read found an event (more may be queued): then the
    /// next read tries at once; otherwise it waits in poll(2) first, which
    /// saves a failing `rdma_get_cm_event` per wait.
    busy: AtomicBool,
}

// SAFETY: the channel is a file descriptor in a malloc'd struct that
// librdmacm never writes after creation; every call that touches the
// state of the channel's ids runs under `lock`.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl ChannelInner {
    pub(crate) fn as_ptr(&self) -> *mut sys::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// Takes the channel's lock. A thread that panicked while holding it
    /// left no librdmacm call half done (the calls do not unwind), so a
    /// poisoned lock is taken as it is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is set at creation and never changes.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // Every id holds the channel, so none is left when this runs.
        // SAFETY: the channel is live and destroyed once, here.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

/// An event channel (`struct rdma_event_channel`): the file descriptor on
/// which the events of its [`CmId`]s arrive.
///
/// It can be read blocking ([`get_event`](Self::get_event)), with a
/// deadline ([`get_event_timeout`](Self::get_event_timeout)) or without
/// waiting ([`try_get_event`](Self::try_get_event)), and polled with
/// `poll(2)`/`epoll(7)` through [`AsFd`]. Cloning shares the channel.
///
/// ```no_run
/// use rdma_verbs::cm::{EventChannel, PortSpace};
/// let ch = EventChannel::new()?;
/// let listener = ch.create_id(PortSpace::Tcp)?;
/// listener.bind("0.0.0.0:7471".parse().unwrap())?;
/// listener.listen(16)?;
/// let event = ch.get_event()?;
/// println!("{}", event.kind());
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "rdma_event_channel")]
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl EventChannel {
    /// Opens an event channel (`/dev/infiniband/rdma_cm`).
    ///
    /// Fails with `ENODEV` when the system has no RDMA device.
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Self> {
        // SAFETY: no arguments; returns a fresh channel or NULL with errno.
        let raw = check_ptr("rdma_create_event_channel", unsafe {
            sys::rdma_create_event_channel()
        })?;
        let inner = Arc::new(ChannelInner {
            raw,
            lock: Mutex::new(()),
            busy: AtomicBool::new(false),
        });
        // Waiting happens in poll(2), never inside rdma_get_cm_event with
        // the lock held.
        let fd = inner.fd();
        crate::fd::set_nonblocking(fd, true)?;
        Ok(EventChannel { inner })
    }

    /// Creates an id in `ps` whose events arrive on this channel.
    #[doc(alias = "rdma_create_id")]
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId> {
        CmId::new(&self.inner, ps)
    }

    /// Waits for the next event.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            if let Some(event) = self.next(None)? {
                return Ok(event);
            }
        }
    }

    /// The next event if one is waiting, without blocking.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        self.next(Some(Duration::ZERO))
    }

    /// Waits up to `timeout` for the next event; `None` if none came.
    ///
    /// A `timeout` that runs past what the clock can represent (such as
    /// `Duration::MAX`) waits without limit, as [`get_event`](Self::get_event).
    #[doc(alias = "rdma_get_cm_event")]
    pub fn get_event_timeout(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        self.next(Some(timeout))
    }

    /// Waits up to `timeout` for the next event and checks that it is a
    /// `kind` event with status 0: the usual step of a client or server
    /// written in sequence.
    ///
    /// Anything else is an [`Error::CmEvent`] naming the event awaited and
    /// the one that came, with its status (an errno for the error events, a
    /// reject reason for [`CmEventKind::Rejected`]); no event in time is
    /// [`Error::Timeout`]. The event that came is acknowledged either way.
    /// A `timeout` past what the clock can represent waits without limit
    /// (see [`get_event_timeout`](Self::get_event_timeout)).
    pub fn expect(&self, kind: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        match self.get_event_timeout(timeout)? {
            None => Err(Error::Timeout {
                what: kind.c_name(),
                waited: timeout,
            }),
            Some(event) if event.kind() == kind && event.status() == 0 => Ok(event),
            Some(event) => Err(event.unexpected(kind)),
        }
    }

    fn next(&self, wait: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = wait.and_then(deadline_after);
        let mut try_first = self.inner.busy.load(Ordering::Relaxed) || wait == Some(Duration::ZERO);
        loop {
            if try_first {
                if let Some(event) = self.read_one()? {
                    self.inner.busy.store(true, Ordering::Relaxed);
                    return Ok(Some(event));
                }
                self.inner.busy.store(false, Ordering::Relaxed);
            }
            try_first = true;
            if !self.wait_readable(deadline)? {
                return Ok(None);
            }
        }
    }

    /// Waits in `poll(2)` until the descriptor is readable (true), an
    /// interrupting signal came (true: the caller looks again), or
    /// `deadline` passed (false; `None` waits without limit).
    pub(crate) fn wait_readable(&self, deadline: Option<Instant>) -> Result<bool> {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                // Round up so that a short wait is not a busy loop.
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd: self.inner.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the channel's open descriptor.
        let rc = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if rc < 0 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            if errno != libc::EINTR {
                return poll_failed(errno);
            }
        }
        Ok(true)
    }

    /// One `rdma_get_cm_event` on the non-blocking descriptor, under the lock.
    pub(crate) fn read_one(&self) -> Result<Option<CmEvent>> {
        let guard = self.inner.lock();
        loop {
            let mut raw: *mut sys::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: the channel is live; `raw` is a valid out-pointer. The
            // lock is held, so librdmacm's processing of the event (which
            // writes the id's fields and may modify its QP) runs alone.
            let rc = unsafe { sys::rdma_get_cm_event(self.inner.as_ptr(), &mut raw) };
            if rc != 0 {
                let errno = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL);
                if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK {
                    return Ok(None);
                }
                return Err(Error::Verb {
                    verb: "rdma_get_cm_event",
                    errno,
                });
            }
            let Some(raw) = NonNull::new(raw) else {
                continue;
            };
            // SAFETY: `raw` is a fresh event from this channel, not yet
            // acknowledged; the lock is held.
            if let Some(event) = unsafe { CmEvent::wrap(&self.inner, raw, &guard) } {
                return Ok(Some(event));
            }
            // An event for an id that is being destroyed: acknowledged and
            // dropped by `wrap`; read on.
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel (and so `self`) lives.
        unsafe { BorrowedFd::borrow_raw(self.inner.fd()) }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd()
    }
}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.fd())
            .finish()
    }
}

/// The instant `wait` from now, or `None` (no deadline: wait without
/// limit) when it is past what `Instant` can represent, such as
/// `Duration::MAX`: never an overflow panic.
pub(crate) fn deadline_after(wait: Duration) -> Option<Instant> {
    Instant::now().checked_add(wait)
}

#[cold]
fn poll_failed(errno: i32) -> Result<bool> {
    Err(Error::Verb {
        verb: "poll",
        errno,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_of_any_wait_does_not_overflow() {
        assert!(deadline_after(Duration::MAX).is_none());
        assert!(deadline_after(Duration::new(u64::MAX, 999_999_999)).is_none());
        let soon = deadline_after(Duration::from_secs(1)).expect("1 s from now");
        assert!(soon > Instant::now());
        assert!(deadline_after(Duration::ZERO).is_some());
    }
}

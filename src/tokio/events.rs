//! [`AsyncEvents`]: the device's asynchronous events on tokio.

use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use ::tokio::io::unix::AsyncFd;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::event::AsyncEvent;

/// The context's async-event descriptor, kept open by the context.
struct EventFd(Context);

// SAFETY: the context's descriptor is set when it is opened, never changes,
// and is closed only when its last handle (this one among them) is dropped.
unsafe impl super::OwnsFd for EventFd {}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The asynchronous events of a device (`ibv_get_async_event`) as a
/// [`Stream`](futures_core::Stream), or one at a time with
/// [`next`](Self::next): port changes, QP and CQ errors, SRQ limits, as
/// the typed [`AsyncEvent`].
///
/// Each event is read and acknowledged as
/// [`Context::get_async_event`] does (including what it records about a
/// QP that an event moved to ERR). Creating one makes the context's
/// async-event descriptor non-blocking: a blocking
/// [`Context::get_async_event`] on the same context (or a clone) then
/// answers `EAGAIN` instead of waiting. One `AsyncEvents` per context at a
/// time: the reactor refuses a descriptor registered twice (a typed
/// error, `EEXIST`).
///
/// ```no_run
/// # async fn f() -> rdma_verbs::Result<()> {
/// use rdma_verbs::tokio::AsyncEvents;
/// use rdma_verbs::{AsyncEvent, Context};
/// let ctx = Context::open_first()?;
/// let mut events = AsyncEvents::new(&ctx)?;
/// loop {
///     match events.next().await? {
///         AsyncEvent::Port { event, port } => println!("port {port}: event {event}"),
///         other => println!("{other:?}"),
///     }
/// }
/// # }
/// ```
#[doc(alias = "ibv_get_async_event")]
pub struct AsyncEvents {
    fd: AsyncFd<EventFd>,
}

impl AsyncEvents {
    /// Registers `ctx`'s async-event descriptor with the current tokio
    /// runtime (and makes it non-blocking).
    pub fn new(ctx: &Context) -> Result<Self> {
        super::in_runtime("ibv_get_async_event")?;
        let raw = ctx.as_raw_fd();
        let was = crate::fd::set_nonblocking(raw, true)?;
        match super::register(EventFd(ctx.clone()), "ibv_get_async_event") {
            Ok(fd) => Ok(AsyncEvents { fd }),
            Err(e) => {
                // Refused: the descriptor is left as it was.
                if !was {
                    super::restore_blocking(raw);
                }
                Err(e)
            }
        }
    }

    /// Waits for the next event, reads and acknowledges it.
    ///
    /// Cancel safe: the future waits only for readiness, and an event read
    /// is returned in the same step.
    #[doc(alias = "ibv_get_async_event")]
    pub async fn next(&mut self) -> Result<AsyncEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next event if one is pending, without waiting.
    pub fn try_next(&mut self) -> Result<Option<AsyncEvent>> {
        read(&self.fd.get_ref().0)
    }

    fn poll_event(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<AsyncEvent>> {
        loop {
            let mut guard = match self.fd.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(super::io_error("epoll_wait", &e))),
                Poll::Ready(Ok(guard)) => guard,
            };
            match read(&guard.get_inner().0) {
                Ok(Some(event)) => return Poll::Ready(Ok(event)),
                Ok(None) => guard.clear_ready(),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// One event without blocking: `None` on `EAGAIN`.
fn read(ctx: &Context) -> Result<Option<AsyncEvent>> {
    match ctx.get_async_event() {
        Ok(event) => Ok(Some(event)),
        Err(Error::Verb { errno, .. }) if errno == libc::EAGAIN => Ok(None),
        Err(e) => Err(e),
    }
}

impl futures_core::Stream for AsyncEvents {
    type Item = Result<AsyncEvent>;

    /// The next event; the stream never ends (errors are items).
    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx).map(Some)
    }
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.fd.get_ref().0.name())
            .finish()
    }
}

//! [`AsyncCmChannel`]: the connection manager's events on tokio, and its
//! steps (resolve, connect, accept) as `async fn`s.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use ::tokio::io::unix::AsyncFd;
use ::tokio::sync::Notify;

use crate::cm::route::Want;
use crate::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventsOf, Kept, PortSpace};
use crate::error::{Error, Result};

/// The channel's descriptor, kept open by the channel.
struct ChanFd(EventChannel);

// SAFETY: the channel's descriptor is set when it is opened, never changes,
// and is closed only when its last handle (this one among them) is dropped.
unsafe impl super::OwnsFd for ChanFd {}

impl AsRawFd for ChanFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A CM event channel on tokio: its events as a
/// [`Stream`](futures_core::Stream) ([`events`](Self::events)), the events
/// of one id ([`next_event_for`](Self::next_event_for)), and the CM's
/// steps as `async fn`s that start the step and wait for its event:
/// [`resolve_addr`](Self::resolve_addr), [`resolve_route`](Self::resolve_route),
/// [`connect`](Self::connect), [`get_request`](Self::get_request),
/// [`accept`](Self::accept), [`disconnect`](Self::disconnect).
///
/// Many tasks may wait on one channel at once, each for its own id: an
/// event read by one task for another id is kept for that id's waiter
/// (and the waiter woken), so a server can run one task per connection
/// on the listener's channel, which is where the CM delivers the events
/// of every connection the listener accepted. Events kept for an id that
/// no handle refers to any more are acknowledged and dropped.
///
/// ```no_run
/// # async fn f() -> rdma_verbs::Result<()> {
/// use std::time::Duration;
/// use rdma_verbs::cm::{ConnParam, PortSpace};
/// use rdma_verbs::tokio::AsyncCmChannel;
/// let ch = AsyncCmChannel::new()?;
/// let id = ch.create_id(PortSpace::Tcp)?;
/// let timeout = Duration::from_secs(2);
/// ch.resolve_addr(&id, None, "10.0.0.2:7471".parse().unwrap(), timeout).await?;
/// ch.resolve_route(&id, timeout).await?;
/// // ... id.create_qp(...) ...
/// ch.connect(&id, &ConnParam::default()).await?; // ESTABLISHED: the QP is in RTS
/// # Ok(()) }
/// ```
///
/// Cloning shares the channel. Threads: `Send` and `Sync`.
#[doc(alias = "rdma_event_channel")]
#[doc(alias = "rdma_get_cm_event")]
#[derive(Clone)]
pub struct AsyncCmChannel {
    inner: Arc<Inner>,
}

struct Inner {
    fd: AsyncFd<ChanFd>,
    /// Events read for another waiter than the reader, oldest first (the
    /// routing core [`CmRouter`](crate::cm::CmRouter) shares).
    kept: Mutex<Kept>,
    /// Woken (all waiters) whenever an event is kept.
    kept_changed: Notify,
}

impl AsyncCmChannel {
    /// Opens an event channel and registers it with the current tokio
    /// runtime (typed errors: no runtime; no RDMA device, `ENODEV`).
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Self> {
        super::in_runtime("rdma_create_event_channel")?;
        Self::from_channel(EventChannel::new()?)
    }

    /// Registers an existing channel with the current tokio runtime. Its
    /// events should then be read only through the returned value (a
    /// blocking read elsewhere would take events a waiter here expects).
    pub fn from_channel(channel: EventChannel) -> Result<Self> {
        let fd = super::register(ChanFd(channel), "rdma_create_event_channel")?;
        Ok(AsyncCmChannel {
            inner: Arc::new(Inner {
                fd,
                kept: Mutex::new(Kept::default()),
                kept_changed: Notify::new(),
            }),
        })
    }

    /// The channel.
    pub fn channel(&self) -> &EventChannel {
        &self.inner.fd.get_ref().0
    }

    /// Creates an id in `ps` whose events arrive on this channel.
    #[doc(alias = "rdma_create_id")]
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId> {
        self.channel().create_id(ps)
    }

    /// Waits for the next event of the channel, for any id (events kept
    /// for a waiter come first, oldest first).
    ///
    /// Cancel safe: the future holds no event while it waits; an event it
    /// reads is returned or kept in the same step.
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn next_event(&self) -> Result<CmEvent> {
        self.next_matching(Want::Any).await
    }

    /// Waits for the next event of `of`: one id's, a listener's and the
    /// ids' taken from its requests, or any ([`EventsOf`], the same
    /// routing as [`CmRouter::next`](crate::cm::CmRouter::next)). Events
    /// for others read meanwhile are kept for their waiters. Cancel safe,
    /// as [`next_event`](Self::next_event).
    ///
    /// Fails with [`Error::InvalidArgument`] when the id is not on this channel.
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn next_event_of(&self, of: EventsOf<'_>) -> Result<CmEvent> {
        of.check(self.channel())?;
        self.next_matching(of.want()).await
    }

    /// Waits for the next event for `id` (for a listener: its connection
    /// requests). Events for other ids read meanwhile are kept for their
    /// waiters. Cancel safe, as [`next_event`](Self::next_event).
    ///
    /// Fails with [`Error::InvalidArgument`] when `id` is not on this channel.
    pub async fn next_event_for(&self, id: &CmId) -> Result<CmEvent> {
        self.check(id, "rdma_get_cm_event")?;
        self.next_matching(Want::Id(id.key())).await
    }

    /// Waits for the next event for `id` and checks that it is a `kind`
    /// event with status 0; anything else is an [`Error::CmEvent`] naming
    /// both (the event is acknowledged either way), as
    /// [`EventChannel::expect`] does. Cancel safe.
    pub async fn expect(&self, id: &CmId, kind: CmEventKind) -> Result<CmEvent> {
        let event = self.next_event_for(id).await?;
        if event.kind() == kind && event.status() == 0 {
            Ok(event)
        } else {
            Err(event.unexpected(kind))
        }
    }

    /// Resolves `dst` ([`CmId::resolve_addr`]) and waits for
    /// `ADDR_RESOLVED`; `ADDR_ERROR` (after `timeout`, `-ETIMEDOUT`) is an
    /// [`Error::CmEvent`].
    ///
    /// Dropping the future after the resolution started leaves its event
    /// to be read by the next wait for `id`.
    #[doc(alias = "rdma_resolve_addr")]
    pub async fn resolve_addr(
        &self,
        id: &CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        self.check(id, "rdma_resolve_addr")?;
        id.resolve_addr(src, dst, timeout)?;
        self.expect(id, CmEventKind::AddrResolved).await.map(drop)
    }

    /// Resolves the route ([`CmId::resolve_route`]) and waits for
    /// `ROUTE_RESOLVED`. Dropping the future leaves the event to the next
    /// wait for `id`.
    #[doc(alias = "rdma_resolve_route")]
    pub async fn resolve_route(&self, id: &CmId, timeout: Duration) -> Result<()> {
        self.check(id, "rdma_resolve_route")?;
        id.resolve_route(timeout)?;
        self.expect(id, CmEventKind::RouteResolved).await.map(drop)
    }

    /// Connects ([`CmId::connect`]) and waits for the answer: the
    /// `ESTABLISHED` event (the id's CM QP is then in RTS), or
    /// `CONNECT_RESPONSE` for an id without a CM QP. `REJECTED`,
    /// `UNREACHABLE` and `CONNECT_ERROR` are [`Error::CmEvent`]s. The event
    /// is returned for its private data and connection parameters.
    ///
    /// Dropping the future after the request went out leaves the answer to
    /// the next wait for `id` (the connection may still be made).
    #[doc(alias = "rdma_connect")]
    pub async fn connect(&self, id: &CmId, param: &ConnParam<'_>) -> Result<CmEvent> {
        self.check(id, "rdma_connect")?;
        id.connect(param)?;
        let event = self.next_event_for(id).await?;
        match event.kind() {
            CmEventKind::Established | CmEventKind::ConnectResponse if event.status() == 0 => {
                Ok(event)
            }
            _ => Err(event.unexpected(CmEventKind::Established)),
        }
    }

    /// Waits for the next connection request to `listener`. Take its new
    /// id with [`CmEvent::take_request`], create its QP, and
    /// [`accept`](Self::accept) it (or reject it); dropping the event with
    /// the request untaken rejects it. Cancel safe.
    pub async fn get_request(&self, listener: &CmId) -> Result<CmEvent> {
        self.expect(listener, CmEventKind::ConnectRequest).await
    }

    /// Accepts a request on its new id ([`CmId::accept`]) and waits for
    /// `ESTABLISHED`. The new id's events arrive on the listener's channel,
    /// which must be this one.
    #[doc(alias = "rdma_accept")]
    pub async fn accept(&self, id: &CmId, param: &ConnParam<'_>) -> Result<CmEvent> {
        self.check(id, "rdma_accept")?;
        id.accept(param)?;
        self.expect(id, CmEventKind::Established).await
    }

    /// Disconnects ([`CmId::disconnect`]) and waits for the id's
    /// `DISCONNECTED` event (which is also what a peer's disconnect gives;
    /// if it came first, it is returned, and this side's disconnect is the
    /// answer the peer waits for).
    ///
    /// The side that disconnects first gets its event when the peer
    /// answers: the peer's own disconnect, or the destruction of its id
    /// (or, if the peer never answers, the CM's timeout). A server that
    /// sees `DISCONNECTED` should therefore disconnect or drop the id
    /// promptly.
    #[doc(alias = "rdma_disconnect")]
    pub async fn disconnect(&self, id: &CmId) -> Result<CmEvent> {
        self.check(id, "rdma_disconnect")?;
        // A peer's disconnect may have come first: the id is then no
        // longer connected and librdmacm refuses with EINVAL, but the
        // event is there to be read.
        if let Err(e) = id.disconnect() {
            if !matches!(e, Error::Verb { errno, .. } if errno == libc::EINVAL) {
                return Err(e);
            }
        }
        let event = self.next_event_for(id).await?;
        if event.kind() == CmEventKind::Disconnected {
            Ok(event)
        } else {
            Err(event.unexpected(CmEventKind::Disconnected))
        }
    }

    /// Every event of the channel, as a stream (the events kept for
    /// waiters first). The stream never ends; errors are items.
    pub fn events(&self) -> CmEvents<'_> {
        CmEvents {
            ch: self,
            next: None,
        }
    }

    fn check(&self, id: &CmId, verb: &'static str) -> Result<()> {
        if id.on_channel(&self.channel().inner) {
            Ok(())
        } else {
            Err(Error::invalid(
                verb,
                "the id's events arrive on another event channel",
            ))
        }
    }

    /// The next event for `want`: a kept one, else one read now, else wait
    /// for the channel or for a kept event.
    async fn next_matching(&self, want: Want) -> Result<CmEvent> {
        let inner = &*self.inner;
        loop {
            // Registered before looking, so that an event kept after the
            // look wakes this waiter.
            let mut changed = pin!(inner.kept_changed.notified());
            changed.as_mut().enable();
            if let Some(event) = inner.take_or_read(want)? {
                return Ok(event);
            }
            let mut readable = pin!(inner.fd.readable());
            std::future::poll_fn(|cx: &mut TaskContext<'_>| {
                if changed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ok(()));
                }
                match readable.as_mut().poll(cx) {
                    Poll::Ready(Ok(mut guard)) => {
                        // Cleared before the next read, which runs until
                        // EAGAIN: an event after the clear wakes again.
                        guard.clear_ready();
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(super::io_error("epoll_wait", &e))),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
        }
    }
}

impl Inner {
    fn kept(&self) -> MutexGuard<'_, Kept> {
        // Pushes and removals of whole events only: a poisoned lock is
        // taken as it is.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept event for `want`, or the first for it of those waiting on
    /// the channel (the others are kept, and their waiters woken).
    fn take_or_read(&self, want: Want) -> Result<Option<CmEvent>> {
        let mut kept = self.kept();
        // Events nobody can ask for any more are acknowledged now.
        kept.sweep();
        if let Some(event) = kept.take(want) {
            return Ok(Some(event));
        }
        let found = kept.read(&self.fd.get_ref().0, want);
        drop(kept);
        if found.kept_more {
            self.kept_changed.notify_waiters();
        }
        found.event
    }
}

/// The events of an [`AsyncCmChannel`] as a [`Stream`](futures_core::Stream)
/// ([`AsyncCmChannel::events`]). Dropping it loses no event.
pub struct CmEvents<'a> {
    ch: &'a AsyncCmChannel,
    next: Option<Pin<Box<dyn Future<Output = Result<CmEvent>> + Send + 'a>>>,
}

impl futures_core::Stream for CmEvents<'_> {
    type Item = Result<CmEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let ch = this.ch;
        let next = this
            .next
            .get_or_insert_with(|| Box::pin(ch.next_matching(Want::Any)));
        let out = std::task::ready!(next.as_mut().poll(cx));
        this.next = None;
        Poll::Ready(Some(out))
    }
}

impl fmt::Debug for AsyncCmChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCmChannel")
            .field("fd", &self.inner.fd.get_ref().0.as_raw_fd())
            .field("kept", &self.inner.kept().len())
            .finish()
    }
}

impl fmt::Debug for CmEvents<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvents")
            .field("channel", self.ch)
            .finish()
    }
}

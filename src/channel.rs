//! Completion channels (`struct ibv_comp_channel`): waiting for completions
//! on a file descriptor.

use std::ffi::c_int;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::{check_ptr, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::sys;
use crate::users::{Tally, UserKind};

pub(crate) mod acks;

impl RawObject for sys::ibv_comp_channel {
    const DESTROY: &'static str = "ibv_destroy_comp_channel";
    const NAME: &'static str = "completion channel";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live channel, once.
        unsafe { sys::ibv_destroy_comp_channel(ptr) }
    }
}

/// A completion channel (`struct ibv_comp_channel`): completion queues
/// created with it signal, after [`CompletionQueue::req_notify`], by making
/// its file descriptor readable.
///
/// The descriptor is available through [`AsFd`], so epoll, mio or an async
/// runtime can wait on it (with [`set_nonblocking`](Self::set_nonblocking));
/// this crate depends on none of them.
///
/// ```no_run
/// use rdma_verbs::{CompletionChannel, Context, WorkCompletion};
/// let ctx = Context::open_first()?;
/// let channel = CompletionChannel::new(&ctx)?;
/// let cq = ctx.create_cq_with_channel(64, &channel, 0)?;
/// cq.req_notify(false)?;
/// // ... post work ...
/// let event = channel.get_event()?; // blocks until a completion arrives
/// assert!(event.is_for(&cq));
/// cq.req_notify(false)?; // re-arm, then drain
/// let mut wcs = [WorkCompletion::default(); 16];
/// while !cq.poll(&mut wcs)?.is_empty() {}
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_comp_channel")]
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<Owned<sys::ibv_comp_channel, (Context, Tally)>>,
}

/// A completion event: a CQ of the channel was notified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEvent {
    cq: *mut sys::ibv_cq,
}

// SAFETY: the pointer is only compared, never dereferenced.
unsafe impl Send for CqEvent {}
// SAFETY: as above.
unsafe impl Sync for CqEvent {}

impl CqEvent {
    /// Whether the event is for `cq`.
    pub fn is_for(&self, cq: &CompletionQueue) -> bool {
        self.cq == cq.as_ptr()
    }
}

impl CompletionChannel {
    /// Creates a completion channel on `ctx`.
    #[doc(alias = "ibv_create_comp_channel")]
    pub fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is live.
        let raw = check_ptr("ibv_create_comp_channel", unsafe {
            sys::ibv_create_comp_channel(ctx.as_ptr())
        })?;
        let tally = Tally::new(ctx.users(), UserKind::CompletionChannel, 1);
        // SAFETY: a fresh channel owned by nobody else; it keeps `ctx` alive.
        let inner = unsafe { Owned::new(raw, (ctx.clone(), tally)) };
        Ok(CompletionChannel {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_comp_channel {
        self.inner.as_ptr()
    }

    pub(crate) fn context(&self) -> &Context {
        &self.inner.keep().0
    }

    /// Makes [`get_event`](Self::get_event) return `EAGAIN` instead of
    /// blocking when no event is pending (for event loops).
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        crate::fd::set_nonblocking(self.as_raw_fd(), nonblocking).map(|_| ())
    }

    /// Waits for the next completion event and acknowledges it.
    ///
    /// The CQ must be re-armed with [`CompletionQueue::req_notify`] to get
    /// another event. On a non-blocking channel with nothing pending, the
    /// error's errno is `EAGAIN`.
    ///
    /// Events are acknowledged in batches of 64 (`ibv_ack_cq_events` takes
    /// the CQ's lock, so C programs acknowledge several at once), and the
    /// CQ's destruction acknowledges the rest first, so dropping a CQ never
    /// waits on an event read here (see `channel/acks.rs`).
    #[doc(alias = "ibv_get_cq_event")]
    #[doc(alias = "ibv_ack_cq_events")]
    pub fn get_event(&self) -> Result<CqEvent> {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live; both out-pointers are valid.
        let rc = unsafe { sys::ibv_get_cq_event(self.as_ptr(), &mut cq, &mut ctx) };
        crate::error::check_rc("ibv_get_cq_event", rc)?;
        // SAFETY: what ibv_get_cq_event of this crate's channel just
        // returned: a CQ this crate made on it, with its `EventAcks`.
        unsafe { acks::read(cq, ctx) };
        Ok(CqEvent { cq })
    }

    /// Destroys the channel now; [`Error::InUse`](crate::Error::InUse) while clones or CQs use it.
    #[doc(alias = "ibv_destroy_comp_channel")]
    pub fn close(self) -> Result<()> {
        close_shared(self.inner)
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is live; `fd` is set at creation and never changes.
        unsafe { (*self.as_ptr()).fd }
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while the channel (borrowed for
        // the returned lifetime) lives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

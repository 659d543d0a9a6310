//! [`AsyncCq`]: one CQ with its own completion channel, awaited by one task.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use ::tokio::io::unix::AsyncFd;

use crate::channel::CompletionChannel;
use crate::context::Context;
use crate::cq::{CompletionQueue, WorkCompletion};
use crate::error::Result;

/// The longest busy-poll [`AsyncCq::set_busy_poll`] takes.
const MAX_SPIN: Duration = Duration::from_millis(10);

/// Completions a stream reads per `ibv_poll_cq`.
const STREAM_BATCH: usize = 16;

/// A completion queue whose completions are awaited on tokio: the CQ, a
/// completion channel of its own registered with the reactor, and the
/// arming state (`ibv_create_comp_channel`, `ibv_create_cq`,
/// `ibv_req_notify_cq`, `ibv_get_cq_event`, `ibv_ack_cq_events`).
///
/// One task owns it and waits with [`poll`](Self::poll) (at least one
/// completion into the caller's buffer) or uses it as a
/// [`Stream`](futures_core::Stream) of completions. QPs are created on
/// [`cq`](Self::cq) as on any CQ, and the completions are reclaimed on
/// them as usual. For many QPs on one CQ, each with its own task, see
/// [`SharedCq`](super::SharedCq).
///
/// ```no_run
/// # async fn f() -> rdma_verbs::Result<()> {
/// use rdma_verbs::tokio::AsyncCq;
/// use rdma_verbs::{Context, QpInitAttr, QpType, WorkCompletion};
/// let ctx = Context::open_first()?;
/// let pd = ctx.alloc_pd()?;
/// let mut cq = AsyncCq::new(&ctx, 256)?;
/// let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, cq.cq(), cq.cq()))?;
/// // ... connect, post ...
/// let mut wcs = [WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs).await? {
///     if let Some(done) = qp.reclaim_one(wc) {
///         println!("wr {} -> {:?}", done.wr_id, wc.status());
///     }
/// }
/// # Ok(()) }
/// ```
///
/// Threads: `Send` and `Sync` (the CQ and channel are; the arming state is
/// only changed through `&mut self`).
#[doc(alias = "ibv_req_notify_cq")]
#[doc(alias = "ibv_get_cq_event")]
pub struct AsyncCq {
    w: Waiter,
    /// Completions polled by the stream or `ready` and not yet handed out
    /// (kept here, not in a stream object, so that dropping a future loses
    /// none; boxed, so that moving an `AsyncCq` copies a few words).
    buf: Box<[WorkCompletion; STREAM_BATCH]>,
    head: u8,
    len: u8,
}

/// The CQ, its registered channel and the arming state: what a wait needs.
struct Waiter {
    fd: AsyncFd<CompletionChannel>,
    cq: CompletionQueue,
    /// Whether `ibv_req_notify_cq` was called since the last event read.
    armed: bool,
    spin: Spin,
    /// When the last wait went to sleep (only with a busy-poll limit).
    slept_at: Option<Instant>,
}

/// The busy-poll setting and its adaptation.
#[derive(Debug, Clone, Copy)]
struct Spin {
    /// The most a wait spins before arming (zero: never spins).
    limit: Duration,
    /// What the next wait spins: the limit, halved after each spin that
    /// found nothing, restored when a sleep ended within the limit.
    now: Duration,
}

impl AsyncCq {
    /// Creates a completion channel, a CQ of at least `cqe` entries on it
    /// (completion vector 0) and registers the channel with the current
    /// tokio runtime.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) outside a
    /// tokio runtime (nothing created); what [`Context::create_cq`] and
    /// `ibv_create_comp_channel` answer, for a bad `cqe` among others;
    /// [`Error::Verb`](crate::Error::Verb) naming `epoll_ctl` when the
    /// runtime cannot watch the channel's descriptor.
    #[doc(alias = "ibv_create_comp_channel")]
    #[doc(alias = "ibv_create_cq")]
    pub fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        Self::with_vector(ctx, cqe, 0)
    }

    /// As [`new`](Self::new), on completion vector `comp_vector`.
    ///
    /// # Errors
    /// As [`new`](Self::new); a `comp_vector` the device does not have is
    /// refused before any call (as [`Context::create_cq_with_channel`]
    /// refuses it).
    pub fn with_vector(ctx: &Context, cqe: u32, comp_vector: u32) -> Result<Self> {
        // Checked before anything is created.
        super::in_runtime("ibv_create_comp_channel")?;
        let channel = CompletionChannel::new(ctx)?;
        channel.set_nonblocking(true)?;
        let cq = ctx.create_cq_with_channel(cqe, &channel, comp_vector)?;
        let fd = super::register(channel, "ibv_create_comp_channel")?;
        Ok(AsyncCq {
            w: Waiter {
                fd,
                cq,
                armed: false,
                spin: Spin {
                    limit: Duration::ZERO,
                    now: Duration::ZERO,
                },
                slept_at: None,
            },
            buf: Box::new([WorkCompletion::default(); STREAM_BATCH]),
            head: 0,
            len: 0,
        })
    }

    /// The CQ, to create QPs on (and to poll without waiting).
    pub fn cq(&self) -> &CompletionQueue {
        &self.w.cq
    }

    /// Busy-polls for up to `limit` before arming and sleeping, at each
    /// wait that finds the CQ empty (zero, the default, never spins).
    ///
    /// Spinning trades a core for latency: the wakeup through the reactor
    /// costs microseconds, a completion found while spinning costs a poll.
    /// The spin blocks the task's worker thread for its duration, so the
    /// limit should be short (a few microseconds to tens). It adapts: a
    /// spin that finds nothing halves the next one (down to none), and a
    /// sleep that ends within `limit` restores it, so an idle CQ soon stops
    /// costing a core and a busy one spins again.
    ///
    /// # Errors
    /// A limit above 10 ms is refused ([`Error::OutOfRange`](crate::Error::OutOfRange),
    /// nothing changed): a spin that long stalls every other task of the
    /// worker thread.
    pub fn set_busy_poll(&mut self, limit: Duration) -> Result<()> {
        if limit > MAX_SPIN {
            return Err(crate::Error::OutOfRange {
                what: "busy-poll limit (ns)",
                value: u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX),
                range: "0..=10000000",
            });
        }
        self.w.spin = Spin { limit, now: limit };
        Ok(())
    }

    /// Waits until at least one completion is there and polls up to
    /// `wcs.len()` of them into `wcs` (`ibv_poll_cq`), returning the filled
    /// part. Returns at once, without a system call, when the CQ already
    /// has completions. An empty `wcs` returns an empty slice at once.
    ///
    /// Cancel safe: the future waits only for the channel's readiness;
    /// completions it polls are returned in the same step, so dropping it
    /// loses none (they stay in the CQ for the next call).
    ///
    /// # Errors
    /// What `ibv_poll_cq`, `ibv_req_notify_cq` or `ibv_get_cq_event`
    /// answer when they fail, and [`Error::Verb`](crate::Error::Verb)
    /// naming `epoll_wait` when the runtime's wait on the channel fails;
    /// the CQ's completions stay in it.
    #[doc(alias = "ibv_poll_cq")]
    pub async fn poll<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
    ) -> Result<&'a mut [WorkCompletion]> {
        let n = self.take_buffered(wcs);
        if n > 0 {
            return Ok(&mut wcs[..n]);
        }
        let w = &mut self.w;
        let n = std::future::poll_fn(|cx| w.poll_fill(cx, wcs)).await?;
        Ok(&mut wcs[..n])
    }

    /// Waits until at least one completion is there, without handing it
    /// out: up to 16 are polled into the `AsyncCq`'s own buffer, and the
    /// next [`poll`](Self::poll), [`try_poll`](Self::try_poll) or stream
    /// item returns them first. For a `select!` over several sources, and
    /// for programs that drain the CQ in their own loop after a wakeup.
    ///
    /// Cancel safe: as [`poll`](Self::poll); completions polled into the
    /// buffer are kept there in the same step.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    pub async fn ready(&mut self) -> Result<()> {
        if self.len > 0 {
            return Ok(());
        }
        let (w, buf) = (&mut self.w, &mut *self.buf);
        let n = std::future::poll_fn(|cx| w.poll_fill(cx, buf)).await?;
        self.head = 0;
        self.len = n as u8;
        Ok(())
    }

    /// Polls up to `wcs.len()` completions without waiting (the CQ's
    /// [`poll`](CompletionQueue::poll), after any completion a stream has
    /// read and not yielded yet).
    ///
    /// # Errors
    /// What `ibv_poll_cq` answers when it fails.
    pub fn try_poll<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
    ) -> Result<&'a mut [WorkCompletion]> {
        let n = self.take_buffered(wcs);
        if n > 0 {
            return Ok(&mut wcs[..n]);
        }
        self.w.cq.poll(wcs)
    }

    /// Moves stream-buffered completions into `wcs`.
    #[inline]
    fn take_buffered(&mut self, wcs: &mut [WorkCompletion]) -> usize {
        if self.len == 0 {
            return 0;
        }
        let n = usize::from(self.len).min(wcs.len());
        let h = usize::from(self.head);
        wcs[..n].copy_from_slice(&self.buf[h..h + n]);
        self.head += n as u8;
        self.len -= n as u8;
        n
    }
}

impl Waiter {
    /// The poll behind [`AsyncCq::poll`] and the stream: fills `wcs`
    /// with at least one completion, or registers the waker.
    ///
    /// Poll; spin (if set); arm and poll again; only then wait for the
    /// channel. See the module docs for why the poll after arming closes
    /// the race with a completion that arrives in between.
    fn poll_fill(
        &mut self,
        cx: &mut TaskContext<'_>,
        wcs: &mut [WorkCompletion],
    ) -> Poll<Result<usize>> {
        if wcs.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut spun = false;
        loop {
            let n = self.cq.poll(wcs)?.len();
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            if !spun && !self.spin.now.is_zero() {
                spun = true;
                let n = self.spin_poll(wcs)?;
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
            }
            if !self.armed {
                self.cq.req_notify(false)?;
                self.armed = true;
                let n = self.cq.poll(wcs)?.len();
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
            }
            match self.fd.poll_read_ready(cx) {
                Poll::Pending => {
                    if !self.spin.limit.is_zero() && self.slept_at.is_none() {
                        self.slept_at = Some(Instant::now());
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(super::io_error("epoll_wait", &e))),
                Poll::Ready(Ok(mut guard)) => {
                    // One event is all a wait needs (it says: poll the CQ),
                    // and the CQ fires one per arm. The readiness is cleared
                    // after it: the next event makes the descriptor ready
                    // again (epoll is edge-triggered under tokio), and an
                    // event left queued (a `req_notify` of the caller's own)
                    // is harmless: the kernel counts events for
                    // `ibv_destroy_cq` as they are read, and frees unread
                    // ones with the CQ.
                    // Acknowledged in the CQ's batches (`channel/acks.rs`).
                    let read = guard.get_inner().get_event();
                    guard.clear_ready();
                    drop(guard);
                    match read {
                        Ok(_) => self.event_read(),
                        Err(e) if e.errno() == Some(libc::EAGAIN) => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
        }
    }

    /// Accounts an event just read: the CQ is no longer armed.
    #[inline]
    fn event_read(&mut self) {
        self.armed = false;
        if let Some(t) = self.slept_at.take() {
            if t.elapsed() <= self.spin.limit {
                self.spin.now = self.spin.limit;
            }
        }
    }

    /// Busy-polls for up to the current spin; halves the next spin when
    /// this one finds nothing.
    #[cold]
    fn spin_poll(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let start = Instant::now();
        loop {
            for _ in 0..16 {
                let n = self.cq.poll(wcs)?.len();
                if n > 0 {
                    return Ok(n);
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.spin.now {
                self.spin.now /= 2;
                if self.spin.now < Duration::from_nanos(500) {
                    self.spin.now = Duration::ZERO;
                }
                return Ok(0);
            }
        }
    }
}

impl futures_core::Stream for AsyncCq {
    type Item = Result<WorkCompletion>;

    /// The next completion, polling 16 at a time into a
    /// buffer inside the `AsyncCq` (so that dropping a `next()` future, or
    /// switching between the stream and [`poll`](AsyncCq::poll), loses
    /// none). The stream never ends; an error is yielded as an item.
    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.len == 0 {
            match ready!(this.w.poll_fill(cx, &mut *this.buf)) {
                Ok(n) => {
                    this.head = 0;
                    this.len = n as u8;
                }
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
        let wc = this.buf[usize::from(this.head)];
        this.head += 1;
        this.len -= 1;
        Poll::Ready(Some(Ok(wc)))
    }
}

impl fmt::Debug for AsyncCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncCq")
            .field("cq", &self.w.cq)
            .field("armed", &self.w.armed)
            .field("buffered", &self.len)
            .field("busy_poll", &self.w.spin.limit)
            .finish()
    }
}

//! [`SharedCq`]: one CQ serving many QPs, each QP's completions awaited by
//! its own task ([`QpCompletions`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll};

use ::tokio::sync::Notify;

use super::AsyncCq;
use crate::context::Context;
use crate::cq::{CompletionQueue, WorkCompletion};
use crate::cq_route::{self, ROUTE_BATCH as DRIVE_BATCH};
use crate::error::{Error, Result};
use crate::qp::{QpNum, QueuePair};

/// A completion queue shared by many QPs on tokio, each QP's completions
/// delivered to its own [`QpCompletions`] (routed by QP number).
///
/// A task of its own (spawned on the runtime it is created in) waits on
/// the CQ's completion channel as an [`AsyncCq`] does, polls the CQ and
/// puts each completion in the queue of its QP, waking that QP's waiting
/// task. This is the shape of a server that holds many connections on one
/// CQ: a task per connection, no polling thread per connection, and no
/// task ever sees another's completions.
///
/// Register a QP ([`register`](Self::register)) before posting on it:
/// completions for a QP number nobody has registered are dropped and
/// counted ([`unrouted`](Self::unrouted)); their buffers stay with the QP,
/// which hands them back at RESET or when closed, as for any request
/// whose completion was not reclaimed. A [`QpCompletions`] dropped with
/// completions queued (its task cancelled) leaves them for the next
/// registration of its QP, which gets them first.
///
/// ```no_run
/// # async fn f() -> rdma_verbs::Result<()> {
/// use rdma_verbs::tokio::SharedCq;
/// use rdma_verbs::{Context, QpInitAttr, QpType, WorkCompletion};
/// let ctx = Context::open_first()?;
/// let pd = ctx.alloc_pd()?;
/// let shared = SharedCq::new(&ctx, 4096)?;
/// for _ in 0..64 {
///     let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, shared.cq(), shared.cq()))?;
///     let mut completions = shared.register(&qp)?;
///     tokio::spawn(async move {
///         // ... connect, post ...
///         let mut wcs = [WorkCompletion::default(); 8];
///         for wc in completions.poll(&mut wcs).await? {
///             let _done = qp.reclaim_one(wc); // this QP's, never another's
///         }
///         Ok::<(), rdma_verbs::Error>(())
///     });
/// }
/// # Ok(()) }
/// ```
///
/// Cloning shares the CQ; the driving task ends when the last `SharedCq`
/// and [`QpCompletions`] are dropped (or when its runtime shuts down).
pub struct SharedCq {
    shared: Arc<Shared>,
}

/// One QP's completions from a [`SharedCq`].
///
/// Threads: `Send` and `Sync`; one task waits on it at a time
/// ([`poll`](Self::poll) takes `&mut self`).
pub struct QpCompletions {
    shared: Arc<Shared>,
    qp_num: QpNum,
    notify: Arc<Notify>,
}

struct Shared {
    cq: CompletionQueue,
    routes: Mutex<Routes>,
    /// Live `SharedCq` and `QpCompletions` handles; the driver stops at 0.
    handles: AtomicUsize,
    /// Tells the driver that the last handle is gone.
    closed: Notify,
}

/// The routing core [`CqRouter`](crate::CqRouter) shares, and the
/// driver's end.
#[derive(Default)]
struct Routes {
    core: cq_route::Routes<Arc<Notify>>,
    /// The driver's failure (the verb and errno), reported to every waiter.
    failed: Option<(&'static str, i32)>,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, Routes> {
        // A panic while holding the lock leaves whole queues (pushes and
        // pops of `Copy` values), so a poisoned lock is taken as it is.
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn hold(self: &Arc<Self>) -> Arc<Self> {
        self.handles.fetch_add(1, Ordering::Relaxed);
        Arc::clone(self)
    }

    fn release(&self) {
        if self.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.closed.notify_one();
        }
    }
}

impl SharedCq {
    /// Creates a CQ of at least `cqe` entries with its own completion
    /// channel, and spawns the task that routes its completions on the
    /// current tokio runtime.
    ///
    /// `cqe` must hold every completion the QPs on it can have outstanding
    /// at once (their send and receive queue depths added up), as for any
    /// CQ.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] outside a tokio runtime (nothing
    /// created), and what [`AsyncCq::new`](super::AsyncCq::new) answers.
    #[doc(alias = "ibv_create_cq")]
    pub fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        let acq = AsyncCq::new(ctx, cqe)?;
        let shared = Arc::new(Shared {
            cq: acq.cq().clone(),
            routes: Mutex::new(Routes::default()),
            handles: AtomicUsize::new(1),
            closed: Notify::new(),
        });
        // The guard is moved into the task's future, so it runs even if
        // the task is dropped before its first poll.
        ::tokio::spawn(drive(acq, Gone(Arc::clone(&shared))));
        Ok(SharedCq { shared })
    }

    /// The CQ, to create QPs on. Do not poll it: completions polled here
    /// do not reach the QPs' [`QpCompletions`].
    pub fn cq(&self) -> &CompletionQueue {
        &self.shared.cq
    }

    /// Routes `qp`'s completions (by its QP number) to the returned queue,
    /// first those a dropped `QpCompletions` of the same QP number left.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP is not on this CQ (neither
    /// its send nor its receive CQ), and when its number is registered
    /// already (until that [`QpCompletions`] is dropped).
    pub fn register(&self, qp: &QueuePair) -> Result<QpCompletions> {
        let notify = Arc::new(Notify::new());
        let qp_num = self.shared.routes().core.register(
            &self.shared.cq,
            qp,
            Arc::clone(&notify),
            "SharedCq::register",
        )?;
        Ok(QpCompletions {
            shared: self.shared.hold(),
            qp_num,
            notify,
        })
    }

    /// How many completions no live [`QpCompletions`] holds: those that
    /// came for QP numbers nobody had registered (and were dropped), and
    /// those a dropped `QpCompletions` left for its QP's next registration.
    pub fn unrouted(&self) -> u64 {
        self.shared.routes().core.unrouted()
    }
}

impl Clone for SharedCq {
    fn clone(&self) -> Self {
        SharedCq {
            shared: self.shared.hold(),
        }
    }
}

impl Drop for SharedCq {
    fn drop(&mut self) {
        self.shared.release();
    }
}

impl QpCompletions {
    /// The QP number whose completions this receives.
    pub fn qp_num(&self) -> QpNum {
        self.qp_num
    }

    /// How many of the QP's completions have arrived and wait to be polled.
    pub fn queued(&self) -> usize {
        self.shared.routes().core.queued(self.qp_num)
    }

    /// Waits until the QP has at least one completion and moves up to
    /// `wcs.len()` of them into `wcs`, oldest first; an empty `wcs`
    /// returns at once.
    ///
    /// Cancel safe: the future waits only for a notification; the QP's
    /// completions stay in its queue until a call moves them into its
    /// buffer, in the same step as it returns.
    ///
    /// # Errors
    /// [`Error::Verb`] once the routing task's poll of the CQ failed (the
    /// verb and its errno), after the completions it routed before are
    /// taken.
    pub async fn poll<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
    ) -> Result<&'a mut [WorkCompletion]> {
        loop {
            let n = self.try_take(wcs)?;
            if n > 0 || wcs.is_empty() {
                return Ok(&mut wcs[..n]);
            }
            // A completion routed after `try_take` leaves a permit, so
            // this returns at once then.
            self.notify.notified().await;
        }
    }

    /// Moves up to `wcs.len()` of the QP's completions that have arrived
    /// into `wcs`, without waiting.
    ///
    /// # Errors
    /// As [`poll`](Self::poll).
    pub fn try_poll<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
    ) -> Result<&'a mut [WorkCompletion]> {
        let n = self.try_take(wcs)?;
        Ok(&mut wcs[..n])
    }

    fn try_take(&mut self, wcs: &mut [WorkCompletion]) -> Result<usize> {
        let mut routes = self.shared.routes();
        // The route lives as long as this handle (inserted by `register`,
        // removed by its drop).
        let n = routes.core.take(self.qp_num, wcs);
        match routes.failed {
            Some((verb, errno)) if n == 0 => Err(Error::Verb { verb, errno }),
            _ => Ok(n),
        }
    }
}

impl Drop for QpCompletions {
    fn drop(&mut self) {
        // Completions still queued wait for the QP's next registration
        // (until then, its requests' buffers stay with the QP).
        self.shared.routes().core.unregister(self.qp_num);
        self.shared.release();
    }
}

/// The routing task: waits on the CQ as an [`AsyncCq`], dispatches every
/// completion to its QP's queue, and ends when the last handle is dropped.
///
/// `gone` tells the waiters when the task ends, also when it is dropped
/// without finishing (its runtime shut down), even before its first poll.
async fn drive(mut acq: AsyncCq, gone: Gone) {
    let shared = &gone.0;
    let mut wcs = [WorkCompletion::default(); DRIVE_BATCH];
    loop {
        let polled = {
            let wait = acq.poll(&mut wcs);
            let closed = shared.closed.notified();
            let mut wait = std::pin::pin!(wait);
            let mut closed = std::pin::pin!(closed);
            std::future::poll_fn(|cx: &mut TaskContext<'_>| {
                if Pin::new(&mut closed).poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                wait.as_mut().poll(cx).map(Some)
            })
            .await
        };
        let n = match polled {
            None => return,
            Some(Ok(got)) => got.len(),
            Some(Err(e)) => {
                // `gone` wakes the waiters with it.
                shared.routes().failed = Some(match e {
                    Error::Verb { verb, errno } => (verb, errno),
                    _ => ("ibv_poll_cq", libc::EIO),
                });
                return;
            }
        };
        dispatch(shared, &wcs[..n]);
    }
}

/// Ends the routing: every waiter from now on gets an error (the driver's
/// own, or `ECANCELED` when the task was dropped by its runtime).
struct Gone(Arc<Shared>);

impl Drop for Gone {
    fn drop(&mut self) {
        let mut routes = self.0.routes();
        if routes.failed.is_none() {
            routes.failed = Some(("SharedCq (its routing task ended)", libc::ECANCELED));
        }
        for notify in routes.core.wakers() {
            notify.notify_one();
        }
    }
}

/// Puts each completion in its QP's queue and wakes each QP's task once.
/// `wcs` holds at most [`DRIVE_BATCH`] completions.
fn dispatch(shared: &Shared, wcs: &[WorkCompletion]) {
    shared
        .routes()
        .core
        .dispatch(wcs, |notify| notify.notify_one());
}

impl fmt::Debug for SharedCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes = self.shared.routes();
        f.debug_struct("SharedCq")
            .field("cq", &self.shared.cq)
            .field("qps", &routes.core.len())
            .field("unrouted", &routes.core.unrouted())
            .finish()
    }
}

impl fmt::Debug for QpCompletions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpCompletions")
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

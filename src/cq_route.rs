//! One CQ shared by several QPs, each completion handed to its QP's queue
//! by QP number: the routing core ([`Routes`]) that [`CqRouter`]
//! (blocking) and the `tokio` layer's `SharedCq` share, and [`CqRouter`]
//! with its per-QP [`QpInbox`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::cq::{CompletionQueue, WorkCompletion};
use crate::error::{Error, Result};
use crate::qp::{QpNum, QueuePair};

/// Completions routed per `ibv_poll_cq`.
pub(crate) const ROUTE_BATCH: usize = 32;

/// The QPs' queues of one CQ, keyed by QP number; `W` is what wakes a
/// QP's waiter (tokio's `Notify`; nothing for [`CqRouter`], whose waiters
/// poll).
pub(crate) struct Routes<W> {
    queues: HashMap<QpNum, Route<W>>,
    /// Completions for QP numbers nobody registered.
    unrouted: u64,
    /// Completions a dropped handle had queued, by QP number, for the next
    /// registration of that number.
    left: HashMap<QpNum, VecDeque<WorkCompletion>>,
}

struct Route<W> {
    wcs: VecDeque<WorkCompletion>,
    waker: W,
    /// Got completions in the current dispatch (to wake once).
    touched: bool,
}

impl<W> Default for Routes<W> {
    fn default() -> Self {
        Routes {
            queues: HashMap::new(),
            unrouted: 0,
            left: HashMap::new(),
        }
    }
}

impl<W> Routes<W> {
    /// Gives `qp` (a QP on `cq`) a queue, first holding what a dropped
    /// handle of its number left; returns its QP number.
    pub(crate) fn register(
        &mut self,
        cq: &CompletionQueue,
        qp: &QueuePair,
        waker: W,
        verb: &'static str,
    ) -> Result<QpNum> {
        if !qp.uses_cq(cq) {
            return Err(refused(verb, qp.qp_num(), "is not on this CQ"));
        }
        let qp_num = qp.qp_num();
        if self.queues.contains_key(&qp_num) {
            return Err(refused(verb, qp_num, "is registered already"));
        }
        let wcs = self
            .left
            .remove(&qp_num)
            .unwrap_or_else(|| VecDeque::with_capacity(qp.queue_depths()));
        self.queues.insert(
            qp_num,
            Route {
                wcs,
                waker,
                touched: false,
            },
        );
        Ok(qp_num)
    }

    /// Ends `qp_num`'s registration; completions still queued wait for
    /// its next registration (until then, their requests' buffers stay
    /// with the QP).
    pub(crate) fn unregister(&mut self, qp_num: QpNum) {
        if let Some(route) = self.queues.remove(&qp_num) {
            if !route.wcs.is_empty() {
                self.left.insert(qp_num, route.wcs);
            }
        }
    }

    /// Moves up to `out.len()` of `qp_num`'s completions into `out`,
    /// oldest first; how many.
    pub(crate) fn take(&mut self, qp_num: QpNum, out: &mut [WorkCompletion]) -> usize {
        match self.queues.get_mut(&qp_num) {
            Some(route) => {
                let n = route.wcs.len().min(out.len());
                for (slot, wc) in out.iter_mut().zip(route.wcs.drain(..n)) {
                    *slot = wc;
                }
                n
            }
            None => 0,
        }
    }

    /// How many of `qp_num`'s completions wait to be taken.
    pub(crate) fn queued(&self, qp_num: QpNum) -> usize {
        self.queues.get(&qp_num).map_or(0, |r| r.wcs.len())
    }

    /// Completions no registered handle holds: dropped for unregistered
    /// QP numbers, and left by dropped handles.
    pub(crate) fn unrouted(&self) -> u64 {
        let left: usize = self.left.values().map(VecDeque::len).sum();
        self.unrouted + left as u64
    }

    /// How many QPs are registered.
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Every registered QP's waker.
    #[cfg(feature = "tokio")]
    pub(crate) fn wakers(&self) -> impl Iterator<Item = &W> {
        self.queues.values().map(|r| &r.waker)
    }

    /// Puts each completion in its QP's queue and calls `wake` once for
    /// each QP that got some. `wcs` holds at most [`ROUTE_BATCH`].
    pub(crate) fn dispatch(&mut self, wcs: &[WorkCompletion], mut wake: impl FnMut(&W)) {
        // The QPs that got completions, each once (at most one per completion).
        let mut touched = [QpNum::default(); ROUTE_BATCH];
        let mut ntouched = 0;
        for wc in wcs.iter().take(ROUTE_BATCH) {
            match self.queues.get_mut(&wc.qp_num()) {
                Some(route) => {
                    route.wcs.push_back(*wc);
                    if !route.touched {
                        route.touched = true;
                        touched[ntouched] = wc.qp_num();
                        ntouched += 1;
                    }
                }
                None => self.unrouted += 1,
            }
        }
        for qp_num in &touched[..ntouched] {
            if let Some(route) = self.queues.get_mut(qp_num) {
                route.touched = false;
                wake(&route.waker);
            }
        }
    }
}

#[cold]
fn refused(verb: &'static str, qp_num: QpNum, why: &str) -> Error {
    Error::invalid(verb, format!("QP {qp_num:#x} {why}"))
}

/// A completion queue shared by several QPs, without an async runtime:
/// each completion is handed by QP number to its QP's [`QpInbox`], so a
/// program never matches completions to connections by hand.
///
/// Whoever polls (any [`QpInbox::poll`] or [`QpInbox::wait`], or
/// [`route`](Self::route)) polls the CQ and puts every completion in the
/// queue of its QP; each inbox then takes its own, in the order the CQ
/// gave them. The routing is the `tokio` layer's `SharedCq`'s (one core);
/// there a task polls, here the callers do.
///
/// ```no_run
/// use std::time::Duration;
/// use rdma_verbs::{Context, CqRouter, QpInitAttr, QpType, WorkCompletion};
/// let ctx = Context::open_first()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(1024)?;
/// let router = CqRouter::new(&cq);
/// let mut conns = Vec::new();
/// for _ in 0..8 {
///     let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
///     let inbox = router.register(&qp)?;
///     conns.push((qp, inbox)); // ... connect, post ...
/// }
/// let mut wcs = [WorkCompletion::default(); 16];
/// for (qp, inbox) in &mut conns {
///     for wc in inbox.wait(&mut wcs, Duration::from_secs(2))?.iter() {
///         let _done = qp.reclaim_one(wc); // this QP's, never another's
///     }
/// }
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
///
/// Register a QP before posting on it: completions for a QP number nobody
/// registered are dropped and counted ([`unrouted`](Self::unrouted));
/// their buffers stay with the QP, which hands them back at RESET or when
/// closed, as for any request whose completion was not reclaimed. A
/// [`QpInbox`] dropped with completions queued leaves them for the next
/// registration of its QP, which gets them first. Poll the CQ only through
/// the router: completions polled elsewhere reach no inbox.
///
/// To sleep until completions come rather than poll, give the CQ a
/// completion channel and wait on it (with [`crate::wait::Poller`]
/// beside other sources): arm ([`CompletionQueue::req_notify`]), call
/// [`route`](Self::route), and sleep only if nothing came.
///
/// Cloning shares the router. Threads: `Send` and `Sync`; polls of the CQ
/// are serialised, so each QP's completions stay in the CQ's order.
#[doc(alias = "ibv_poll_cq")]
pub struct CqRouter {
    shared: Arc<Shared>,
}

/// One QP's completions from a [`CqRouter`] (its registration: dropping
/// it ends it).
///
/// Drop it with its QP: the device may give a later QP the same number,
/// whose registration this one would refuse, and whose completions it
/// would take.
///
/// Threads: `Send` and `Sync`; it takes `&mut self` to take completions.
pub struct QpInbox {
    shared: Arc<Shared>,
    qp_num: QpNum,
}

struct Shared {
    cq: CompletionQueue,
    /// Held while the CQ is polled, so that completions are queued in the
    /// CQ's order.
    routes: Mutex<Routes<()>>,
}

impl Shared {
    fn routes(&self) -> MutexGuard<'_, Routes<()>> {
        // Whole pushes and pops of `Copy` values only: a poisoned lock is
        // taken as it is.
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Polls the CQ until it is empty, routing every completion.
    fn route_locked(&self, routes: &mut Routes<()>) -> Result<usize> {
        let mut wcs = [WorkCompletion::default(); ROUTE_BATCH];
        let mut total = 0;
        loop {
            let n = self.cq.poll(&mut wcs)?.len();
            routes.dispatch(&wcs[..n], |_| {});
            total += n;
            if n < ROUTE_BATCH {
                return Ok(total);
            }
        }
    }
}

impl CqRouter {
    /// Routes the completions of `cq` (which it shares).
    pub fn new(cq: &CompletionQueue) -> Self {
        CqRouter {
            shared: Arc::new(Shared {
                cq: cq.clone(),
                routes: Mutex::new(Routes::default()),
            }),
        }
    }

    /// The CQ, to create QPs on. Do not poll it elsewhere.
    pub fn cq(&self) -> &CompletionQueue {
        &self.shared.cq
    }

    /// Routes `qp`'s completions (by its QP number) to the returned inbox,
    /// first those a dropped inbox of the same QP number left.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP is not on this CQ (neither
    /// its send nor its receive CQ), and when its number is registered
    /// already (until that [`QpInbox`] is dropped).
    pub fn register(&self, qp: &QueuePair) -> Result<QpInbox> {
        let qp_num =
            self.shared
                .routes()
                .register(&self.shared.cq, qp, (), "CqRouter::register")?;
        Ok(QpInbox {
            shared: Arc::clone(&self.shared),
            qp_num,
        })
    }

    /// Polls the CQ (`ibv_poll_cq`) until it is empty, putting every
    /// completion in its QP's inbox; how many it polled.
    ///
    /// # Errors
    /// [`Error::Verb`] when `ibv_poll_cq` fails (the completions routed
    /// before stay routed).
    #[doc(alias = "ibv_poll_cq")]
    pub fn route(&self) -> Result<usize> {
        let mut routes = self.shared.routes();
        self.shared.route_locked(&mut routes)
    }

    /// How many completions no live [`QpInbox`] holds: those that came for
    /// QP numbers nobody had registered (dropped), and those a dropped
    /// inbox left for its QP's next registration.
    pub fn unrouted(&self) -> u64 {
        self.shared.routes().unrouted()
    }
}

impl Clone for CqRouter {
    fn clone(&self) -> Self {
        CqRouter {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl QpInbox {
    /// The QP number whose completions this receives.
    pub fn qp_num(&self) -> QpNum {
        self.qp_num
    }

    /// How many of the QP's completions are routed and wait to be taken.
    pub fn queued(&self) -> usize {
        self.shared.routes().queued(self.qp_num)
    }

    /// Moves up to `wcs.len()` of the QP's completions into `wcs`, oldest
    /// first, without waiting: those routed already, else those the CQ has
    /// now (polled and routed, the other QPs' kept for them).
    ///
    /// # Errors
    /// [`Error::Verb`] when `ibv_poll_cq` fails.
    #[doc(alias = "ibv_poll_cq")]
    pub fn poll<'a>(&mut self, wcs: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        let mut routes = self.shared.routes();
        let mut n = routes.take(self.qp_num, wcs);
        if n == 0 && !wcs.is_empty() {
            self.shared.route_locked(&mut routes)?;
            n = routes.take(self.qp_num, wcs);
        }
        Ok(&mut wcs[..n])
    }

    /// Waits up to `timeout` until the QP has at least one completion and
    /// moves up to `wcs.len()` of them into `wcs`; an empty `wcs` returns
    /// at once. It polls the CQ (routing the other QPs' completions),
    /// yielding the processor between polls, and sleeping up to a
    /// millisecond between them once nothing came for a while.
    ///
    /// A `timeout` past what the clock can represent waits without limit.
    ///
    /// # Errors
    /// [`Error::Timeout`] ("a completion of the QP") when none came in
    /// time; [`Error::Verb`] when `ibv_poll_cq` fails.
    #[doc(alias = "ibv_poll_cq")]
    pub fn wait<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
        timeout: Duration,
    ) -> Result<&'a mut [WorkCompletion]> {
        let deadline = Instant::now().checked_add(timeout);
        let mut idle = 0u32;
        loop {
            let n = self.poll(wcs)?.len();
            if n > 0 || wcs.is_empty() {
                return Ok(&mut wcs[..n]);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(nothing_came(timeout));
            }
            idle = idle.saturating_add(1);
            back_off(idle);
        }
    }
}

/// Between two empty polls: yield at first, then sleep a little longer
/// each time, up to 1 ms.
fn back_off(idle: u32) {
    if idle < 64 {
        std::thread::yield_now();
    } else {
        let us = u64::from(idle - 63).min(1000);
        std::thread::sleep(Duration::from_micros(us));
    }
}

#[cold]
fn nothing_came(waited: Duration) -> Error {
    Error::Timeout {
        what: "a completion of the QP",
        waited,
    }
}

impl Drop for QpInbox {
    fn drop(&mut self) {
        self.shared.routes().unregister(self.qp_num);
    }
}

impl fmt::Debug for CqRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let routes = self.shared.routes();
        f.debug_struct("CqRouter")
            .field("cq", &self.shared.cq)
            .field("qps", &routes.len())
            .field("unrouted", &routes.unrouted())
            .finish()
    }
}

impl fmt::Debug for QpInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpInbox")
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

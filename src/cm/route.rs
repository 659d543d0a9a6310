//! Routing a channel's CM events to the waiter of their id: the one core
//! ([`Kept`]) that [`CmRouter`] (blocking) and the `tokio` layer's
//! `AsyncCmChannel` share, and [`CmRouter`] itself.
//!
//! Every connection a listener accepts delivers its events on the
//! listener's channel, interleaved with the listener's own connection
//! requests and with the events of any other id on the channel.
//! [`EventChannel::get_event`] hands them out in arrival order; a router
//! hands each waiter the events of the id it waits for and keeps the
//! others, oldest first, for their own waiters.
//!
//! What happens to events kept for an id that is dropped: [`CmRouter`]'s
//! docs, *Held events*.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::addr::PortSpace;
use super::channel::{deadline_after, EventChannel};
use super::event::{CmEvent, CmEventKind};
use super::id::CmId;
use crate::error::{Error, Result};

/// Whose events a wait of a [`CmRouter`] (or of the `tokio` layer's
/// `AsyncCmChannel::next_event_of`) is for.
#[derive(Clone, Copy, Debug)]
pub enum EventsOf<'a> {
    /// Any id's: the oldest event kept, else the next to arrive.
    Any,
    /// One id's (for a listener: the connection requests to it).
    Id(&'a CmId),
    /// A listener's connection requests, and the events of every id taken
    /// from them ([`CmId::listener_key`]): the whole of a server's traffic
    /// on a channel it shares with other ids.
    Listener(&'a CmId),
}

impl EventsOf<'_> {
    pub(crate) fn want(self) -> Want {
        match self {
            EventsOf::Any => Want::Any,
            EventsOf::Id(id) => Want::Id(id.key()),
            EventsOf::Listener(l) => Want::Family(l.key()),
        }
    }

    /// What a timeout says was awaited.
    fn what(self) -> &'static str {
        match self {
            EventsOf::Any => "a CM event",
            EventsOf::Id(_) => "a CM event of the id",
            EventsOf::Listener(_) => "a CM event of the listener or of an id taken from it",
        }
    }

    /// Refuses a wait for an id whose events arrive on another channel
    /// (they would never come here).
    pub(crate) fn check(self, chan: &EventChannel) -> Result<()> {
        let id = match self {
            EventsOf::Any => return Ok(()),
            EventsOf::Id(id) | EventsOf::Listener(id) => id,
        };
        if id.on_channel(&chan.inner) {
            Ok(())
        } else {
            Err(other_channel("rdma_get_cm_event"))
        }
    }
}

#[cold]
fn other_channel(verb: &'static str) -> Error {
    Error::invalid(verb, "the id's events arrive on another event channel")
}

/// Which events a wait takes, by key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    Any,
    Id(u64),
    /// The listener's own events and those of the ids taken from it.
    Family(u64),
}

impl Want {
    fn matches(self, e: &CmEvent) -> bool {
        match self {
            Want::Any => true,
            Want::Id(k) => e.id_key() == k,
            Want::Family(k) => e.id_key() == k || e.id_parent() == k,
        }
    }
}

/// Events read for another waiter than the reader, oldest first: the
/// routing core of [`CmRouter`] and of `tokio::AsyncCmChannel`. Each
/// keeps one behind its own lock.
#[derive(Default)]
pub(crate) struct Kept {
    events: VecDeque<CmEvent>,
}

/// What [`Kept::read`] found.
pub(crate) struct Found {
    /// The first event read that the wait takes, or the read's failure
    /// when none came before it.
    pub(crate) event: Result<Option<CmEvent>>,
    /// Whether events for other waiters were kept (wake them).
    pub(crate) kept_more: bool,
}

impl Kept {
    /// Acknowledges and drops the events whose id nothing but kept events
    /// holds (no handle can ask for them any more): the id is destroyed
    /// with the last of them, an untaken request rejected.
    pub(crate) fn sweep(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let mut kept_per_id: HashMap<u64, usize> = HashMap::new();
        for e in &self.events {
            *kept_per_id.entry(e.id_key()).or_default() += 1;
        }
        // Every kept event of an id counts among its holders, so an id
        // with no other holder has exactly as many as it has kept events;
        // its events go together (each drop lowers the count the next
        // compares, staying at or below its own kept count).
        self.events
            .retain(|e| e.id_holders() > kept_per_id.get(&e.id_key()).copied().unwrap_or(0));
    }

    /// The oldest kept event the wait takes.
    pub(crate) fn take(&mut self, want: Want) -> Option<CmEvent> {
        let at = self.events.iter().position(|e| want.matches(e))?;
        self.events.remove(at)
    }

    /// Reads the channel until it has nothing more (without waiting),
    /// returning the first event the wait takes and keeping the others.
    pub(crate) fn read(&mut self, chan: &EventChannel, want: Want) -> Found {
        let mut found = None;
        let mut kept_more = false;
        let read = loop {
            match chan.read_one() {
                Ok(Some(event)) => {
                    if found.is_none() && want.matches(&event) {
                        found = Some(event);
                    } else {
                        self.events.push_back(event);
                        kept_more = true;
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let event = match (found, read) {
            (Some(event), _) => Ok(Some(event)),
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(None),
        };
        Found { event, kept_more }
    }

    /// How many events are kept.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }
}

/// A CM event channel whose events are routed to the waiter of their id,
/// without an async runtime: [`next`](Self::next) waits, up to a deadline,
/// for the next event of one id ([`EventsOf::Id`]), of a listener and the
/// connections taken from it ([`EventsOf::Listener`]) or of any
/// ([`EventsOf::Any`]); events of other ids read meanwhile are kept for
/// their own waiters, oldest first. Nothing is lost: each event goes to
/// exactly one waiter.
///
/// This is what a server of several connections in one thread needs:
/// connection requests, `ESTABLISHED` and `DISCONNECTED` events of many
/// ids interleave on the listener's channel, and [`EventChannel::expect`]
/// takes only the next of them. A client with several ids on one channel
/// steps each with [`expect`](Self::expect):
///
/// ```no_run
/// use std::time::Duration;
/// use rdma_verbs::cm::{CmEventKind, CmRouter, PortSpace};
/// let router = CmRouter::new()?;
/// let t = Duration::from_secs(2);
/// let ids = (0..4)
///     .map(|_| router.create_id(PortSpace::Tcp))
///     .collect::<Result<Vec<_>, _>>()?;
/// for id in &ids {
///     id.resolve_addr(None, "10.99.0.1:7471".parse().unwrap(), t)?;
/// }
/// // Their events come in any order; each wait takes its own id's.
/// for id in ids.iter().rev() {
///     router.expect(id, CmEventKind::AddrResolved, t)?;
/// }
/// assert_eq!(router.kept(), 0);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
///
/// Read the channel only through the router (a read elsewhere, such as
/// [`EventChannel::get_event`], takes events a waiter here expects). To
/// wait on it beside other descriptors ([`crate::wait::Poller`], `epoll`),
/// use its descriptor ([`AsFd`]) and [`try_next`](Self::try_next): a
/// waiter that finds nothing leaves what it read for others in the queue,
/// which the descriptor does not show, so look with `try_next` before
/// waiting.
///
/// # Held events and `rdma_destroy_id`
///
/// librdmacm's `rdma_destroy_id` waits until every event it handed out
/// for the id is acknowledged. A kept event is not acknowledged yet, but
/// it holds its id (as every [`CmEvent`] does), so dropping the id's
/// [`CmId`] never waits: the id is destroyed when its last event goes.
/// Events kept for an id that no handle names any more (its [`CmId`]
/// dropped, or given to [`CmId::close`], which refuses with
/// [`Error::InUse`] while they are held) and that nothing else holds are
/// acknowledged and dropped at the router's next look at its queue (any
/// wait, or [`kept`](Self::kept)), and the id is destroyed then; a
/// connection request among them is rejected, as an untaken request
/// always is.
///
/// Cloning shares the router. Threads: `Send` and `Sync`; several threads
/// may wait at once, each for its own ids: one reads the descriptor at a
/// time, and wakes the others when it keeps an event or stops reading.
#[doc(alias = "rdma_get_cm_event")]
#[derive(Clone)]
pub struct CmRouter {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    chan: EventChannel,
    state: Mutex<State>,
    /// Signalled when an event is kept or the reader stops reading.
    changed: Condvar,
}

struct State {
    kept: Kept,
    /// Whether a waiter is in `poll(2)` on the descriptor (the others wait
    /// on `changed`).
    reading: bool,
}

impl RouterInner {
    fn state(&self) -> MutexGuard<'_, State> {
        // Pushes and removals of whole events only: a poisoned lock is
        // taken as it is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl CmRouter {
    /// Opens an event channel and routes its events.
    #[doc(alias = "rdma_create_event_channel")]
    pub fn new() -> Result<Self> {
        Ok(Self::from_channel(EventChannel::new()?))
    }

    /// Routes the events of `channel`, which should from now on be read
    /// only through the router.
    pub fn from_channel(channel: EventChannel) -> Self {
        CmRouter {
            inner: Arc::new(RouterInner {
                chan: channel,
                state: Mutex::new(State {
                    kept: Kept::default(),
                    reading: false,
                }),
                changed: Condvar::new(),
            }),
        }
    }

    /// The channel.
    pub fn channel(&self) -> &EventChannel {
        &self.inner.chan
    }

    /// Creates an id in `ps` whose events arrive on this router's channel.
    #[doc(alias = "rdma_create_id")]
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId> {
        self.inner.chan.create_id(ps)
    }

    /// Waits up to `timeout` for the next event of `of` (a kept one
    /// first, oldest first); events for others read meanwhile are kept.
    ///
    /// A `timeout` past what the clock can represent (`Duration::MAX`)
    /// waits without limit.
    ///
    /// # Errors
    /// [`Error::Timeout`] naming what was awaited when no such event came
    /// in time; [`Error::InvalidArgument`] when the id's events arrive on
    /// another channel (nothing waited); [`Error::Verb`] when reading the
    /// channel failed.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn next(&self, of: EventsOf<'_>, timeout: Duration) -> Result<CmEvent> {
        of.check(&self.inner.chan)?;
        match self.wait(of.want(), deadline_after(timeout))? {
            Some(event) => Ok(event),
            None => Err(timed_out(of.what(), timeout)),
        }
    }

    /// The next event of `of` if one is kept or waiting on the channel,
    /// without blocking (others read meanwhile are kept).
    ///
    /// # Errors
    /// As [`next`](Self::next), never [`Error::Timeout`].
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_next(&self, of: EventsOf<'_>) -> Result<Option<CmEvent>> {
        of.check(&self.inner.chan)?;
        self.wait(of.want(), Some(Instant::now()))
    }

    /// Waits up to `timeout` for the next event of `id` and checks that
    /// it is a `kind` event with status 0, as [`EventChannel::expect`]
    /// does for the channel's next event.
    ///
    /// # Errors
    /// [`Error::CmEvent`] naming the event awaited and the one that came,
    /// with its status (the event is acknowledged); [`Error::Timeout`]
    /// naming `kind` when none came in time; otherwise as
    /// [`next`](Self::next).
    pub fn expect(&self, id: &CmId, kind: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        let of = EventsOf::Id(id);
        of.check(&self.inner.chan)?;
        match self.wait(of.want(), deadline_after(timeout))? {
            None => Err(timed_out(kind.c_name(), timeout)),
            Some(event) if event.kind() == kind && event.status() == 0 => Ok(event),
            Some(event) => Err(event.unexpected(kind)),
        }
    }

    /// How many events are kept for waiters that have not asked for them
    /// yet. Events of ids that no handle names any more are acknowledged
    /// and dropped first (see [`CmRouter`], *Held events*).
    pub fn kept(&self) -> usize {
        let mut st = self.inner.state();
        st.kept.sweep();
        st.kept.len()
    }

    /// The event for `want`: a kept one, one read now, or one read or kept
    /// before `deadline` (`None`: no limit); `Ok(None)` once it passed.
    fn wait(&self, want: Want, deadline: Option<Instant>) -> Result<Option<CmEvent>> {
        let inner = &*self.inner;
        let mut st = inner.state();
        loop {
            st.kept.sweep();
            if let Some(event) = st.kept.take(want) {
                return Ok(Some(event));
            }
            let past = deadline.is_some_and(|d| Instant::now() >= d);
            if st.reading {
                // Another waiter reads: it wakes us when it keeps an event
                // or stops reading (then one of us reads).
                if past {
                    return Ok(None);
                }
                st = match deadline {
                    None => inner.changed.wait(st).unwrap_or_else(|e| e.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        let (g, _) = inner
                            .changed
                            .wait_timeout(st, left)
                            .unwrap_or_else(|e| e.into_inner());
                        g
                    }
                };
                continue;
            }
            let found = st.kept.read(&inner.chan, want);
            if found.kept_more {
                inner.changed.notify_all();
            }
            if let Some(event) = found.event? {
                return Ok(Some(event));
            }
            if past {
                return Ok(None);
            }
            st.reading = true;
            drop(st);
            let r = inner.chan.wait_readable(deadline);
            st = inner.state();
            st.reading = false;
            inner.changed.notify_all();
            r?;
        }
    }
}

#[cold]
fn timed_out(what: &'static str, waited: Duration) -> Error {
    Error::Timeout { what, waited }
}

impl AsFd for CmRouter {
    /// The channel's descriptor: readable when events wait to be read (not
    /// when events are kept; see [`CmRouter`]).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.chan.as_fd()
    }
}

impl fmt::Debug for CmRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.inner.state();
        f.debug_struct("CmRouter")
            .field("channel", &self.inner.chan)
            .field("kept", &st.kept.len())
            .field("reading", &st.reading)
            .finish()
    }
}

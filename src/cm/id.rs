//! CM ids (`struct rdma_cm_id`).

use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::addr::{read_sockaddr, PortSpace, RawAddr};
use super::channel::ChannelInner;
use super::link::{LinkShared, QpLink};
use super::param::{describe, max_private_data, ConnParam, PrivateDataOp};
use crate::context::Context;
use crate::error::{check_rc, Error, Result};
use crate::pd::ProtectionDomain;
use crate::qp::{QpAttr, QpInitAttr, QpState, QueuePair};
use crate::sys;
use crate::users::{Tally, UserKind};

use sys::rdma_cm_mc_join_flags as jf;

// The id's QP: create_qp, init_qp_attr, init_qp_attr_for.
mod qp;

c_enum! {
    /// How to join a multicast group (`enum rdma_cm_mc_join_flags`: one
    /// value, not a set).
    #[doc(alias = "rdma_cm_mc_join_flags")]
    pub enum McJoin(jf): u32 {
        /// Send and receive (what `rdma_join_multicast` does).
        FullMember = RDMA_MC_JOIN_FLAG_FULLMEMBER,
        /// Send only: the QP is not attached to the group.
        SendOnlyFullMember = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
    }
}

/// What a librdmacm call does to the id's QP when it succeeds (on failure
/// the QP's state is read from the device: librdmacm may have moved it part
/// of the way).
#[derive(Clone, Copy)]
enum After {
    /// Nothing.
    Unchanged,
    /// Moves it to this state (`rdma_accept`: RTR, then RTS).
    To(QpState),
    /// `rdma_disconnect`: ERR on InfiniBand/RoCE, SQD on iWARP.
    Disconnect,
}

/// Numbers ids and multicast joins, for [`CmId::key`] and join contexts.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
static NEXT_GROUP: AtomicUsize = AtomicUsize::new(1);

/// A joined multicast group.
struct Group {
    addr: SocketAddr,
    /// The join's context, which its events carry.
    token: usize,
    /// Its events not yet acknowledged: `rdma_leave_multicast` waits for them.
    held: usize,
}

/// The id itself, shared by its [`CmId`] and its unacknowledged events.
pub(crate) struct IdInner {
    raw: NonNull<sys::rdma_cm_id>,
    chan: Arc<ChannelInner>,
    /// `Weak::into_raw` of this very struct, kept in `raw->context`: an
    /// event finds its id through it. Let go after the id is destroyed.
    weak: *const IdInner,
    key: u64,
    /// The key of the listener whose connection request made this id (0
    /// for an id made with `rdma_create_id`).
    parent: u64,
    ps: PortSpace,
    /// The QP made on the id, while it lives.
    link: Mutex<Option<Arc<LinkShared>>>,
    groups: Mutex<Vec<Group>>,
    ctx: OnceLock<(Context, Tally)>,
    /// Set once `destroy` has run (successfully or not).
    destroyed: bool,
    /// Set by `connect`: librdmacm moves this side's QP when the connect
    /// response arrives.
    active: std::sync::atomic::AtomicBool,
}

// Threads: librdmacm's calls on the id run under the channel's lock (see
// `CmId::call`; `rdma_leave_multicast` too, also in `destroy`), except
// `rdma_destroy_id`, which takes librdmacm's own per-id mutex and runs only
// from the last handle; `weak` is only turned back into a `Weak` under that
// lock or in `destroy`. The rest is Mutex/OnceLock/atomics.
// SAFETY: by the above, the id may move to and be used from any thread.
unsafe impl Send for IdInner {}
// SAFETY: as above.
unsafe impl Sync for IdInner {}

impl IdInner {
    /// Takes ownership of `raw`, a live id on `chan` nobody else owns, and
    /// points its context at the new struct.
    ///
    /// # Safety
    /// As said; if another thread may read events of the channel, the
    /// channel's lock is held.
    unsafe fn wrap(
        chan: &Arc<ChannelInner>,
        raw: NonNull<sys::rdma_cm_id>,
        ps: PortSpace,
        parent: u64,
    ) -> Arc<Self> {
        let inner = Arc::new_cyclic(|weak: &Weak<IdInner>| IdInner {
            raw,
            chan: chan.clone(),
            weak: weak.clone().into_raw(),
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
            parent,
            ps,
            link: Mutex::new(None),
            groups: Mutex::new(Vec::new()),
            ctx: OnceLock::new(),
            destroyed: false,
            active: std::sync::atomic::AtomicBool::new(false),
        });
        // SAFETY: `raw` is live and ours; the caller holds the lock if needed.
        unsafe { (*raw.as_ptr()).context = inner.weak as *mut c_void };
        inner
    }

    /// The id whose `context` librdmacm handed back, unless it is being
    /// destroyed.
    ///
    /// # Safety
    /// `raw` is a live id of this crate's (its context is an `IdInner`'s
    /// `weak`), and the channel's lock is held, or an unacknowledged event
    /// of `raw` keeps its destruction waiting.
    pub(crate) unsafe fn from_raw_id(raw: *mut sys::rdma_cm_id) -> Option<Arc<IdInner>> {
        if raw.is_null() {
            return None;
        }
        // SAFETY: per the caller, `raw` is live.
        let ctx = unsafe { (*raw).context } as *const IdInner;
        if ctx.is_null() {
            return None;
        }
        // SAFETY: `ctx` is a `Weak::into_raw` whose count the id holds until
        // after `rdma_destroy_id`, which waits for the caller's event; the
        // `ManuallyDrop` leaves that count alone.
        let weak = ManuallyDrop::new(unsafe { Weak::from_raw(ctx) });
        weak.upgrade()
    }

    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// The key of the listener this id came from (0 for none).
    pub(crate) fn parent(&self) -> u64 {
        self.parent
    }

    pub(crate) fn ps(&self) -> PortSpace {
        self.ps
    }

    /// Reads the state of the id's QP into its known state. Call with the
    /// channel's lock held.
    pub(crate) fn refresh_qp_locked(&self) {
        if let Some(link) = self.link.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            link.refresh();
        }
    }

    /// Records that librdmacm moved the id's QP to `state`. Call with the
    /// channel's lock held.
    pub(crate) fn qp_moved_locked(&self, state: QpState) {
        if let Some(link) = self.link.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            link.moved(state);
        }
    }

    /// Whether the id called `rdma_connect` (the active side).
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Counts a multicast event of the join `token`; false if no such join.
    pub(crate) fn hold_group(&self, token: usize) -> bool {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        match groups.iter_mut().find(|g| g.token == token) {
            Some(g) => {
                g.held += 1;
                true
            }
            None => false,
        }
    }

    pub(crate) fn release_group(&self, token: usize) {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = groups.iter_mut().find(|g| g.token == token) {
            g.held = g.held.saturating_sub(1);
        }
    }

    /// Destroys the id: the QP is let go, groups are left, then
    /// `rdma_destroy_id`. Runs once, from `close` or `Drop`; after a
    /// failure the id is left alone (leaked with what it holds).
    fn destroy(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.destroyed, true) {
            return Ok(());
        }
        {
            let _guard = self.chan.lock();
            // Groups first, while `id->qp` still names the QP: librdmacm
            // detaches it from each group. The lock is held (librdmacm reads
            // `id->qp`); the wait inside for the group's acknowledgements
            // ends at once: every read event holds this id, and this is its
            // last handle, and unread ones the kernel drops with the group.
            let groups = std::mem::take(self.groups.get_mut().unwrap_or_else(|e| e.into_inner()));
            for g in groups {
                let mut addr = RawAddr::new(g.addr);
                // SAFETY: the id is live; `addr` is valid for the call (see above).
                unsafe { sys::rdma_leave_multicast(self.raw.as_ptr(), addr.as_ptr()) };
            }
            if let Some(link) = self
                .link
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                link.detach_locked();
            }
        }
        // SAFETY: the id is live and destroyed once, here. No event of it is
        // held (each holds the id), so the wait for acknowledgements inside
        // only covers events another thread is handing back right now.
        let rc = unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
        check_rc("rdma_destroy_id", rc)?;
        // SAFETY: the id is gone, so no event can look up `weak` any more;
        // its count is released once, here.
        drop(unsafe { Weak::from_raw(self.weak) });
        Ok(())
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        // On failure the id lives on in librdmacm with its context pointer,
        // so the weak count stays (leaked) with it. Nothing panics.
        let _ = self.destroy();
    }
}

/// A connection manager id (`struct rdma_cm_id`): the RDMA counterpart of
/// a socket, which resolves addresses, listens, connects and accepts.
///
/// Its events arrive on the [`EventChannel`](super::EventChannel) it was
/// made from. Dropping it destroys it (`rdma_destroy_id`) once its last
/// unacknowledged event is dropped too; [`close`](Self::close) reports a
/// failure. A QP made on it with [`create_qp`](Self::create_qp) is a
/// separate object: either can be dropped first.
///
/// Calls that send something return as soon as it is sent; their outcome
/// is an event (`resolve_addr` -> [`AddrResolved`](super::CmEventKind::AddrResolved)
/// or [`AddrError`](super::CmEventKind::AddrError), ...).
#[doc(alias = "rdma_cm_id")]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl CmId {
    pub(crate) fn new(chan: &Arc<ChannelInner>, ps: PortSpace) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: the channel is live; `raw` is a valid out-parameter.
        let rc = unsafe {
            sys::rdma_create_id(chan.as_ptr(), &mut raw, std::ptr::null_mut(), ps.as_raw())
        };
        check_rc("rdma_create_id", rc)?;
        let raw = NonNull::new(raw).ok_or(Error::Verb {
            verb: "rdma_create_id",
            errno: libc::EINVAL,
        })?;
        // The new id has no events yet, so nobody else reads its context.
        // SAFETY: a fresh id on `chan`, owned by nobody else.
        let inner = unsafe { IdInner::wrap(chan, raw, ps, 0) };
        Ok(CmId { inner })
    }

    /// Takes a connection request's new id; `listener` is the key of the
    /// listener the request came to.
    ///
    /// # Safety
    /// `raw` is the live new id of a connection request on `chan`, owned by
    /// nobody else, and the channel's lock is held.
    pub(crate) unsafe fn adopt(
        chan: &Arc<ChannelInner>,
        raw: NonNull<sys::rdma_cm_id>,
        ps: PortSpace,
        listener: u64,
    ) -> Self {
        CmId {
            // SAFETY: per the caller.
            inner: unsafe { IdInner::wrap(chan, raw, ps, listener) },
        }
    }

    pub(crate) fn inner(&self) -> &Arc<IdInner> {
        &self.inner
    }

    /// Whether the id's events arrive on `chan`.
    pub(crate) fn on_channel(&self, chan: &Arc<ChannelInner>) -> bool {
        Arc::ptr_eq(&self.inner.chan, chan)
    }

    /// A number that tells this id apart from every other of the process
    /// ([`CmEvent::id_key`](super::CmEvent::id_key) gives the one of an
    /// event's id).
    pub fn key(&self) -> u64 {
        self.inner.key
    }

    /// The [`key`](Self::key) of the listener whose connection request
    /// made this id ([`CmEvent::take_request`](super::CmEvent::take_request)),
    /// `None` for an id made with [`EventChannel::create_id`](super::EventChannel::create_id).
    /// A [`CmRouter`](super::CmRouter) routes this id's events to waiters
    /// for [`EventsOf::Listener`](super::EventsOf::Listener) of that listener.
    pub fn listener_key(&self) -> Option<u64> {
        (self.inner.parent != 0).then_some(self.inner.parent)
    }

    /// The port space the id was made in.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// Runs one librdmacm call on the raw id under the channel's lock, then
    /// brings the known state of the id's QP up to date: from what the call
    /// does when it succeeds (`after`), or from the device when it failed.
    fn call(
        &self,
        verb: &'static str,
        after: After,
        f: impl FnOnce(*mut sys::rdma_cm_id) -> c_int,
    ) -> Result<()> {
        let _guard = self.inner.chan.lock();
        let raw = self.inner.raw.as_ptr();
        let r = check_rc(verb, f(raw)).map(|_| ());
        match (r.is_ok(), after) {
            (true, After::Unchanged) => {}
            (true, After::To(state)) => self.inner.qp_moved_locked(state),
            // SAFETY: the id is live and on a device (`disconnect` checks);
            // the lock is held.
            (true, After::Disconnect) if unsafe { ib_transport(raw) } => {
                self.inner.qp_moved_locked(QpState::Err)
            }
            _ => self.inner.refresh_qp_locked(),
        }
        r
    }

    /// Reads the raw id under the channel's lock.
    fn read<R>(&self, f: impl FnOnce(&sys::rdma_cm_id) -> R) -> R {
        let _guard = self.inner.chan.lock();
        // SAFETY: the id is live; the lock keeps librdmacm from writing it meanwhile.
        f(unsafe { &*self.inner.raw.as_ptr() })
    }

    /// Binds the id to a local address (port 0: any free port). Binding to
    /// an RDMA device's address also gives the id its
    /// [`context`](Self::context).
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut a = RawAddr::new(addr);
        // SAFETY: the id is live; `a` is a valid address for the call.
        self.call("rdma_bind_addr", After::Unchanged, |id| unsafe {
            sys::rdma_bind_addr(id, a.as_ptr())
        })
    }

    /// Starts resolving `dst` (from `src`, or the route's source address)
    /// to an RDMA device and port: an
    /// [`AddrResolved`](super::CmEventKind::AddrResolved) event, or
    /// [`AddrError`](super::CmEventKind::AddrError) after `timeout`.
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let ms = timeout_ms(timeout)?;
        let mut src = src.map(RawAddr::new);
        let mut dst = RawAddr::new(dst);
        let src_ptr = src.as_mut().map_or(std::ptr::null_mut(), RawAddr::as_ptr);
        // SAFETY: the id is live; the addresses are valid for the call.
        self.call("rdma_resolve_addr", After::Unchanged, |id| unsafe {
            sys::rdma_resolve_addr(id, src_ptr, dst.as_ptr(), ms)
        })
    }

    /// Starts resolving the route to the resolved address: a
    /// [`RouteResolved`](super::CmEventKind::RouteResolved) or
    /// [`RouteError`](super::CmEventKind::RouteError) event.
    ///
    /// The route must start at an address of an RDMA device's network
    /// interface. An address no RDMA device has (127.0.0.1 resolves, as
    /// the loopback device, but has no route) fails with
    /// [`Error::NoRdmaAddress`](crate::Error::NoRdmaAddress), which names
    /// the address and lists this machine's RDMA addresses.
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout_ms(timeout)?;
        if self.read(|id| id.verbs.is_null()) {
            return Err(not_on_a_device("rdma_resolve_route"));
        }
        // SAFETY: the id is live and has a device (librdmacm reads `verbs`).
        let r = self.call("rdma_resolve_route", After::Unchanged, |id| unsafe {
            sys::rdma_resolve_route(id, ms)
        });
        match r {
            Err(Error::Verb { errno, .. }) if errno == libc::ENODEV => Err(
                super::route_hint::no_rdma_device_has(self.local_addr(), errno),
            ),
            r => r,
        }
    }

    /// Sets one `RDMA_OPTION_ID` option (`rdma_set_option`).
    fn set_id_option<T>(&self, name: u32, value: &T) -> Result<()> {
        let len = std::mem::size_of::<T>();
        let ptr = (value as *const T).cast_mut().cast::<c_void>();
        // SAFETY: the id is live; `ptr` points to `len` readable bytes of
        // the type the option takes (the kernel copies them in).
        self.call("rdma_set_option", After::Unchanged, |id| unsafe {
            sys::rdma_set_option(id, sys::RDMA_OPTION_ID as c_int, name as c_int, ptr, len)
        })
    }

    /// The type of service of the id's traffic (`RDMA_OPTION_ID_TOS`): on
    /// RoCE the IP header's TOS byte, on InfiniBand mapped to a service
    /// level. Set it before resolving the route.
    #[doc(alias = "rdma_set_option")]
    #[doc(alias = "RDMA_OPTION_ID_TOS")]
    pub fn set_tos(&self, tos: u8) -> Result<()> {
        self.set_id_option(sys::RDMA_OPTION_ID_TOS, &tos)
    }

    /// Whether the id may bind a port that a closed id still holds
    /// (`RDMA_OPTION_ID_REUSEADDR`). Set it before binding.
    #[doc(alias = "rdma_set_option")]
    #[doc(alias = "RDMA_OPTION_ID_REUSEADDR")]
    pub fn set_reuse_addr(&self, on: bool) -> Result<()> {
        self.set_id_option(sys::RDMA_OPTION_ID_REUSEADDR, &c_int::from(on))
    }

    /// The QP's local ACK timeout the CM uses (`RDMA_OPTION_ID_ACK_TIMEOUT`,
    /// 4.096 us * 2^`timeout`, 0..=31), overriding the one from the path.
    #[doc(alias = "rdma_set_option")]
    #[doc(alias = "RDMA_OPTION_ID_ACK_TIMEOUT")]
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        if timeout > 31 {
            return Err(Error::OutOfRange {
                what: "ACK timeout",
                value: timeout.into(),
                range: "0..=31",
            });
        }
        self.set_id_option(sys::RDMA_OPTION_ID_ACK_TIMEOUT, &timeout)
    }

    /// Listens for connection requests on the bound address; each arrives
    /// as a [`ConnectRequest`](super::CmEventKind::ConnectRequest) event.
    #[doc(alias = "rdma_listen")]
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let backlog = c_int::try_from(backlog).unwrap_or(c_int::MAX);
        // SAFETY: the id is live.
        self.call("rdma_listen", After::Unchanged, |id| unsafe {
            sys::rdma_listen(id, backlog)
        })
    }

    /// The device context the id is on, once bound or resolved: the one
    /// librdmacm opened, which every id on the device shares. PDs for
    /// [`create_qp`](Self::create_qp) come from it.
    #[doc(alias = "verbs")]
    pub fn context(&self) -> Result<Context> {
        if let Some((ctx, _)) = self.inner.ctx.get() {
            return Ok(ctx.clone());
        }
        let verbs =
            NonNull::new(self.read(|id| id.verbs)).ok_or_else(|| not_on_a_device("rdma_cm_id"))?;
        let ctx = super::device::context_for(verbs)?;
        let held = self.inner.ctx.get_or_init(|| {
            let tally = Tally::new(ctx.users(), UserKind::CmId, 1);
            (ctx, tally)
        });
        Ok(held.0.clone())
    }

    /// The device port the id is on (0 before it is bound or resolved).
    pub fn port_num(&self) -> u8 {
        self.read(|id| id.port_num)
    }

    /// The local address (`rdma_get_local_addr`), once bound or resolved.
    #[doc(alias = "rdma_get_local_addr")]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.read(|id| {
            // SAFETY: `src_addr` is a sockaddr_storage-sized union member of the live id.
            unsafe { read_sockaddr(std::ptr::addr_of!(id.route.addr.__bindgen_anon_1).cast()) }
        })
    }

    /// The peer's address (`rdma_get_peer_addr`), once resolved or connected.
    #[doc(alias = "rdma_get_peer_addr")]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.read(|id| {
            // SAFETY: `dst_addr` is a sockaddr_storage-sized union member of the live id.
            unsafe { read_sockaddr(std::ptr::addr_of!(id.route.addr.__bindgen_anon_2).cast()) }
        })
    }

    fn conn_raw(
        &self,
        verb: &'static str,
        op: PrivateDataOp,
        param: &ConnParam<'_>,
    ) -> Result<sys::rdma_conn_param> {
        let ctx = self.context()?;
        let has_qp = self.read(|id| !id.qp.is_null());
        param.to_raw(verb, op, self.inner.ps, &ctx, has_qp)
    }

    /// Connects to the resolved peer (`rdma_connect`): an
    /// [`Established`](super::CmEventKind::Established) event (for an id
    /// with a CM QP, which is then in RTS), a
    /// [`ConnectResponse`](super::CmEventKind::ConnectResponse) (for an id
    /// without one: move the program's QP, then [`establish`](Self::establish)),
    /// or [`Rejected`](super::CmEventKind::Rejected) /
    /// [`Unreachable`](super::CmEventKind::Unreachable). On a UD id this
    /// asks the peer for its QP number and Q_Key (the reply is an
    /// `Established` event with [`ud_info`](super::CmEvent::ud_info)).
    #[doc(alias = "rdma_connect")]
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        if self.read(|id| id.verbs.is_null()) {
            return Err(not_on_a_device("rdma_connect"));
        }
        let mut p = self.conn_raw("rdma_connect", PrivateDataOp::Connect, param)?;
        self.inner.active.store(true, Ordering::Release);
        // SAFETY: the id is live; `p` and the private data it points to
        // (borrowed from `param`) are valid for the call.
        self.call("rdma_connect", After::Unchanged, |id| unsafe {
            sys::rdma_connect(id, &mut p)
        })
    }

    /// Accepts a connection request (`rdma_accept`) on its new id; for an
    /// id with a CM QP, the QP is in RTS when this returns.
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        let mut p = self.conn_raw("rdma_accept", PrivateDataOp::Accept, param)?;
        let after = if self.inner.ps.is_connected() {
            After::To(QpState::Rts)
        } else {
            After::Unchanged
        };
        // SAFETY: as in `connect`.
        self.call("rdma_accept", after, |id| unsafe {
            sys::rdma_accept(id, &mut p)
        })
    }

    /// Rejects a connection request (`rdma_reject`), with private data for
    /// the peer's [`Rejected`](super::CmEventKind::Rejected) event.
    #[doc(alias = "rdma_reject")]
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let limit = max_private_data(PrivateDataOp::Reject, self.inner.ps);
        if private_data.len() > limit {
            return Err(Error::invalid(
                "rdma_reject",
                format!(
                    "{} bytes of private data is more than the {limit} {} carries",
                    private_data.len(),
                    describe(PrivateDataOp::Reject, self.inner.ps)
                ),
            ));
        }
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast::<c_void>()
        };
        let len = private_data.len() as u8;
        // SAFETY: the id is live; `ptr` points to `len` readable bytes (or is NULL).
        self.call("rdma_reject", After::Unchanged, |id| unsafe {
            sys::rdma_reject(id, ptr, len)
        })
    }

    /// Tells the peer that a connection without a CM QP is ready
    /// (`rdma_establish`), after a
    /// [`ConnectResponse`](super::CmEventKind::ConnectResponse) and moving
    /// the program's QP to RTS.
    #[doc(alias = "rdma_establish")]
    pub fn establish(&self) -> Result<()> {
        if self.read(|id| !id.qp.is_null()) {
            return Err(Error::invalid(
                "rdma_establish",
                "the id has a CM QP, which the CM establishes itself",
            ));
        }
        // SAFETY: the id is live.
        self.call("rdma_establish", After::Unchanged, |id| unsafe {
            sys::rdma_establish(id)
        })
    }

    /// Disconnects (`rdma_disconnect`): a CM QP goes to ERR (its
    /// outstanding requests flush), and both sides get a
    /// [`Disconnected`](super::CmEventKind::Disconnected) event.
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(&self) -> Result<()> {
        if self.read(|id| id.verbs.is_null()) {
            return Err(not_on_a_device("rdma_disconnect"));
        }
        // SAFETY: the id is live and on a device.
        self.call("rdma_disconnect", After::Disconnect, |id| unsafe {
            sys::rdma_disconnect(id)
        })
    }

    /// Joins the multicast group `addr` as a full member: a
    /// [`MulticastJoin`](super::CmEventKind::MulticastJoin) event with the
    /// group's [`ud_info`](super::CmEvent::ud_info); a CM QP is attached to
    /// the group when it arrives.
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&self, addr: SocketAddr) -> Result<()> {
        self.join_multicast_with(addr, McJoin::FullMember)
    }

    /// Joins the multicast group `addr` as `how` says (`rdma_join_multicast_ex`).
    #[doc(alias = "rdma_join_multicast_ex")]
    pub fn join_multicast_with(&self, addr: SocketAddr, how: McJoin) -> Result<()> {
        const VERB: &str = "rdma_join_multicast_ex";
        if self.inner.ps.is_connected() {
            return Err(Error::invalid(
                VERB,
                format!(
                    "multicast needs a UD port space, not {}",
                    self.inner.ps.c_name()
                ),
            ));
        }
        let token = NEXT_GROUP.fetch_add(1, Ordering::Relaxed);
        {
            // The group is known before its event can be read. (The groups'
            // lock is never held while taking the channel's: event reading
            // takes them the other way round.)
            let mut groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
            if groups.iter().any(|g| g.addr == addr) {
                return Err(Error::invalid(
                    VERB,
                    format!("the id has joined {addr} already"),
                ));
            }
            groups.push(Group {
                addr,
                token,
                held: 0,
            });
        }
        let mut raw_addr = RawAddr::new(addr);
        let mut attr = sys::rdma_cm_join_mc_attr_ex {
            comp_mask: sys::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_ADDRESS
                | sys::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
            join_flags: how.as_raw(),
            addr: raw_addr.as_ptr(),
        };
        // SAFETY: the id is live; `attr` and the address it points to are
        // valid for the call; `token` is only handed back, never dereferenced.
        let r = self.call(VERB, After::Unchanged, |id| unsafe {
            sys::rdma_join_multicast_ex(id, &mut attr, token as *mut c_void)
        });
        if r.is_err() {
            self.inner
                .groups
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|g| g.token != token);
        }
        r
    }

    /// Leaves the multicast group `addr` (`rdma_leave_multicast`).
    ///
    /// Refused while an event of the group is held: librdmacm waits for its
    /// acknowledgement, which would never come from a thread waiting here.
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        const VERB: &str = "rdma_leave_multicast";
        {
            let mut groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
            let Some(pos) = groups.iter().position(|g| g.addr == addr) else {
                return Err(Error::invalid(
                    VERB,
                    format!("the id has not joined {addr}"),
                ));
            };
            if groups[pos].held > 0 {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "an event of group {addr} is still held; drop it first (librdmacm waits for its acknowledgement)"
                    ),
                ));
            }
            groups.remove(pos);
        }
        let mut a = RawAddr::new(addr);
        // librdmacm detaches the id's QP (under the lock, like every reader
        // of `id->qp`), then waits for the group's events, none held here.
        // SAFETY: the id is live; `a` is a valid address for the call.
        self.call(VERB, After::Unchanged, |id| unsafe {
            sys::rdma_leave_multicast(id, a.as_ptr())
        })
    }

    /// Destroys the id now and reports failure (`rdma_destroy_id`).
    ///
    /// While an event of the id (or, for a listener, a connection request
    /// to it) is held, the id cannot be destroyed: this returns
    /// [`Error::InUse`], and the id is destroyed when the last such event is
    /// dropped.
    #[doc(alias = "rdma_destroy_id")]
    pub fn close(self) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => inner.destroy(),
            // Only its unacknowledged events hold it (CmId is not Clone).
            Err(arc) => Err(crate::handle::in_use("CM id", &arc, None)),
        }
    }
}

/// Whether the id's device is InfiniBand/RoCE (not iWARP).
///
/// # Safety
/// `raw` is a live id on a device (`verbs` set), read under the channel's lock.
unsafe fn ib_transport(raw: *mut sys::rdma_cm_id) -> bool {
    // SAFETY: per the caller, `verbs` and its device are live.
    unsafe {
        let verbs = (*raw).verbs;
        !verbs.is_null()
            && (*(*verbs).device).transport_type == sys::ibv_transport_type::IBV_TRANSPORT_IB
    }
}

fn timeout_ms(timeout: Duration) -> Result<c_int> {
    c_int::try_from(timeout.as_millis()).map_err(|_| Error::OutOfRange {
        what: "timeout in milliseconds",
        value: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        range: "0..=2147483647",
    })
}

fn not_on_a_device(verb: &'static str) -> Error {
    Error::invalid(
        verb,
        "the id is not on a device yet: bind it to a local RDMA address or resolve an address first",
    )
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("key", &self.inner.key)
            .field("port_space", &self.inner.ps)
            .field("local_addr", &self.local_addr())
            .field("peer_addr", &self.peer_addr())
            .finish()
    }
}

//! CM events (`struct rdma_cm_event`), acknowledged when dropped.

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, MutexGuard};

use super::channel::ChannelInner;
use super::id::{CmId, IdInner};
use super::param::{ConnInfo, UdInfo};
use crate::error::Error;
use crate::sys;

use sys::rdma_cm_event_type as t;

/// What happened (`enum rdma_cm_event_type`).
#[doc(alias = "rdma_cm_event_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: [`CmId::resolve_addr`] found the
    /// local device and port; the id now has a [`context`](CmId::context).
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: address resolution failed (status: the
    /// negative errno, `-ETIMEDOUT` for an address nobody answers for).
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: [`CmId::resolve_route`] succeeded.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`: route resolution failed.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a peer connects to a listener; the
    /// new id is [`CmEvent::take_request`], its offer
    /// [`CmEvent::conn_info`] / [`CmEvent::ud_info`] and
    /// [`CmEvent::private_data`].
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: the peer accepted a connection of
    /// an id without a CM QP; finish with [`CmId::establish`].
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: setting up the connection failed.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer rejected the connection (status:
    /// the reject reason; the peer's [`private_data`](CmEvent::private_data)).
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`: the connection is up (for UD ids: the
    /// peer's [`ud_info`](CmEvent::ud_info)).
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is down.
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the id's device is going away.
    DeviceRemoval,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`: a [`CmId::join_multicast`] finished;
    /// the group's address vector is in [`ud_info`](CmEvent::ud_info).
    MulticastJoin,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`: a join failed or the group broke.
    MulticastError,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`: the id's address moved to another device.
    AddrChange,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`: the QP of a closed connection left
    /// time-wait and can be reused.
    TimewaitExit,
    /// An event this crate does not know (a newer librdmacm); the number.
    Other(u32),
}

impl CmEventKind {
    const TABLE: [(CmEventKind, u32, &'static str); 16] = [
        (
            Self::AddrResolved,
            t::RDMA_CM_EVENT_ADDR_RESOLVED,
            "RDMA_CM_EVENT_ADDR_RESOLVED",
        ),
        (
            Self::AddrError,
            t::RDMA_CM_EVENT_ADDR_ERROR,
            "RDMA_CM_EVENT_ADDR_ERROR",
        ),
        (
            Self::RouteResolved,
            t::RDMA_CM_EVENT_ROUTE_RESOLVED,
            "RDMA_CM_EVENT_ROUTE_RESOLVED",
        ),
        (
            Self::RouteError,
            t::RDMA_CM_EVENT_ROUTE_ERROR,
            "RDMA_CM_EVENT_ROUTE_ERROR",
        ),
        (
            Self::ConnectRequest,
            t::RDMA_CM_EVENT_CONNECT_REQUEST,
            "RDMA_CM_EVENT_CONNECT_REQUEST",
        ),
        (
            Self::ConnectResponse,
            t::RDMA_CM_EVENT_CONNECT_RESPONSE,
            "RDMA_CM_EVENT_CONNECT_RESPONSE",
        ),
        (
            Self::ConnectError,
            t::RDMA_CM_EVENT_CONNECT_ERROR,
            "RDMA_CM_EVENT_CONNECT_ERROR",
        ),
        (
            Self::Unreachable,
            t::RDMA_CM_EVENT_UNREACHABLE,
            "RDMA_CM_EVENT_UNREACHABLE",
        ),
        (
            Self::Rejected,
            t::RDMA_CM_EVENT_REJECTED,
            "RDMA_CM_EVENT_REJECTED",
        ),
        (
            Self::Established,
            t::RDMA_CM_EVENT_ESTABLISHED,
            "RDMA_CM_EVENT_ESTABLISHED",
        ),
        (
            Self::Disconnected,
            t::RDMA_CM_EVENT_DISCONNECTED,
            "RDMA_CM_EVENT_DISCONNECTED",
        ),
        (
            Self::DeviceRemoval,
            t::RDMA_CM_EVENT_DEVICE_REMOVAL,
            "RDMA_CM_EVENT_DEVICE_REMOVAL",
        ),
        (
            Self::MulticastJoin,
            t::RDMA_CM_EVENT_MULTICAST_JOIN,
            "RDMA_CM_EVENT_MULTICAST_JOIN",
        ),
        (
            Self::MulticastError,
            t::RDMA_CM_EVENT_MULTICAST_ERROR,
            "RDMA_CM_EVENT_MULTICAST_ERROR",
        ),
        (
            Self::AddrChange,
            t::RDMA_CM_EVENT_ADDR_CHANGE,
            "RDMA_CM_EVENT_ADDR_CHANGE",
        ),
        (
            Self::TimewaitExit,
            t::RDMA_CM_EVENT_TIMEWAIT_EXIT,
            "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        ),
    ];

    /// Decodes a C value.
    pub fn from_raw(raw: u32) -> Self {
        Self::TABLE
            .iter()
            .find(|(_, r, _)| *r == raw)
            .map_or(Self::Other(raw), |(k, _, _)| *k)
    }

    /// The C value.
    pub fn as_raw(self) -> u32 {
        match self {
            Self::Other(raw) => raw,
            k => Self::TABLE
                .iter()
                .find(|(x, _, _)| *x == k)
                .map_or(u32::MAX, |(_, r, _)| *r),
        }
    }

    /// The C name (`rdma_event_str`), `"UNKNOWN EVENT"` for [`Other`](Self::Other).
    #[doc(alias = "rdma_event_str")]
    pub fn c_name(self) -> &'static str {
        Self::TABLE
            .iter()
            .find(|(x, _, _)| *x == self)
            .map_or("UNKNOWN EVENT", |(_, _, n)| *n)
    }

    /// Whether the event is one of the multicast events, whose
    /// `param.ud.private_data` is the join's context rather than data.
    fn is_multicast(self) -> bool {
        matches!(self, Self::MulticastJoin | Self::MulticastError)
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(raw) => write!(f, "UNKNOWN EVENT {raw}"),
            k => f.write_str(k.c_name()),
        }
    }
}

/// A CM event (`struct rdma_cm_event`).
///
/// Dropping it acknowledges it (`rdma_ack_cm_event`), exactly once. It
/// keeps the id it is counted against alive until then, because
/// `rdma_destroy_id` waits for that acknowledgement. A connection
/// request's new id that was not taken with
/// [`take_request`](Self::take_request) is destroyed with the event, which
/// makes the kernel reject the request.
#[doc(alias = "rdma_cm_event")]
pub struct CmEvent {
    raw: NonNull<sys::rdma_cm_event>,
    kind: CmEventKind,
    /// The id the acknowledgement is counted against: the listener for a
    /// connection request, the event's id otherwise.
    id: Arc<IdInner>,
    /// A connection request's new id, until taken.
    request: Option<CmId>,
    /// The multicast group of a multicast event (its join token).
    group: Option<usize>,
}

// Threads: the event is a malloc'd struct librdmacm no longer writes once
// `rdma_get_cm_event` returned it, and `rdma_ack_cm_event` may run on any
// thread (it takes librdmacm's per-id mutex); `IdInner` and `CmId` are
// Send + Sync.
// SAFETY: by the above, the event may move to and be dropped on any thread.
unsafe impl Send for CmEvent {}
// SAFETY: `&CmEvent` only reads the immutable event.
unsafe impl Sync for CmEvent {}

impl CmEvent {
    /// Wraps an event fresh from `rdma_get_cm_event`, or acknowledges it
    /// and returns `None` when its id is being destroyed.
    ///
    /// # Safety
    /// `raw` came from `rdma_get_cm_event` on `chan` and is not yet
    /// acknowledged; `_locked` is `chan`'s lock.
    pub(crate) unsafe fn wrap(
        chan: &Arc<ChannelInner>,
        raw: NonNull<sys::rdma_cm_event>,
        _locked: &MutexGuard<'_, ()>,
    ) -> Option<CmEvent> {
        // SAFETY: a valid event, per the caller.
        let ev = unsafe { &*raw.as_ptr() };
        let kind = CmEventKind::from_raw(ev.event);
        let counted = if kind == CmEventKind::ConnectRequest {
            ev.listen_id
        } else {
            ev.id
        };
        // SAFETY: `counted` is a live id (the event is not acknowledged, so
        // its destruction waits); its context is ours (ids are only made here).
        let id = unsafe { IdInner::from_raw_id(counted) };
        let Some(id) = id else {
            // Its id is being destroyed, and waits for this acknowledgement.
            if kind == CmEventKind::ConnectRequest {
                // SAFETY: the request's new id is ours alone; nothing else knows it.
                unsafe { sys::rdma_destroy_id(ev.id) };
            }
            // SAFETY: acknowledged once, here; not used after.
            unsafe { sys::rdma_ack_cm_event(raw.as_ptr()) };
            return None;
        };
        let request = match (kind, NonNull::new(ev.id)) {
            (CmEventKind::ConnectRequest, Some(new)) => {
                // SAFETY: the new id is live, unowned, on `chan`; the lock is held.
                Some(unsafe { CmId::adopt(chan, new, id.ps(), id.key()) })
            }
            _ => None,
        };
        let group = if kind.is_multicast() {
            // SAFETY: for multicast events librdmacm puts the join's context
            // (our token) into `param.ud.private_data`.
            let token = unsafe { ev.param.ud.private_data } as usize;
            id.hold_group(token).then_some(token)
        } else {
            None
        };
        // What librdmacm did to the id's QP while it read the event: on a
        // connect response it moved the active side's QP to RTR and RTS
        // (ESTABLISHED), or tried to move it to ERR (CONNECT_ERROR); on a
        // reject it moved it to ERR. Nothing for the other events.
        match kind {
            CmEventKind::Established if id.is_active() && id.ps().is_connected() => {
                id.qp_moved_locked(crate::qp::QpState::Rts)
            }
            CmEventKind::ConnectError | CmEventKind::Rejected => id.refresh_qp_locked(),
            _ => {}
        }
        Some(CmEvent {
            raw,
            kind,
            id,
            request,
            group,
        })
    }

    fn raw(&self) -> &sys::rdma_cm_event {
        // SAFETY: the event stays valid until acknowledged in `drop`.
        unsafe { &*self.raw.as_ptr() }
    }

    /// What happened.
    pub fn kind(&self) -> CmEventKind {
        self.kind
    }

    /// The event's status: 0, a negative errno for the error events, or the
    /// reject reason of [`CmEventKind::Rejected`] (28 for a consumer reject
    /// in InfiniBand/RoCE's CM).
    pub fn status(&self) -> i32 {
        self.raw().status
    }

    /// The reject reason of a [`CmEventKind::Rejected`] event (the IB CM's:
    /// 28 for a consumer reject, 8 for an invalid service id, i.e. nobody
    /// listening); `None` for other events.
    pub fn reject_reason(&self) -> Option<i32> {
        (self.kind == CmEventKind::Rejected).then(|| self.status())
    }

    /// Whether the event is for `id` (for a connection request: whether
    /// `id` is the listener it came to).
    pub fn is_for(&self, id: &CmId) -> bool {
        Arc::ptr_eq(&self.id, id.inner())
    }

    /// The [`CmId::key`] of the id the event is for (the listener, for a
    /// connection request).
    pub fn id_key(&self) -> u64 {
        self.id.key()
    }

    /// How many holders the event's id has: its [`CmId`] (if not dropped)
    /// and its unacknowledged events, this one among them.
    pub(crate) fn id_holders(&self) -> usize {
        Arc::strong_count(&self.id)
    }

    /// The key of the listener the event's id came from (0 for none); for
    /// a connection request, the listener's own parent.
    pub(crate) fn id_parent(&self) -> u64 {
        self.id.parent()
    }

    /// Takes a connection request's new id, to [`accept`](CmId::accept)
    /// or [`reject`](CmId::reject). `None` for other events, and the
    /// second time.
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }

    /// The private data that came with the event (connect request, accept,
    /// reject, ...): empty when there was none, and for multicast events.
    ///
    /// The CM pads private data to its message's fixed size, so a request
    /// shows the sender's bytes followed by zeros.
    pub fn private_data(&self) -> &[u8] {
        if self.kind.is_multicast() {
            return &[];
        }
        let p = &self.raw().param;
        // SAFETY: librdmacm filled the `ud` member for ids of UD port spaces
        // and `conn` for the others (`ucma_copy_*_event`); both start with
        // the same two private-data fields.
        let (ptr, len) = unsafe {
            if self.id.ps().is_connected() {
                (p.conn.private_data, p.conn.private_data_len)
            } else {
                (p.ud.private_data, p.ud.private_data_len)
            }
        };
        if ptr.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: librdmacm copied `len` bytes into the event itself; they
        // live until it is acknowledged, after `&self` ends.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), usize::from(len)) }
    }

    /// The connection parameters the peer offered or agreed to (connected
    /// port spaces: connect request, connect response, established,
    /// rejected).
    pub fn conn_info(&self) -> Option<ConnInfo> {
        if !self.id.ps().is_connected() || self.kind.is_multicast() {
            return None;
        }
        // SAFETY: `conn` is the member librdmacm filled for connected ids.
        Some(ConnInfo::from_raw(unsafe { &self.raw().param.conn }))
    }

    /// Where UD sends to the peer or group go (UD port spaces: connect
    /// request, established, multicast join).
    pub fn ud_info(&self) -> Option<UdInfo> {
        if self.id.ps().is_connected() && !self.kind.is_multicast() {
            return None;
        }
        // SAFETY: `ud` is the member librdmacm filled for UD ids and for
        // multicast events.
        Some(UdInfo::from_raw(unsafe { &self.raw().param.ud }))
    }

    /// The error for an event that is not the `awaited` one.
    pub(crate) fn unexpected(&self, awaited: CmEventKind) -> Error {
        Error::CmEvent {
            awaited: awaited.c_name(),
            got: self.kind.c_name(),
            status: self.status(),
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // An untaken request's id goes first (the kernel rejects it).
        drop(self.request.take());
        // SAFETY: acknowledged exactly once, here; nothing reads the event after.
        unsafe { sys::rdma_ack_cm_event(self.raw.as_ptr()) };
        if let Some(token) = self.group {
            self.id.release_group(token);
        }
    }
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("kind", &self.kind)
            .field("status", &self.status())
            .field("id", &self.id.key())
            .field("private_data_len", &self.private_data().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_name_like_rdma_event_str() {
        for (k, raw, name) in CmEventKind::TABLE {
            assert_eq!(CmEventKind::from_raw(raw), k);
            assert_eq!(k.as_raw(), raw);
            assert_eq!(k.c_name(), name);
        }
        assert_eq!(CmEventKind::from_raw(999), CmEventKind::Other(999));
        assert_eq!(CmEventKind::Other(999).as_raw(), 999);
        assert_eq!(
            CmEventKind::Established.to_string(),
            "RDMA_CM_EVENT_ESTABLISHED"
        );
    }
}

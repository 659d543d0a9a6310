//! The RDMA connection manager (librdmacm, `rdma/rdma_cma.h`): connect by
//! IP address instead of exchanging QP numbers by hand.
//!
//! | C | Rust |
//! |---|---|
//! | `struct rdma_event_channel`, `rdma_get_cm_event` | [`EventChannel`] |
//! | `struct rdma_cm_id` (`rdma_create_id`) | [`CmId`] |
//! | `struct rdma_cm_event`, `rdma_ack_cm_event` | [`CmEvent`], [`CmEventKind`] |
//! | `struct rdma_conn_param` | [`ConnParam`] (given), [`ConnInfo`] (received) |
//! | `struct rdma_ud_param` | [`UdInfo`] |
//! | `rdma_create_qp` | [`CmId::create_qp`] |
//! | `rdma_init_qp_attr` | [`CmId::init_qp_attr`] |
//! | `rdma_get_cm_event`, routed to the waiter of each id | [`CmRouter`], [`EventsOf`] |
//!
//! # How the pieces fit
//!
//! Every id belongs to one [`EventChannel`], on which its events arrive.
//! An event is acknowledged (`rdma_ack_cm_event`) exactly once, when the
//! [`CmEvent`] is dropped; until then it keeps its id alive, because
//! `rdma_destroy_id` waits for the acknowledgement of every event of the
//! id it has handed out (dropping the id first would otherwise hang).
//! Ids keep their channel alive; a connection request's new id
//! ([`CmEvent::take_request`]) keeps the channel alive and does not need
//! its listener.
//!
//! The device context of an id is the one librdmacm opened for the device
//! the address resolved to: [`CmId::context`] wraps it in a [`Context`](crate::Context),
//! the same one for every id on that device, from which PDs, CQs and MRs
//! are made as usual. A PD of a context opened with [`Context::open`](crate::Context::open) is
//! refused by [`CmId::create_qp`] with a typed error, as librdmacm would
//! refuse it with `EINVAL`.
//!
//! # Queue pairs
//!
//! Both ways real programs use are supported:
//!
//! * [`CmId::create_qp`] (`rdma_create_qp`): the CM moves the QP itself
//!   (to INIT at creation, or all the way to RTS for UD; to RTR and RTS on
//!   [`accept`](CmId::accept) or when the connect response arrives; to ERR
//!   on a reject and on [`disconnect`](CmId::disconnect)). The QP's
//!   [`state`](crate::QueuePair::state) follows each move before the call
//!   or event that made it returns: from what librdmacm did when its
//!   modifies succeeded (no extra call), and read from the device when a
//!   call failed part-way or librdmacm's own move to ERR may have (a
//!   reject, a connect error). A UC QP of the program's own can ride on a
//!   `RDMA_PS_TCP` id with [`CmId::init_qp_attr_for`].
//! * A QP of the program's own, moved through the crate's validated
//!   [`modify`](crate::QueuePair::modify) with the attributes
//!   [`CmId::init_qp_attr`] reads from the CM, and named in the connection
//!   parameters with [`ConnParam::qp_num`]; the active side then calls
//!   [`CmId::establish`].
//!
//! # Threads
//!
//! librdmacm writes fields of `struct rdma_cm_id` (its route, its QP
//! pointer) while it processes events inside `rdma_get_cm_event`, and reads
//! them in most calls. Every call this module makes on an id or channel
//! that touches those fields takes the channel's lock, so the types here
//! are `Send` and `Sync`. The channel's file descriptor is non-blocking:
//! a thread waiting for an event waits in `poll(2)`, without the lock.
//!
//! # Example: a client
//!
//! ```no_run
//! use rdma_verbs::cm::{CmEventKind, ConnParam, EventChannel, PortSpace};
//! use rdma_verbs::{QpInitAttr, QpType};
//! use std::time::Duration;
//!
//! let ch = EventChannel::new()?;
//! let id = ch.create_id(PortSpace::Tcp)?;
//! let t = Duration::from_secs(2);
//! id.resolve_addr(None, "10.99.0.1:7471".parse().unwrap(), t)?;
//! ch.expect(CmEventKind::AddrResolved, t)?;
//! id.resolve_route(t)?;
//! ch.expect(CmEventKind::RouteResolved, t)?;
//! let ctx = id.context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16)?;
//! let qp = id.create_qp(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
//! id.connect(&ConnParam::new().initiator_depth(1).responder_resources(1))?;
//! ch.expect(CmEventKind::Established, t)?;
//! assert_eq!(qp.state(), rdma_verbs::QpState::Rts);
//! # Ok::<(), rdma_verbs::Error>(())
//! ```

mod addr;
mod channel;
mod device;
mod event;
mod id;
mod link;
mod param;
pub(crate) mod route;
mod route_hint;

pub use addr::PortSpace;
pub use channel::EventChannel;
pub use event::{CmEvent, CmEventKind};
pub use id::{CmId, McJoin};
pub use param::{max_private_data, ConnInfo, ConnParam, PrivateDataOp, UdInfo};
#[cfg(feature = "tokio")]
pub(crate) use route::Kept;
pub use route::{CmRouter, EventsOf};

pub(crate) use link::QpLink;

/// The Q_Key librdmacm gives UD QPs of `RDMA_PS_UDP` ids (`RDMA_UDP_QKEY`).
#[doc(alias = "RDMA_UDP_QKEY")]
pub const UDP_QKEY: u32 = crate::sys::RDMA_UDP_QKEY;

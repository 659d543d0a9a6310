//! Queue pairs (`struct ibv_qp`): creation, the state machine, and reading
//! attributes back.
//!
//! The data path (posting, the ledger of outstanding requests, reclaiming,
//! the halves, templates, receive pools and `ibv_wr_*` batches) is a layer
//! of its own in `src/datapath/`; its types are named here
//! ([`SendWr`], [`Completed`], [`SendHalf`], ...).
//!
//! # Modifying a QP
//!
//! `ibv_modify_qp` takes a 26-field `struct ibv_qp_attr` and a mask saying
//! which fields count; which ones a transition needs depends on the QP's
//! type and state, and in C a mistake shows up as a bare `EINVAL`. Here:
//!
//! * [`QpAttr`] is the dynamic attribute set: one setter per attribute, each
//!   setting its own [`QpAttrMask`] bit, with typed values ([`Psn`],
//!   [`AckTimeout`], [`MinRnrTimer`], [`AddressVector`], ...) that refuse
//!   out-of-range input when built.
//! * [`QueuePair::modify`] validates before calling: the transition from the
//!   QP's known state must be legal, the mask must hold exactly what the
//!   kernel's table ([`transition_rule`]) requires and allows, and values
//!   must fit the device and port. A refusal names the transition, the QP
//!   type and the missing or forbidden flags, e.g.
//!   `RC INIT->RTR is missing IBV_QP_MIN_RNR_TIMER, IBV_QP_MAX_DEST_RD_ATOMIC`,
//!   and never reaches the device. [`QueuePair::modify_unchecked`] is the
//!   raw path.
//! * [`Qp<T>`](Qp) with the typed builders ([`ResetToInit`], [`InitToRtr`],
//!   [`RtrToRts`], ...) makes a missing or forbidden attribute, or a builder
//!   of the wrong transport, a compile error. See the [`Qp`] docs for why the
//!   state is checked at run time rather than being a type parameter.
//! * [`QueuePair::connect`] takes a fresh QP to RTS against an [`Endpoint`]
//!   (the record rdma-core's pingpong examples exchange) with sensible
//!   defaults; [`QueuePair::bring_up_ud`] and
//!   [`QueuePair::bring_up_raw_packet`] (and `bring_up` on [`Qp<Ud>`](Qp)
//!   and [`Qp<RawPacket>`](Qp)) take the connectionless transports to RTS
//!   without a peer.
//!
//! # What a QP can do: every public method of [`QueuePair`]
//!
//! | concern | methods | file |
//! |---|---|---|
//! | create, close | [`new`](QueuePair::new) ([`ProtectionDomain::create_qp`]), [`close`](QueuePair::close), [`close_and_reclaim`](QueuePair::close_and_reclaim) | `qp/mod.rs`, `datapath/reclaim.rs` |
//! | facts | [`qp_num`](QueuePair::qp_num), [`qp_type`](QueuePair::qp_type), [`caps`](QueuePair::caps), [`pd`](QueuePair::pd), [`srq`](QueuePair::srq), [`send_ops`](QueuePair::send_ops), [`as_raw`](QueuePair::as_raw) | `qp/mod.rs`, `datapath/ex.rs` |
//! | why a completion failed | [`explain`](QueuePair::explain) ([`Explanation`]) | `qp/explain.rs`, `qp/explain/causes.rs` |
//! | state machine | [`state`](QueuePair::state), [`port`](QueuePair::port), [`modify`](QueuePair::modify), [`modify_unchecked`](QueuePair::modify_unchecked), [`resync`](QueuePair::resync), [`wait_sq_drained`](QueuePair::wait_sq_drained), [`query`](QueuePair::query), [`query_state`](QueuePair::query_state), [`reset`](QueuePair::reset) | `qp/modify.rs`, `qp/query.rs`, `datapath/reclaim.rs` |
//! | bring-up | [`local_endpoint`](QueuePair::local_endpoint), [`connect`](QueuePair::connect), [`bring_up_ud`](QueuePair::bring_up_ud), [`bring_up_raw_packet`](QueuePair::bring_up_raw_packet); typed: [`Qp`] | `qp/connect.rs`, `qp/bring_up.rs`, `qp/typed.rs` |
//! | post | [`post_send`](QueuePair::post_send), [`post_recv`](QueuePair::post_recv), [`post_recv_one`](QueuePair::post_recv_one), [`post_template`](QueuePair::post_template), [`post_template_one`](QueuePair::post_template_one), [`send_template`](QueuePair::send_template), [`template_source_mut`](QueuePair::template_source_mut), [`start_batch`](QueuePair::start_batch); raw: [`post_send_raw`](QueuePair::post_send_raw), [`post_recv_raw`](QueuePair::post_recv_raw) | `datapath/post.rs`, `datapath/post/recv.rs`, `datapath/template.rs`, `datapath/ex.rs` |
//! | get requests back | [`reclaim`](QueuePair::reclaim), [`reclaim_one`](QueuePair::reclaim_one), [`reclaim_chunks`](QueuePair::reclaim_chunks), [`take_released`](QueuePair::take_released), [`outstanding_sends`](QueuePair::outstanding_sends), [`outstanding_recvs`](QueuePair::outstanding_recvs), [`bookkeeping_bytes`](QueuePair::bookkeeping_bytes) | `datapath/reclaim.rs`, `datapath/post.rs` |
//! | two threads | [`split`](QueuePair::split) ([`SendHalf`], [`RecvHalf`]), [`into_split`](QueuePair::into_split) ([`OwnedSendHalf`], [`OwnedRecvHalf`], [`OwnedSendHalf::reunite`]) | `datapath/halves.rs`, `datapath/split.rs` |
//! | memory windows | [`bind_mw`](QueuePair::bind_mw), [`unbind_mw`](QueuePair::unbind_mw), [`invalidate_mw`](QueuePair::invalidate_mw), [`invalidated_rkey`](QueuePair::invalidated_rkey) | `mw/bind.rs`, `mw/invalidate.rs` |
//!
//! # Posting, and getting requests back
//!
//! | to post | it is the same as | except |
//! |---|---|---|
//! | [`post_send`](QueuePair::post_send) | (the plain send) | |
//! | [`post_recv`](QueuePair::post_recv) | `post_send` | receives; a receive without a buffer takes an RDMA WRITE with immediate |
//! | [`post_recv_one`](QueuePair::post_recv_one) | `post_recv` | one request, no iterator: 23 instructions less a receive than `post_recv(Some(wr))` (see [`guide::performance`](crate::guide::performance)) |
//! | [`post_template`](QueuePair::post_template) | `post_send` | every request copies one checked [`SendTemplate`]: a `wr_id` and a flag per request |
//! | [`post_template_one`](QueuePair::post_template_one) | `post_template` | one request, the raw request the QP keeps for the template reused |
//! | [`WrBatch::post`] | `post_send` | through `ibv_wr_*` on a QP made with `send_ops`, handed over by [`WrBatch::complete`] |
//! | [`RecvBuffers::post`] | `post_recv` | buffers the pool owns, one call for every free one; buffers of 0 bytes for RDMA WRITE with immediate |
//! | [`SendHalf::post_send`], [`RecvHalf::post_recv`] | the `QueuePair` method | on one queue of a split QP, beside the other half |
//! | [`SharedReceiveQueue::post_recv`](crate::SharedReceiveQueue::post_recv) | `post_recv` | to an SRQ, from any thread |
//!
//! | to get back | it is the same as | except |
//! |---|---|---|
//! | [`reclaim`](QueuePair::reclaim) | (the plain reclaim) | |
//! | [`reclaim_one`](QueuePair::reclaim_one) | `reclaim` | returns the named request by value; earlier sends it ends go to `take_released` |
//! | [`reclaim_chunks`](QueuePair::reclaim_chunks) | `reclaim` | only the chunks, into the caller's collection |
//! | [`take_released`](QueuePair::take_released) | `reclaim` | what a RESET or a `reclaim_one` left, no completion needed |
//! | [`reset`](QueuePair::reset), [`close_and_reclaim`](QueuePair::close_and_reclaim) | `take_released` | after moving to RESET, or destroying the QP: everything |
//! | [`RecvBuffers::take`] | `reclaim_one` | a pool's buffer as a borrowed [`Received`], given back to the pool |
//! | [`SendHalf::reclaim_one`], [`RecvHalf::reclaim_one`], ... | the `QueuePair` method | only the half's own queue's completions end anything |
//! | [`SharedReceiveQueue::reclaim`](crate::SharedReceiveQueue::reclaim) | `reclaim` | the SRQ's receives, whichever QP took them |

mod attr;
mod bring_up;
mod connect;
mod explain;
pub(crate) mod known;
mod mask;
mod modify;
mod query;
mod table;
mod typed;
mod types;
mod validate;
mod values;

pub use crate::remote::RemoteBuf;
pub use attr::QpAttr;
pub use connect::{ConnectOptions, Endpoint};
pub use explain::{Cause, CauseKind, ExplainFacts, Explanation};
pub(crate) use known::{Known, QpRegistry};
pub use mask::QpAttrMask;
pub use query::{QpAttributes, QpInitAttributes};
pub use table::{transition_rule, TransitionRule};
// The data path's types (`crate::datapath`), named here by users.
#[cfg(feature = "cm")]
pub(crate) use crate::datapath::create_ex_with;
pub(crate) use crate::datapath::post_error;
pub use crate::datapath::{
    Completed, Completion, FlushPlacement, FlushSelectivity, OwnedRecvHalf, OwnedSendHalf,
    PostError, Received, RecvBuffers, RecvHalf, RecvWr, RemoteAddr, RemoteWr, RequestKind,
    ReuniteError, SendHalf, SendOp, SendOpsFlags, SendTemplate, SendWr, Taken, WrBatch, MAX_SGE,
};
pub use typed::{
    InitToInit, InitToRtr, Modify, Qp, RawPacket, Rc, ResetToInit, RtrToRts, RtsToRts, RtsToSqd,
    SqdToRts, SqdToSqd, SqeToRts, ToErr, ToReset, Transport, Uc, Ud,
};
pub use types::{QpState, QpType};
pub use validate::{check_transition, ModifyError};
pub use values::{
    AckTimeout, AddressVector, AltPath, GlobalRoute, MinRnrTimer, PathMigState, Psn, QKey, QpNum,
    RateLimit, RetryCount, RnrRetry,
};

use std::ffi::c_int;
use std::fmt;

use crate::cq::CompletionQueue;
use crate::error::{check_ptr, Error, Result};
use crate::handle::{Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use crate::sys;
use crate::users::{Tally, UserKind};

impl RawObject for sys::ibv_qp {
    const DESTROY: &'static str = "ibv_destroy_qp";
    const NAME: &'static str = "queue pair";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live QP, once.
        unsafe { sys::ibv_destroy_qp(ptr) }
    }
}

/// The sizes of a queue pair's queues (`struct ibv_qp_cap`).
///
/// When creating a QP these are minimums; the device may give more, and
/// [`QueuePair::caps`] reports what it gave.
#[doc(alias = "ibv_qp_cap")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// `max_send_wr`: outstanding send work requests.
    pub max_send_wr: u32,
    /// `max_recv_wr`: outstanding receive work requests.
    pub max_recv_wr: u32,
    /// `max_send_sge`: scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// `max_recv_sge`: scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// `max_inline_data`: bytes that can be sent inline.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    /// 16 send and 16 receive work requests, one SGE each, no inline data.
    fn default() -> Self {
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

impl QpCaps {
    pub(crate) fn from_raw(c: &sys::ibv_qp_cap) -> Self {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }

    pub(crate) fn to_raw(self) -> sys::ibv_qp_cap {
        sys::ibv_qp_cap {
            max_send_wr: self.max_send_wr,
            max_recv_wr: self.max_recv_wr,
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline_data: self.max_inline_data,
        }
    }
}

/// What to create a queue pair with (`struct ibv_qp_init_attr`).
///
/// ```no_run
/// use rdma_verbs::{Context, QpCaps, QpInitAttr, QpType};
/// let ctx = Context::open_first()?;
/// let pd = ctx.alloc_pd()?;
/// let cq = ctx.create_cq(64)?;
/// let qp = pd.create_qp(
///     &QpInitAttr::new(QpType::Rc, &cq, &cq)
///         .caps(QpCaps { max_send_wr: 32, ..QpCaps::default() })
///         .sq_sig_all(true),
/// )?;
/// println!("QP number {:#x}", qp.qp_num());
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone)]
pub struct QpInitAttr<'a> {
    qp_type: QpType,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    srq: Option<&'a SharedReceiveQueue>,
    caps: QpCaps,
    sq_sig_all: bool,
    pub(crate) send_ops: Option<SendOpsFlags>,
}

impl<'a> QpInitAttr<'a> {
    /// A QP of type `qp_type` whose sends complete on `send_cq` and receives
    /// on `recv_cq` (which may be the same CQ), with [`QpCaps::default`] and
    /// only signalled sends generating completions.
    pub fn new(
        qp_type: QpType,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> Self {
        QpInitAttr {
            qp_type,
            send_cq,
            recv_cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
            send_ops: None,
        }
    }

    /// Receives through `srq` instead of the QP's own receive queue
    /// (`max_recv_wr` and `max_recv_sge` are then ignored).
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.srq = Some(srq);
        self
    }

    /// The transport type asked for.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Sets the queue sizes (`cap`).
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Whether every send generates a completion (`sq_sig_all`), rather than
    /// only those posted with the signalled flag.
    pub fn sq_sig_all(mut self, all: bool) -> Self {
        self.sq_sig_all = all;
        self
    }
}

/// What a queue pair keeps alive: its PD and its CQs.
///
/// The outstanding requests' buffers live here too, so that they are freed
/// only after the QP is destroyed, and leaked with it if destruction fails.
/// One heap block per QP ([`QueuePair`] holds it boxed): the handles and
/// the data path's bookkeeping together, so that creating a QP allocates
/// once for both and moving a `QueuePair` copies a few words.
struct QpKeep {
    /// The QP's entries in its PD's, CQs' and SRQ's user counts.
    _tallies: [Option<Tally>; 4],
    /// What both halves of the QP read: its handle, PD, SRQ, known state
    /// and type.
    common: crate::datapath::QpCommon,
    _send_cq: CompletionQueue,
    _recv_cq: CompletionQueue,
    pending: crate::datapath::Pending,
    /// The QP's entry in its context's registry (for the event delivery);
    /// dropped only after the QP is destroyed.
    _registration: known::Registration,
}

/// A queue pair (`struct ibv_qp`).
///
/// It keeps its [`ProtectionDomain`] and both [`CompletionQueue`]s alive, so
/// they can be dropped in any order.
#[doc(alias = "ibv_qp")]
pub struct QueuePair {
    /// For a QP created on a CM id: its tie to the id. Declared before
    /// `inner` so that it is dropped first: the id lets go of the QP
    /// (`id->qp = NULL`) before `inner` destroys it.
    #[cfg(feature = "cm")]
    cm: Option<crate::cm::QpLink>,
    inner: Owned<sys::ibv_qp, Box<QpKeep>>,
    qp_type: QpType,
    caps: QpCaps,
    /// The known state: as of the last successful modify or resync, or
    /// what an error completion or a fatal event proved since (shared
    /// with the context's event delivery, the halves and, for a CM QP, its
    /// id).
    known: std::sync::Arc<Known>,
    /// A number no other QP of this process has had (addresses are
    /// reused): what a [`SendTemplate`] names its QP by.
    id: u64,
    /// The port set by the last modify that carried IBV_QP_PORT.
    port: Option<u8>,
    /// For a UD QP: the port the receive floor was last found for (0:
    /// none yet) and the floor, the bytes a receive needs at least (the
    /// 40-byte GRH on a port that needs one, else 0).
    recv_floor: (u8, u32),
    /// For a QP made with `send_ops`: its `ibv_qp_ex`.
    pub(crate) ex: Option<crate::datapath::QpEx>,
}

/// A QP number of this process's own, never given twice (a `u64` counted
/// up by one for each QP cannot wrap).
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl ProtectionDomain {
    /// Creates a queue pair in this PD.
    #[doc(alias = "ibv_create_qp")]
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::new(self, attr)
    }
}

impl QueuePair {
    /// Creates a queue pair in `pd`, in the RESET state.
    ///
    /// Refused before any call: CQs of another device context, queue sizes
    /// beyond the device's `max_qp_wr`/`max_sge`, XRC or driver types (which
    /// need `ibv_create_qp_ex`), and RAW_PACKET on a device with no Ethernet
    /// port. A device that refuses RAW_PACKET answers with
    /// [`Error::Unsupported`].
    #[doc(alias = "ibv_create_qp")]
    pub fn new(pd: &ProtectionDomain, attr: &QpInitAttr<'_>) -> Result<Self> {
        if let Some(ops) = attr.send_ops {
            return crate::datapath::create_ex(pd, attr, ops);
        }
        Self::create_with(pd, attr, "ibv_create_qp", |raw_attr| {
            // SAFETY: PD and CQs are live (borrowed for the call) and belong to
            // the same context (checked by `create_with`); `raw_attr` is a valid in/out struct.
            let raw = unsafe { sys::ibv_create_qp(pd.as_ptr(), raw_attr) };
            check_ptr("ibv_create_qp", raw)
        })
    }

    /// Checks `attr`, then creates the QP with `create` (`ibv_create_qp`,
    /// or `rdma_create_qp` on a CM id) and takes ownership of it.
    pub(crate) fn create_with(
        pd: &ProtectionDomain,
        attr: &QpInitAttr<'_>,
        verb: &'static str,
        create: impl FnOnce(&mut sys::ibv_qp_init_attr) -> Result<std::ptr::NonNull<sys::ibv_qp>>,
    ) -> Result<Self> {
        let ctx = pd.context();
        if attr.send_ops.is_some() != matches!(verb, "ibv_create_qp_ex" | "rdma_create_qp_ex") {
            return Err(Error::invalid(
                verb,
                "internal: extended QPs (QpInitAttr::send_ops) go through ibv_create_qp_ex",
            ));
        }
        for (which, cq) in [("send_cq", attr.send_cq), ("recv_cq", attr.recv_cq)] {
            if !cq.context().same_as(ctx) {
                return Err(Error::invalid(
                    verb,
                    format!("{which} belongs to another device context than the PD"),
                ));
            }
        }
        if let Some(srq) = attr.srq {
            if !srq.pd().context().same_as(ctx) {
                return Err(Error::invalid(
                    verb,
                    "the SRQ belongs to another device context than the PD",
                ));
            }
        }
        let dev = ctx.attr();
        let caps = attr.caps;
        for (name, value, max, limit) in [
            ("max_send_wr", caps.max_send_wr, dev.max_qp_wr, "max_qp_wr"),
            ("max_recv_wr", caps.max_recv_wr, dev.max_qp_wr, "max_qp_wr"),
            ("max_send_sge", caps.max_send_sge, dev.max_sge, "max_sge"),
            ("max_recv_sge", caps.max_recv_sge, dev.max_sge, "max_sge"),
        ] {
            if value > max {
                return Err(Error::invalid(
                    verb,
                    format!("{name} {value} is more than the device's {limit} of {max}"),
                ));
            }
        }
        match attr.qp_type {
            QpType::Rc | QpType::Uc | QpType::Ud => {}
            QpType::RawPacket => {
                // The link layer is fixed while the context is open: the
                // cached one accepts, a refusal re-reads the ports.
                let ethernet = |fresh| {
                    ctx.ports()
                        .filter_map(|p| ctx.port_fixed(p, fresh).ok())
                        .any(|p| p.is_roce())
                };
                let ethernet = ethernet(false) || ethernet(true);
                if !ethernet {
                    return Err(Error::Unsupported {
                        what: "RAW_PACKET queue pairs (no Ethernet port)",
                        device: ctx.name().to_owned(),
                        errno: None,
                    });
                }
            }
            other => {
                return Err(Error::invalid(
                    verb,
                    format!(
                        "{} QPs cannot be created with ibv_create_qp",
                        other.short_name()
                    ),
                ))
            }
        }

        // rdma-core before 38 copies the whole struct, its 4 bytes of tail
        // padding included, into an `ibv_qp_init_attr_ex`, where they land
        // on `comp_mask` (rdma-core 74af92ae5, "ibverbs: Don't memcpy
        // padding in ibv_qp_init_attr"): garbage there is refused with
        // EINVAL. So every byte is zeroed first and the fields are written
        // in place: no copy of the struct, which need not keep its padding,
        // comes between.
        let mut zeroed = std::mem::MaybeUninit::<sys::ibv_qp_init_attr>::zeroed();
        // All-zero bytes are a valid `ibv_qp_init_attr`: null pointers and
        // zero numbers.
        // SAFETY: so the zeroed value is initialised.
        let raw_attr = unsafe { zeroed.assume_init_mut() };
        raw_attr.qp_context = std::ptr::null_mut();
        raw_attr.send_cq = attr.send_cq.as_ptr();
        raw_attr.recv_cq = attr.recv_cq.as_ptr();
        raw_attr.srq = attr
            .srq
            .map_or(std::ptr::null_mut(), SharedReceiveQueue::as_ptr);
        raw_attr.cap = caps.to_raw();
        raw_attr.qp_type = attr.qp_type.as_raw();
        raw_attr.sq_sig_all = c_int::from(attr.sq_sig_all);
        let raw = match create(raw_attr) {
            Ok(raw) => raw,
            Err(e) if attr.qp_type == QpType::RawPacket && is_unsupported(&e) => {
                return Err(Error::Unsupported {
                    what: "RAW_PACKET queue pairs",
                    device: ctx.name().to_owned(),
                    errno: e.errno(),
                })
            }
            Err(e) => return Err(e),
        };
        let caps = QpCaps::from_raw(&raw_attr.cap);
        let known = Known::new(QpState::Reset);
        let kind = UserKind::QueuePair;
        let (scq, rcq) = (attr.send_cq, attr.recv_cq);
        let one_cq = std::sync::Arc::ptr_eq(&scq.inner, &rcq.inner);
        let keep = Box::new(QpKeep {
            _tallies: [
                Some(Tally::new(pd.users(), kind, 1)),
                // One QP, holding its CQ twice when it is both.
                Some(Tally::new(scq.users(), kind, if one_cq { 2 } else { 1 })),
                (!one_cq).then(|| Tally::new(rcq.users(), kind, 1)),
                attr.srq.map(|srq| Tally::new(srq.users(), kind, 1)),
            ],
            common: crate::datapath::QpCommon::new(
                raw,
                pd.clone(),
                attr.srq.cloned(),
                std::sync::Arc::clone(&known),
                attr.qp_type,
            ),
            _send_cq: attr.send_cq.clone(),
            _recv_cq: attr.recv_cq.clone(),
            pending: crate::datapath::Pending::new(
                &caps,
                attr.qp_type,
                pd.as_ptr(),
                dev.atomic_cap != crate::device_attr::AtomicCap::None,
            ),
            _registration: known::Registration::new(ctx, raw.as_ptr(), &known),
        });
        // SAFETY: a fresh QP owned by nobody else; `keep` holds its PD and CQs.
        let inner = unsafe { Owned::new(raw, keep) };
        Ok(QueuePair {
            #[cfg(feature = "cm")]
            cm: None,
            inner,
            id: next_id(),
            qp_type: attr.qp_type,
            // ibv_create_qp wrote back the sizes the device actually gave.
            caps,
            known,
            port: None,
            recv_floor: (0, 0),
            ex: None,
        })
    }

    /// The process-unique number of this QP (see [`SendTemplate`]).
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.inner.as_ptr()
    }

    /// The raw `struct ibv_qp *`, for calls the safe layer does not cover.
    ///
    /// It stays valid while `self` lives. Changing the QP's state through it
    /// leaves [`state`](Self::state) stale until [`resync`](Self::resync).
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.as_ptr()
    }

    /// The QP number, which peers address it by (`qp_num` of
    /// `struct ibv_qp`): the same type as a completion's
    /// [`qp_num`](crate::WorkCompletion::qp_num) and
    /// [`src_qp`](crate::WorkCompletion::src_qp), an [`Endpoint`]'s and the
    /// CM's, so they compare without a cast; `{:x}` and `u32::from` give the
    /// number.
    ///
    /// [`Endpoint`]: crate::qp::Endpoint
    #[inline]
    pub fn qp_num(&self) -> QpNum {
        // SAFETY: the QP is live; `qp_num` is set at creation and never changes.
        QpNum::truncate(unsafe { (*self.as_ptr()).qp_num })
    }

    /// The transport type.
    #[inline]
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The queue sizes the device gave at creation.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Whether `cq` is the QP's send or receive CQ.
    pub(crate) fn uses_cq(&self, cq: &CompletionQueue) -> bool {
        let k = self.inner.keep();
        std::sync::Arc::ptr_eq(&k._send_cq.inner, &cq.inner)
            || std::sync::Arc::ptr_eq(&k._recv_cq.inner, &cq.inner)
    }

    /// The most completions the QP can have outstanding: its send and
    /// receive queue depths.
    pub(crate) fn queue_depths(&self) -> usize {
        self.caps.max_send_wr as usize + self.caps.max_recv_wr as usize
    }

    /// The protection domain the QP was created in.
    #[inline]
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().common.pd
    }

    /// The shared receive queue the QP receives through, if any.
    #[inline]
    pub fn srq(&self) -> Option<&SharedReceiveQueue> {
        self.inner.keep().common.srq.as_ref()
    }

    #[inline]
    pub(crate) fn pending(&self) -> &crate::datapath::Pending {
        &self.inner.keep().pending
    }

    #[inline]
    pub(crate) fn pending_mut(&mut self) -> &mut crate::datapath::Pending {
        &mut self.inner.keep_mut().pending
    }

    /// The facts both halves read and the pending requests: disjoint
    /// borrows of the QP's keep.
    #[inline(always)]
    pub(crate) fn parts(&mut self) -> (&crate::datapath::QpCommon, &mut crate::datapath::Pending) {
        let keep = self.inner.keep_mut();
        (&keep.common, &mut keep.pending)
    }

    /// The facts both halves read, from a shared QP (an owned half's).
    #[inline(always)]
    pub(crate) fn common(&self) -> &crate::datapath::QpCommon {
        &self.inner.keep().common
    }

    /// Destroys the QP and returns its outstanding requests' bookkeeping.
    pub(crate) fn into_keep(self) -> Result<crate::datapath::Pending> {
        let keep = self.release_link().into_keep()?;
        Ok(keep.pending)
    }

    /// Destroys the QP now, reporting failure.
    ///
    /// On failure the QP is leaked together with its PD and CQs, which are
    /// never freed under it.
    #[doc(alias = "ibv_destroy_qp")]
    pub fn close(self) -> Result<()> {
        self.release_link().close()
    }

    /// Lets a CM id let go of the QP (when it has one), then hands over the
    /// raw owner, so that destroying it cannot leave the id pointing at it.
    fn release_link(self) -> Owned<sys::ibv_qp, Box<QpKeep>> {
        #[cfg(feature = "cm")]
        drop(self.cm);
        self.inner
    }

    /// The known state's shared cell (for the CM id of a CM QP, and the
    /// send-queue lock of a batch).
    pub(crate) fn known(&self) -> &std::sync::Arc<Known> {
        &self.known
    }

    /// The fewest bytes a receive may have in all: for a UD QP on a port
    /// that needs a GRH (RoCE, or `IBV_QPF_GRH_REQUIRED`), the 40-byte GRH
    /// the device writes first; otherwise 0. Found once per port (from the
    /// context's port cache) and kept.
    #[inline]
    pub(crate) fn recv_floor(&mut self) -> u32 {
        if self.qp_type != QpType::Ud {
            return 0;
        }
        let Some(port) = self.port() else { return 0 };
        if self.recv_floor.0 == port {
            return self.recv_floor.1;
        }
        match self.pd().context().port_fixed(port, false) {
            Ok(f) => {
                let floor = if f.grh_required() {
                    crate::datapath::GRH_LEN
                } else {
                    0
                };
                self.recv_floor = (port, floor);
                floor
            }
            // Not known: nothing refused (the device judges).
            Err(_) => 0,
        }
    }

    /// Ties the QP to a CM id (see [`crate::cm::QpLink`]).
    #[cfg(feature = "cm")]
    pub(crate) fn set_link(&mut self, link: crate::cm::QpLink) {
        self.cm = Some(link);
    }
}

/// errnos with which kernels and providers refuse a QP type they do not implement.
fn is_unsupported(e: &Error) -> bool {
    matches!(
        e.errno(),
        Some(libc::EOPNOTSUPP | libc::EINVAL | libc::EPROTONOSUPPORT | libc::ENOSYS)
    )
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &format_args!("{:#x}", self.qp_num()))
            .field("qp_type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}

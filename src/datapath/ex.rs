//! Extended queue pairs (`ibv_create_qp_ex`) and the `ibv_wr_*` batch: see [`WrBatch`].
use std::ptr::NonNull;

use super::chain::refused_entry;
use super::completed::Completed;
use super::post::SendFacts;
use super::post::{fail, lend_send};
use super::request::{SendOp, SendWr, MAX_SGE};
use super::{PostError, QpInitAttr, QpType, QueuePair};
use crate::device_attr::{AtomicCap, DeviceCapFlags};
use crate::error::{check_ptr, Error, Result};
use crate::mw::internal as mw;
use crate::mw::{MemoryWindow, MwBind};
use crate::pd::ProtectionDomain;
use crate::sys;

mod remote_only;
pub use remote_only::{FlushPlacement, FlushSelectivity, RemoteWr};

bitflags::bitflags! {
    /// The operations an extended QP may post (`enum ibv_qp_create_send_ops_flags`,
    /// the `send_ops_flags` of `struct ibv_qp_init_attr_ex`).
    #[doc(alias = "ibv_qp_create_send_ops_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendOpsFlags: u64 {
        /// `IBV_QP_EX_WITH_RDMA_WRITE`: `ibv_wr_rdma_write` ([`SendOp::RdmaWrite`]).
        const RDMA_WRITE = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64;
        /// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`: `ibv_wr_rdma_write_imm` ([`SendOp::RdmaWriteWithImm`]).
        const RDMA_WRITE_WITH_IMM = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64;
        /// `IBV_QP_EX_WITH_SEND`: `ibv_wr_send` ([`SendOp::Send`]).
        const SEND = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64;
        /// `IBV_QP_EX_WITH_SEND_WITH_IMM`: `ibv_wr_send_imm` ([`SendOp::SendWithImm`]).
        const SEND_WITH_IMM = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64;
        /// `IBV_QP_EX_WITH_RDMA_READ`: `ibv_wr_rdma_read` ([`SendOp::RdmaRead`]).
        const RDMA_READ = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`: `ibv_wr_atomic_cmp_swp` ([`SendOp::CompareSwap`]).
        const ATOMIC_CMP_AND_SWP = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`: `ibv_wr_atomic_fetch_add` ([`SendOp::FetchAdd`]).
        const ATOMIC_FETCH_AND_ADD = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64;
        /// `IBV_QP_EX_WITH_LOCAL_INV`: `ibv_wr_local_inv` ([`WrBatch::local_inv`]).
        const LOCAL_INV = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_LOCAL_INV.0 as u64;
        /// `IBV_QP_EX_WITH_BIND_MW`: `ibv_wr_bind_mw` ([`WrBatch::bind_mw`]).
        const BIND_MW = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_BIND_MW.0 as u64;
        /// `IBV_QP_EX_WITH_SEND_WITH_INV`: `ibv_wr_send_inv` ([`SendOp::SendWithInv`]).
        const SEND_WITH_INV = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_INV.0 as u64;
        /// `IBV_QP_EX_WITH_TSO`: `ibv_wr_send_tso`. Not offered by the safe
        /// batch (refused at creation).
        const TSO = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_TSO.0 as u64;
        /// `IBV_QP_EX_WITH_ATOMIC_WRITE`: `ibv_wr_atomic_write`
        /// ([`WrBatch::atomic_write`]; RC only, headers of rdma-core 44 and
        /// later, devices with [`DeviceCapFlags::ATOMIC_WRITE`]).
        const ATOMIC_WRITE = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_WRITE.0 as u64;
        /// `IBV_QP_EX_WITH_FLUSH`: `ibv_wr_flush` ([`WrBatch::flush`]; RC
        /// only, headers of rdma-core 45 and later, devices with
        /// [`DeviceCapFlags::FLUSH_GLOBAL`] or `FLUSH_PERSISTENT`).
        const FLUSH = sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH.0 as u64;
    }
}

impl SendOpsFlags {
    /// The operations of [`SendOp`] (and the memory-window ones) a
    /// transport can post: what [`QpInitAttr::send_ops`] accepts for it
    /// besides [`ATOMIC_WRITE`](Self::ATOMIC_WRITE) and
    /// [`FLUSH`](Self::FLUSH) on RC, and what [`QueuePair::post_send`]
    /// lets through (RC: all ten; UC: sends, RDMA writes and memory-window
    /// binds; UD: sends; RAW_PACKET: plain sends). This is the table of the
    /// `ibv_wr_post` man page, except that UC has no `LOCAL_INV`: rxe
    /// (Linux 6.1, `rxe_opcode.c`) accepts `IB_WR_LOCAL_INV` on RC QPs
    /// only. ATOMIC_WRITE and FLUSH are left out because few devices have
    /// them: asked for, they are refused where the device lacks them.
    pub fn for_transport(qp_type: QpType) -> Self {
        let sends = Self::SEND | Self::SEND_WITH_IMM;
        let writes = Self::RDMA_WRITE | Self::RDMA_WRITE_WITH_IMM;
        match qp_type {
            QpType::Rc => {
                sends
                    | writes
                    | Self::SEND_WITH_INV
                    | Self::RDMA_READ
                    | Self::ATOMIC_CMP_AND_SWP
                    | Self::ATOMIC_FETCH_AND_ADD
                    | Self::LOCAL_INV
                    | Self::BIND_MW
            }
            QpType::Uc => sends | writes | Self::SEND_WITH_INV | Self::BIND_MW,
            QpType::Ud => sends,
            QpType::RawPacket => Self::SEND,
            _ => Self::empty(),
        }
    }

    /// The flag of `op`.
    pub(crate) fn of(op: &SendOp) -> Self {
        match op {
            SendOp::Send => Self::SEND,
            SendOp::SendWithImm(_) => Self::SEND_WITH_IMM,
            SendOp::SendWithInv(_) => Self::SEND_WITH_INV,
            SendOp::RdmaWrite(_) => Self::RDMA_WRITE,
            SendOp::RdmaWriteWithImm(..) => Self::RDMA_WRITE_WITH_IMM,
            SendOp::RdmaRead(_) => Self::RDMA_READ,
            SendOp::CompareSwap { .. } => Self::ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => Self::ATOMIC_FETCH_AND_ADD,
        }
    }
}

/// The extended side of a QP: the `ibv_qp_ex` (part of the same provider
/// object as the `ibv_qp`, valid as long as it) and its operations.
#[derive(Clone, Copy)]
pub(crate) struct QpEx {
    ptr: NonNull<sys::ibv_qp_ex>,
    ops: SendOpsFlags,
    /// rxe: lists of unequal entries are refused (see the module docs).
    rxe: bool,
}

// SAFETY: the pointer is into the QP's provider object; it is only used
// through `&mut QueuePair` (a batch), like the QP itself, which libibverbs
// lets any thread use.
unsafe impl Send for QpEx {}
// SAFETY: as for `Send`: `&QueuePair` gives no access to it.
unsafe impl Sync for QpEx {}

impl<'a> QpInitAttr<'a> {
    /// Creates the QP with `ibv_create_qp_ex`, able to post `ops` through
    /// the `ibv_wr_*` API ([`QueuePair::start_batch`]).
    ///
    /// Checked before the call: `ops` is not empty, every operation suits
    /// the transport ([`SendOpsFlags::for_transport`]) and the device
    /// (atomics need `atomic_cap`, memory-window operations
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B` or `MEM_MGT_EXTENSIONS`,
    /// `ATOMIC_WRITE` and `FLUSH` their capability bits and headers that
    /// have `ibv_wr_atomic_write`/`ibv_wr_flush`), and `TSO` is not asked
    /// for. A provider that refuses the set answers [`Error::Unsupported`].
    ///
    /// ```no_run
    /// use rdma_verbs::qp::SendOpsFlags;
    /// use rdma_verbs::{Context, QpInitAttr, QpType};
    /// let ctx = Context::open_first()?;
    /// let pd = ctx.alloc_pd()?;
    /// let cq = ctx.create_cq(64)?;
    /// let qp = pd.create_qp(
    ///     &QpInitAttr::new(QpType::Rc, &cq, &cq)
    ///         .send_ops(SendOpsFlags::SEND | SendOpsFlags::RDMA_WRITE),
    /// )?;
    /// assert_eq!(qp.send_ops(), Some(SendOpsFlags::SEND | SendOpsFlags::RDMA_WRITE));
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_create_qp_ex")]
    #[doc(alias = "send_ops_flags")]
    pub fn send_ops(mut self, ops: SendOpsFlags) -> Self {
        self.send_ops = Some(ops);
        self
    }
}

/// The checks of `ops` for a QP of `qp_type` on the device of `pd`.
fn check_send_ops(
    verb: &'static str,
    pd: &ProtectionDomain,
    qp_type: QpType,
    ops: SendOpsFlags,
) -> Result<()> {
    if ops.is_empty() {
        return Err(Error::invalid(verb, "send_ops is empty"));
    }
    let unoffered = ops & SendOpsFlags::TSO;
    if !unoffered.is_empty() {
        return Err(Error::invalid(
            verb,
            format!("{unoffered:?}: the safe batch has no such operation"),
        ));
    }
    let mut allowed = SendOpsFlags::for_transport(qp_type);
    if qp_type == QpType::Rc {
        allowed |= SendOpsFlags::ATOMIC_WRITE | SendOpsFlags::FLUSH;
    }
    let beyond = ops - allowed;
    if !beyond.is_empty() {
        return Err(Error::invalid(
            verb,
            format!("{} QPs cannot post {beyond:?}", qp_type.short_name()),
        ));
    }
    device_refusal(pd, ops)
}

/// What the device (or, for ATOMIC_WRITE and FLUSH, the headers the crate
/// was built with) lacks of `ops`, as [`Error::Unsupported`].
fn device_refusal(pd: &ProtectionDomain, ops: SendOpsFlags) -> Result<()> {
    let ctx = pd.context();
    let dev = ctx.attr();
    let unsupported = |what| Error::Unsupported {
        what,
        device: ctx.name().to_owned(),
        errno: None,
    };
    let atomics = SendOpsFlags::ATOMIC_CMP_AND_SWP | SendOpsFlags::ATOMIC_FETCH_AND_ADD;
    if ops.intersects(atomics) && dev.atomic_cap == AtomicCap::None {
        return Err(unsupported("atomic operations (atomic_cap is NONE)"));
    }
    let type2 = DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B;
    if ops.contains(SendOpsFlags::BIND_MW) && !dev.capabilities.intersects(type2) {
        return Err(unsupported("posted memory-window binds (type 2 windows)"));
    }
    let inv = SendOpsFlags::LOCAL_INV | SendOpsFlags::SEND_WITH_INV;
    if ops.intersects(inv)
        && !dev
            .capabilities
            .intersects(type2 | DeviceCapFlags::MEM_MGT_EXTENSIONS)
    {
        return Err(unsupported("invalidation (IBV_DEVICE_MEM_MGT_EXTENSIONS)"));
    }
    if ops.contains(SendOpsFlags::ATOMIC_WRITE) {
        if !cfg!(rdma_core_wr_atomic_write) {
            return Err(unsupported(
                "RDMA ATOMIC_WRITE (these rdma-core headers, before 44, have no ibv_wr_atomic_write)",
            ));
        }
        if !dev.capabilities.contains(DeviceCapFlags::ATOMIC_WRITE) {
            return Err(unsupported(
                "RDMA ATOMIC_WRITE (the device does not report IB_UVERBS_DEVICE_ATOMIC_WRITE)",
            ));
        }
    }
    if ops.contains(SendOpsFlags::FLUSH) {
        if !cfg!(rdma_core_wr_flush) {
            return Err(unsupported(
                "RDMA FLUSH (these rdma-core headers, before 45, have no ibv_wr_flush)",
            ));
        }
        let flush = DeviceCapFlags::FLUSH_GLOBAL | DeviceCapFlags::FLUSH_PERSISTENT;
        if !dev.capabilities.intersects(flush) {
            return Err(unsupported(
                "RDMA FLUSH (the device reports neither IB_UVERBS_DEVICE_FLUSH_GLOBAL nor _PERSISTENT)",
            ));
        }
    }
    Ok(())
}

/// Creates an extended QP (`QueuePair::new` with `send_ops` set).
pub(crate) fn create(
    pd: &ProtectionDomain,
    attr: &QpInitAttr<'_>,
    ops: SendOpsFlags,
) -> Result<QueuePair> {
    const VERB: &str = "ibv_create_qp_ex";
    let ctx = pd.context();
    create_ex_with(pd, attr, ops, VERB, |x| {
        // SAFETY: live context, PD and CQs of that context (checked by
        // `create_with`); `x` is a valid in/out struct whose comp_mask
        // names exactly the fields set.
        check_ptr(VERB, unsafe { sys::ibv_create_qp_ex(ctx.as_ptr(), x) })
    })
}

/// Checks `ops`, then creates an extended QP with `call` (given the
/// `ibv_qp_init_attr_ex` of `attr` with the PD and `ops`:
/// `ibv_create_qp_ex`, or `rdma_create_qp_ex` on a CM id) and takes
/// ownership of it with its `ibv_qp_ex`.
pub(crate) fn create_ex_with(
    pd: &ProtectionDomain,
    attr: &QpInitAttr<'_>,
    ops: SendOpsFlags,
    verb: &'static str,
    call: impl FnOnce(&mut sys::ibv_qp_init_attr_ex) -> Result<NonNull<sys::ibv_qp>>,
) -> Result<QueuePair> {
    check_send_ops(verb, pd, attr.qp_type(), ops)?;
    let ctx = pd.context();
    let mut qp = QueuePair::create_with(pd, attr, verb, |raw| {
        let mut x = sys::ibv_qp_init_attr_ex {
            qp_context: raw.qp_context,
            send_cq: raw.send_cq,
            recv_cq: raw.recv_cq,
            srq: raw.srq,
            cap: raw.cap,
            qp_type: raw.qp_type,
            sq_sig_all: raw.sq_sig_all,
            comp_mask: sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
                | sys::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0,
            pd: pd.as_ptr(),
            send_ops_flags: ops.bits(),
            ..Default::default()
        };
        let created = call(&mut x);
        raw.cap = x.cap;
        created.map_err(|e| match e.errno() {
            Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                what: "extended QPs with these send_ops",
                device: ctx.name().to_owned(),
                errno: Some(errno),
            },
            _ => e,
        })
    })?;
    // SAFETY: the QP is live and was created by ibv_create_qp_ex (which
    // rdma_create_qp_ex calls) with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.
    let ex = unsafe { sys::ibv_qp_to_qp_ex(qp.as_ptr()) };
    let ptr = NonNull::new(ex)
        .ok_or_else(|| Error::invalid(verb, "the provider gave a QP without its ibv_qp_ex"))?;
    qp.ex = Some(QpEx {
        ptr,
        ops,
        rxe: ctx.is_rxe(),
    });
    Ok(qp)
}

impl QueuePair {
    /// The operations the QP was created to post through the `ibv_wr_*`
    /// API, or `None` for a QP made without [`QpInitAttr::send_ops`].
    #[inline]
    pub fn send_ops(&self) -> Option<SendOpsFlags> {
        self.ex.map(|e| e.ops)
    }

    /// Opens a batch of send requests (`ibv_wr_start`).
    ///
    /// Refused (nothing called) for a QP created without
    /// [`QpInitAttr::send_ops`], and when the known state is RESET, INIT or
    /// RTR (sends need RTS, SQD, SQE or ERR).
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, a: rdma_verbs::Chunk, b: rdma_verbs::Chunk, remote: rdma_verbs::qp::RemoteAddr) -> Result<(), rdma_verbs::qp::PostError> {
    /// use rdma_verbs::qp::{SendOp, SendWr};
    /// let mut batch = qp.start_batch()?;
    /// batch.post(SendWr::new(1, SendOp::RdmaWrite(remote)).sge(a).unsignaled())?;
    /// batch.post(SendWr::new(2, SendOp::SendWithImm(7)).sge(b))?;
    /// batch.complete()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP without `send_ops`,
    /// [`Error::GuardLeaked`] when an earlier batch was leaked open, and
    /// [`Error::QpState`] below RTS.
    #[doc(alias = "ibv_wr_start")]
    pub fn start_batch(&mut self) -> Result<WrBatch<'_>> {
        const VERB: &str = "ibv_wr_start";
        let Some(ex) = self.ex else {
            return Err(Error::invalid(
                VERB,
                "the QP was created without send_ops (QpInitAttr::send_ops)",
            ));
        };
        // A batch leaked while open still holds the provider's send-queue
        // lock: refused, as is a send in a state that takes none.
        if let Some(e) = self.send_refusal(VERB) {
            return Err(e);
        }
        let checks = self.pending().send.facts;
        self.known().lock_sends();
        // SAFETY: a live extended QP; no batch is open on it (a live batch
        // borrows the QP mutably; a leaked one left the known state's
        // send-queue lock set, which refused above).
        unsafe { sys::ibv_wr_start(ex.ptr.as_ptr()) };
        Ok(WrBatch {
            qp: self,
            ex,
            checks,
            open: true,
            n: 0,
        })
    }
}

/// An open batch of send requests on an extended QP (between
/// `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`).
///
/// Extended queue pairs (`struct ibv_qp_ex`, `ibv_create_qp_ex`) and the
/// `ibv_wr_*` send API, with the buffer ownership of the basic path.
///
/// A QP created with [`QpInitAttr::send_ops`] is an ordinary [`QueuePair`]
/// (the same validated `modify`, typed builders, receives and reclaim)
/// that can also post sends in *batches*: [`QueuePair::start_batch`]
/// (`ibv_wr_start`), then [`Self::post`] per request (`ibv_wr_send`,
/// `ibv_wr_rdma_write`, ... with `ibv_wr_set_sge`/`_sge_list`/
/// `_inline_data`/`_ud_addr`), [`Self::bind_mw`] and
/// [`Self::local_inv`] for memory windows, and finally
/// [`Self::complete`] (`ibv_wr_complete`) or [`Self::abort`]
/// (`ibv_wr_abort`).
///
/// # Ownership, as on the basic path
///
/// A request is described by the same [`SendWr`] as for
/// [`QueuePair::post_send`]: it takes its [`Chunk`](crate::Chunk)s by value, and
/// [`Self::post`] moves them into the QP's send ledger under a fresh
/// tag, which becomes the request's `wr_id`. They come back through the
/// same [`QueuePair::reclaim`] (from a [`WorkCompletion`](crate::WorkCompletion)
/// or an extended CQ's [`PolledWc`](crate::PolledWc)), a RESET, or the
/// QP's destruction. Every check of `post_send` runs before the request
/// reaches the provider, plus: the operation must be among the QP's
/// `send_ops`; a refused request hands its chunks back in the
/// [`PostError`] and leaves the batch open for the next one.
///
/// * [`complete`](Self::complete) hands the batch to the device. If it
///   fails, the requests stay outstanding ("in doubt", as for a failed
///   `post_send`): a provider's failure return is no proof that nothing was
///   queued.
/// * [`abort`](Self::abort) (or dropping the batch) discards the batch:
///   `ibv_wr_abort` guarantees the requests prepared since `ibv_wr_start`
///   never reach the device (the provider has not published them: rxe
///   never stored its producer index, mlx5 never rang the doorbell), so
///   their chunks come back at once, and memory-window bookkeeping is
///   undone.
///
/// The batch borrows the QP mutably, so nothing else posts to (or
/// modifies) the QP while it is open. Between `ibv_wr_start` and
/// `ibv_wr_complete`/`ibv_wr_abort` providers hold the send queue's lock.
/// Leaking a batch (`std::mem::forget`) keeps that lock held for good, so
/// the QP remembers that a batch is open: from then on everything that
/// would take the lock again (`post_send`, `start_batch`, memory-window
/// binds, unbinds and invalidations) is refused with
/// [`Error::GuardLeaked`] instead of spinning
/// forever. Receives, RESET (which hands back the leaked batch's requests:
/// none reached the device) and closing the QP still work.
///
/// # Costs
///
/// Posting allocates nothing: the ledger and the batch's tag list are
/// allocated with the QP (room for `max_send_wr` requests), and the
/// scatter/gather list is built on the stack.
///
/// # rxe
///
/// rdma-core's rxe provider (`providers/rxe/rxe.c`, `wr_set_sge_list`)
/// computes a list's length as the first entry's length times the number
/// of entries, so a request whose entries differ in length would move the
/// wrong number of bytes. On rxe such a request is refused with
/// [`Error::Unsupported`]; single entries and lists of equal entries are
/// exact.
///
/// Dropping an open batch aborts it (its chunks are dropped, never having
/// reached the device). Not `Send`: the provider's send-queue lock is
/// taken on the thread that opened the batch.
#[doc(alias = "ibv_qp_ex")]
pub struct WrBatch<'q> {
    qp: &'q mut QueuePair,
    ex: QpEx,
    checks: SendFacts,
    open: bool,
    /// How many requests the batch holds (the newest in the ledger).
    n: usize,
}

impl WrBatch<'_> {
    /// How many requests the batch holds so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the batch holds no request yet.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn ptr(&self) -> *mut sys::ibv_qp_ex {
        self.ex.ptr.as_ptr()
    }

    /// Refuses `flag` if the QP was not created for it.
    #[inline]
    fn check_op(&self, verb: &'static str, flag: SendOpsFlags) -> Result<()> {
        if self.ex.ops.contains(flag) {
            Ok(())
        } else {
            Err(Error::invalid(
                verb,
                format!("the QP was created without {flag:?} in its send_ops"),
            ))
        }
    }

    /// Refuses a request when the send queue is full.
    #[inline]
    fn check_room(&self, verb: &'static str) -> Result<()> {
        let ledger = &self.qp.pending().send.ledger;
        if ledger.room() == 0 {
            return Err(ledger.refusal(verb, 1));
        }
        Ok(())
    }

    /// Adds a send request to the batch: `ibv_wr_send`, `ibv_wr_send_imm`,
    /// `ibv_wr_send_inv`, `ibv_wr_rdma_write`, `ibv_wr_rdma_write_imm`,
    /// `ibv_wr_rdma_read`, `ibv_wr_atomic_cmp_swp` or
    /// `ibv_wr_atomic_fetch_add` after the request's operation, then
    /// `ibv_wr_set_ud_addr` for a UD destination and `ibv_wr_set_sge`,
    /// `ibv_wr_set_sge_list` or `ibv_wr_set_inline_data` for its data.
    ///
    /// The request's chunks move into the QP (see [`WrBatch`]).
    /// Refused before any call, with the chunks handed back and the batch
    /// still open: everything [`QueuePair::post_send`] refuses, an
    /// operation not in the QP's `send_ops`, a full send queue, and on rxe
    /// a list of entries of unequal lengths. Allocates nothing.
    ///
    /// # Errors
    /// A [`PostError`] with the request's chunks, nothing recorded and the
    /// batch still open, for what is refused above.
    #[doc(alias = "ibv_wr_send")]
    #[doc(alias = "ibv_wr_rdma_write")]
    #[doc(alias = "ibv_wr_rdma_read")]
    #[doc(alias = "ibv_wr_set_sge_list")]
    pub fn post(&mut self, wr: SendWr<'_>) -> Result<(), PostError> {
        const VERB: &str = "ibv_wr_post";
        let refused = self
            .checks
            .check(&wr)
            .and_then(|()| match wr.op {
                SendOp::SendWithInv(rkey) => {
                    crate::mw::check_send_inv(VERB, self.qp.pd().context(), self.qp.as_ptr(), rkey)
                }
                _ => Ok(()),
            })
            .and_then(|()| self.check_op(VERB, SendOpsFlags::of(&wr.op)))
            .and_then(|()| self.check_rxe_list(&wr))
            .and_then(|()| self.check_room(VERB));
        if let Err(e) = refused {
            let mut back = Vec::new();
            wr.data.give_back(&mut back);
            return Err(fail(e, 0, back));
        }
        // The raw entries, on the stack; the provider copies them into the
        // request during the setter call.
        let mut sge = [sys::ibv_sge::default(); MAX_SGE];
        let n = wr.data.fill(&mut sge);
        let inline = wr.inline_data();
        let ud = wr
            .ud
            .as_ref()
            .map(|(ah, qpn, qkey)| (ah.as_ptr(), qpn.get(), qkey.0));
        let (op, flags) = (wr.op, wr.flags);
        // The way a plain send enters the ledger (`post_send`'s).
        let p = &mut self.qp.pending_mut().send;
        let tag = match lend_send(&mut p.ledger, &mut p.side, wr) {
            Ok(tag) => tag,
            Err(loan) => return Err(refused_entry(VERB, &p.ledger, loan)),
        };
        let ex = self.ptr();
        // The batch is open on this live extended QP (`&mut` held); the
        // operation is among the QP's send_ops (checked), so its function
        // pointer is set; the entries name chunks the ledger now holds (in
        // this QP's PD, checked) and inline data borrowed for this call,
        // which the provider copies before returning; a UD destination's
        // address handle is held by the ledger too.
        // SAFETY: see above.
        unsafe {
            (*ex).wr_id = tag;
            (*ex).wr_flags = flags;
            match op {
                SendOp::Send => sys::ibv_wr_send(ex),
                SendOp::SendWithImm(imm) => sys::ibv_wr_send_imm(ex, imm.to_be()),
                SendOp::SendWithInv(rkey) => sys::ibv_wr_send_inv(ex, rkey),
                SendOp::RdmaWrite(r) => sys::ibv_wr_rdma_write(ex, r.rkey, r.addr),
                SendOp::RdmaWriteWithImm(r, imm) => {
                    sys::ibv_wr_rdma_write_imm(ex, r.rkey, r.addr, imm.to_be())
                }
                SendOp::RdmaRead(r) => sys::ibv_wr_rdma_read(ex, r.rkey, r.addr),
                SendOp::CompareSwap {
                    remote,
                    compare,
                    swap,
                } => sys::ibv_wr_atomic_cmp_swp(ex, remote.rkey, remote.addr, compare, swap),
                SendOp::FetchAdd { remote, add } => {
                    sys::ibv_wr_atomic_fetch_add(ex, remote.rkey, remote.addr, add)
                }
            }
            if let Some((ah, qpn, qkey)) = ud {
                sys::ibv_wr_set_ud_addr(ex, ah, qpn, qkey);
            }
            match (inline, n) {
                (Some(data), _) => {
                    sys::ibv_wr_set_inline_data(ex, data.as_ptr() as *mut _, data.len())
                }
                (None, 1) => sys::ibv_wr_set_sge(ex, sge[0].lkey, sge[0].addr, sge[0].length),
                (None, n) => sys::ibv_wr_set_sge_list(ex, n, sge.as_ptr()),
            }
        }
        self.n += 1;
        Ok(())
    }

    /// rxe adds up a list's lengths wrongly (see the module docs).
    fn check_rxe_list(&self, wr: &SendWr<'_>) -> Result<()> {
        let mut lens = wr.data.entries().map(|(_, l)| l);
        let first = lens.next();
        if self.ex.rxe && wr.inline_data().is_none() && lens.any(|l| Some(l) != first) {
            return Err(Error::Unsupported {
                what: "scatter/gather lists of unequal entries in a batch on rxe \
                       (its ibv_wr_set_sge_list counts the first entry's length for each)",
                device: self.qp.pd().context().name().to_owned(),
                errno: None,
            });
        }
        Ok(())
    }

    /// Adds a bind of type 2 memory window `mw` to the batch
    /// (`ibv_wr_bind_mw`), returning the window's new rkey (which peers may
    /// use once the batch is complete and the bind has run).
    ///
    /// The checks and bookkeeping of [`QueuePair::bind_mw`] apply; type 1
    /// windows are refused (they are bound with `QueuePair::bind_mw`), as
    /// is a QP created without [`SendOpsFlags::BIND_MW`].
    ///
    /// # Errors
    /// A [`PostError`], nothing recorded, for what [`QueuePair::bind_mw`]
    /// refuses, a type 1 window, and a QP without `BIND_MW`.
    #[doc(alias = "ibv_wr_bind_mw")]
    pub fn bind_mw(&mut self, mw: &mut MemoryWindow, bind: &MwBind<'_>) -> Result<u32, PostError> {
        const VERB: &str = "ibv_wr_bind_mw";
        let refused = if mw::is_type1(mw) {
            Err(Error::invalid(
                VERB,
                "a type 1 window is bound with QueuePair::bind_mw (ibv_bind_mw), not in a batch",
            ))
        } else {
            self.check_op(VERB, SendOpsFlags::BIND_MW)
                .and_then(|()| mw::check_bind(VERB, self.qp, mw, bind))
                .and_then(|()| self.check_room(VERB))
        };
        refused.map_err(|e| fail(e, 0, Vec::new()))?;
        let (raw_mw, current, rkey, loan) = mw::lend_type2_bind(mw, bind.region());
        let tag = self.lend(VERB, bind.wr_id_value(), loan)?;
        // SAFETY: `raw_mw` is `mw`'s, borrowed mutably for this call.
        unsafe { mw::set_current_rkey(raw_mw, current) };
        let info = bind.info();
        let ex = self.ptr();
        // SAFETY: open batch on a live extended QP with BIND_MW (checked);
        // the window and region are live, of the QP's PD (checked), and
        // held by the ledger entry; `info` is read during the call only.
        unsafe {
            (*ex).wr_id = tag;
            (*ex).wr_flags = bind.send_flags();
            sys::ibv_wr_bind_mw(ex, raw_mw, rkey, &info);
        }
        self.n += 1;
        Ok(rkey)
    }

    /// Adds a local invalidation of type 2 memory window `mw` to the batch
    /// (`ibv_wr_local_inv` with its rkey); the checks and bookkeeping of
    /// [`QueuePair::invalidate_mw`] apply, and the QP needs
    /// [`SendOpsFlags::LOCAL_INV`]. Signalled.
    ///
    /// # Errors
    /// A [`PostError`], nothing recorded, for what
    /// [`QueuePair::invalidate_mw`] refuses and a QP without `LOCAL_INV`.
    #[doc(alias = "ibv_wr_local_inv")]
    pub fn local_inv(&mut self, wr_id: u64, mw: &mut MemoryWindow) -> Result<(), PostError> {
        const VERB: &str = "ibv_wr_local_inv";
        self.check_op(VERB, SendOpsFlags::LOCAL_INV)
            .and_then(|()| mw::check_invalidate(VERB, self.qp, mw))
            .and_then(|()| self.check_room(VERB))
            .map_err(|e| fail(e, 0, Vec::new()))?;
        let (rkey, loan) = mw::lend_invalidate(mw);
        let tag = self.lend(VERB, wr_id, loan)?;
        let ex = self.ptr();
        // SAFETY: open batch on a live extended QP with LOCAL_INV
        // (checked); the request names no memory.
        unsafe {
            (*ex).wr_id = tag;
            (*ex).wr_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            sys::ibv_wr_local_inv(ex, rkey);
        }
        self.n += 1;
        Ok(())
    }

    /// Records a window request's loan in the send ledger (the one door
    /// of window requests, `SendQueue::lend_window`).
    fn lend(
        &mut self,
        verb: &'static str,
        wr_id: u64,
        loan: crate::mw::MwLoan,
    ) -> Result<u64, PostError> {
        self.qp.pending_mut().send.lend_window(verb, wr_id, loan)
    }

    /// Hands the batch to the device (`ibv_wr_complete`).
    ///
    /// On failure the batch's requests stay outstanding (the
    /// [`PostError`] counts them in `posted`): a provider may have queued
    /// them anyway, so only a completion, a RESET or the QP's destruction
    /// hands their chunks back. An empty batch is completed too (the
    /// provider's lock must be released) and posts nothing.
    ///
    /// # Errors
    /// A [`PostError`] when `ibv_wr_complete` fails: the batch's requests
    /// stay outstanding, counted in `posted`.
    #[doc(alias = "ibv_wr_complete")]
    pub fn complete(mut self) -> Result<(), PostError> {
        self.open = false;
        let n = self.len();
        // SAFETY: the batch is open on this live extended QP; this ends it.
        let rc = unsafe { sys::ibv_wr_complete(self.ptr()) };
        self.n = 0;
        // The provider released its lock, whatever `rc` says.
        self.qp.known().unlock_sends();
        crate::error::check_rc("ibv_wr_complete", rc)
            .map(|_| ())
            .map_err(|e| fail(e, n, Vec::new()))
    }

    /// Discards the batch (`ibv_wr_abort`): none of its requests reaches
    /// the device, and they come back at once, oldest first, with their
    /// chunks ([`Completed::signaled`] is false); memory-window binds and
    /// invalidations of the batch are undone in the windows' bookkeeping.
    #[doc(alias = "ibv_wr_abort")]
    pub fn abort(mut self) -> Vec<Completed> {
        self.abort_in_place()
    }

    fn abort_in_place(&mut self) -> Vec<Completed> {
        if !self.open {
            return Vec::new();
        }
        self.open = false;
        // SAFETY: the batch is open on this live extended QP; this ends it,
        // and the provider discards what the batch prepared.
        unsafe { sys::ibv_wr_abort(self.ptr()) };
        self.qp.known().unlock_sends();
        let p = &mut self.qp.pending_mut().send;
        let mut undone = Vec::with_capacity(self.n);
        // Newest first: the batch's requests are the ledger's newest.
        for _ in 0..std::mem::take(&mut self.n) {
            if let Some((wr_id, loan, mw_loan)) = p.undo_newest() {
                if let Some(l) = mw_loan {
                    l.restore();
                }
                undone.push(Completed::new(
                    wr_id,
                    false,
                    super::ledger::Kind::Send,
                    loan,
                ));
            }
        }
        undone.reverse();
        undone
    }
}

impl Drop for WrBatch<'_> {
    /// Aborts an open batch; its chunks are dropped (they never reached the
    /// device).
    fn drop(&mut self) {
        drop(self.abort_in_place());
    }
}

impl std::fmt::Debug for WrBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WrBatch")
            .field("qp_num", &format_args!("{:#x}", self.qp.qp_num()))
            .field("requests", &self.len())
            .field("open", &self.open)
            .finish()
    }
}

//! Completion queues (`struct ibv_cq`) and work completions (`struct ibv_wc`).

use crate::sys::{ibv_wc_opcode, ibv_wc_status};
use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use crate::channel::CompletionChannel;
use crate::context::Context;
use crate::error::{check_count, check_ptr, Error, Result};
use crate::handle::{close_counted, Owned, RawObject};
use crate::sys;
use crate::users::{Tally, UserCounts, UserKind};

impl RawObject for sys::ibv_cq {
    const DESTROY: &'static str = "ibv_destroy_cq";
    const NAME: &'static str = "completion queue";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live CQ, once: the events
        // read from its channel are acknowledged before it is destroyed
        // (ibv_destroy_cq waits for them), their count freed after.
        unsafe {
            let acks = crate::channel::acks::close(ptr);
            let rc = sys::ibv_destroy_cq(ptr);
            if rc == 0 {
                crate::channel::acks::free(acks);
            }
            rc
        }
    }
}

/// What a CQ keeps alive: its context, and its completion channel if any.
pub(crate) struct CqKeep {
    _tally: Tally,
    ctx: Context,
    /// Its users by kind (queue pairs), for `close`'s refusal.
    users: Arc<UserCounts>,
    _channel: Option<CompletionChannel>,
    /// Created with `ibv_create_cq_ex`: polled only through
    /// [`CompletionQueueEx`](crate::CompletionQueueEx), never with `ibv_poll_cq`.
    ex: bool,
}

pub(crate) type CqInner = Owned<sys::ibv_cq, CqKeep>;

/// A completion queue (`struct ibv_cq`).
///
/// Queue pairs that use it keep it alive. Polling is thread-safe (libibverbs
/// locks inside the provider), and polling allocates nothing.
///
/// ```no_run
/// use rdma_verbs::{Context, WorkCompletion};
/// let ctx = Context::open_first()?;
/// let cq = ctx.create_cq(256)?;
/// let mut wcs = [WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs)? {
///     println!("wr {} finished: {:?}", wc.wr_id(), wc.status());
/// }
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_cq")]
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl Context {
    /// Creates a completion queue with room for at least `cqe` completions.
    ///
    /// # Errors
    /// As [`CompletionQueue::new`].
    #[doc(alias = "ibv_create_cq")]
    pub fn create_cq(&self, cqe: u32) -> Result<CompletionQueue> {
        CompletionQueue::new(self, cqe)
    }

    /// Creates a completion queue that signals through `channel`, on
    /// completion vector `comp_vector`.
    ///
    /// # Errors
    /// As [`CompletionQueue::new`]; and, before any call,
    /// [`Error::InvalidArgument`] for a channel of another context or a
    /// `comp_vector` outside the context's `num_comp_vectors`.
    #[doc(alias = "ibv_create_cq")]
    pub fn create_cq_with_channel(
        &self,
        cqe: u32,
        channel: &CompletionChannel,
        comp_vector: u32,
    ) -> Result<CompletionQueue> {
        CompletionQueue::create(self, cqe, Some(channel), comp_vector)
    }
}

impl CompletionQueue {
    /// Creates a completion queue on `ctx` with room for at least `cqe`
    /// completions (the device may round up: see [`capacity`](Self::capacity)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before any call when `cqe` is not between
    /// 1 and the device's `max_cqe`; [`Error::Verb`] with the errno when
    /// `ibv_create_cq` fails.
    #[doc(alias = "ibv_create_cq")]
    pub fn new(ctx: &Context, cqe: u32) -> Result<Self> {
        Self::create(ctx, cqe, None, 0)
    }

    fn create(
        ctx: &Context,
        cqe: u32,
        channel: Option<&CompletionChannel>,
        comp_vector: u32,
    ) -> Result<Self> {
        if let Some(ch) = channel {
            if !ch.context().same_as(ctx) {
                return Err(Error::invalid(
                    "ibv_create_cq",
                    "the completion channel belongs to another context",
                ));
            }
        }
        let vectors = ctx.num_comp_vectors();
        if comp_vector >= vectors {
            return Err(Error::invalid(
                "ibv_create_cq",
                format!("completion vector {comp_vector} is outside 0..{vectors}"),
            ));
        }
        let max = ctx.attr().max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::invalid(
                "ibv_create_cq",
                format!("cqe {cqe} is outside 1..={max} (the device's max_cqe)"),
            ));
        }
        // SAFETY: live context; no user context; the channel, if any, is
        // live and of this context; the vector exists. `cqe <= max_cqe`,
        // which is an int, so the casts are lossless.
        let raw = unsafe {
            sys::ibv_create_cq(
                ctx.as_ptr(),
                cqe as c_int,
                std::ptr::null_mut(),
                channel.map_or(std::ptr::null_mut(), CompletionChannel::as_ptr),
                comp_vector as c_int,
            )
        };
        let raw = check_ptr("ibv_create_cq", raw)?;
        // SAFETY: a fresh CQ of `ctx` owned by nobody else, on `channel`.
        Ok(unsafe { Self::from_raw(ctx, raw, channel, false) })
    }

    /// Takes ownership of a fresh CQ of `ctx` (from `ibv_create_cq`, or the
    /// `ibv_cq` of an `ibv_create_cq_ex` one when `ex`).
    ///
    /// # Safety
    /// `raw` is a live CQ of `ctx`, owned by nobody else, created on
    /// `channel` (if any), not yet armed, whose `cq_context` nothing else
    /// uses (a CQ on a channel gets its event count there).
    pub(crate) unsafe fn from_raw(
        ctx: &Context,
        raw: std::ptr::NonNull<sys::ibv_cq>,
        channel: Option<&CompletionChannel>,
        ex: bool,
    ) -> Self {
        if channel.is_some() {
            // SAFETY: a fresh CQ (the caller's promise), not yet armed.
            unsafe { crate::channel::acks::attach(raw.as_ptr()) };
        }
        let keep = CqKeep {
            _tally: Tally::new(ctx.users(), UserKind::CompletionQueue, 1),
            ctx: ctx.clone(),
            users: UserCounts::new(),
            _channel: channel.cloned(),
            ex,
        };
        // SAFETY: a fresh CQ owned by nobody else (caller); it keeps `ctx`
        // and its channel alive.
        let inner = unsafe { Owned::new(raw, keep) };
        CompletionQueue {
            inner: Arc::new(inner),
        }
    }

    /// Whether this is an extended CQ's handle (polled through
    /// [`CompletionQueueEx`](crate::CompletionQueueEx)).
    #[inline]
    pub fn is_extended(&self) -> bool {
        self.inner.keep().ex
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.inner.as_ptr()
    }

    /// The context the CQ belongs to.
    #[inline]
    pub fn context(&self) -> &Context {
        &self.inner.keep().ctx
    }

    /// Asks for a completion event on the CQ's channel at the next
    /// completion (or the next solicited one, if `solicited_only`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a CQ made without a completion
    /// channel; [`Error::Verb`] with the errno when `ibv_req_notify_cq`
    /// fails.
    #[doc(alias = "ibv_req_notify_cq")]
    #[inline]
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.inner.keep()._channel.is_none() {
            return Err(Error::invalid(
                "ibv_req_notify_cq",
                "the CQ has no completion channel",
            ));
        }
        // SAFETY: the CQ is live.
        let rc = unsafe { sys::ibv_req_notify_cq(self.as_ptr(), c_int::from(solicited_only)) };
        crate::error::check_rc("ibv_req_notify_cq", rc).map(|_| ())
    }

    /// How many completions the CQ holds (`cqe`), possibly more than asked for.
    #[inline]
    pub fn capacity(&self) -> u32 {
        // SAFETY: the CQ is live; plain field read.
        u32::try_from(unsafe { (*self.as_ptr()).cqe }).unwrap_or(0)
    }

    /// Polls up to `wcs.len()` completions into `wcs` and returns the filled part.
    ///
    /// An empty result means the CQ had nothing. Allocates nothing.
    ///
    /// The handle of an extended CQ ([`is_extended`](Self::is_extended)) is
    /// refused: its completions are read through
    /// [`CompletionQueueEx::start_poll`](crate::CompletionQueueEx::start_poll),
    /// whose batch holds the provider's CQ lock (a `poll` on the same
    /// thread during a batch would wait for it forever).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an extended CQ's handle (above);
    /// [`Error::Verb`] when the provider's poll fails (a negative return).
    #[doc(alias = "ibv_poll_cq")]
    #[inline]
    pub fn poll<'a>(&self, wcs: &'a mut [WorkCompletion]) -> Result<&'a mut [WorkCompletion]> {
        if self.inner.keep().ex {
            return Err(Error::invalid(
                "ibv_poll_cq",
                "an extended CQ is polled with CompletionQueueEx::start_poll",
            ));
        }
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ; `wcs` has room for `n` `ibv_wc`s (`WorkCompletion`
        // is `repr(transparent)` over `ibv_wc`). ibv_poll_cq is the inline that
        // dispatches to the provider.
        let rc = unsafe { sys::ibv_poll_cq(self.as_ptr(), n, wcs.as_mut_ptr().cast()) };
        let got = check_count("ibv_poll_cq", rc)?.min(wcs.len());
        Ok(&mut wcs[..got])
    }

    /// Destroys the CQ now, reporting failure.
    ///
    /// # Errors
    /// [`Error::InUse`] while other handles or queue pairs using it are
    /// alive (the error says how many of each); it is then destroyed when
    /// the last of them is dropped. [`Error::Verb`] when `ibv_destroy_cq`
    /// fails (the CQ is then leaked).
    #[doc(alias = "ibv_destroy_cq")]
    pub fn close(self) -> Result<()> {
        close_counted(self.inner, |k| Some(&k.users))
    }

    /// The CQ's user counts, for its queue pairs' tallies.
    pub(crate) fn users(&self) -> &Arc<UserCounts> {
        &self.inner.keep().users
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.context().name())
            .field("capacity", &self.capacity())
            .finish()
    }
}

c_enum! {
    /// The status of a work completion (`enum ibv_wc_status`).
    #[doc(alias = "ibv_wc_status")]
    pub enum WcStatus(ibv_wc_status): u32 {
        /// The operation completed successfully.
        Success = IBV_WC_SUCCESS,
        /// Local length error: a message did not fit the posted buffers.
        LocLenErr = IBV_WC_LOC_LEN_ERR,
        /// Local QP operation error.
        LocQpOpErr = IBV_WC_LOC_QP_OP_ERR,
        /// Local EE context operation error.
        LocEecOpErr = IBV_WC_LOC_EEC_OP_ERR,
        /// Local protection error: a buffer is outside its MR or lacks access.
        LocProtErr = IBV_WC_LOC_PROT_ERR,
        /// Flushed: the QP went to the error state before this ran.
        WrFlushErr = IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind error.
        MwBindErr = IBV_WC_MW_BIND_ERR,
        /// Bad response from the peer.
        BadRespErr = IBV_WC_BAD_RESP_ERR,
        /// Local access error.
        LocAccessErr = IBV_WC_LOC_ACCESS_ERR,
        /// Remote invalid request.
        RemInvReqErr = IBV_WC_REM_INV_REQ_ERR,
        /// Remote access error: bad rkey, address or rights.
        RemAccessErr = IBV_WC_REM_ACCESS_ERR,
        /// Remote operation error.
        RemOpErr = IBV_WC_REM_OP_ERR,
        /// Transport retries exceeded (the peer did not answer).
        RetryExcErr = IBV_WC_RETRY_EXC_ERR,
        /// RNR retries exceeded (the peer had no receive posted).
        RnrRetryExcErr = IBV_WC_RNR_RETRY_EXC_ERR,
        /// Local RDD violation.
        LocRddViolErr = IBV_WC_LOC_RDD_VIOL_ERR,
        /// Remote invalid RD request.
        RemInvRdReqErr = IBV_WC_REM_INV_RD_REQ_ERR,
        /// Remote aborted.
        RemAbortErr = IBV_WC_REM_ABORT_ERR,
        /// Invalid EE context number.
        InvEecnErr = IBV_WC_INV_EECN_ERR,
        /// Invalid EE context state.
        InvEecStateErr = IBV_WC_INV_EEC_STATE_ERR,
        /// Fatal error.
        FatalErr = IBV_WC_FATAL_ERR,
        /// Response timeout.
        RespTimeoutErr = IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralErr = IBV_WC_GENERAL_ERR,
        /// Tag matching error.
        TmErr = IBV_WC_TM_ERR,
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

c_enum! {
    /// What a work completion was for (`enum ibv_wc_opcode`).
    #[doc(alias = "ibv_wc_opcode")]
    pub enum WcOpcode(ibv_wc_opcode): u32 {
        /// A send (with or without immediate data).
        Send = IBV_WC_SEND,
        /// An RDMA write.
        RdmaWrite = IBV_WC_RDMA_WRITE,
        /// An RDMA read.
        RdmaRead = IBV_WC_RDMA_READ,
        /// An atomic compare-and-swap.
        CompSwap = IBV_WC_COMP_SWAP,
        /// An atomic fetch-and-add.
        FetchAdd = IBV_WC_FETCH_ADD,
        /// A memory window bind.
        BindMw = IBV_WC_BIND_MW,
        /// A local invalidate.
        LocalInv = IBV_WC_LOCAL_INV,
        /// A TSO send.
        Tso = IBV_WC_TSO,
        /// An RDMA FLUSH ([`WrBatch::flush`](crate::qp::WrBatch::flush)).
        Flush = IBV_WC_FLUSH,
        /// An RDMA ATOMIC_WRITE ([`WrBatch::atomic_write`](crate::qp::WrBatch::atomic_write)).
        AtomicWrite = IBV_WC_ATOMIC_WRITE,
        /// A receive.
        Recv = IBV_WC_RECV,
        /// A receive of an RDMA write with immediate data.
        RecvRdmaWithImm = IBV_WC_RECV_RDMA_WITH_IMM,
        /// Tag matching: add.
        TmAdd = IBV_WC_TM_ADD,
        /// Tag matching: delete.
        TmDel = IBV_WC_TM_DEL,
        /// Tag matching: sync.
        TmSync = IBV_WC_TM_SYNC,
        /// Tag matching: receive.
        TmRecv = IBV_WC_TM_RECV,
        /// Tag matching: no tag.
        TmNoTag = IBV_WC_TM_NO_TAG,
        /// Driver-specific.
        Driver1 = IBV_WC_DRIVER1,
        /// Driver-specific.
        Driver2 = IBV_WC_DRIVER2,
        /// Driver-specific.
        Driver3 = IBV_WC_DRIVER3,
    }
}

impl WcStatus {
    /// libibverbs' description of the status (`ibv_wc_status_str`), e.g.
    /// "transport retry counter exceeded". What made it likely for one
    /// QP's completion: [`QueuePair::explain`](crate::QueuePair::explain).
    #[doc(alias = "ibv_wc_status_str")]
    pub fn message(self) -> &'static str {
        // SAFETY: ibv_wc_status_str returns a pointer to a static, NUL-terminated
        // string for any value (an "unknown" text for values it does not know).
        let s = unsafe { std::ffi::CStr::from_ptr(sys::ibv_wc_status_str(self.as_raw())) };
        s.to_str().unwrap_or("unknown")
    }
}

bitflags::bitflags! {
    /// Flags of a work completion (`enum ibv_wc_flags`).
    #[doc(alias = "ibv_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a GRH is in the first 40 bytes of the receive buffer (UD).
        const GRH = sys::ibv_wc_flags::IBV_WC_GRH.0;
        /// `IBV_WC_WITH_IMM`: immediate data is valid.
        const WITH_IMM = sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        /// `IBV_WC_IP_CSUM_OK`: the IP checksum was verified.
        const IP_CSUM_OK = sys::ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        /// `IBV_WC_WITH_INV`: an rkey was invalidated.
        const WITH_INV = sys::ibv_wc_flags::IBV_WC_WITH_INV.0;
        /// `IBV_WC_TM_SYNC_REQ`.
        const TM_SYNC_REQ = sys::ibv_wc_flags::IBV_WC_TM_SYNC_REQ.0;
        /// `IBV_WC_TM_MATCH`.
        const TM_MATCH = sys::ibv_wc_flags::IBV_WC_TM_MATCH.0;
        /// `IBV_WC_TM_DATA_VALID`.
        const TM_DATA_VALID = sys::ibv_wc_flags::IBV_WC_TM_DATA_VALID.0;
        // Flags newer providers report that this version does not name.
        const _ = !0;
    }
}

/// One work completion (`struct ibv_wc`), decoded on access.
///
/// It has the C struct's layout, so [`CompletionQueue::poll`] fills a slice
/// of these directly, without copying or allocating.
#[doc(alias = "ibv_wc")]
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct WorkCompletion(sys::ibv_wc);

impl WorkCompletion {
    pub(crate) fn raw(&self) -> &sys::ibv_wc {
        &self.0
    }

    /// The `wr_id` of the work request this completes, as the device saw it.
    ///
    /// For requests posted through the safe API this is the crate's tag
    /// for the request, not the caller's number: the caller's `wr_id` comes
    /// back in [`Completed::wr_id`](crate::qp::Completed::wr_id) from
    /// [`QueuePair::reclaim_one`](crate::QueuePair::reclaim_one) (or
    /// [`reclaim`](crate::QueuePair::reclaim)), and
    /// [`request_kind`](Self::request_kind) says which queue the request
    /// was posted to. For requests of the raw path it is the caller's own.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    /// Which queue the completed request was posted to (a send queue, a
    /// QP's receive queue, an SRQ), from the tag of a safe-path request:
    /// known for failed and flushed completions too, whose opcode is not.
    /// `None` for a raw-path request's `wr_id`.
    ///
    /// ```
    /// let wc = rdma_verbs::WorkCompletion::default();
    /// assert_eq!(wc.request_kind(), None);
    /// ```
    #[inline]
    pub fn request_kind(&self) -> Option<crate::qp::RequestKind> {
        crate::qp::RequestKind::of_tag(self.0.wr_id)
    }

    /// The status; `Err(raw)` for a status this crate does not know.
    /// Why a request failed, as far as its QP can tell:
    /// [`QueuePair::explain`](crate::QueuePair::explain).
    #[inline]
    pub fn status(&self) -> Result<WcStatus, u32> {
        WcStatus::from_raw(self.0.status).ok_or(self.0.status)
    }

    /// Whether the status is `IBV_WC_SUCCESS`.
    #[inline]
    pub fn is_success(&self) -> bool {
        self.0.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The operation. `Err(raw)` for a failed or flushed completion (the
    /// C field is undefined then: what kind of request it was comes from
    /// [`request_kind`](Self::request_kind)) and for an unknown opcode.
    #[inline]
    pub fn opcode(&self) -> Result<WcOpcode, u32> {
        if !self.is_success() {
            return Err(self.0.opcode);
        }
        WcOpcode::from_raw(self.0.opcode).ok_or(self.0.opcode)
    }

    /// `vendor_err`: the provider's own error code for a failed completion.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// `byte_len`: bytes received (receives) or transferred.
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The flags.
    #[inline]
    pub fn flags(&self) -> WcFlags {
        WcFlags::from_bits_retain(self.0.wc_flags)
    }

    /// The immediate data, in host order, when `IBV_WC_WITH_IMM` is set.
    #[inline]
    pub fn imm_data(&self) -> Option<u32> {
        // SAFETY: both union members are plain u32s.
        let raw = unsafe { self.0.__bindgen_anon_1.imm_data };
        self.flags()
            .contains(WcFlags::WITH_IMM)
            .then(|| u32::from_be(raw))
    }

    /// The invalidated rkey, when `IBV_WC_WITH_INV` is set.
    ///
    /// rxe (measured on Linux 6.1) marks a receive that invalidated a
    /// window with the kernel's `IB_WC_WITH_INVALIDATE` bit (`1 << 2`),
    /// which libibverbs passes through unchanged and which is
    /// `IBV_WC_IP_CSUM_OK` in user space: there this returns `None`. Ask the
    /// receiving QP instead: [`QueuePair::invalidated_rkey`](crate::QueuePair::invalidated_rkey)
    /// knows its device and transport and reads both.
    #[inline]
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.flags()
            .contains(WcFlags::WITH_INV)
            .then(|| self.ex_data())
    }

    /// The raw `imm_data`/`invalidate_rkey` union, whatever the flags say.
    #[inline]
    pub(crate) fn ex_data(&self) -> u32 {
        // SAFETY: both union members are plain u32s.
        unsafe { self.0.__bindgen_anon_1.invalidated_rkey }
    }

    /// `qp_num`: the local QP this completion belongs to, as
    /// [`QueuePair::qp_num`](crate::QueuePair::qp_num) gives it.
    #[inline]
    pub fn qp_num(&self) -> crate::qp::QpNum {
        crate::qp::QpNum::truncate(self.0.qp_num)
    }

    /// `src_qp`: the sender's QP number (UD receives; meaningless for
    /// other completions). The field is 24 bits wide on the wire, so only
    /// the low 24 bits of what the provider wrote are kept.
    #[inline]
    pub fn src_qp(&self) -> crate::qp::QpNum {
        crate::qp::QpNum::truncate(self.0.src_qp)
    }

    /// `pkey_index` (GSI QPs).
    #[inline]
    pub fn pkey_index(&self) -> u16 {
        self.0.pkey_index
    }

    /// `slid`: the sender's LID (UD receives on InfiniBand).
    #[inline]
    pub fn slid(&self) -> u16 {
        self.0.slid
    }

    /// `sl`: the service level (UD receives).
    #[inline]
    pub fn sl(&self) -> u8 {
        self.0.sl
    }

    /// `dlid_path_bits` (UD receives).
    #[inline]
    pub fn dlid_path_bits(&self) -> u8 {
        self.0.dlid_path_bits
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("WorkCompletion");
        match self.request_kind() {
            Some(kind) => d
                .field("request", &kind)
                .field("tag", &format_args!("{:#x}", self.wr_id())),
            None => d.field("wr_id", &self.wr_id()),
        };
        d.field("status", &self.status());
        if self.is_success() {
            d.field("opcode", &self.opcode());
        }
        d.field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .field("flags", &self.flags());
        if let Some(imm) = self.imm_data() {
            d.field("imm_data", &imm);
        }
        d.finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(f: impl FnOnce(&mut sys::ibv_wc)) -> WorkCompletion {
        let mut raw = sys::ibv_wc::default();
        f(&mut raw);
        WorkCompletion(raw)
    }

    #[test]
    fn decodes_a_receive_with_immediate() {
        let w = wc(|r| {
            r.wr_id = 42;
            r.status = sys::ibv_wc_status::IBV_WC_SUCCESS;
            r.opcode = sys::ibv_wc_opcode::IBV_WC_RECV;
            r.byte_len = 100;
            r.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
            r.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_IMM.0;
            r.src_qp = 0x11;
        });
        assert_eq!(w.wr_id(), 42);
        assert_eq!(w.status(), Ok(WcStatus::Success));
        assert!(w.is_success());
        assert_eq!(w.opcode(), Ok(WcOpcode::Recv));
        assert_eq!(w.byte_len(), 100);
        assert_eq!(w.imm_data(), Some(0x1234_5678));
        assert_eq!(w.invalidated_rkey(), None);
        assert_eq!(w.src_qp().get(), 0x11);
        // Bits above the 24 of the field on the wire are not a QP number.
        let w = wc(|r| r.src_qp = 0xff00_0011);
        assert_eq!(w.src_qp(), crate::qp::QpNum::new(0x11).unwrap());
    }

    #[test]
    fn a_failed_completion_has_no_opcode_but_its_request_kind() {
        // A flushed receive of the safe path: the device left the opcode
        // field as zero, which reads as SEND.
        let w = wc(|r| {
            r.wr_id = (2 << 62) | 0x1_0005;
            r.status = sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
            r.opcode = sys::ibv_wc_opcode::IBV_WC_SEND;
        });
        assert_eq!(w.opcode(), Err(sys::ibv_wc_opcode::IBV_WC_SEND));
        assert_eq!(w.request_kind(), Some(crate::qp::RequestKind::Recv));
        let shown = format!("{w:?}");
        assert!(
            shown.contains("request: Recv") && !shown.contains("opcode"),
            "{shown}"
        );
        // A raw-path wr_id is the caller's, shown as such.
        let raw = wc(|r| r.wr_id = 42);
        assert_eq!(raw.request_kind(), None);
        assert!(format!("{raw:?}").contains("wr_id: 42"));
    }

    #[test]
    fn immediate_is_absent_without_the_flag() {
        let w = wc(|r| r.__bindgen_anon_1.imm_data = 7);
        assert_eq!(w.imm_data(), None);
    }

    #[test]
    fn unknown_status_is_reported_raw() {
        let w = wc(|r| r.status = 999);
        assert_eq!(w.status(), Err(999));
        assert!(!w.is_success());
        let w = wc(|r| r.status = sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        assert_eq!(w.status(), Ok(WcStatus::WrFlushErr));
    }

    #[test]
    fn status_messages_come_from_libibverbs() {
        assert_eq!(WcStatus::Success.message(), "success");
        assert_eq!(
            WcStatus::RetryExcErr.message(),
            "transport retry counter exceeded"
        );
    }

    #[test]
    fn same_layout_as_ibv_wc() {
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<sys::ibv_wc>()
        );
        assert_eq!(
            std::mem::align_of::<WorkCompletion>(),
            std::mem::align_of::<sys::ibv_wc>()
        );
    }

    #[test]
    fn status_and_opcode_round_trip() {
        for s in WcStatus::ALL {
            assert_eq!(WcStatus::from_raw(s.as_raw()), Some(*s));
        }
        for o in WcOpcode::ALL {
            assert_eq!(WcOpcode::from_raw(o.as_raw()), Some(*o));
        }
        assert_eq!(WcOpcode::Recv.as_raw(), 128);
    }
}

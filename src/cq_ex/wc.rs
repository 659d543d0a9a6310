//! The completions: [`PolledWc`], the current completion of a batch, with
//! a read method per field (bounded by the field's trait), and its
//! [`Completion`] impl through which queue pairs and SRQs reclaim.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::{
    has, FieldSet, WithByteLen, WithCompletionTimestamp, WithCompletionWallclock, WithCvlan,
    WithDlidPathBits, WithFlowTag, WithImm, WithQpNum, WithSl, WithSlid, WithSrcQp,
};
use crate::cq::{WcFlags, WcOpcode, WcStatus};
use crate::error::Result;
use crate::qp::Completion;
use crate::sys;
use crate::sys::ibv_create_cq_wc_flags as wcf;
// What the docs link to.
#[cfg(doc)]
use super::CqPoll;

/// The current completion of a batch, read field by field from the
/// provider (`ibv_wc_read_*`).
///
/// Borrows its [`CqPoll`]: it cannot outlive the next
/// [`next`](CqPoll::next) or the batch. Reads of optional fields need the
/// field in `F`. It hands requests back through
/// [`QueuePair::reclaim`](crate::QueuePair::reclaim) and
/// [`SharedReceiveQueue::reclaim`](crate::SharedReceiveQueue::reclaim).
#[doc(alias = "ibv_cq_ex")]
pub struct PolledWc<'p, F: FieldSet> {
    pub(super) cq: NonNull<sys::ibv_cq_ex>,
    pub(super) _batch: PhantomData<&'p mut ()>,
    pub(super) _f: PhantomData<fn() -> F>,
}

impl<F: FieldSet> PolledWc<'_, F> {
    #[inline]
    fn raw(&self) -> *mut sys::ibv_cq_ex {
        self.cq.as_ptr()
    }

    /// The `wr_id` of the work request this completes, as the device saw
    /// it (the crate's tag for requests of the safe path; the caller's
    /// `wr_id` comes back from [`QueuePair::reclaim`](crate::QueuePair::reclaim)).
    #[doc(alias = "ibv_cq_ex")]
    #[inline]
    pub fn wr_id(&self) -> u64 {
        // SAFETY: the CQ is live and the batch open, with this completion
        // current (the borrow of the batch); `wr_id` is a plain field the
        // provider set for it.
        unsafe { (*self.raw()).wr_id }
    }

    #[inline]
    fn raw_status(&self) -> u32 {
        // SAFETY: as in `wr_id`.
        unsafe { (*self.raw()).status }
    }

    /// The status; `Err(raw)` for a status this crate does not know.
    #[doc(alias = "ibv_cq_ex")]
    #[inline]
    pub fn status(&self) -> Result<WcStatus, u32> {
        let s = self.raw_status();
        WcStatus::from_raw(s).ok_or(s)
    }

    /// Whether the status is `IBV_WC_SUCCESS`.
    #[doc(alias = "ibv_cq_ex")]
    #[inline]
    pub fn is_success(&self) -> bool {
        self.raw_status() == sys::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The operation (`ibv_wc_read_opcode`). `Err(raw)` for a failed or
    /// flushed completion (the opcode is undefined then: the kind of
    /// request comes from [`request_kind`](Self::request_kind)) and for an
    /// unknown opcode.
    #[doc(alias = "ibv_wc_read_opcode")]
    #[inline]
    pub fn opcode(&self) -> Result<WcOpcode, u32> {
        // SAFETY: batch open with this completion current; read_opcode is
        // always set (checked in `build`).
        let o = unsafe { sys::ibv_wc_read_opcode(self.raw()) };
        if !self.is_success() {
            return Err(o);
        }
        WcOpcode::from_raw(o).ok_or(o)
    }

    /// Which queue the completed request was posted to, from the tag of a
    /// safe-path request (failed and flushed completions too); `None` for
    /// a raw-path `wr_id`.
    #[inline]
    pub fn request_kind(&self) -> Option<crate::qp::RequestKind> {
        crate::qp::RequestKind::of_tag(self.wr_id())
    }

    /// The provider's own error code (`ibv_wc_read_vendor_err`).
    #[doc(alias = "ibv_wc_read_vendor_err")]
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        // SAFETY: as in `opcode`; read_vendor_err is always set.
        unsafe { sys::ibv_wc_read_vendor_err(self.raw()) }
    }

    /// The flags (`ibv_wc_read_wc_flags`).
    #[doc(alias = "ibv_wc_read_wc_flags")]
    #[inline]
    pub fn flags(&self) -> WcFlags {
        // SAFETY: as in `opcode`; read_wc_flags is always set.
        WcFlags::from_bits_retain(unsafe { sys::ibv_wc_read_wc_flags(self.raw()) })
    }

    /// Bytes received or transferred (`ibv_wc_read_byte_len`).
    #[doc(alias = "ibv_wc_read_byte_len")]
    #[inline]
    pub fn byte_len(&self) -> u32
    where
        F: WithByteLen,
    {
        // SAFETY: batch open with this completion current; the CQ was
        // created with byte_len (`F: WithByteLen`) and `build` checked the
        // provider set read_byte_len.
        unsafe { sys::ibv_wc_read_byte_len(self.raw()) }
    }

    /// The immediate data in host order, when the flags have `WITH_IMM`
    /// (`ibv_wc_read_imm_data`).
    #[doc(alias = "ibv_wc_read_imm_data")]
    #[inline]
    pub fn imm_data(&self) -> Option<u32>
    where
        F: WithImm,
    {
        if !self.flags().contains(WcFlags::WITH_IMM) {
            return None;
        }
        // SAFETY: as in `byte_len`, for imm (`F: WithImm`, read_imm_data).
        Some(u32::from_be(unsafe {
            sys::ibv_wc_read_imm_data(self.raw())
        }))
    }

    /// The rkey a send with invalidate invalidated, when the flags have
    /// `WITH_INV` (`ibv_wc_read_invalidated_rkey`).
    ///
    /// rxe marks the invalidation with another bit (see
    /// [`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey)):
    /// [`QueuePair::invalidated_rkey`](crate::QueuePair::invalidated_rkey)
    /// reads both.
    #[doc(alias = "ibv_wc_read_invalidated_rkey")]
    #[inline]
    pub fn invalidated_rkey(&self) -> Option<u32>
    where
        F: WithImm,
    {
        if !self.flags().contains(WcFlags::WITH_INV) {
            return None;
        }
        // The set has imm (`F: WithImm`), so this reads the word.
        Some(Completion::inv_word(self))
    }

    /// The local QP number (`ibv_wc_read_qp_num`), as
    /// [`QueuePair::qp_num`](crate::QueuePair::qp_num) gives it.
    #[doc(alias = "ibv_wc_read_qp_num")]
    #[inline]
    pub fn qp_num(&self) -> crate::qp::QpNum
    where
        F: WithQpNum,
    {
        // SAFETY: as in `byte_len`, for qp_num.
        crate::qp::QpNum::truncate(unsafe { sys::ibv_wc_read_qp_num(self.raw()) })
    }

    /// The sender's QP number (UD receives; `ibv_wc_read_src_qp`), its
    /// low 24 bits (the width of the field on the wire).
    #[doc(alias = "ibv_wc_read_src_qp")]
    #[inline]
    pub fn src_qp(&self) -> crate::qp::QpNum
    where
        F: WithSrcQp,
    {
        // SAFETY: as in `byte_len`, for src_qp.
        crate::qp::QpNum::truncate(unsafe { sys::ibv_wc_read_src_qp(self.raw()) })
    }

    /// The sender's LID (UD receives on InfiniBand; `ibv_wc_read_slid`).
    #[doc(alias = "ibv_wc_read_slid")]
    #[inline]
    pub fn slid(&self) -> u32
    where
        F: WithSlid,
    {
        // SAFETY: as in `byte_len`, for slid.
        unsafe { sys::ibv_wc_read_slid(self.raw()) }
    }

    /// The service level (`ibv_wc_read_sl`).
    #[doc(alias = "ibv_wc_read_sl")]
    #[inline]
    pub fn sl(&self) -> u8
    where
        F: WithSl,
    {
        // SAFETY: as in `byte_len`, for sl.
        unsafe { sys::ibv_wc_read_sl(self.raw()) }
    }

    /// The destination LID path bits (`ibv_wc_read_dlid_path_bits`).
    #[doc(alias = "ibv_wc_read_dlid_path_bits")]
    #[inline]
    pub fn dlid_path_bits(&self) -> u8
    where
        F: WithDlidPathBits,
    {
        // SAFETY: as in `byte_len`, for dlid_path_bits.
        unsafe { sys::ibv_wc_read_dlid_path_bits(self.raw()) }
    }

    /// The completion time in device clock units (`ibv_wc_read_completion_ts`;
    /// the device's `completion_timestamp_mask` says which bits count).
    #[doc(alias = "ibv_wc_read_completion_ts")]
    #[inline]
    pub fn completion_ts(&self) -> u64
    where
        F: WithCompletionTimestamp,
    {
        // SAFETY: as in `byte_len`, for the completion timestamp.
        unsafe { sys::ibv_wc_read_completion_ts(self.raw()) }
    }

    /// The completion time in wallclock nanoseconds
    /// (`ibv_wc_read_completion_wallclock_ns`).
    #[doc(alias = "ibv_wc_read_completion_wallclock_ns")]
    #[inline]
    pub fn completion_wallclock_ns(&self) -> u64
    where
        F: WithCompletionWallclock,
    {
        // SAFETY: as in `byte_len`, for the wallclock timestamp.
        unsafe { sys::ibv_wc_read_completion_wallclock_ns(self.raw()) }
    }

    /// The customer VLAN (`ibv_wc_read_cvlan`).
    #[doc(alias = "ibv_wc_read_cvlan")]
    #[inline]
    pub fn cvlan(&self) -> u16
    where
        F: WithCvlan,
    {
        // SAFETY: as in `byte_len`, for cvlan.
        unsafe { sys::ibv_wc_read_cvlan(self.raw()) }
    }

    /// The flow tag (`ibv_wc_read_flow_tag`).
    #[doc(alias = "ibv_wc_read_flow_tag")]
    #[inline]
    pub fn flow_tag(&self) -> u32
    where
        F: WithFlowTag,
    {
        // SAFETY: as in `byte_len`, for flow_tag.
        unsafe { sys::ibv_wc_read_flow_tag(self.raw()) }
    }
}

impl<F: FieldSet> crate::datapath::CompletionSealed for PolledWc<'_, F> {}

impl<F: FieldSet> Completion for PolledWc<'_, F> {
    #[inline]
    fn tag(&self) -> u64 {
        self.wr_id()
    }

    #[inline]
    fn local_qp_num(&self) -> Option<u32> {
        if !has::<F>(wcf::IBV_WC_EX_WITH_QP_NUM) {
            return None;
        }
        // SAFETY: as in `byte_len`: the set has qp_num (checked just above,
        // the same bit `WithQpNum` stands for) and `build` checked the
        // provider set read_qp_num.
        Some(unsafe { sys::ibv_wc_read_qp_num(self.raw()) })
    }

    #[inline]
    fn succeeded(&self) -> bool {
        self.is_success()
    }
    #[inline]
    fn status_code(&self) -> u32 {
        self.raw_status()
    }
    #[inline]
    fn vendor_code(&self) -> u32 {
        self.vendor_err()
    }

    #[inline]
    fn inv_flags(&self) -> Option<WcFlags> {
        has::<F>(wcf::IBV_WC_EX_WITH_IMM).then(|| self.flags())
    }

    #[inline]
    fn inv_word(&self) -> u32 {
        if !has::<F>(wcf::IBV_WC_EX_WITH_IMM) {
            return 0;
        }
        // SAFETY: as in `imm_data`: the set has imm (checked just above,
        // the bit `WithImm` stands for) and `build` checked the provider
        // set read_imm_data.
        unsafe { sys::ibv_wc_read_invalidated_rkey(self.raw()) }
    }

    #[inline]
    fn wc_opcode(&self) -> Result<WcOpcode, u32> {
        self.opcode()
    }
}

impl<F: FieldSet> fmt::Debug for PolledWc<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PolledWc");
        d.field("wr_id", &self.wr_id())
            .field("status", &self.status());
        if self.is_success() {
            d.field("opcode", &self.opcode());
        }
        d.field("flags", &self.flags());
        if let Some(qpn) = self.local_qp_num() {
            d.field("qp_num", &qpn);
        }
        if has::<F>(wcf::IBV_WC_EX_WITH_BYTE_LEN) {
            // SAFETY: as in `byte_len` (the set has byte_len: checked here).
            d.field("byte_len", &unsafe {
                sys::ibv_wc_read_byte_len(self.raw())
            });
        }
        if has::<F>(wcf::IBV_WC_EX_WITH_IMM) && self.flags().contains(WcFlags::WITH_IMM) {
            // SAFETY: as in `imm_data` (the set has imm: checked here).
            let imm = unsafe { sys::ibv_wc_read_imm_data(self.raw()) };
            d.field("imm_data", &u32::from_be(imm));
        }
        d.finish_non_exhaustive()
    }
}

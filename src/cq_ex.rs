//! Extended completion queues (`ibv_create_cq_ex`, `struct ibv_cq_ex`):
//! completions read field by field, with the set of fields fixed when the
//! CQ is created and known to the compiler.
//!
//! # Fields
//!
//! [`Context::create_cq_ex`] returns a [`CqExBuilder`]; each of its field
//! methods ([`byte_len`](CqExBuilder::byte_len), [`imm`](CqExBuilder::imm),
//! [`qp_num`](CqExBuilder::qp_num), ...) adds one `IBV_WC_EX_WITH_*` flag to
//! the `wc_flags` of the call and turns one type parameter of the
//! [`Fields`] set from [`Off`] to [`On`]. A completion of the CQ
//! ([`PolledWc`]) has a read method per field, bounded by the field's trait
//! ([`WithByteLen`], [`WithImm`], ...): reading a field the CQ was not
//! created with does not compile. That is more than tidiness: a provider
//! leaves the `read_*` function of a field not asked for unset, and
//! calling it would jump through a NULL pointer. [`CqExBuilder::build`]
//! also checks that the provider did install every function the set needs
//! before handing the CQ out.
//!
//! `wr_id`, status, opcode, vendor error and flags are always there.
//! [`StandardFields`] is the set of `IBV_WC_STANDARD_FLAGS` (byte_len, imm,
//! qp_num, src_qp, slid, sl, dlid_path_bits), which
//! [`standard`](CqExBuilder::standard) asks for in one call.
//!
//! # Polling
//!
//! A batch is a lending iterator: [`CompletionQueueEx::start_poll`]
//! (`ibv_start_poll`) opens it when the CQ has a completion, and each
//! [`CqPoll::next`] yields one completion, the first call the one
//! `ibv_start_poll` found and every later one through `ibv_next_poll`,
//! until the CQ is empty. A [`PolledWc`] borrows its batch, so it cannot be
//! kept past the next `next` (which moves the provider's cursor) nor past
//! the end of the batch. Dropping the batch (or [`CqPoll::end`]) calls
//! `ibv_end_poll` when it is due (see below); the completions the batch
//! yielded are then consumed. The batch holds the provider's CQ lock from
//! `ibv_start_poll` to its end, so [`CqPoll`] is neither `Send` nor `Sync`:
//! it ends on the thread that opened it.
//!
//! `ibv_start_poll` takes the first completion off the queue: a batch
//! dropped before its first `next` consumes that completion unseen, as
//! `ibv_end_poll` after `ibv_start_poll` does in C.
//!
//! While a batch is open the provider's CQ lock is held, and other users
//! of that lock wait for it. Do not destroy or reset a queue pair of this CQ on
//! the batch's own thread while it is open: mlx5 cleans the QP's entries
//! out of its CQs under that lock and would wait for it forever. Reclaiming
//! through [`QueuePair::reclaim`](crate::QueuePair::reclaim) calls no verb
//! and is fine inside a batch.
//!
//! # The rxe quirk: when `ibv_end_poll` is due
//!
//! The man page (`ibv_create_cq_ex(3)`) says `ibv_end_poll` follows every
//! successful `ibv_start_poll`, including after `ibv_next_poll` reported
//! `ENOENT`. The soft-RoCE provider does not work that way (rdma-core's
//! `providers/rxe/rxe.c`, `cq_next_poll` and `cq_end_poll`): its
//! `next_poll`, on finding the queue empty, itself stores the consumer
//! index and releases the CQ lock, and its `end_poll` always advances the
//! index once more and then unlocks. Calling `ibv_end_poll` after an
//! `ENOENT` of `ibv_next_poll` on rxe therefore moves the consumer index one
//! past the producer (the CQ then reads stale entries as new ones, or loses
//! a ring's worth) and unlocks a lock that is not held. Other providers
//! (mlx5 among them) keep the lock in `next_poll` and need `ibv_end_poll`.
//!
//! So on rxe, recognised by its vendor id `0xFFFFFF` (`RXE_VENDOR_ID` in the
//! kernel's `drivers/infiniband/sw/rxe/rxe_param.h`, what `ibv_devinfo`
//! reports as `vendor_id` for an rxe device), a batch that `ibv_next_poll`
//! ended with `ENOENT` is not followed by `ibv_end_poll`; a batch dropped
//! earlier is (rxe's `end_poll` then consumes the current completion, as
//! intended). On every other device `ibv_end_poll` ends every batch.
//!
//! ```no_run
//! use rdma_verbs::{Context, QpInitAttr, QpType};
//! let ctx = Context::open_first()?;
//! let mut cq = ctx.create_cq_ex(256).byte_len().qp_num().build()?;
//! let pd = ctx.alloc_pd()?;
//! let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq()))?;
//! // ... post work ...
//! if let Some(mut batch) = cq.start_poll()? {
//!     while let Some(wc) = batch.next()? {
//!         println!("wr {} ({} bytes) on QP {}", wc.wr_id(), wc.byte_len(), wc.qp_num());
//!     }
//! }
//! # drop(qp);
//! # Ok::<(), rdma_verbs::Error>(())
//! ```

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::channel::CompletionChannel;
use crate::context::Context;
use crate::cq::{CompletionQueue, WcFlags, WcOpcode, WcStatus};
use crate::error::{Error, Result};
use crate::qp::Completion;
use crate::sys;
use crate::sys::ibv_create_cq_wc_flags as wcf;

/// The vendor id of soft-RoCE devices: `RXE_VENDOR_ID` (`0XFFFFFF`) in the
/// kernel's `drivers/infiniband/sw/rxe/rxe_param.h`.
pub(crate) const RXE_VENDOR_ID: u32 = 0x00FF_FFFF;

mod sealed {
    /// Keeps the field markers and sets to this crate's types.
    pub trait Sealed {}
}

/// A field the CQ was created with (type-level `true`).
#[doc(alias = "ibv_create_cq_wc_flags")]
#[derive(Debug)]
pub enum On {}
/// A field the CQ was created without (type-level `false`).
#[doc(alias = "ibv_create_cq_wc_flags")]
#[derive(Debug)]
pub enum Off {}

/// [`On`] or [`Off`]. Sealed.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub trait Flag: sealed::Sealed + 'static {
    /// Whether the field is asked for.
    const ON: bool;
}
impl sealed::Sealed for On {}
impl sealed::Sealed for Off {}
impl Flag for On {
    const ON: bool = true;
}
impl Flag for Off {
    const ON: bool = false;
}

/// A set of completion fields: one [`On`]/[`Off`] per field, in the order
/// of `enum ibv_create_cq_wc_flags`: byte_len, imm, qp_num, src_qp, slid,
/// sl, dlid_path_bits, completion timestamp, completion wallclock, cvlan,
/// flow_tag. Only a type; never made.
///
/// Spelled out it is long; [`CqExBuilder`]'s methods build it, and
/// [`NoFields`] and [`StandardFields`] name the common sets.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub struct Fields<B, I, Q, S, L, SL, D, T, W, V, FT> {
    _never: std::convert::Infallible,
    #[allow(clippy::type_complexity)]
    _set: PhantomData<fn() -> (B, I, Q, S, L, SL, D, T, W, V, FT)>,
}

/// No optional field: `wc_flags` 0.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub type NoFields = Fields<Off, Off, Off, Off, Off, Off, Off, Off, Off, Off, Off>;

/// The fields of `IBV_WC_STANDARD_FLAGS`: byte_len, imm, qp_num, src_qp,
/// slid, sl and dlid_path_bits.
#[doc(alias = "IBV_WC_STANDARD_FLAGS")]
pub type StandardFields = Fields<On, On, On, On, On, On, On, Off, Off, Off, Off>;

/// A set of completion fields ([`Fields`]), with its `wc_flags`. Sealed.
#[doc(alias = "ibv_create_cq_wc_flags")]
pub trait FieldSet: sealed::Sealed + 'static {
    /// byte_len.
    type ByteLen: Flag;
    /// imm_data / invalidated_rkey.
    type Imm: Flag;
    /// qp_num.
    type QpNum: Flag;
    /// src_qp.
    type SrcQp: Flag;
    /// slid.
    type Slid: Flag;
    /// sl.
    type Sl: Flag;
    /// dlid_path_bits.
    type DlidPathBits: Flag;
    /// The completion timestamp.
    type CompletionTimestamp: Flag;
    /// The completion wallclock timestamp.
    type CompletionWallclock: Flag;
    /// cvlan.
    type Cvlan: Flag;
    /// flow_tag.
    type FlowTag: Flag;
    /// The `wc_flags` of `ibv_create_cq_ex` for this set.
    const WC_FLAGS: u64;
}

/// `bit` when `F` is [`On`], else 0.
const fn bit<F: Flag>(bit: wcf) -> u64 {
    if F::ON {
        bit.0 as u64
    } else {
        0
    }
}

impl<B, I, Q, S, L, SL, D, T, W, V, FT> sealed::Sealed
    for Fields<B, I, Q, S, L, SL, D, T, W, V, FT>
{
}

impl<B, I, Q, S, L, SL, D, T, W, V, FT> FieldSet for Fields<B, I, Q, S, L, SL, D, T, W, V, FT>
where
    B: Flag,
    I: Flag,
    Q: Flag,
    S: Flag,
    L: Flag,
    SL: Flag,
    D: Flag,
    T: Flag,
    W: Flag,
    V: Flag,
    FT: Flag,
{
    type ByteLen = B;
    type Imm = I;
    type QpNum = Q;
    type SrcQp = S;
    type Slid = L;
    type Sl = SL;
    type DlidPathBits = D;
    type CompletionTimestamp = T;
    type CompletionWallclock = W;
    type Cvlan = V;
    type FlowTag = FT;
    const WC_FLAGS: u64 = bit::<B>(wcf::IBV_WC_EX_WITH_BYTE_LEN)
        | bit::<I>(wcf::IBV_WC_EX_WITH_IMM)
        | bit::<Q>(wcf::IBV_WC_EX_WITH_QP_NUM)
        | bit::<S>(wcf::IBV_WC_EX_WITH_SRC_QP)
        | bit::<L>(wcf::IBV_WC_EX_WITH_SLID)
        | bit::<SL>(wcf::IBV_WC_EX_WITH_SL)
        | bit::<D>(wcf::IBV_WC_EX_WITH_DLID_PATH_BITS)
        | bit::<T>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
        | bit::<W>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
        | bit::<V>(wcf::IBV_WC_EX_WITH_CVLAN)
        | bit::<FT>(wcf::IBV_WC_EX_WITH_FLOW_TAG);
}

/// Declares, per field: its trait (implemented by every set that has the
/// field) and its builder method (the same set with the field turned on).
macro_rules! cq_fields {
    ($(
        $(#[$tdoc:meta])*
        trait $tr:ident = $assoc:ident;
        $(#[$mdoc:meta])*
        fn $method:ident -> [$($p:ty),+];
    )+) => {
        $(
            $(#[$tdoc])*
            pub trait $tr: FieldSet {}
            impl<F: FieldSet<$assoc = On>> $tr for F {}
        )+

        impl<'a, F: FieldSet> CqExBuilder<'a, F> {
            $(
                $(#[$mdoc])*
                pub fn $method(self) -> CqExBuilder<'a, Fields<$($p),+>> {
                    self.retype()
                }
            )+
        }
    };
}

cq_fields! {
    /// Sets with byte_len ([`PolledWc::byte_len`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithByteLen = ByteLen;
    /// Asks for `byte_len` (`IBV_WC_EX_WITH_BYTE_LEN`).
    #[doc(alias = "IBV_WC_EX_WITH_BYTE_LEN")]
    fn byte_len -> [On, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the immediate data / invalidated rkey
    /// ([`PolledWc::imm_data`], [`PolledWc::invalidated_rkey`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithImm = Imm;
    /// Asks for the immediate data and the invalidated rkey, which share
    /// the field (`IBV_WC_EX_WITH_IMM`).
    #[doc(alias = "IBV_WC_EX_WITH_IMM")]
    fn imm -> [F::ByteLen, On, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with qp_num ([`PolledWc::qp_num`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithQpNum = QpNum;
    /// Asks for the local QP number (`IBV_WC_EX_WITH_QP_NUM`); with it,
    /// [`QueuePair::reclaim`](crate::QueuePair::reclaim) also checks the
    /// completion is the QP's own.
    #[doc(alias = "IBV_WC_EX_WITH_QP_NUM")]
    fn qp_num -> [F::ByteLen, F::Imm, On, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with src_qp ([`PolledWc::src_qp`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSrcQp = SrcQp;
    /// Asks for the sender's QP number (`IBV_WC_EX_WITH_SRC_QP`).
    #[doc(alias = "IBV_WC_EX_WITH_SRC_QP")]
    fn src_qp -> [F::ByteLen, F::Imm, F::QpNum, On, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with slid ([`PolledWc::slid`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSlid = Slid;
    /// Asks for the sender's LID (`IBV_WC_EX_WITH_SLID`).
    #[doc(alias = "IBV_WC_EX_WITH_SLID")]
    fn slid -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, On, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with sl ([`PolledWc::sl`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithSl = Sl;
    /// Asks for the service level (`IBV_WC_EX_WITH_SL`).
    #[doc(alias = "IBV_WC_EX_WITH_SL")]
    fn sl -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, On, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with dlid_path_bits ([`PolledWc::dlid_path_bits`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithDlidPathBits = DlidPathBits;
    /// Asks for the destination LID path bits (`IBV_WC_EX_WITH_DLID_PATH_BITS`).
    #[doc(alias = "IBV_WC_EX_WITH_DLID_PATH_BITS")]
    fn dlid_path_bits -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, On,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the completion timestamp ([`PolledWc::completion_ts`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCompletionTimestamp = CompletionTimestamp;
    /// Asks for the device's completion timestamp
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`); needs a device with a
    /// non-zero `completion_timestamp_mask`.
    #[doc(alias = "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP")]
    fn completion_timestamp -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl,
        F::DlidPathBits, On, F::CompletionWallclock, F::Cvlan, F::FlowTag];

    /// Sets with the wallclock timestamp ([`PolledWc::completion_wallclock_ns`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCompletionWallclock = CompletionWallclock;
    /// Asks for the completion time in wallclock nanoseconds
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`); needs a device with
    /// a `completion_timestamp_mask` and an `hca_core_clock`.
    #[doc(alias = "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK")]
    fn completion_wallclock -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl,
        F::DlidPathBits, F::CompletionTimestamp, On, F::Cvlan, F::FlowTag];

    /// Sets with cvlan ([`PolledWc::cvlan`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithCvlan = Cvlan;
    /// Asks for the customer VLAN (`IBV_WC_EX_WITH_CVLAN`).
    #[doc(alias = "IBV_WC_EX_WITH_CVLAN")]
    fn cvlan -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, On, F::FlowTag];

    /// Sets with flow_tag ([`PolledWc::flow_tag`]).
    #[doc(alias = "ibv_create_cq_wc_flags")]
    trait WithFlowTag = FlowTag;
    /// Asks for the flow tag (`IBV_WC_EX_WITH_FLOW_TAG`).
    #[doc(alias = "IBV_WC_EX_WITH_FLOW_TAG")]
    fn flow_tag -> [F::ByteLen, F::Imm, F::QpNum, F::SrcQp, F::Slid, F::Sl, F::DlidPathBits,
        F::CompletionTimestamp, F::CompletionWallclock, F::Cvlan, On];
}

/// Whether set `F` has the field of `flag`.
#[inline]
const fn has<F: FieldSet>(flag: wcf) -> bool {
    F::WC_FLAGS & flag.0 as u64 != 0
}

/// The builder of an extended CQ: the fields, then [`build`](Self::build).
///
/// Made by [`Context::create_cq_ex`].
#[doc(alias = "ibv_cq_init_attr_ex")]
#[must_use = "a builder does nothing until build() is called"]
pub struct CqExBuilder<'a, F: FieldSet> {
    ctx: &'a Context,
    cqe: u32,
    channel: Option<CompletionChannel>,
    comp_vector: u32,
    _f: PhantomData<fn() -> F>,
}

impl Context {
    /// Starts an extended completion queue with room for at least `cqe`
    /// completions and no optional field; see [`CqExBuilder`].
    ///
    /// ```no_run
    /// # let ctx = rdma_verbs::Context::open_first()?;
    /// let cq = ctx.create_cq_ex(128).standard().build()?;
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn create_cq_ex(&self, cqe: u32) -> CqExBuilder<'_, NoFields> {
        CqExBuilder {
            ctx: self,
            cqe,
            channel: None,
            comp_vector: 0,
            _f: PhantomData,
        }
    }
}

impl<'a, F: FieldSet> CqExBuilder<'a, F> {
    fn retype<G: FieldSet>(self) -> CqExBuilder<'a, G> {
        CqExBuilder {
            ctx: self.ctx,
            cqe: self.cqe,
            channel: self.channel,
            comp_vector: self.comp_vector,
            _f: PhantomData,
        }
    }

    /// Asks for the seven fields of `IBV_WC_STANDARD_FLAGS` (byte_len, imm,
    /// qp_num, src_qp, slid, sl, dlid_path_bits).
    #[doc(alias = "IBV_WC_STANDARD_FLAGS")]
    #[allow(clippy::type_complexity)]
    pub fn standard(
        self,
    ) -> CqExBuilder<
        'a,
        Fields<
            On,
            On,
            On,
            On,
            On,
            On,
            On,
            F::CompletionTimestamp,
            F::CompletionWallclock,
            F::Cvlan,
            F::FlowTag,
        >,
    > {
        self.retype()
    }

    /// Signals through `channel` (of the same context), on completion
    /// vector `comp_vector` (checked by [`build`](Self::build)).
    #[doc(alias = "ibv_cq_init_attr_ex")]
    pub fn channel(mut self, channel: &CompletionChannel, comp_vector: u32) -> Self {
        self.channel = Some(channel.clone());
        self.comp_vector = comp_vector;
        self
    }

    /// What to call the fields a provider refused.
    fn refused_what() -> &'static str {
        if has::<F>(wcf::IBV_WC_EX_WITH_CVLAN) {
            "the cvlan completion field"
        } else if has::<F>(wcf::IBV_WC_EX_WITH_FLOW_TAG) {
            "the flow_tag completion field"
        } else if has::<F>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
            || has::<F>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
        {
            "completion timestamps"
        } else {
            "extended completion queues with these fields"
        }
    }

    /// Creates the CQ (`ibv_create_cq_ex` with `wc_flags` = exactly the
    /// fields asked for).
    ///
    /// Refused before the call: `cqe` outside 1..=`max_cqe`, a channel of
    /// another context, a completion vector the context lacks
    /// ([`Error::InvalidArgument`]); timestamps on a device whose
    /// `completion_timestamp_mask` is 0, or wallclock timestamps on one
    /// without `hca_core_clock` ([`Error::Unsupported`], errno `None`). A
    /// provider refusing the fields (`EOPNOTSUPP`, `EINVAL`, `ENOSYS`: rxe
    /// takes only the standard ones) is [`Error::Unsupported`] with its
    /// errno, as is a provider that accepted but left a field's read
    /// function unset (the CQ is then destroyed again).
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn build(self) -> Result<CompletionQueueEx<F>> {
        const VERB: &str = "ibv_create_cq_ex";
        let ctx = self.ctx;
        let unsupported = |what, errno| Error::Unsupported {
            what,
            device: ctx.name().to_owned(),
            errno,
        };
        if let Some(ch) = &self.channel {
            if !ch.context().same_as(ctx) {
                return Err(Error::invalid(
                    VERB,
                    "the completion channel belongs to another context",
                ));
            }
        }
        let vectors = ctx.num_comp_vectors();
        if self.comp_vector >= vectors {
            return Err(Error::invalid(
                VERB,
                format!(
                    "completion vector {} is outside 0..{vectors}",
                    self.comp_vector
                ),
            ));
        }
        let attr = ctx.attr();
        let max = attr.max_cqe;
        if self.cqe == 0 || self.cqe > max {
            return Err(Error::invalid(
                VERB,
                format!(
                    "cqe {} is outside 1..={max} (the device's max_cqe)",
                    self.cqe
                ),
            ));
        }
        let wants_ts = has::<F>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
            || has::<F>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
        if wants_ts && attr.completion_timestamp_mask == 0 {
            return Err(unsupported("completion timestamps", None));
        }
        if has::<F>(wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
            && attr.hca_core_clock_khz == 0
        {
            return Err(unsupported("completion wallclock timestamps", None));
        }
        let mut init = sys::ibv_cq_init_attr_ex {
            cqe: self.cqe,
            cq_context: std::ptr::null_mut(),
            channel: self
                .channel
                .as_ref()
                .map_or(std::ptr::null_mut(), CompletionChannel::as_ptr),
            comp_vector: self.comp_vector,
            wc_flags: F::WC_FLAGS,
            comp_mask: 0,
            flags: 0,
            parent_domain: std::ptr::null_mut(),
        };
        // `init` is fully initialised, names a live channel of this context
        // (or none) and an existing vector, and asks for no comp_mask
        // extension. ibv_create_cq_ex is the inline that dispatches to the
        // provider (EOPNOTSUPP when it has none).
        // SAFETY: a live context and a valid `init` (above).
        let raw = unsafe { sys::ibv_create_cq_ex(ctx.as_ptr(), &mut init) };
        let Some(raw) = NonNull::new(raw) else {
            let errno = last_errno();
            return Err(match errno {
                libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS => {
                    unsupported(Self::refused_what(), Some(errno))
                }
                _ => Error::Verb { verb: VERB, errno },
            });
        };
        // SAFETY: `raw` is a live extended CQ; ibv_cq_ex_to_cq only casts
        // (verbs.h: the ibv_cq_ex starts with the ibv_cq's fields).
        let base = unsafe { sys::ibv_cq_ex_to_cq(raw.as_ptr()) };
        let Some(base) = NonNull::new(base) else {
            // Cannot happen (a cast of a non-NULL pointer); the CQ is leaked
            // rather than destroyed through a pointer that is not its own.
            return Err(Error::Unexpected {
                verb: "ibv_cq_ex_to_cq",
                field: "pointer",
                value: 0,
            });
        };
        // SAFETY: the fresh CQ of `ctx`, owned by nobody else, created on
        // `self.channel`; `ex` marks the handle as an extended CQ's, so
        // `CompletionQueue::poll` refuses it.
        let cq = unsafe { CompletionQueue::from_raw(ctx, base, self.channel.as_ref(), true) };
        // SAFETY: `raw` is live (owned by `cq`); the provider filled its
        // function table when it created it and does not change it after.
        let ops = unsafe { raw.as_ref() };
        let base_ops = ops.start_poll.is_some()
            && ops.next_poll.is_some()
            && ops.end_poll.is_some()
            && ops.read_opcode.is_some()
            && ops.read_vendor_err.is_some()
            && ops.read_wc_flags.is_some();
        let field_ops = [
            (wcf::IBV_WC_EX_WITH_BYTE_LEN, ops.read_byte_len.is_some()),
            (wcf::IBV_WC_EX_WITH_IMM, ops.read_imm_data.is_some()),
            (wcf::IBV_WC_EX_WITH_QP_NUM, ops.read_qp_num.is_some()),
            (wcf::IBV_WC_EX_WITH_SRC_QP, ops.read_src_qp.is_some()),
            (wcf::IBV_WC_EX_WITH_SLID, ops.read_slid.is_some()),
            (wcf::IBV_WC_EX_WITH_SL, ops.read_sl.is_some()),
            (
                wcf::IBV_WC_EX_WITH_DLID_PATH_BITS,
                ops.read_dlid_path_bits.is_some(),
            ),
            (
                wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
                ops.read_completion_ts.is_some(),
            ),
            (
                wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
                ops.read_completion_wallclock_ns.is_some(),
            ),
            (wcf::IBV_WC_EX_WITH_CVLAN, ops.read_cvlan.is_some()),
            (wcf::IBV_WC_EX_WITH_FLOW_TAG, ops.read_flow_tag.is_some()),
        ];
        if !base_ops || field_ops.iter().any(|&(f, set)| has::<F>(f) && !set) {
            drop(cq); // destroys it
            return Err(unsupported(Self::refused_what(), None));
        }
        Ok(CompletionQueueEx {
            cq,
            raw,
            rxe: attr.vendor_id == RXE_VENDOR_ID,
            open: false,
            _f: PhantomData,
        })
    }
}

impl<F: FieldSet> fmt::Debug for CqExBuilder<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqExBuilder")
            .field("device", &self.ctx.name())
            .field("cqe", &self.cqe)
            .field("channel", &self.channel.is_some())
            .field("comp_vector", &self.comp_vector)
            .field("wc_flags", &format_args!("{:#x}", F::WC_FLAGS))
            .finish()
    }
}

/// The calling thread's errno, EINVAL when unset (what libibverbs uses for
/// "the provider refused").
fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(e) if e != 0 => e,
        _ => libc::EINVAL,
    }
}

/// The errno of a poll verb's result: `None` for 0; the value itself when
/// positive (rxe and mlx5 return `ENOENT`), `errno` for -1, `-rc` otherwise.
fn poll_errno(rc: c_int) -> Option<i32> {
    match rc {
        0 => None,
        1.. => Some(rc),
        -1 => Some(last_errno()),
        _ => Some(-rc),
    }
}

/// An extended completion queue (`struct ibv_cq_ex`) whose completions
/// carry the fields of `F`.
///
/// Queue pairs use it through [`as_cq`](Self::as_cq); its completions are
/// read in batches with [`start_poll`](Self::start_poll) (see the [module
/// docs](self)). Not `Clone`: a batch needs `&mut self`, so one handle
/// polls at a time.
#[doc(alias = "ibv_cq_ex")]
pub struct CompletionQueueEx<F: FieldSet> {
    cq: CompletionQueue,
    raw: NonNull<sys::ibv_cq_ex>,
    /// rxe: `ibv_next_poll`'s `ENOENT` ends the batch itself.
    rxe: bool,
    /// A batch holds the provider's CQ lock (`ibv_start_poll` ran and
    /// neither `ibv_end_poll` nor the provider ended it). Still set when no
    /// `CqPoll` is alive means one was leaked (`mem::forget`).
    open: bool,
    _f: PhantomData<fn() -> F>,
}

// Threads: `raw` is the same CQ that `cq` owns (a `Send + Sync` handle
// that keeps it alive), so it is valid wherever `self` is. Polling verbs
// are only called through `&mut self` (a `CqPoll` borrows the CQ mutably),
// so two threads never run a batch on it through this handle, and other
// handles (`as_cq` clones, the QPs' own) are refused `ibv_poll_cq`. What
// `&self` offers (`as_cq`, `capacity`, `req_notify`, `wc_flags`) reads
// fields fixed at creation or calls verbs libibverbs makes thread safe.
// SAFETY: by the above, the handle may move to another thread.
unsafe impl<F: FieldSet> Send for CompletionQueueEx<F> {}
// SAFETY: as above: shared access never polls.
unsafe impl<F: FieldSet> Sync for CompletionQueueEx<F> {}

impl<F: FieldSet> CompletionQueueEx<F> {
    /// The CQ as a [`CompletionQueue`], for creating queue pairs
    /// ([`QpInitAttr::new`](crate::QpInitAttr::new)) and
    /// [`req_notify`](CompletionQueue::req_notify). Its
    /// [`poll`](CompletionQueue::poll) is refused.
    #[doc(alias = "ibv_cq_ex_to_cq")]
    #[inline]
    pub fn as_cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// How many completions the CQ holds (`cqe`), possibly more than asked for.
    #[doc(alias = "ibv_cq_ex")]
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.cq.capacity()
    }

    /// Asks for a completion event on the CQ's channel, as
    /// [`CompletionQueue::req_notify`].
    #[doc(alias = "ibv_req_notify_cq")]
    #[inline]
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.cq.req_notify(solicited_only)
    }

    /// The `wc_flags` the CQ was created with.
    #[doc(alias = "ibv_create_cq_wc_flags")]
    #[inline]
    pub fn wc_flags(&self) -> u64 {
        F::WC_FLAGS
    }

    /// Opens a batch (`ibv_start_poll`): `None` when the CQ is empty
    /// (`ENOENT`; nothing to end), else a batch whose first
    /// [`next`](CqPoll::next) yields the completion found.
    ///
    /// A batch that was leaked while open (`std::mem::forget` of a
    /// [`CqPoll`]) left the provider's CQ lock held, so another
    /// `ibv_start_poll` would spin forever: then this is refused with
    /// [`Error::GuardLeaked`], now and for good (the CQ can only be closed,
    /// once its queue pairs are gone).
    #[doc(alias = "ibv_start_poll")]
    #[inline]
    pub fn start_poll(&mut self) -> Result<Option<CqPoll<'_, F>>> {
        if self.open {
            return Err(leaked_poll());
        }
        let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
        // A live extended CQ whose start_poll the provider set (checked in
        // `build`); `attr` asks for nothing; no batch is open (a live
        // `CqPoll` borrows `self` mutably until it has ended its batch; a
        // leaked one left `open` set, which refused above).
        // SAFETY: see above.
        let rc = unsafe { sys::ibv_start_poll(self.raw.as_ptr(), &mut attr) };
        match poll_errno(rc) {
            None => {
                self.open = true;
                Ok(Some(CqPoll {
                    cq: self,
                    state: Batch::First,
                    _not_send: PhantomData,
                }))
            }
            Some(libc::ENOENT) => Ok(None),
            Some(errno) => Err(Error::Verb {
                verb: "ibv_start_poll",
                errno,
            }),
        }
    }

    /// Destroys the CQ now, reporting failure; as
    /// [`CompletionQueue::close`] (fails with [`Error::InUse`] while queue
    /// pairs use it).
    #[doc(alias = "ibv_destroy_cq")]
    pub fn close(self) -> Result<()> {
        self.cq.close()
    }
}

impl<F: FieldSet> fmt::Debug for CompletionQueueEx<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueueEx")
            .field("device", &self.cq.context().name())
            .field("capacity", &self.capacity())
            .field("wc_flags", &format_args!("{:#x}", F::WC_FLAGS))
            .finish()
    }
}

/// Where a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batch {
    /// `ibv_start_poll` found a completion that `next` has not yielded.
    First,
    /// `next` yielded the current completion.
    Current,
    /// The CQ had no more (or `ibv_next_poll` failed); `next` calls nothing.
    /// `released`: the provider ended the batch itself (rxe's `ENOENT`), so
    /// `ibv_end_poll` must not be called.
    Over { released: bool },
}

/// An open batch of an extended CQ (between `ibv_start_poll` and
/// `ibv_end_poll`): a lending iterator over its completions.
///
/// Dropping it (or [`end`](Self::end)) ends the batch. It holds the
/// provider's CQ lock, so it is neither `Send` nor `Sync`.
///
/// Leaking it (`std::mem::forget`) before the provider ended the batch
/// keeps that lock held for good: the CQ remembers it, and every later
/// [`start_poll`](CompletionQueueEx::start_poll) is refused with
/// [`Error::GuardLeaked`] instead of spinning forever. On rxe a batch that
/// [`next`](Self::next) ran to its end holds no lock any more, so leaking
/// it then costs nothing. Some providers (mlx5) also take the CQ's lock
/// when a QP using the CQ is moved to RESET or destroyed: there, after such
/// a leak, those calls would wait forever; rxe's do not take it.
#[doc(alias = "ibv_start_poll")]
pub struct CqPoll<'c, F: FieldSet> {
    cq: &'c mut CompletionQueueEx<F>,
    state: Batch,
    _not_send: PhantomData<*const ()>,
}

impl<F: FieldSet> CqPoll<'_, F> {
    /// The next completion: the first call yields the one `ibv_start_poll`
    /// found, later ones call `ibv_next_poll`. `None` once the CQ is empty
    /// (and from then on, without calling anything).
    ///
    /// The completion borrows the batch, so it is gone before the next call.
    #[doc(alias = "ibv_next_poll")]
    #[allow(clippy::should_implement_trait)] // a lending iterator: no `Iterator`
    #[inline]
    pub fn next(&mut self) -> Result<Option<PolledWc<'_, F>>> {
        match self.state {
            Batch::First => self.state = Batch::Current,
            Batch::Current => {
                // The batch is open (start_poll succeeded and neither
                // end_poll nor a final next_poll has run); the provider set
                // next_poll (checked in `build`). No `PolledWc` of the
                // batch is alive (they borrow `self`).
                // SAFETY: an open batch of a live CQ (above).
                let rc = unsafe { sys::ibv_next_poll(self.cq.raw.as_ptr()) };
                match poll_errno(rc) {
                    None => {}
                    Some(libc::ENOENT) => {
                        self.state = Batch::Over {
                            released: self.cq.rxe,
                        };
                        // rxe released its lock: a leak from here on holds none.
                        self.cq.open = !self.cq.rxe;
                        return Ok(None);
                    }
                    Some(errno) => {
                        self.state = Batch::Over { released: false };
                        return Err(Error::Verb {
                            verb: "ibv_next_poll",
                            errno,
                        });
                    }
                }
            }
            Batch::Over { .. } => return Ok(None),
        }
        Ok(Some(PolledWc {
            cq: self.cq.raw,
            _batch: PhantomData,
            _f: PhantomData,
        }))
    }

    /// Ends the batch now (what dropping it does).
    #[doc(alias = "ibv_end_poll")]
    pub fn end(self) {}
}

/// The refusal of `ibv_start_poll` on a CQ whose batch was leaked open.
#[cold]
#[inline(never)]
fn leaked_poll() -> Error {
    Error::GuardLeaked {
        verb: "ibv_start_poll",
        guard: "a CqPoll of this CQ",
        lock: "the CQ's lock (ibv_start_poll without ibv_end_poll)",
        can: "the CQ can no longer be polled; close it once no queue pair uses it",
    }
}

impl<F: FieldSet> Drop for CqPoll<'_, F> {
    fn drop(&mut self) {
        self.cq.open = false;
        if self.state != (Batch::Over { released: true }) {
            // SAFETY: the batch is open and this ends it, once (see the
            // module docs for rxe, where an ENOENT of next_poll already
            // ended it and `released` skips this).
            unsafe { sys::ibv_end_poll(self.cq.raw.as_ptr()) }
        }
    }
}

impl<F: FieldSet> fmt::Debug for CqPoll<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqPoll")
            .field("cq", &self.cq)
            .field("state", &self.state)
            .finish()
    }
}

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
    cq: NonNull<sys::ibv_cq_ex>,
    _batch: PhantomData<&'p mut ()>,
    _f: PhantomData<fn() -> F>,
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

    /// The operation (`ibv_wc_read_opcode`); only meaningful when the
    /// status is success. `Err(raw)` for an unknown opcode.
    #[doc(alias = "ibv_wc_read_opcode")]
    #[inline]
    pub fn opcode(&self) -> Result<WcOpcode, u32> {
        // SAFETY: batch open with this completion current; read_opcode is
        // always set (checked in `build`).
        let o = unsafe { sys::ibv_wc_read_opcode(self.raw()) };
        WcOpcode::from_raw(o).ok_or(o)
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

    /// The local QP number (`ibv_wc_read_qp_num`).
    #[doc(alias = "ibv_wc_read_qp_num")]
    #[inline]
    pub fn qp_num(&self) -> u32
    where
        F: WithQpNum,
    {
        // SAFETY: as in `byte_len`, for qp_num.
        unsafe { sys::ibv_wc_read_qp_num(self.raw()) }
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

impl<F: FieldSet> crate::qp::post_internal::CompletionSealed for PolledWc<'_, F> {}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_set_is_ibv_wc_standard_flags() {
        assert_eq!(
            StandardFields::WC_FLAGS,
            u64::from(sys::IBV_WC_STANDARD_FLAGS)
        );
        assert_eq!(NoFields::WC_FLAGS, 0);
    }

    #[test]
    fn each_field_sets_its_own_bit() {
        type B<F> = fn(CqExBuilder<'static, NoFields>) -> CqExBuilder<'static, F>;
        // Each builder method, by the bit it must add to an empty set.
        fn check<F: FieldSet>(_: B<F>, bit: wcf) {
            assert_eq!(F::WC_FLAGS, u64::from(bit.0), "{:#x}", bit.0);
        }
        check(CqExBuilder::byte_len, wcf::IBV_WC_EX_WITH_BYTE_LEN);
        check(CqExBuilder::imm, wcf::IBV_WC_EX_WITH_IMM);
        check(CqExBuilder::qp_num, wcf::IBV_WC_EX_WITH_QP_NUM);
        check(CqExBuilder::src_qp, wcf::IBV_WC_EX_WITH_SRC_QP);
        check(CqExBuilder::slid, wcf::IBV_WC_EX_WITH_SLID);
        check(CqExBuilder::sl, wcf::IBV_WC_EX_WITH_SL);
        check(
            CqExBuilder::dlid_path_bits,
            wcf::IBV_WC_EX_WITH_DLID_PATH_BITS,
        );
        check(
            CqExBuilder::completion_timestamp,
            wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
        );
        check(
            CqExBuilder::completion_wallclock,
            wcf::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
        );
        check(CqExBuilder::cvlan, wcf::IBV_WC_EX_WITH_CVLAN);
        check(CqExBuilder::flow_tag, wcf::IBV_WC_EX_WITH_FLOW_TAG);
    }

    #[test]
    fn fields_accumulate_and_repeat_harmlessly() {
        type Two = Fields<On, Off, On, Off, Off, Off, Off, Off, Off, Off, Off>;
        assert_eq!(
            Two::WC_FLAGS,
            u64::from((wcf::IBV_WC_EX_WITH_BYTE_LEN | wcf::IBV_WC_EX_WITH_QP_NUM).0)
        );
        fn builder_types<'a>(b: CqExBuilder<'a, NoFields>) -> CqExBuilder<'a, Two> {
            b.qp_num().byte_len().qp_num()
        }
        let _ = builder_types;
        type All = Fields<On, On, On, On, On, On, On, On, On, On, On>;
        fn everything<'a>(b: CqExBuilder<'a, NoFields>) -> CqExBuilder<'a, All> {
            b.flow_tag()
                .cvlan()
                .completion_wallclock()
                .completion_timestamp()
                .standard()
        }
        let _ = everything;
        assert_eq!(All::WC_FLAGS, 0b1011_1111_1111);
    }

    #[test]
    fn poll_results_decode_every_convention() {
        assert_eq!(poll_errno(0), None);
        assert_eq!(poll_errno(libc::ENOENT), Some(libc::ENOENT));
        assert_eq!(poll_errno(-libc::ENOENT), Some(libc::ENOENT));
        // SAFETY: __errno_location returns this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::EIO };
        assert_eq!(poll_errno(-1), Some(libc::EIO));
    }

    #[test]
    fn rxe_vendor_id_is_the_kernels() {
        // RXE_VENDOR_ID in drivers/infiniband/sw/rxe/rxe_param.h.
        assert_eq!(RXE_VENDOR_ID, 0xFF_FFFF);
    }
}

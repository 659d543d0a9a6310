//! The extended CQ object and its creation: [`CqExBuilder`] (made by
//! [`Context::create_cq_ex`]) and its checks, `ibv_create_cq_ex`, and
//! [`CompletionQueueEx`] itself.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::{enoent_ends_batch, enoent_releases_lock, has, FieldSet, Fields, NoFields, On};
use crate::channel::CompletionChannel;
use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::sys;
use crate::sys::ibv_create_cq_wc_flags as wcf;

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
    pub(super) fn retype<G: FieldSet>(self) -> CqExBuilder<'a, G> {
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
    /// # Errors
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
        // The provider is of the rdma-core of the libibverbs loaded.
        let release = crate::sys::loaded_release();
        Ok(CompletionQueueEx {
            cq,
            raw,
            enoent_unlocks: enoent_releases_lock(attr.vendor_id, release),
            enoent_ends: enoent_ends_batch(attr.vendor_id, release),
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
pub(super) fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(e) if e != 0 => e,
        _ => libc::EINVAL,
    }
}

/// An extended completion queue (`struct ibv_cq_ex`) whose completions
/// carry the fields of `F`.
///
/// Queue pairs use it through [`as_cq`](Self::as_cq); its completions are
/// read in batches with [`start_poll`](Self::start_poll) (see the [module
/// docs](crate::cq_ex)). Not `Clone`: a batch needs `&mut self`, so one handle
/// polls at a time.
#[doc(alias = "ibv_cq_ex")]
pub struct CompletionQueueEx<F: FieldSet> {
    cq: CompletionQueue,
    pub(super) raw: NonNull<sys::ibv_cq_ex>,
    /// rxe before rdma-core 59: `ibv_next_poll`'s `ENOENT` releases the
    /// CQ lock (module docs).
    pub(super) enoent_unlocks: bool,
    /// rxe before rdma-core 55: that `ENOENT` also ends the batch, and no
    /// `ibv_end_poll` is due (module docs).
    pub(super) enoent_ends: bool,
    /// A batch holds the provider's CQ lock (`ibv_start_poll` ran and
    /// neither `ibv_end_poll` nor the provider ended it). Still set when no
    /// `CqPoll` is alive means one was leaked (`mem::forget`).
    pub(super) open: bool,
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
    ///
    /// # Errors
    /// As [`CompletionQueue::req_notify`].
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

    /// Destroys the CQ now, reporting failure; as
    /// [`CompletionQueue::close`].
    ///
    /// # Errors
    /// [`Error::InUse`] while queue pairs use it; [`Error::Verb`] when
    /// `ibv_destroy_cq` fails (the CQ is then leaked).
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

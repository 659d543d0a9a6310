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
//! `ENOENT`, and that the batch holds the CQ until then. The soft-RoCE
//! provider (rdma-core's `providers/rxe/rxe.c`, `cq_next_poll` and
//! `cq_end_poll`) came to work that way in three steps:
//!
//! | rdma-core | `ENOENT` of `next_poll` | `ibv_end_poll` after it |
//! |---|---|---|
//! | before 55 | consumes the current completion, releases the CQ lock | must not run: it advances the consumer index past the producer (stale entries read as new, or a ring's worth lost) |
//! | 55 to 58 ("rxe: fix completion queue consumer index overrun") | leaves the current completion, releases the lock | consumes it (and releases the lock again); without it the next batch reads that completion again |
//! | 59 and later ("rxe: Fix double unlock in cq_ex polling") | leaves the current completion, keeps the lock | as the man page says, and as every other provider (mlx5) |
//!
//! So on rxe, recognised by its vendor id `0xFFFFFF` (`RXE_VENDOR_ID` in the
//! kernel's `drivers/infiniband/sw/rxe/rxe_param.h`, what `ibv_devinfo`
//! reports as `vendor_id` for an rxe device), the crate follows the
//! release of the libibverbs the process runs with
//! ([`sys::loaded_libibverbs`](crate::sys::loaded_libibverbs); the provider
//! is of the same rdma-core): before 55 a batch that `ibv_next_poll` ended
//! with `ENOENT` is not followed by `ibv_end_poll` (a batch dropped
//! earlier is: rxe's `end_poll` then consumes the current completion, as
//! intended), and before 59 such a batch, leaked, holds no lock. On every
//! other device and release, and where the library's name says no release,
//! `ibv_end_poll` ends every batch and a leaked batch holds the CQ, as the
//! man page says.
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

// The completion fields at the type level; the CQ and its creation; the
// poll batch; the completions.
mod cq;
mod fields;
mod poll;
mod wc;

// What the module docs' links name.
#[cfg(doc)]
use crate::context::Context;

use cq::last_errno;
pub use cq::{CompletionQueueEx, CqExBuilder};
use fields::has;
pub use fields::{
    FieldSet, Fields, Flag, NoFields, Off, On, StandardFields, WithByteLen,
    WithCompletionTimestamp, WithCompletionWallclock, WithCvlan, WithDlidPathBits, WithFlowTag,
    WithImm, WithQpNum, WithSl, WithSlid, WithSrcQp,
};
pub use poll::CqPoll;
pub use wc::PolledWc;

/// The vendor id of soft-RoCE devices: `RXE_VENDOR_ID` (`0XFFFFFF`) in the
/// kernel's `drivers/infiniband/sw/rxe/rxe_param.h`.
pub(crate) const RXE_VENDOR_ID: u32 = 0x00FF_FFFF;

/// Whether an `ENOENT` of `ibv_next_poll` ends the batch itself, with no
/// `ibv_end_poll` due, on a device of `vendor_id` whose provider is of
/// rdma-core `release`: rxe before 55 (see the module docs).
pub(crate) fn enoent_ends_batch(vendor_id: u32, release: Option<u32>) -> bool {
    vendor_id == RXE_VENDOR_ID && release.is_some_and(|r| r < 55)
}

/// Whether that `ENOENT` releases the CQ lock, so that a batch leaked after
/// it holds nothing: rxe before 59 (see the module docs). An unknown release
/// is taken to keep it (a leak is then refused, never waited on).
pub(crate) fn enoent_releases_lock(vendor_id: u32, release: Option<u32>) -> bool {
    vendor_id == RXE_VENDOR_ID && release.is_some_and(|r| r < 59)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rxe_vendor_id_is_the_kernels() {
        // RXE_VENDOR_ID in drivers/infiniband/sw/rxe/rxe_param.h.
        assert_eq!(RXE_VENDOR_ID, 0xFF_FFFF);
    }

    #[test]
    fn what_an_enoent_of_next_poll_does_by_release() {
        let rxe = RXE_VENDOR_ID;
        for (release, ends, unlocks) in [
            (Some(44), true, true),
            (Some(54), true, true),
            (Some(55), false, true),
            (Some(58), false, true),
            (Some(59), false, false),
            (Some(65), false, false),
            (None, false, false),
        ] {
            assert_eq!(enoent_ends_batch(rxe, release), ends, "{release:?}");
            assert_eq!(enoent_releases_lock(rxe, release), unlocks, "{release:?}");
        }
        // mlx5: the man page's way whatever the release.
        assert!(!enoent_ends_batch(0x02c9, Some(44)));
        assert!(!enoent_releases_lock(0x02c9, Some(44)));
    }
}

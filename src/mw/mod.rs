//! Memory windows (`struct ibv_mw`): remote access to part of a memory
//! region, granted and revoked without re-registering it.
//!
//! A window is allocated in a protection domain ([`ProtectionDomain::alloc_mw`])
//! and then *bound* to a range of a [`MemoryRegion`](crate::MemoryRegion) registered with
//! [`AccessFlags::MW_BIND`], with its own remote rights; peers use the
//! window's [`rkey`](MemoryWindow::rkey) with addresses inside that range.
//!
//! * **Type 1** windows are bound with `ibv_bind_mw`
//!   ([`QueuePair::bind_mw`]), which the provider turns into a request on
//!   the QP's send queue; the new rkey is chosen by the provider. They
//!   are revoked by binding them again elsewhere, by an unbind (a bind of
//!   length 0: [`QueuePair::unbind_mw`]), or by deallocation.
//! * **Type 2** windows are bound by a posted request: `IBV_WR_BIND_MW`
//!   through [`QueuePair::bind_mw`], or `ibv_wr_bind_mw` in an extended
//!   QP's batch ([`WrBatch::bind_mw`](crate::qp::WrBatch::bind_mw)); the
//!   crate picks the new rkey with `ibv_inc_rkey`. They are revoked by a
//!   local invalidation ([`QueuePair::invalidate_mw`],
//!   [`WrBatch::local_inv`](crate::qp::WrBatch::local_inv)) or by a
//!   peer's [`SendOp::SendWithInv`](crate::qp::SendOp::SendWithInv).
//!
//! # Rules checked before any call
//!
//! The verbs refuse, and the crate refuses first with a typed error naming
//! the rule: a region without `MW_BIND`; a window, region and QP of
//! different protection domains; a range outside the region or empty;
//! rights other than `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`
//! (zero-based windows are not offered: for a range a peer addresses from
//! 0, register the region itself at iova 0 with
//! [`ProtectionDomain::register_owned_at`](crate::ProtectionDomain::register_owned_at),
//! and bind windows to it: their addresses are then offsets too); `REMOTE_WRITE` or
//! `REMOTE_ATOMIC` on a region without `LOCAL_WRITE`; a QP not in RTS
//! (binding and invalidating post to the send queue) or not RC/UC; a type 1
//! window in a batch, or invalidated (only type 2 windows are); a type 2
//! window unbound, or a type 1 window not known to be bound; a device
//! without memory windows of the type ([`Error::Unsupported`] at
//! allocation).
//!
//! # Lifetimes
//!
//! A bound window keeps its region registered (and its buffer allocated):
//! the region cannot be freed under a window that still lets peers reach
//! it. The window holds the region of its latest bind; the region it was
//! bound to before stays held by the bind (or invalidation) request until
//! the device is done with it: until its completion is reclaimed, or the
//! QP is reset or destroyed. Requests hold their window too. A window
//! revoked by a peer's `SEND_WITH_INV` keeps holding its region until it
//! is bound again, invalidated locally or deallocated (holding longer is
//! always safe).
//!
//! # State, and rxe
//!
//! The crate tracks what it knows of each window: free, binding (a bind
//! posted, its completion not reclaimed yet), bound (the bind's completion,
//! or a later one of its send queue, reclaimed with success), invalidating,
//! or unknown (a bind or invalidation handed back by a RESET or the QP's
//! destruction, which may or may not have run). [`reclaim`](QueuePair::reclaim)
//! moves it along, and a receive reclaimed on a QP or an SRQ that reports
//! a peer's invalidation ([`QueuePair::invalidated_rkey`]) frees the window
//! of the context with that rkey. A type 2 bind needs a free window, as the
//! verbs require. A window whose state is unknown is bound no more (the
//! device has either the key of the cut-short bind or the one before, and a
//! bind naming the wrong one fails with `IBV_WC_MW_BIND_ERR`): drop it and
//! allocate another. A local invalidation needs a *bound* one, because
//! rxe on Linux 6.1 dereferences the NULL QP and region of a free window
//! when asked to invalidate it (`rxe_do_invalidate_mw`) and the machine
//! goes down. A peer's `SEND_WITH_INV` racing a local invalidation of the
//! same window is such a case that no check here can rule out. The same
//! kernel crashes on a `SEND_WITH_INV` naming a free window of its own
//! device: `post_send` and [`WrBatch::post`](crate::qp::WrBatch::post)
//! refuse one whose rkey is that of a window of the same context not known
//! to be bound, when the QP's destination is on the same device (windows of
//! other contexts or processes are not known to the crate, so a program
//! should only send it for windows the peer bound and announced).
//!
//! rxe's bound type 2 window also holds a reference on the QP that bound
//! it: destroying that QP while the window is allocated waits for the
//! kernel's pool timeout (measured: 50 s a QP, Linux 6.1). Deallocate (or
//! invalidate) windows before dropping their QP; a bind whose completion
//! was not reclaimed keeps its window allocated until the QP is gone.
//!
//! Because a region with `MW_BIND` can be written by peers through a
//! window, it is never split into [`Chunk`](crate::Chunk)s (slices):
//! [`MemoryRegion::into_chunks`](crate::MemoryRegion::into_chunks) refuses it, as it refuses regions with
//! `REMOTE_WRITE`.

// The window object and its state; binding; invalidation, by the QP or a
// peer, and the SEND_WITH_INV checks; the loan a request holds.
mod bind;
mod invalidate;
mod loan;
mod window;

use crate::mr::RegionCore;
use crate::sys;
// What the module docs' links name.
#[cfg(doc)]
use crate::{error::Error, mr::AccessFlags, pd::ProtectionDomain, qp::QueuePair};

use bind::not_in_leaked_batch;
pub use bind::MwBind;
pub(crate) use bind::{check_bind, check_qp, set_current_rkey};
pub(crate) use invalidate::{
    check_invalidate, check_send_inv, invalidated_by_peer, peer_invalidated,
};
pub(crate) use loan::{restore, MwLoan};
pub(crate) use window::MwInner;
use window::{slot, MwState};
pub use window::{MemoryWindow, MwType};

/// Crate access for the extended QP's batch.
pub(crate) mod internal {
    use super::*;
    pub(crate) use super::{check_bind, check_invalidate, set_current_rkey};

    /// The raw window, its rkey before the bind, the new rkey
    /// (`ibv_inc_rkey` of the old one), and the loan of a type 2 bind.
    pub(crate) fn lend_type2_bind(
        mw: &mut MemoryWindow,
        mr: &RegionCore,
    ) -> (*mut sys::ibv_mw, u32, u32, MwLoan) {
        let current = mw.rkey();
        // SAFETY: `ibv_inc_rkey` is a pure function.
        let rkey = unsafe { sys::ibv_inc_rkey(current) };
        let loan = mw.lend_bind(mr, rkey);
        (mw.as_ptr(), current, rkey, loan)
    }

    /// The rkey and loan of a local invalidation in a batch.
    pub(crate) fn lend_invalidate(mw: &mut MemoryWindow) -> (u32, MwLoan) {
        (mw.rkey(), mw.lend_invalidate())
    }

    /// Whether the window is type 1.
    pub(crate) fn is_type1(mw: &MemoryWindow) -> bool {
        mw.ty == MwType::Type1
    }
}

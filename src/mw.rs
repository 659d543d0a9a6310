//! Memory windows (`struct ibv_mw`): remote access to part of a memory
//! region, granted and revoked without re-registering it.
//!
//! A window is allocated in a protection domain ([`ProtectionDomain::alloc_mw`])
//! and then *bound* to a range of a [`MemoryRegion`] registered with
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
//! (zero-based windows are not offered); `REMOTE_WRITE` or
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
//! [`MemoryRegion::into_chunks`] refuses it, as it refuses regions with
//! `REMOTE_WRITE`.

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::context::Context;
use crate::device_attr::{AtomicCap, DeviceCapFlags};
use crate::error::{check_ptr, Error, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::mr::{AccessFlags, MemoryRegion, MrInner};
use crate::pd::ProtectionDomain;
use crate::qp::{PostError, QpState, QpType, QueuePair};
use crate::sys;
use crate::sys::ibv_mw_type;
use crate::users::{Tally, UserKind};

impl RawObject for sys::ibv_mw {
    const DESTROY: &'static str = "ibv_dealloc_mw";
    const NAME: &'static str = "memory window";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live window, once.
        unsafe { sys::ibv_dealloc_mw(ptr) }
    }
}

c_enum! {
    /// The type of a memory window (`enum ibv_mw_type`).
    #[doc(alias = "ibv_mw_type")]
    pub enum MwType(ibv_mw_type): u32 {
        /// `IBV_MW_TYPE_1`: bound with `ibv_bind_mw`; the provider picks the rkey.
        Type1 = IBV_MW_TYPE_1,
        /// `IBV_MW_TYPE_2`: bound by a posted request, invalidated locally or by a peer.
        Type2 = IBV_MW_TYPE_2,
    }
}

/// What the crate knows of a window's state on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MwState {
    /// Never bound, or its invalidation's completion was reclaimed.
    Free,
    /// A bind was posted; its completion has not been reclaimed.
    Binding,
    /// A bind's completion (or a later one) was reclaimed with success.
    Bound,
    /// A local invalidation was posted; its completion has not been reclaimed.
    Invalidating,
    /// A bind or invalidation was handed back by a RESET or the QP's
    /// destruction: it may or may not have run.
    Unknown,
}

/// The window's bookkeeping, under one lock.
struct Slot {
    state: MwState,
    /// The region of the latest bind (held while the window may reach it).
    bound: Option<Arc<MrInner>>,
    /// Regions the window may still reach after a request of unknown fate
    /// (held until the window is deallocated).
    stale: Vec<Arc<MrInner>>,
}

/// What a window keeps alive: its PD, the regions it may reach, and the
/// rkey of its latest bind.
pub(crate) struct MwKeep {
    _tally: Tally,
    pd: ProtectionDomain,
    slot: Mutex<Slot>,
    rkey: AtomicU32,
}

pub(crate) type MwInner = Owned<sys::ibv_mw, MwKeep>;

fn slot(mw: &MwInner) -> std::sync::MutexGuard<'_, Slot> {
    mw.keep()
        .slot
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl MwState {
    fn describe(self) -> &'static str {
        match self {
            MwState::Free => "it is free",
            MwState::Binding => "its bind's completion has not been reclaimed",
            MwState::Bound => "bound",
            MwState::Invalidating => "an invalidation of it is in flight",
            MwState::Unknown => "a bind or invalidation of it was cut short by a RESET",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MwOp {
    Bind,
    Invalidate,
}

/// What a bind or invalidation request holds until the device is done with
/// it: its window, and what the window had before (region, state, rkey),
/// to put back if the request did not run.
pub(crate) struct MwLoan {
    mw: Arc<MwInner>,
    op: MwOp,
    old: Option<Arc<MrInner>>,
    old_state: MwState,
    old_rkey: u32,
    settled: bool,
}

impl MwLoan {
    /// Puts the window back as it was: the request did not run.
    ///
    /// `seen` says whether the device saw the request (a failed or flushed
    /// completion) or not (an aborted batch). In the first case the region
    /// the slot held meanwhile is kept until the window is deallocated: a
    /// later bind of a type 1 window on another QP may have run and reach
    /// it (holding longer is always safe; each region is held once).
    fn undo(&mut self, seen: bool) {
        self.settled = true;
        let mut s = slot(&self.mw);
        s.state = self.old_state;
        let newer = std::mem::replace(&mut s.bound, self.old.take());
        if let Some(n) = newer.filter(|_| seen) {
            let held = s.bound.iter().chain(&s.stale).any(|m| Arc::ptr_eq(m, &n));
            if !held {
                s.stale.push(n);
            }
        }
        self.mw.keep().rkey.store(self.old_rkey, Ordering::Relaxed);
    }

    /// The request never reached the device (an aborted batch, no room).
    pub(crate) fn restore(mut self) {
        self.undo(false);
    }

    /// The request's completion (or a later one) was reclaimed: it ran
    /// (`ran`), or it failed or was flushed and did not.
    pub(crate) fn settle(&mut self, ran: bool) {
        if !ran {
            self.undo(true);
            return;
        }
        self.settled = true;
        let mut s = slot(&self.mw);
        s.state = match self.op {
            MwOp::Bind => MwState::Bound,
            MwOp::Invalidate => MwState::Free,
        };
        // The region the window had before is let go with the loan.
    }
}

impl Drop for MwLoan {
    /// Handed back by a RESET or the QP's destruction: the request may or
    /// may not have run. The window keeps every region it may reach, and
    /// is not invalidated again (a free window invalidated crashes rxe).
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut s = slot(&self.mw);
        s.state = MwState::Unknown;
        if let Some(old) = self.old.take() {
            let held = s.bound.iter().chain(&s.stale).any(|m| Arc::ptr_eq(m, &old));
            if !held {
                s.stale.push(old);
            }
        }
    }
}

/// A memory window (`struct ibv_mw`).
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context, MwBind, MwType};
/// # fn f(qp: &mut rdma_verbs::QueuePair) -> Result<(), Box<dyn std::error::Error>> {
/// let pd = qp.pd().clone();
/// let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
/// let mut mw = pd.alloc_mw(MwType::Type2)?;
/// // Peers may read bytes 0..1024 of `mr` through the window's rkey.
/// let bind = MwBind::new(&mr, 0, 1024, AccessFlags::REMOTE_READ)?.wr_id(7);
/// let rkey = qp.bind_mw(&mut mw, &bind)?;
/// println!("tell the peer: addr {:#x} rkey {rkey:#x}", bind.remote_addr());
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_mw")]
pub struct MemoryWindow {
    inner: Arc<MwInner>,
    ty: MwType,
}

impl ProtectionDomain {
    /// Allocates a memory window of type `ty` in this PD.
    ///
    /// [`Error::Unsupported`] on a device without memory windows
    /// (`IBV_DEVICE_MEM_WINDOW`), or for type 2 without
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`/`_2B`, before any call.
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, ty: MwType) -> Result<MemoryWindow> {
        MemoryWindow::new(self, ty)
    }
}

impl MemoryWindow {
    /// Allocates a memory window of type `ty` in `pd` (see
    /// [`ProtectionDomain::alloc_mw`]).
    #[doc(alias = "ibv_alloc_mw")]
    pub fn new(pd: &ProtectionDomain, ty: MwType) -> Result<Self> {
        let ctx = pd.context();
        let caps = ctx.attr().capabilities;
        let needs = match ty {
            MwType::Type1 => DeviceCapFlags::MEM_WINDOW,
            MwType::Type2 => {
                DeviceCapFlags::MEM_WINDOW_TYPE_2A | DeviceCapFlags::MEM_WINDOW_TYPE_2B
            }
        };
        if !caps.intersects(needs) {
            return Err(Error::Unsupported {
                what: match ty {
                    MwType::Type1 => "memory windows (IBV_DEVICE_MEM_WINDOW)",
                    MwType::Type2 => "type 2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2A/2B)",
                },
                device: ctx.name().to_owned(),
                errno: None,
            });
        }
        // SAFETY: the PD is live; `ty` is a valid enum value.
        let raw = unsafe { sys::ibv_alloc_mw(pd.as_ptr(), ty.as_raw()) };
        let raw = check_ptr("ibv_alloc_mw", raw).map_err(|e| match e.errno() {
            Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                what: "memory windows",
                device: ctx.name().to_owned(),
                errno: Some(errno),
            },
            _ => e,
        })?;
        // SAFETY: `raw` is live (just allocated); `rkey` is set by the provider.
        let rkey = unsafe { (*raw.as_ptr()).rkey };
        let keep = MwKeep {
            _tally: Tally::new(pd.users(), UserKind::MemoryWindow, 1),
            pd: pd.clone(),
            slot: Mutex::new(Slot {
                state: MwState::Free,
                bound: None,
                stale: Vec::new(),
            }),
            rkey: AtomicU32::new(rkey),
        };
        // SAFETY: a fresh window owned by nobody else; it keeps its PD alive.
        let inner = Arc::new(unsafe { Owned::new(raw, keep) });
        pd.context().add_window(&inner);
        Ok(MemoryWindow { inner, ty })
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_mw {
        self.inner.as_ptr()
    }

    /// The window's type.
    #[inline]
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The remote key peers use: the rkey of the latest bind posted (or of
    /// the unbound window, before any).
    ///
    /// A bind that then fails (its completion has an error status) leaves
    /// the device with the old rkey; bind again, or allocate a new window.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.inner.keep().rkey.load(Ordering::Relaxed)
    }

    /// The protection domain it was allocated in.
    #[inline]
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().pd
    }

    /// Whether the window is bound as far as the crate knows: a bind's
    /// completion was reclaimed with success, and no invalidation (local,
    /// or a peer's seen in a reclaimed receive) since.
    pub fn is_bound(&self) -> bool {
        slot(&self.inner).state == MwState::Bound
    }

    /// Whether the window holds a region (from its latest bind, which may
    /// still be in flight).
    pub fn holds_region(&self) -> bool {
        slot(&self.inner).bound.is_some()
    }

    fn state(&self) -> MwState {
        slot(&self.inner).state
    }

    /// Records a bind to `mr` with `rkey` (posted now) and returns what the
    /// request must hold until the device is done with it.
    fn lend_bind(&mut self, mr: &MemoryRegion, rkey: u32) -> MwLoan {
        let mut s = slot(&self.inner);
        let old = s.bound.replace(Arc::clone(mr.inner()));
        let old_state = std::mem::replace(&mut s.state, MwState::Binding);
        drop(s);
        let old_rkey = self.inner.keep().rkey.swap(rkey, Ordering::Relaxed);
        MwLoan {
            mw: Arc::clone(&self.inner),
            op: MwOp::Bind,
            old,
            old_state,
            old_rkey,
            settled: false,
        }
    }

    /// Records a local invalidation (posted now).
    fn lend_invalidate(&mut self) -> MwLoan {
        let mut s = slot(&self.inner);
        let old = s.bound.take();
        let old_state = std::mem::replace(&mut s.state, MwState::Invalidating);
        drop(s);
        MwLoan {
            mw: Arc::clone(&self.inner),
            op: MwOp::Invalidate,
            old,
            old_state,
            old_rkey: self.rkey(),
            settled: false,
        }
    }

    /// Deallocates the window now, reporting failure.
    ///
    /// Fails with [`Error::InUse`] while a posted bind or invalidation
    /// still holds it; it is then deallocated when the last of them ends.
    /// On failure of `ibv_dealloc_mw` the window and the region it holds
    /// are leaked.
    #[doc(alias = "ibv_dealloc_mw")]
    pub fn close(self) -> Result<()> {
        close_shared(self.inner)
    }
}

impl fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("type", &self.ty)
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("state", &self.state())
            .finish()
    }
}

/// A bind of a memory window to a range of a region (`struct
/// ibv_mw_bind_info`, with the request's `wr_id` and flags of `struct
/// ibv_mw_bind`).
///
/// Signalled by default: the bind produces a completion
/// ([`WcOpcode::BindMw`](crate::WcOpcode::BindMw)) that
/// [`QueuePair::reclaim`] ends.
#[doc(alias = "ibv_mw_bind")]
#[doc(alias = "ibv_mw_bind_info")]
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    mr: &'a MemoryRegion,
    offset: usize,
    len: usize,
    access: AccessFlags,
    wr_id: u64,
    signaled: bool,
}

impl<'a> MwBind<'a> {
    /// Binds bytes `offset..offset + len` of `mr` with the remote rights
    /// `access` (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`).
    ///
    /// [`Error::InvalidArgument`] when the range is empty or does not lie
    /// inside the region (`offset + len` past its end, or beyond
    /// `usize::MAX`): so a bind's [`remote_addr`](Self::remote_addr) is
    /// always an address of the region. The other rules of the
    /// [module docs](crate::mw) are checked when the bind is posted.
    pub fn new(
        mr: &'a MemoryRegion,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        check_range(mr.len(), offset, len)?;
        Ok(MwBind {
            mr,
            offset,
            len,
            access,
            wr_id: 0,
            signaled: true,
        })
    }

    /// The caller's `wr_id` for the bind request (0 by default).
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// No completion on success (clears `IBV_SEND_SIGNALED`).
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// The address peers use for the first byte of the window: the
    /// region's address plus `offset`.
    ///
    /// Exact: [`new`](Self::new) took only offsets inside the region, and
    /// the region's addresses are those of its live buffer, so the sum
    /// never reaches `u64::MAX` (saturating only so that no build can
    /// panic here).
    pub fn remote_addr(&self) -> u64 {
        self.mr.addr().saturating_add(self.offset as u64)
    }

    pub(crate) fn region(&self) -> &'a MemoryRegion {
        self.mr
    }

    pub(crate) fn wr_id_value(&self) -> u64 {
        self.wr_id
    }

    pub(crate) fn send_flags(&self) -> u32 {
        if self.signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        }
    }

    pub(crate) fn info(&self) -> sys::ibv_mw_bind_info {
        sys::ibv_mw_bind_info {
            mr: self.mr.as_ptr(),
            addr: self.remote_addr(),
            length: self.len as u64,
            mw_access_flags: self.access.bits(),
        }
    }
}

/// The range check of [`MwBind::new`]: `offset..offset + len` is
/// non-empty and inside a region of `region` bytes, its end computed
/// without overflow.
fn check_range(region: usize, offset: usize, len: usize) -> Result<()> {
    const VERB: &str = "MwBind::new";
    match offset.checked_add(len) {
        None => Err(Error::invalid(
            VERB,
            format!(
                "offset {offset} + length {len} overflows usize (the region has {region} bytes)"
            ),
        )),
        Some(_) if len == 0 => Err(Error::invalid(
            VERB,
            format!(
                "the window at offset {offset} is empty (length 0): a bind needs at least one \
                 byte (a type 1 window is unbound with QueuePair::unbind_mw)"
            ),
        )),
        Some(end) if end > region => Err(Error::invalid(
            VERB,
            format!("bytes {offset}..{end} are outside the {region}-byte region"),
        )),
        Some(_) => Ok(()),
    }
}

/// Outside a batch, a bind, unbind or invalidation is posted on its own,
/// which takes the provider's send-queue lock: refused while a leaked
/// [`WrBatch`](crate::qp::WrBatch) holds it. (A live batch borrows the QP,
/// so only a leaked one can leave `batch_open` set here.)
fn not_in_leaked_batch(verb: &'static str, qp: &QueuePair) -> Result<()> {
    if qp.pending().batch_open {
        return Err(crate::qp::post_internal::leaked_batch(verb));
    }
    Ok(())
}

/// The checks a bind gets before any call (`verb` names it in errors).
pub(crate) fn check_bind(
    verb: &'static str,
    qp: &QueuePair,
    mw: &MemoryWindow,
    b: &MwBind<'_>,
) -> Result<()> {
    check_qp(verb, qp, mw)?;
    if mw.state() == MwState::Unknown {
        // A bind names the window's current key (`mw_rkey`): after a RESET
        // cut a bind short, the device has the old key or the new one, and
        // a bind naming the wrong one fails with IBV_WC_MW_BIND_ERR (the QP
        // goes to ERR); after a cut-short invalidation a type 2 window may
        // still be bound.
        return Err(Error::invalid(
            verb,
            "the window's key and state on the device are unknown (a RESET or the QP's \
             destruction cut a bind or invalidation of it short): drop it and allocate \
             a new window",
        ));
    }
    if mw.ty == MwType::Type2 && mw.state() != MwState::Free {
        return Err(Error::invalid(
            verb,
            format!(
                "a type 2 window is bound only when free, and {}: invalidate it first",
                match mw.state() {
                    MwState::Bound => "it is bound",
                    other => other.describe(),
                }
            ),
        ));
    }
    let mr = b.mr;
    if !mr.access().contains(AccessFlags::MW_BIND) {
        return Err(Error::invalid(
            verb,
            "the region was registered without AccessFlags::MW_BIND (IBV_ACCESS_MW_BIND)",
        ));
    }
    if mr.pd().as_ptr() != mw.pd().as_ptr() {
        return Err(Error::invalid(
            verb,
            "the region and the window belong to different protection domains",
        ));
    }
    match b.offset.checked_add(b.len) {
        Some(end) if b.len > 0 && end <= mr.len() => {}
        _ => {
            return Err(Error::invalid(
                verb,
                format!(
                    "bytes {}..{} are empty or outside the {}-byte region",
                    b.offset,
                    b.offset.saturating_add(b.len),
                    mr.len()
                ),
            ))
        }
    }
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if !remote.contains(b.access) {
        return Err(Error::invalid(
            verb,
            format!(
                "a window takes only REMOTE_READ, REMOTE_WRITE and REMOTE_ATOMIC, not {:?}",
                b.access - remote
            ),
        ));
    }
    let writes = b.access & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if !writes.is_empty() && !mr.access().contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(
            verb,
            format!("a window with {writes:?} needs a region with AccessFlags::LOCAL_WRITE"),
        ));
    }
    if b.access.contains(AccessFlags::REMOTE_ATOMIC)
        && qp.pd().context().attr().atomic_cap == AtomicCap::None
    {
        return Err(Error::invalid(
            verb,
            "REMOTE_ATOMIC on a device without atomics (atomic_cap NONE)",
        ));
    }
    Ok(())
}

/// The checks of any request on a window: same PD as the QP, the QP RC or
/// UC and in RTS.
pub(crate) fn check_qp(verb: &'static str, qp: &QueuePair, mw: &MemoryWindow) -> Result<()> {
    if !matches!(qp.qp_type(), QpType::Rc | QpType::Uc) {
        return Err(Error::invalid(
            verb,
            format!(
                "{} QPs cannot bind or invalidate memory windows (RC and UC can)",
                qp.qp_type().short_name()
            ),
        ));
    }
    if mw.pd().as_ptr() != qp.pd().as_ptr() {
        return Err(Error::invalid(
            verb,
            "the window and the QP belong to different protection domains",
        ));
    }
    if qp.state() != QpState::Rts {
        return Err(Error::QpState {
            verb,
            state: qp.state(),
            needs: "binding and invalidating memory windows need RTS",
        });
    }
    Ok(())
}

impl QueuePair {
    /// Binds memory window `mw` to a range of a region, returning the
    /// window's new rkey for peers.
    ///
    /// Type 1 windows go through `ibv_bind_mw`; type 2 windows are bound by
    /// posting `IBV_WR_BIND_MW` with `ibv_post_send` (on an extended QP,
    /// [`WrBatch::bind_mw`](crate::qp::WrBatch::bind_mw) does it in a
    /// batch). Either way the bind is a request on the send queue: it takes
    /// a slot, completes in order with the sends, and
    /// [`reclaim`](Self::reclaim) ends it, handing back a
    /// [`Completed`](crate::qp::Completed) with the bind's `wr_id` and no
    /// chunks. The rules of the [module docs](crate::mw) are checked first.
    /// If the provider fails, the request stays outstanding as a failed
    /// post's do ([`PostError`]), and the window keeps both regions.
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_mw(&mut self, mw: &mut MemoryWindow, bind: &MwBind<'_>) -> Result<u32, PostError> {
        let verb = match mw.ty {
            MwType::Type1 => "ibv_bind_mw",
            MwType::Type2 => "ibv_post_send",
        };
        not_in_leaked_batch(verb, self)
            .and_then(|()| check_bind(verb, self, mw, bind))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        let qp = self.as_ptr();
        let raw_mw = mw.as_ptr();
        let info = bind.info();
        let flags = bind.send_flags();
        match mw.ty {
            MwType::Type1 => {
                let loan = mw.lend_bind(bind.mr, mw.rkey());
                self.post_type1_bind(mw, bind.wr_id, flags, info, loan)
            }
            MwType::Type2 => {
                let (_, current, rkey, loan) = internal::lend_type2_bind(mw, bind.mr);
                self.post_one_loan(
                    verb,
                    bind.wr_id,
                    (Default::default(), None, Some(loan)),
                    restore,
                    |tag| {
                        // SAFETY: `raw_mw` is `mw`'s, borrowed mutably here.
                        unsafe { set_current_rkey(raw_mw, current) };
                        let mut wr = sys::ibv_send_wr {
                            wr_id: tag,
                            opcode: sys::ibv_wr_opcode::IBV_WR_BIND_MW,
                            send_flags: flags,
                            ..Default::default()
                        };
                        wr.__bindgen_anon_2.bind_mw =
                            sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                                mw: raw_mw,
                                rkey,
                                bind_info: info,
                            };
                        let mut bad = std::ptr::null_mut();
                        // SAFETY: live QP; one request naming a live window and
                        // region of the QP's PD (checked), both held by the
                        // ledger entry until the device is done with them.
                        unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) }
                    },
                )?;
                Ok(rkey)
            }
        }
    }

    /// Unbinds type 1 memory window `mw`: `ibv_bind_mw` with a length of
    /// 0, revoking peers' access once the request has run. Returns the
    /// window's new rkey (a bind, even of nothing, moves it on).
    ///
    /// The request names the region the window is bound to (providers
    /// such as mlx4 read its lkey even for an unbind), so the window must
    /// be known to be bound: refused before any call otherwise, and for
    /// type 2 windows (see [`invalidate_mw`](Self::invalidate_mw)), a QP
    /// not in RTS, another PD. Like a bind, it takes a send-queue slot and
    /// [`reclaim`](Self::reclaim) ends it; the region stays registered
    /// until then (or until a RESET or the QP's destruction).
    #[doc(alias = "ibv_bind_mw")]
    pub fn unbind_mw(&mut self, wr_id: u64, mw: &mut MemoryWindow) -> Result<u32, PostError> {
        const VERB: &str = "ibv_bind_mw";
        let region = not_in_leaked_batch(VERB, self)
            .and_then(|()| check_unbind(VERB, self, mw))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        // SAFETY: the region is live: the window holds it (`bound`), and
        // from here the loan does until the request has ended.
        let addr = unsafe { (*region.as_ptr()).addr } as u64;
        let info = sys::ibv_mw_bind_info {
            mr: region.as_ptr(),
            addr,
            length: 0,
            mw_access_flags: 0,
        };
        let loan = mw.lend_invalidate();
        let signaled = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self.post_type1_bind(mw, wr_id, signaled, info, loan)
    }

    /// Posts `ibv_bind_mw` of type 1 window `mw` (checked) with `info`,
    /// whose region `loan` holds until the request has ended; returns the
    /// rkey the provider gave the window (it writes it into the window
    /// during the call).
    fn post_type1_bind(
        &mut self,
        mw: &mut MemoryWindow,
        wr_id: u64,
        send_flags: u32,
        info: sys::ibv_mw_bind_info,
        loan: MwLoan,
    ) -> Result<u32, PostError> {
        let qp = self.as_ptr();
        let raw_mw = mw.as_ptr();
        self.post_one_loan(
            "ibv_bind_mw",
            wr_id,
            (Default::default(), None, Some(loan)),
            restore,
            |tag| {
                let mut b = sys::ibv_mw_bind {
                    wr_id: tag,
                    send_flags,
                    bind_info: info,
                };
                // Live QP and type 1 window of one PD (checked by the
                // caller); the region `info.mr` is live, held by the loan
                // from now on; `mw` is borrowed mutably, so nothing else
                // reads or writes the window's fields.
                // SAFETY: see above.
                unsafe { sys::ibv_bind_mw(qp, raw_mw, &mut b) }
            },
        )?;
        // SAFETY: the window is live; `&mut mw` excludes other accesses to
        // its fields, and the call above has returned.
        let rkey = unsafe { (*raw_mw).rkey };
        mw.inner.keep().rkey.store(rkey, Ordering::Relaxed);
        Ok(rkey)
    }

    /// Invalidates type 2 memory window `mw` with a local invalidation
    /// (`IBV_WR_LOCAL_INV` naming its rkey), revoking peers' access once
    /// the request has run.
    ///
    /// The region the window held stays registered until the request's
    /// completion is reclaimed (or the QP is reset or destroyed). Refused
    /// before any call: type 1 windows (which are unbound with
    /// [`unbind_mw`](Self::unbind_mw)), a QP not in RTS, another PD.
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    pub fn invalidate_mw(&mut self, wr_id: u64, mw: &mut MemoryWindow) -> Result<(), PostError> {
        const VERB: &str = "ibv_post_send";
        not_in_leaked_batch(VERB, self)
            .and_then(|()| check_invalidate(VERB, self, mw))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        let qp = self.as_ptr();
        let rkey = mw.rkey();
        let loan = mw.lend_invalidate();
        self.post_one_loan(
            VERB,
            wr_id,
            (Default::default(), None, Some(loan)),
            restore,
            |tag| {
                let mut wr = sys::ibv_send_wr {
                    wr_id: tag,
                    opcode: sys::ibv_wr_opcode::IBV_WR_LOCAL_INV,
                    send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.__bindgen_anon_1.invalidate_rkey = rkey;
                let mut bad = std::ptr::null_mut();
                // SAFETY: live QP; one request naming no memory.
                unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) }
            },
        )
    }
}

impl QueuePair {
    /// The rkey that receive completion `wc` of this QP invalidated (a
    /// peer's [`SendOp::SendWithInv`](crate::qp::SendOp::SendWithInv)), or
    /// `None`.
    ///
    /// [`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey) reads `IBV_WC_WITH_INV`; rxe
    /// sets the kernel's `IB_WC_WITH_INVALIDATE` bit instead (`1 << 2`,
    /// which user space calls `IBV_WC_IP_CSUM_OK`, a flag that has no
    /// meaning on the RC and UC receives invalidation happens on). On an
    /// rxe RC or UC QP that bit on a successful receive counts too.
    ///
    /// Takes a [`WorkCompletion`](crate::WorkCompletion) or the
    /// [`PolledWc`](crate::PolledWc) of an extended CQ created with
    /// [`imm`](crate::CqExBuilder::imm) (without it: `None`).
    pub fn invalidated_rkey<C: crate::qp::Completion + ?Sized>(&self, wc: &C) -> Option<u32> {
        let connected = matches!(self.qp_type(), QpType::Rc | QpType::Uc);
        peer_invalidated(self.pd().context(), wc, connected)
    }
}

impl crate::SharedReceiveQueue {
    /// The rkey that receive completion `wc` of this SRQ invalidated (a
    /// peer's [`SendOp::SendWithInv`](crate::qp::SendOp::SendWithInv)), or
    /// `None`: as [`QueuePair::invalidated_rkey`], for receives taken from
    /// the SRQ by any of its QPs. On rxe the kernel's
    /// `IB_WC_WITH_INVALIDATE` bit is the only one it puts at `1 << 2` in a
    /// user-space receive completion (rxe_resp.c sets `GRH`, `WITH_IMM` and
    /// `WITH_INVALIDATE` there), so it is read whatever the QP's type.
    pub fn invalidated_rkey<C: crate::qp::Completion + ?Sized>(&self, wc: &C) -> Option<u32> {
        peer_invalidated(self.pd().context(), wc, true)
    }
}

/// The rkey a peer's SEND_WITH_INV invalidated, as receive completion `wc`
/// of a QP (`connected`: RC or UC) on `ctx` reports it: `IBV_WC_WITH_INV`,
/// or on rxe the kernel-numbered bit (see [`QueuePair::invalidated_rkey`]).
fn peer_invalidated<C: crate::qp::Completion + ?Sized>(
    ctx: &Context,
    wc: &C,
    connected: bool,
) -> Option<u32> {
    // One read (the flags) in the common case: no invalidation.
    let flags = wc.inv_flags()?;
    if flags.contains(crate::WcFlags::WITH_INV) {
        return Some(wc.inv_word());
    }
    let rxe_inv = flags.contains(crate::WcFlags::IP_CSUM_OK)
        && connected
        && wc.succeeded()
        && wc.wc_opcode() == Ok(crate::WcOpcode::Recv)
        && ctx.is_rxe();
    rxe_inv.then(|| wc.inv_word())
}

/// A peer's SEND_WITH_INV invalidated `rkey` (seen in a receive reclaimed
/// on a QP or SRQ of `ctx`): the window with that rkey, if bound, is free,
/// and lets go of its region. Windows are looked up on the context, not a
/// PD: the window is in the receiving QP's PD, which an SRQ's may not be.
pub(crate) fn invalidated_by_peer(ctx: &Context, rkey: u32) {
    let windows: Vec<Arc<MwInner>> = ctx.windows().iter().filter_map(|w| w.upgrade()).collect();
    for mw in windows {
        if mw.keep().rkey.load(Ordering::Relaxed) == rkey {
            let mut s = slot(&mw);
            if s.state == MwState::Bound {
                s.state = MwState::Free;
                s.bound = None;
            }
        }
    }
}

/// The checks of a type 1 unbind; the region the window is bound to.
fn check_unbind(verb: &'static str, qp: &QueuePair, mw: &MemoryWindow) -> Result<Arc<MrInner>> {
    if mw.ty != MwType::Type1 {
        return Err(Error::invalid(
            verb,
            "only type 1 windows are unbound (a type 2 window is invalidated)",
        ));
    }
    check_qp(verb, qp, mw)?;
    let s = slot(&mw.inner);
    match (s.state, &s.bound) {
        (MwState::Bound, Some(region)) => Ok(Arc::clone(region)),
        (state, _) => Err(Error::invalid(
            verb,
            format!(
                "a window is unbound only when known to be bound, and {}",
                state.describe()
            ),
        )),
    }
}

/// The checks of a local invalidation.
pub(crate) fn check_invalidate(
    verb: &'static str,
    qp: &QueuePair,
    mw: &MemoryWindow,
) -> Result<()> {
    if mw.ty != MwType::Type2 {
        return Err(Error::invalid(
            verb,
            "only type 2 windows are invalidated (a type 1 window is rebound, or deallocated)",
        ));
    }
    check_qp(verb, qp, mw)?;
    match mw.state() {
        MwState::Bound => Ok(()),
        state => Err(Error::invalid(
            verb,
            format!(
                "the window is not known to be bound ({}): invalidating a free window crashes \
                 rxe's kernel (Linux 6.1), so only a window whose bind completion was \
                 reclaimed is invalidated",
                state.describe()
            ),
        )),
    }
}

/// Puts the window's current rkey where the provider reads it (`mw->rkey`)
/// before a type 2 bind: the provider names the window by it.
///
/// # Safety
/// `mw` is a live window that the caller borrows mutably (through its
/// `&mut MemoryWindow`), so that nothing else reads or writes its fields.
pub(crate) unsafe fn set_current_rkey(mw: *mut sys::ibv_mw, rkey: u32) {
    // SAFETY: live and exclusively borrowed (caller); providers read
    // `rkey` only inside calls this crate makes.
    unsafe { (*mw).rkey = rkey };
}

/// Undoes a request's bookkeeping that never reached the device.
pub(crate) fn restore(loan: crate::qp::post_internal::SendLoan) {
    if let Some(mw) = loan.2 {
        mw.restore();
    }
}

/// Crate access for the extended QP's batch.
pub(crate) mod internal {
    use super::*;
    pub(crate) use super::{check_bind, check_invalidate, restore, set_current_rkey};

    /// The raw window, its rkey before the bind, the new rkey
    /// (`ibv_inc_rkey` of the old one), and the loan of a type 2 bind.
    pub(crate) fn lend_type2_bind(
        mw: &mut MemoryWindow,
        mr: &MemoryRegion,
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

/// The check of a SEND_WITH_INV (`ibv_post_send` or a batch's
/// `ibv_wr_send_inv`) from QP `qp` of context `ctx` naming `rkey`.
///
/// Invalidating a type 2 window that is not bound (never bound, already
/// invalidated) crashes the kernel of Linux 6.1's rxe (`rxe_invalidate_mw`
/// reaches the window's absent region). When `rkey` is exactly the key of a
/// window of this context that is free, being invalidated, or of unknown
/// state (a bind posted before, whose completion is not reclaimed yet, is
/// taken to have run, as rxe runs it within its post), and the QP's
/// destination is on this device (a GID of its table or its own LID, read
/// with `ibv_query_qp` only in that case), the request is refused. A window
/// of another context or process is not known here; neither is a
/// destination elsewhere, where `rkey` names some other device's window.
#[cold]
#[inline(never)]
pub(crate) fn check_send_inv(
    verb: &'static str,
    ctx: &Context,
    qp: *mut sys::ibv_qp,
    rkey: u32,
) -> Result<()> {
    // Upgraded under the list's lock, dropped after it (a window's drop
    // takes the lock to leave the list).
    let windows: Vec<Arc<MwInner>> = ctx.windows().iter().filter_map(|w| w.upgrade()).collect();
    let unbound = windows.iter().find_map(|mw| {
        let state = slot(mw).state;
        // Binding: the bind was posted first and is the program's intent
        // (announcing the key after posting the bind is the usual order);
        // rxe runs a posted bind before its post call returns.
        let unbound = !matches!(state, MwState::Bound | MwState::Binding);
        (mw.keep().rkey.load(Ordering::Relaxed) == rkey && unbound).then_some(state)
    });
    drop(windows);
    let Some(state) = unbound else {
        return Ok(());
    };
    if !destination_on_device(ctx, qp) {
        return Ok(());
    }
    Err(Error::invalid(
        verb,
        format!(
            "SEND_WITH_INV names rkey {rkey:#x}, a memory window of this device that is not \
             bound ({}): invalidating it would crash rxe on Linux 6.1",
            state.describe()
        ),
    ))
}

/// Whether the destination of connected QP `qp` is on `ctx`'s device (a
/// failure to tell counts as yes: refusing is the safe side).
fn destination_on_device(ctx: &Context, qp: *mut sys::ibv_qp) -> bool {
    let mut a = sys::ibv_qp_attr::default();
    let mut init = sys::ibv_qp_init_attr::default();
    let mask = (sys::ibv_qp_attr_mask::IBV_QP_AV.0 | sys::ibv_qp_attr_mask::IBV_QP_PORT.0) as i32;
    // SAFETY: `qp` is the caller's live QP; both out-structs are valid for writing.
    let rc = unsafe { sys::ibv_query_qp(qp, &mut a, mask, &mut init) };
    if rc != 0 {
        return true;
    }
    let av = &a.ah_attr;
    if av.is_global != 0 {
        // SAFETY: `raw` is the plain 16-byte view of the GID union.
        let dgid = crate::Gid(unsafe { av.grh.dgid.raw });
        return ctx
            .gid_table()
            .map_or(true, |t| t.iter().any(|e| e.gid == dgid));
    }
    let port = if av.port_num != 0 {
        av.port_num
    } else {
        a.port_num
    };
    ctx.query_port(port).map_or(true, |p| p.lid == av.dlid)
}

#[cfg(test)]
mod tests {
    use super::check_range;

    #[test]
    fn bind_ranges_are_checked_without_overflow() {
        let text = |offset, len| check_range(4096, offset, len).unwrap_err().to_string();
        let e = text(usize::MAX, 1);
        assert!(
            e.contains("offset 18446744073709551615 + length 1 overflows"),
            "{e}"
        );
        let e = text(1, usize::MAX);
        assert!(e.contains("overflows usize"), "{e}");
        let e = text(4095, 2);
        assert!(
            e.contains("bytes 4095..4097 are outside the 4096-byte region"),
            "{e}"
        );
        let e = text(4097, 1);
        assert!(e.contains("outside"), "{e}");
        let e = text(4096, 0);
        assert!(e.contains("empty (length 0)"), "{e}");
        let e = text(usize::MAX, 0);
        assert!(e.contains("empty"), "{e}");
        assert!(check_range(4096, 4095, 1).is_ok());
        assert!(check_range(4096, 0, 4096).is_ok());
    }
}

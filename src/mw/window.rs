//! The window object: [`MemoryWindow`] and its type [`MwType`], what the
//! crate knows of its state on the device ([`MwState`], under one lock
//! with the regions it may reach), allocation
//! ([`ProtectionDomain::alloc_mw`]) and deallocation.

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::device_attr::DeviceCapFlags;
use crate::error::{check_ptr, Error, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::mr::MrInner;
use crate::pd::ProtectionDomain;
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
pub(super) enum MwState {
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
pub(super) struct Slot {
    pub(super) state: MwState,
    /// The region of the latest bind (held while the window may reach it).
    pub(super) bound: Option<Arc<MrInner>>,
    /// Regions the window may still reach after a request of unknown fate
    /// (held until the window is deallocated).
    pub(super) stale: Vec<Arc<MrInner>>,
}

/// What a window keeps alive: its PD, the regions it may reach, and the
/// rkey of its latest bind.
pub(crate) struct MwKeep {
    _tally: Tally,
    pd: ProtectionDomain,
    slot: Mutex<Slot>,
    pub(super) rkey: AtomicU32,
}

pub(crate) type MwInner = Owned<sys::ibv_mw, MwKeep>;

pub(super) fn slot(mw: &MwInner) -> std::sync::MutexGuard<'_, Slot> {
    mw.keep()
        .slot
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl MwState {
    pub(super) fn describe(self) -> &'static str {
        match self {
            MwState::Free => "it is free",
            MwState::Binding => "its bind's completion has not been reclaimed",
            MwState::Bound => "bound",
            MwState::Invalidating => "an invalidation of it is in flight",
            MwState::Unknown => "a bind or invalidation of it was cut short by a RESET",
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
    pub(super) inner: Arc<MwInner>,
    pub(super) ty: MwType,
}

impl ProtectionDomain {
    /// Allocates a memory window of type `ty` in this PD.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a device without memory windows
    /// (`IBV_DEVICE_MEM_WINDOW`), or for type 2 without
    /// `IBV_DEVICE_MEM_WINDOW_TYPE_2A`/`_2B`, before any call;
    /// [`Error::Verb`] when `ibv_alloc_mw` fails.
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, ty: MwType) -> Result<MemoryWindow> {
        MemoryWindow::new(self, ty)
    }
}

impl MemoryWindow {
    /// Allocates a memory window of type `ty` in `pd` (see
    /// [`ProtectionDomain::alloc_mw`]).
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mw`].
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

    pub(super) fn state(&self) -> MwState {
        slot(&self.inner).state
    }

    /// Deallocates the window now, reporting failure.
    ///
    /// # Errors
    /// [`Error::InUse`] while a posted bind or invalidation still holds
    /// the window; it is then deallocated when the last of them ends.
    /// [`Error::Verb`] when `ibv_dealloc_mw` fails:
    /// the window and the region it holds are then leaked.
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

//! Protection domains (`struct ibv_pd`).

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{check_ptr, Result};
use crate::handle::{close_counted, Owned, RawObject};
use crate::sys;
use crate::users::{Tally, UserCounts, UserKind};

impl RawObject for sys::ibv_pd {
    const DESTROY: &'static str = "ibv_dealloc_pd";
    const NAME: &'static str = "protection domain";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live PD, once.
        unsafe { sys::ibv_dealloc_pd(ptr) }
    }
}

/// What a PD keeps: its context (and its entry in the context's user
/// counts), and its own users' counts.
pub(crate) struct PdKeep {
    _tally: Tally,
    ctx: Context,
    users: Arc<UserCounts>,
}

pub(crate) type PdInner = Owned<sys::ibv_pd, PdKeep>;

/// A protection domain (`struct ibv_pd`): memory regions, queue pairs and
/// address handles created in one PD can only work with each other.
///
/// The PD keeps its [`Context`] alive; memory regions and queue pairs keep
/// the PD alive, so it is deallocated only after the last of them.
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context};
/// let ctx = Context::open_first()?;
/// let pd = ctx.alloc_pd()?;
/// let mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
/// drop(pd); // fine: `mr` keeps the PD alive
/// println!("lkey {:#x}", mr.lkey());
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_pd")]
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl Context {
    /// Allocates a protection domain.
    #[doc(alias = "ibv_alloc_pd")]
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        ProtectionDomain::new(self)
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    #[doc(alias = "ibv_alloc_pd")]
    pub fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is live for the call.
        let raw = check_ptr("ibv_alloc_pd", unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) })?;
        let keep = PdKeep {
            _tally: Tally::new(ctx.users(), UserKind::ProtectionDomain, 1),
            ctx: ctx.clone(),
            users: UserCounts::new(),
        };
        // SAFETY: `raw` is a fresh PD owned by nobody else; it keeps `ctx` alive.
        let inner = unsafe { Owned::new(raw, keep) };
        Ok(ProtectionDomain {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.inner.as_ptr()
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.keep().ctx
    }

    /// The PD's user counts, for its children's tallies.
    pub(crate) fn users(&self) -> &Arc<UserCounts> {
        &self.inner.keep().users
    }

    /// The kernel's handle of the PD (`handle`).
    pub fn handle(&self) -> u32 {
        // SAFETY: the PD is live; plain field read.
        unsafe { (*self.as_ptr()).handle }
    }

    /// Deallocates the PD now, reporting failure.
    ///
    /// Fails with [`Error::InUse`](crate::Error::InUse) while other handles
    /// or objects created in it are alive (the error names them: queue
    /// pairs, memory regions, memory windows, address handles, shared
    /// receive queues, other handles); it is then deallocated when the
    /// last of them is dropped.
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context, Error, UserKind};
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let _mr = pd.register(64, AccessFlags::LOCAL_WRITE)?;
    /// let _clone = pd.clone();
    /// match pd.close() {
    ///     Err(Error::InUse { users, by, .. }) => {
    ///         assert_eq!(users, 2);
    ///         assert_eq!(by.count(UserKind::MemoryRegion), 1);
    ///         assert_eq!(by.to_string(), "1 memory region, 1 other handle (a clone)");
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_dealloc_pd")]
    pub fn close(self) -> Result<()> {
        close_counted(self.inner, |k| Some(&k.users))
    }
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.context().name())
            .field("handle", &self.handle())
            .finish()
    }
}

//! Ownership of raw verbs objects: one place that destroys them, keeps what
//! they depend on alive until then, and never panics while doing so.

use std::ffi::c_int;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{check_rc, Error, InUseOp, Result};
use crate::users::{InUseBy, UserCounts};

/// A raw libibverbs object type and the verb that destroys it.
pub(crate) trait RawObject {
    /// The destroying verb's name, for errors (`"ibv_dealloc_pd"`).
    const DESTROY: &'static str;
    /// What the object is called in messages (`"protection domain"`).
    const NAME: &'static str;
    /// Destroys the object.
    ///
    /// # Safety
    /// `ptr` came from the matching create verb and has not been destroyed
    /// (a destroy that failed left it alive: libibverbs frees an object
    /// only when its destroy verb succeeds, so it may be tried again).
    unsafe fn destroy(ptr: *mut Self) -> c_int;
}

/// Owns one raw object of type `T` and what it depends on (`K`: its parents'
/// handles, its buffer, ...). `K` is dropped only after `T` is destroyed, so
/// a parent can never be freed under its child, whatever order the user
/// drops things in.
pub(crate) struct Owned<T: RawObject, K> {
    ptr: NonNull<T>,
    keep: ManuallyDrop<K>,
    /// False for an object another library owns and destroys (a context
    /// librdmacm opened): then "destroying" it only lets `keep` go.
    owns: bool,
}

impl<T: RawObject, K> Owned<T, K> {
    /// Takes ownership of `ptr`.
    ///
    /// # Safety
    /// `ptr` is a live object from `T`'s create verb, owned by nobody else,
    /// and `keep` holds everything that must outlive it.
    pub(crate) unsafe fn new(ptr: NonNull<T>, keep: K) -> Self {
        Owned {
            ptr,
            keep: ManuallyDrop::new(keep),
            owns: true,
        }
    }

    /// Wraps an object that another library owns and destroys; `keep` is
    /// what holds it alive there (and is dropped in place of destroying it).
    ///
    /// # Safety
    /// `ptr` is a live object that stays alive while `keep` lives.
    #[cfg(feature = "cm")]
    pub(crate) unsafe fn borrowed(ptr: NonNull<T>, keep: K) -> Self {
        Owned {
            ptr,
            keep: ManuallyDrop::new(keep),
            owns: false,
        }
    }

    /// Destroys the raw object if this handle owns it.
    fn destroy_raw(&self) -> c_int {
        if !self.owns {
            return 0;
        }
        // The callers (`destroy`, `into_keep`, `try_into_keep`) end the
        // handle when the destroy succeeds, and only `try_into_keep` hands
        // the handle back, on failure, when the object is still alive (see
        // `RawObject::destroy`).
        // SAFETY: `ptr` is live and owned by `self` (see `new` and above).
        unsafe { T::destroy(self.ptr.as_ptr()) }
    }

    /// The raw pointer, valid while `self` lives.
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// What this object keeps alive.
    pub(crate) fn keep(&self) -> &K {
        &self.keep
    }

    /// What this object keeps alive, mutably.
    pub(crate) fn keep_mut(&mut self) -> &mut K {
        &mut self.keep
    }

    /// Destroys the object. On failure the object still exists on the device,
    /// so what it depends on is leaked rather than freed under it.
    fn destroy(&mut self) -> Result<()> {
        // Called exactly once: from `close` (which then skips `Drop`) or from `Drop`.
        let rc = self.destroy_raw();
        let result = check_rc(T::DESTROY, rc).map(|_| ());
        if result.is_ok() {
            // SAFETY: `keep` is taken once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.keep) };
        }
        result
    }

    /// Destroys the object now and hands back what it kept alive; on
    /// failure that is leaked with the object, as in [`close`](Self::close).
    pub(crate) fn into_keep(self) -> Result<K> {
        let mut this = ManuallyDrop::new(self);
        // `Drop` will not run (ManuallyDrop), so it is destroyed exactly once, here.
        let rc = this.destroy_raw();
        check_rc(T::DESTROY, rc)?;
        // SAFETY: the object is gone; `keep` is taken once and `this` is
        // never used again (and never dropped).
        Ok(unsafe { ManuallyDrop::take(&mut this.keep) })
    }

    /// Destroys the object now and hands back what it kept alive; on
    /// failure, the handle itself comes back with the error, still owning
    /// the object (libibverbs frees an object only when its destroy verb
    /// succeeded), so the caller may try again or drop it.
    pub(crate) fn try_into_keep(self) -> std::result::Result<K, (Self, Error)> {
        let rc = self.destroy_raw();
        if let Err(e) = check_rc(T::DESTROY, rc) {
            return Err((self, e));
        }
        let mut this = ManuallyDrop::new(self);
        // SAFETY: the object is gone; `keep` is taken once and `this` is
        // never used again (and never dropped).
        Ok(unsafe { ManuallyDrop::take(&mut this.keep) })
    }

    /// Destroys the object now and reports failure.
    pub(crate) fn close(self) -> Result<()> {
        let mut this = ManuallyDrop::new(self);
        this.destroy()
    }
}

impl<T: RawObject, K> Drop for Owned<T, K> {
    fn drop(&mut self) {
        // A failure cannot be reported from here; `close()` exists for callers
        // who want to see it. Either way nothing panics.
        let _ = self.destroy();
    }
}

/// Closes a shared object if `arc` is its last handle; otherwise
/// [`Error::InUse`] with its users counted but not named.
pub(crate) fn close_shared<T: RawObject, K>(arc: Arc<Owned<T, K>>) -> Result<()> {
    close_counted(arc, |_| None)
}

/// [`close_shared`] for an object whose keep has [`UserCounts`]
/// (`counts`), which then names its users by kind.
pub(crate) fn close_counted<T: RawObject, K>(
    arc: Arc<Owned<T, K>>,
    counts: impl Fn(&K) -> Option<&UserCounts>,
) -> Result<()> {
    take_last(arc, counts).and_then(Owned::close)
}

/// The object itself if `arc` is its last handle; otherwise
/// [`Error::InUse`], its users named by `counts` when it has them.
pub(crate) fn take_last<T: RawObject, K>(
    arc: Arc<Owned<T, K>>,
    counts: impl Fn(&K) -> Option<&UserCounts>,
) -> Result<Owned<T, K>> {
    Arc::try_unwrap(arc).map_err(|arc| in_use(T::NAME, &arc, counts(arc.keep())))
}

/// The [`Error::InUse`] of `close` for `arc`, whose other handles are its
/// users: the object is destroyed when the last of them is dropped.
pub(crate) fn in_use<X>(object: &'static str, arc: &Arc<X>, counts: Option<&UserCounts>) -> Error {
    let users = Arc::strong_count(arc) - 1;
    Error::InUse {
        op: InUseOp::Close,
        object,
        users,
        by: counts.map_or_else(|| InUseBy::uncounted(users), |c| c.breakdown(users)),
    }
}

/// The [`Error::InUse`] of a memory region's `op` (`into_inner`, `rejoin`,
/// `rereg_*`) refused while other handles of `arc` name the region: the
/// region stays as it was.
#[cold]
pub(crate) fn region_in_use<X>(op: InUseOp, arc: &Arc<X>) -> Error {
    let users = Arc::strong_count(arc) - 1;
    Error::InUse {
        op,
        object: "memory region",
        users,
        by: InUseBy::region_users(users),
    }
}

// Threads. verbs(7): "This library is a thread safe library and verbs can be
// called from every thread in the process. The same resource can even be
// handled from different threads"; ibv_alloc_td(3): "By default all verbs
// objects are safe for multi-threaded access". Two things can turn that
// locking off, and the crate rules both out: thread domains (`ibv_alloc_td`),
// which it never creates; and a provider's environment switch
// (`MLX5_SINGLE_THREADED=1` and the like), with which every context open is
// refused (`context::PROVIDER_LOCK_SWITCHES`, checked in
// `Context::from_device`, the one path to `ibv_open_device`).
// SAFETY: by the above, any thread may use and destroy the object; `Owned`
// destroys it exactly once, and `K` moves with it, hence `K: Send`.
unsafe impl<T: RawObject, K: Send> Send for Owned<T, K> {}
// SAFETY: shared access only calls verbs through `as_ptr`, which libibverbs
// serialises internally as quoted above; `keep()` hands out `&K`, hence `K: Sync`.
unsafe impl<T: RawObject, K: Sync> Sync for Owned<T, K> {}

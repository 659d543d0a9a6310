//! Address handles (`struct ibv_ah`): where a UD send goes.

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use crate::error::{check_ptr, Error, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::qp::AddressVector;
use crate::sys;

impl RawObject for sys::ibv_ah {
    const DESTROY: &'static str = "ibv_destroy_ah";
    const NAME: &'static str = "address handle";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live AH, once.
        unsafe { sys::ibv_destroy_ah(ptr) }
    }
}

/// An address handle (`struct ibv_ah`): a destination for UD sends.
///
/// Cloning shares the handle. A UD send keeps a clone until it completes,
/// so the handle outlives every send that uses it.
///
/// ```no_run
/// use rdma_verbs::qp::{AddressVector, GlobalRoute};
/// use rdma_verbs::Context;
/// let ctx = Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let dgid = ctx.query_gid(1, 1)?;
/// let ah = pd.create_ah(&AddressVector::new(1).global(GlobalRoute::new(dgid, 1).hop_limit(64)))?;
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_ah")]
#[derive(Clone)]
pub struct AddressHandle {
    inner: Arc<Owned<sys::ibv_ah, ProtectionDomain>>,
}

impl ProtectionDomain {
    /// Creates an address handle for `av`.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle> {
        AddressHandle::new(self, av)
    }
}

impl AddressHandle {
    /// Creates an address handle for `av` in `pd`.
    ///
    /// Refused before the call: a port that does not exist, and no GRH on a
    /// port that needs one (RoCE, or `IBV_QPF_GRH_REQUIRED`), or a GID index
    /// outside the table.
    #[doc(alias = "ibv_create_ah")]
    pub fn new(pd: &ProtectionDomain, av: &AddressVector) -> Result<Self> {
        const VERB: &str = "ibv_create_ah";
        let ctx = pd.context();
        ctx.check_port(VERB, av.port())?;
        let port = ctx.query_port(av.port())?;
        match av.grh() {
            None if port.grh_required() => {
                return Err(Error::invalid(
                    VERB,
                    format!("port {} needs a GRH: use AddressVector::global", av.port()),
                ))
            }
            Some(g) if u32::from(g.sgid_index()) >= port.gid_tbl_len => {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "sgid_index {} is outside the GID table of {} entries",
                        g.sgid_index(),
                        port.gid_tbl_len
                    ),
                ))
            }
            _ => {}
        }
        let mut raw = av.to_raw();
        // SAFETY: the PD is live; `raw` is a valid attribute struct.
        let ah = check_ptr(VERB, unsafe { sys::ibv_create_ah(pd.as_ptr(), &mut raw) })?;
        // SAFETY: a fresh AH owned by nobody else; it keeps its PD alive.
        let inner = unsafe { Owned::new(ah, pd.clone()) };
        Ok(AddressHandle {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.inner.as_ptr()
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        self.inner.keep()
    }

    /// Destroys the handle now, reporting failure; [`Error::InUse`] while
    /// clones (or sends in flight) still hold it.
    #[doc(alias = "ibv_destroy_ah")]
    pub fn close(self) -> Result<()> {
        close_shared(self.inner)
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle").finish_non_exhaustive()
    }
}

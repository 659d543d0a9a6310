//! Address handles (`struct ibv_ah`): where a UD send goes.

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use crate::error::{check_ptr, check_rc, Error, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::qp::AddressVector;
use crate::sys;
use crate::users::{Tally, UserKind};

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
    inner: Arc<Owned<sys::ibv_ah, (ProtectionDomain, Tally)>>,
}

/// The size of the Global Routing Header a UD receive gets in front of the
/// message (`struct ibv_grh`).
pub const GRH_LEN: usize = 40;

impl crate::Context {
    /// The address vector that answers the sender of a UD message received
    /// on `port` (`ibv_init_ah_from_wc`): from its work completion and the
    /// first [`GRH_LEN`] bytes of the receive buffer, where the device puts
    /// the Global Routing Header (always on RoCE; when the completion has
    /// [`WcFlags::GRH`](crate::WcFlags::GRH) on InfiniBand). libibverbs
    /// finds the local GID index the message came in on.
    ///
    /// Refused before the call: a port that does not exist, and `grh`
    /// shorter than [`GRH_LEN`].
    ///
    /// ```no_run
    /// # fn f(pd: &rdma_verbs::ProtectionDomain, wc: &rdma_verbs::WorkCompletion, buf: &[u8]) -> rdma_verbs::Result<()> {
    /// let av = pd.context().reply_av(1, wc, buf)?;
    /// let ah = pd.create_ah(&av)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "ibv_init_ah_from_wc")]
    pub fn reply_av(
        &self,
        port: u8,
        wc: &crate::WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector> {
        const VERB: &str = "ibv_init_ah_from_wc";
        self.check_port(VERB, port)?;
        let Some(g) = grh.get(..GRH_LEN) else {
            return Err(Error::invalid(
                VERB,
                format!("the GRH is {GRH_LEN} bytes, {} given", grh.len()),
            ));
        };
        let gid = |at: usize| {
            let mut raw = [0u8; 16];
            raw.copy_from_slice(&g[at..at + 16]);
            sys::ibv_gid { raw }
        };
        // The header as it lies in memory (its fields are big-endian there).
        let mut raw_grh = sys::ibv_grh {
            version_tclass_flow: u32::from_ne_bytes([g[0], g[1], g[2], g[3]]),
            paylen: u16::from_ne_bytes([g[4], g[5]]),
            next_hdr: g[6],
            hop_limit: g[7],
            sgid: gid(8),
            dgid: gid(24),
        };
        let mut raw_wc = *wc.raw();
        let mut attr = sys::ibv_ah_attr::default();
        // SAFETY: the context is live and `port` one of its ports; the
        // work completion, GRH and attribute structs are valid for the call
        // (libibverbs only reads the first two and writes the third).
        let rc = unsafe {
            sys::ibv_init_ah_from_wc(self.as_ptr(), port, &mut raw_wc, &mut raw_grh, &mut attr)
        };
        check_rc(VERB, rc)?;
        Ok(AddressVector::from_raw(&attr))
    }
}

impl ProtectionDomain {
    /// An address handle that answers the sender of a received UD message
    /// (`ibv_create_ah_from_wc`): [`Context::reply_av`](crate::Context::reply_av),
    /// then [`create_ah`](Self::create_ah).
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn create_ah_from_wc(
        &self,
        port: u8,
        wc: &crate::WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressHandle> {
        let av = self.context().reply_av(port, wc, grh)?;
        self.create_ah(&av)
    }

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
        let tally = Tally::new(pd.users(), UserKind::AddressHandle, 1);
        // SAFETY: a fresh AH owned by nobody else; it keeps its PD alive.
        let inner = unsafe { Owned::new(ah, (pd.clone(), tally)) };
        Ok(AddressHandle {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.inner.as_ptr()
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().0
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

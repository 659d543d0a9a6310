//! Regions over a dma-buf (`ibv_reg_dmabuf_mr`): memory another driver
//! exports, such as a GPU's, which the program has no CPU mapping of.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::owned::{adopt, check_iova, check_registration};
use super::{AccessFlags, Memory, MemoryRegion};
use crate::error::{Error, Refused};
use crate::pd::ProtectionDomain;

const VERB: &str = "ibv_reg_dmabuf_mr";

/// The dma-buf a region is registered over: its file descriptor, owned by
/// the region while it is registered and handed back by
/// [`MemoryRegion::into_inner`], and the offset of the region in it.
///
/// A region over a dma-buf has no bytes in this process: it offers no
/// [`read`](MemoryRegion::read), [`write`](MemoryRegion::write) or chunks
/// (the compiler refuses them), only its keys, for peers
/// ([`remote_buf`](MemoryRegion::remote_buf)) and memory windows.
#[doc(alias = "dmabuf")]
pub struct DmaBuf {
    fd: OwnedFd,
    offset: u64,
}

impl DmaBuf {
    /// The file descriptor, back.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Where the region starts in the dma-buf.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl AsFd for DmaBuf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuf")
            .field("fd", &self.fd.as_raw_fd())
            .field("offset", &self.offset)
            .finish()
    }
}

impl ProtectionDomain {
    /// Registers `len` bytes of the dma-buf `fd` from `offset` on, known to
    /// the device (and peers) at `iova` (`ibv_reg_dmabuf_mr`). The region
    /// owns `fd` until it is closed or [`into_inner`](MemoryRegion::into_inner)
    /// hands it back.
    ///
    /// Refused before any call, with `fd` handed back in the [`Refused`]:
    /// `len == 0`, `len` above `max_mr_size`, `iova + len` past 64 bits,
    /// an `iova` not as far into its page as `offset` (the kernel's rule),
    /// and `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE`.
    /// [`Error::Unsupported`] where the device cannot register dma-bufs
    /// (rxe, most devices without on-demand paging) and where the rdma-core
    /// this crate was built against is older than 34, which added the verb;
    /// `fd` comes back then too, as on every failure.
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context, Error};
    /// # fn gpu_buffer_fd() -> std::os::fd::OwnedFd { unimplemented!() }
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    /// match pd.register_dmabuf(gpu_buffer_fd(), 0, 1 << 20, 0, access) {
    ///     Ok(mr) => println!("peers write the GPU's memory at rkey {:#x}", mr.rkey()),
    ///     Err(refused) if matches!(refused.error(), Error::Unsupported { .. }) => {
    ///         let _fd = refused.into_value(); // stage through host memory instead
    ///     }
    ///     Err(refused) => return Err(refused.into()),
    /// }
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn register_dmabuf(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion<DmaBuf>, Refused<OwnedFd>> {
        if let Err(e) =
            check_registration(self, len, access).and_then(|()| check_iova(VERB, iova, offset, len))
        {
            return Err(Refused::new(e, fd));
        }
        match reg_dmabuf(self, &fd, offset, len, iova, access) {
            Ok(raw) => {
                let owner = Box::new(DmaBuf { fd, offset });
                // No CPU address: the pointer is never followed (a
                // `MemoryRegion<DmaBuf>` has no read, write or chunks).
                let memory = Memory::new(NonNull::dangling(), len, iova, owner);
                Ok(adopt(self, raw, memory, access))
            }
            Err(e) => Err(Refused::new(e, fd)),
        }
    }
}

#[cfg(rdma_core_reg_dmabuf_mr)]
fn reg_dmabuf(
    pd: &ProtectionDomain,
    fd: &OwnedFd,
    offset: u64,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> crate::Result<NonNull<crate::sys::ibv_mr>> {
    // SAFETY: the PD is live and `fd` is an open descriptor the caller
    // owns (the region keeps it open while registered); the device reaches
    // the dma-buf's memory, never this process's.
    let raw = unsafe {
        crate::sys::ibv_reg_dmabuf_mr(
            pd.as_ptr(),
            offset,
            len,
            iova,
            fd.as_raw_fd(),
            access.bits() as i32,
        )
    };
    crate::error::check_ptr(VERB, raw).map_err(|e| match e.errno() {
        Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT)) => {
            Error::Unsupported {
                what: "dma-buf memory regions (ibv_reg_dmabuf_mr)",
                device: pd.context().name().to_owned(),
                errno: Some(errno),
            }
        }
        _ => e,
    })
}

#[cfg(not(rdma_core_reg_dmabuf_mr))]
fn reg_dmabuf(
    pd: &ProtectionDomain,
    _fd: &OwnedFd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _access: AccessFlags,
) -> crate::Result<NonNull<crate::sys::ibv_mr>> {
    Err(Error::Unsupported {
        what: "dma-buf memory regions (ibv_reg_dmabuf_mr: rdma-core 34 and later; this crate was built against an older one)",
        device: pd.context().name().to_owned(),
        errno: None,
    })
}

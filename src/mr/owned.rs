//! Registering memory the program owns, and having it back:
//! [`ProtectionDomain::register_owned`], [`MemoryRegion::into_inner`],
//! [`MemoryRegion::split`] and [`ChunkedRegion`].

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{
    check_access, check_device_access, AccessFlags, Chunk, Memory, MemoryRegion, MrKeep,
    RegionCore, RegisterBuffer,
};
use crate::error::{check_ptr, Error, InUseOp, Refused, Result};
use crate::handle::{region_in_use, Owned};
use crate::pd::ProtectionDomain;
use crate::sys;
use crate::users::{Tally, UserKind};

impl ProtectionDomain {
    /// Registers a buffer the program owns, moving it into the region: no
    /// copy, the device reaches the buffer's own bytes.
    ///
    /// The region holds the buffer for as long as it is registered (the
    /// soundness rules of every region hold: no slice of it while
    /// registered, see [`MemoryRegion`]) and hands it back with
    /// [`MemoryRegion::into_inner`] once `ibv_dereg_mr` has succeeded. Any
    /// [`RegisterBuffer`]: `Vec<u8>`, `Box<[u8]>`, [`Pages`](crate::Pages),
    /// a `memmap2::MmapMut`, a `bytes::BytesMut`, ...
    ///
    /// Refused before any call, with the buffer handed back in the
    /// [`Refused`]: an empty buffer, one longer than the device's
    /// `max_mr_size`, and `REMOTE_WRITE`/`REMOTE_ATOMIC` without
    /// `LOCAL_WRITE`. When `ibv_reg_mr` fails, the buffer comes back too.
    /// The buffer need not be aligned: the device reaches exactly its
    /// bytes, whatever the pages around them hold.
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context};
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let log: Vec<u8> = b"log segment 7".to_vec();
    /// let mut mr = pd.register_owned(log, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    /// // ... peers RDMA-read it through mr.remote_buf() ...
    /// mr.write(0, b"LOG")?;
    /// let log: Vec<u8> = mr.into_inner()?; // deregistered: the Vec is back
    /// assert_eq!(&log, b"LOG segment 7");
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    #[doc(alias = "ibv_reg_mr")]
    pub fn register_owned<B: RegisterBuffer>(
        &self,
        buffer: B,
        access: AccessFlags,
    ) -> Result<MemoryRegion<B>, Refused<B>> {
        register(self, buffer, access, None)
    }

    /// [`register_owned`](Self::register_owned) with the I/O virtual
    /// address of the caller's choice: the device, and peers, know the
    /// buffer's first byte as `iova` ([`MemoryRegion::addr`]). With
    /// `iova = 0` the region is zero-based: a peer addresses it by offset,
    /// whatever its address in this process.
    ///
    /// Refused like `register_owned`, when `iova + len` overflows 64 bits,
    /// and when `iova` is not as far into its page as the buffer is into
    /// its own (the kernel maps whole pages: it would refuse with EINVAL).
    /// A page-aligned buffer ([`Pages`](crate::Pages)) can be registered at
    /// any page-aligned iova, 0 included.
    #[doc(alias = "ibv_reg_mr_iova2")]
    #[doc(alias = "ibv_reg_mr_iova")]
    pub fn register_owned_at<B: RegisterBuffer>(
        &self,
        buffer: B,
        access: AccessFlags,
        iova: u64,
    ) -> Result<MemoryRegion<B>, Refused<B>> {
        register(self, buffer, access, Some(iova))
    }
}

/// The checks every registration of `len` bytes gets before any call.
pub(super) fn check_registration(
    pd: &ProtectionDomain,
    len: usize,
    access: AccessFlags,
) -> Result<()> {
    const VERB: &str = "ibv_reg_mr";
    check_access(VERB, access)?;
    check_device_access(pd, access)?;
    if len == 0 {
        return Err(Error::invalid(VERB, "a memory region cannot be empty"));
    }
    let max = pd.context().attr().max_mr_size;
    if max != 0 && len as u64 > max {
        return Err(Error::invalid(
            VERB,
            format!("{len} bytes is more than the device's max_mr_size of {max}"),
        ));
    }
    Ok(())
}

/// `iova..iova + len` fits in 64 bits, and `iova` is as far into its
/// page as `start` (the buffer's address, or the offset in a dma-buf):
/// the kernel maps whole pages, so it refuses any other iova with EINVAL
/// (`ib_uverbs_reg_mr` and `ib_uverbs_reg_dmabuf_mr` compare the two).
pub(super) fn check_iova(verb: &'static str, iova: u64, start: u64, len: usize) -> Result<()> {
    if iova.checked_add(len as u64).is_none() {
        return Err(Error::invalid(
            verb,
            format!("iova {iova:#x} + {len} bytes runs past the end of the 64-bit address space"),
        ));
    }
    let page = super::page_size() as u64;
    if iova % page != start % page {
        return Err(Error::invalid(
            verb,
            format!(
                "iova {iova:#x} is {} bytes into its page and the memory {} bytes into its own \
                 (at {start:#x}): they must be the same, as the kernel maps whole {page}-byte \
                 pages (a page-aligned buffer such as Pages can be registered at any \
                 page-aligned iova, 0 included)",
                iova % page,
                start % page
            ),
        ));
    }
    Ok(())
}

fn register<B: RegisterBuffer>(
    pd: &ProtectionDomain,
    buffer: B,
    access: AccessFlags,
    iova: Option<u64>,
) -> Result<MemoryRegion<B>, Refused<B>> {
    // Boxed first, so that the bytes stay where they are whatever the type
    // (`RegisterBuffer`'s contract: valid while `buffer` is not moved).
    let mut boxed = Box::new(buffer);
    let bytes = boxed.bytes_to_register();
    let (ptr, len) = (NonNull::from(&mut *bytes).cast::<u8>(), bytes.len());
    let iova = iova.unwrap_or(ptr.as_ptr() as u64);
    let verb = if iova == ptr.as_ptr() as u64 {
        "ibv_reg_mr"
    } else {
        "ibv_reg_mr_iova2"
    };
    if let Err(e) = check_registration(pd, len, access)
        .and_then(|()| check_iova(verb, iova, ptr.as_ptr() as u64, len))
    {
        return Err(Refused::new(e, *boxed));
    }
    // The PD is live; `ptr..ptr + len` are bytes the boxed buffer owns
    // exclusively and keeps valid while it is neither moved nor used
    // (`RegisterBuffer`), and the box goes into the region's `Memory`,
    // which `Owned` keeps (in `keep`) until after ibv_dereg_mr. The _iova2
    // form accepts every access flag; with iova = ptr it is ibv_reg_mr.
    // SAFETY: a live PD and bytes kept valid until deregistration (above).
    let raw = unsafe {
        sys::ibv_reg_mr_iova2(pd.as_ptr(), ptr.as_ptr().cast(), len, iova, access.bits())
    };
    match check_ptr(verb, raw) {
        Ok(raw) => Ok(adopt(pd, raw, Memory::new(ptr, len, iova, boxed), access)),
        Err(e) => Err(Refused::new(e, *boxed)),
    }
}

/// The region of a freshly registered `raw` over `memory`, whose owner is
/// a `Box<B>`.
pub(super) fn adopt<B>(
    pd: &ProtectionDomain,
    raw: NonNull<sys::ibv_mr>,
    memory: Memory,
    access: AccessFlags,
) -> MemoryRegion<B> {
    let keep = MrKeep {
        pd: pd.clone(),
        memory,
        tally: Tally::new(pd.users(), UserKind::MemoryRegion, 1),
        maybe_in: Vec::new(),
        maybe_mapped: Vec::new(),
    };
    // SAFETY: a fresh MR owned by nobody else; it keeps its PD and memory alive.
    let inner = unsafe { Owned::new(raw, keep) };
    MemoryRegion::from_core(RegionCore {
        inner: Arc::new(inner),
        access,
    })
}

/// Deregisters the region of `core` and hands back its buffer, if nothing
/// else holds the region; otherwise, or when `ibv_dereg_mr` fails, `core`
/// comes back with the error, the region still registered.
///
/// # Safety
/// The region's memory owner is a `Box<B>`.
unsafe fn take_buffer<B: 'static>(core: RegionCore) -> std::result::Result<B, (RegionCore, Error)> {
    let RegionCore { inner, access } = core;
    // Nothing can take a new hold of the region meanwhile: holds are made
    // from a region or chunk handle, and `core` is the only one left when
    // this succeeds.
    let owned = match Arc::try_unwrap(inner) {
        Ok(owned) => owned,
        Err(inner) => {
            let e = region_in_use(InUseOp::HandBack, &inner);
            return Err((RegionCore { inner, access }, e));
        }
    };
    match owned.try_into_keep() {
        // SAFETY: the owner is a `Box<B>` (caller).
        Ok(keep) => Ok(unsafe { keep.memory.into_owner::<B>() }),
        Err((owned, e)) => Err((
            RegionCore {
                inner: Arc::new(owned),
                access,
            },
            e,
        )),
    }
}

impl<B: Send + 'static> MemoryRegion<B> {
    /// Deregisters the region and hands its buffer back, its contents as
    /// the device and the program left them.
    ///
    /// Refused, with the region handed back still registered and unchanged
    /// ([`Refused::into_value`]), while anything else names it: a memory
    /// window bound to it (unbind or close the window first). When
    /// `ibv_dereg_mr` fails, the region comes back too, still registered:
    /// try again, or drop it (its memory is then leaked if the device
    /// still refuses, never freed under the device).
    #[doc(alias = "ibv_dereg_mr")]
    pub fn into_inner(self) -> Result<B, Refused<Self>> {
        // SAFETY: a `MemoryRegion<B>` is only made over a `Box<B>` owner
        // (`register`, `register_dmabuf`, `ChunkedRegion::rejoin`).
        unsafe { take_buffer::<B>(self.core) }
            .map_err(|(core, e)| Refused::new(e, MemoryRegion::from_core(core)))
    }
}

impl<B: RegisterBuffer> MemoryRegion<B> {
    /// Splits the region into [`Chunk`]s of `chunk_len` bytes (the last one
    /// may be shorter), as [`into_chunks`](Self::into_chunks) does, and
    /// keeps a [`ChunkedRegion`]: the region's keys, and the way back to
    /// its buffer once every chunk has been dropped.
    ///
    /// Refused, with the region handed back, for regions peers may write
    /// (`REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND`) and for `chunk_len == 0`.
    ///
    /// ```no_run
    /// use rdma_verbs::{AccessFlags, Context};
    /// let pd = Context::open_first()?.alloc_pd()?;
    /// let mr = pd.register_owned(vec![0u8; 64 * 1024], AccessFlags::LOCAL_WRITE)?;
    /// let (region, chunks) = mr.split(4096)?;
    /// // ... post the chunks as receive buffers, reclaim them ...
    /// drop(chunks);
    /// let buf: Vec<u8> = region.into_inner()?; // every chunk is back
    /// # drop(buf);
    /// # Ok::<(), rdma_verbs::Error>(())
    /// ```
    pub fn split(self, chunk_len: usize) -> Result<(ChunkedRegion<B>, Vec<Chunk>), Refused<Self>> {
        const VERB: &str = "MemoryRegion::split";
        let remote = self.access()
            & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::MW_BIND);
        if !remote.is_empty() {
            let e = Error::invalid(
                VERB,
                format!("the region is registered with {remote:?}: peers may write it (directly or through a memory window), so it has no slices"),
            );
            return Err(Refused::new(e, self));
        }
        if chunk_len == 0 {
            return Err(Refused::new(Error::invalid(VERB, "chunk length 0"), self));
        }
        let len = self.len();
        let local_write = self.access().contains(AccessFlags::LOCAL_WRITE);
        let chunks = (0..len)
            .step_by(chunk_len)
            .map(|offset| Chunk {
                mr: Arc::clone(&self.core.inner),
                offset,
                len: chunk_len.min(len - offset),
                local_write,
            })
            .collect();
        let region = ChunkedRegion {
            core: self.core,
            _buffer: PhantomData,
        };
        Ok((region, chunks))
    }
}

/// A region split into [`Chunk`]s ([`MemoryRegion::split`]): its keys, and
/// the way back to its buffer once the chunks are all back.
///
/// The bytes are the chunks' now, so a `ChunkedRegion` offers no access to
/// them. [`into_inner`](Self::into_inner) deregisters the region and hands
/// the buffer back, and [`rejoin`](Self::rejoin) gives the whole
/// [`MemoryRegion`] back, each only once no chunk is left: none in the
/// program's hands, in a posted request, or in a [`SharedChunk`](crate::SharedChunk).
/// A chunk that is never dropped (`mem::forget`) keeps the buffer for good:
/// both keep refusing, and the memory is never freed.
#[doc(alias = "ibv_mr")]
pub struct ChunkedRegion<B = super::Pages> {
    core: RegionCore,
    _buffer: PhantomData<fn() -> B>,
}

impl<B> ChunkedRegion<B> {
    #[inline]
    pub(super) fn core(&self) -> &RegionCore {
        &self.core
    }

    /// How many chunks (and other holds, such as a receive pool's) still
    /// name the region.
    pub fn chunks_out(&self) -> usize {
        Arc::strong_count(&self.core.inner) - 1
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Always false: empty regions are refused at registration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { (*self.core.as_ptr()).lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { (*self.core.as_ptr()).rkey }
    }

    /// The address the device knows the first byte by (its iova).
    pub fn addr(&self) -> u64 {
        self.core.addr()
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.core.access()
    }

    /// The whole region back, if no chunk is left; otherwise `self` again.
    pub fn rejoin(mut self) -> Result<MemoryRegion<B>, Refused<Self>> {
        if Arc::get_mut(&mut self.core.inner).is_none() {
            let e = region_in_use(InUseOp::Rejoin, &self.core.inner);
            return Err(Refused::new(e, self));
        }
        Ok(MemoryRegion::from_core(self.core))
    }
}

impl<B: Send + 'static> ChunkedRegion<B> {
    /// Deregisters the region and hands its buffer back, once no chunk is
    /// left (as [`MemoryRegion::into_inner`]); otherwise, or when
    /// `ibv_dereg_mr` fails, `self` again, still registered.
    #[doc(alias = "ibv_dereg_mr")]
    pub fn into_inner(self) -> Result<B, Refused<Self>> {
        // SAFETY: made from a `MemoryRegion<B>` (`split`), over a `Box<B>`.
        unsafe { take_buffer::<B>(self.core) }.map_err(|(core, e)| {
            Refused::new(
                e,
                ChunkedRegion {
                    core,
                    _buffer: PhantomData,
                },
            )
        })
    }
}

impl<B> fmt::Debug for ChunkedRegion<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkedRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("chunks_out", &self.chunks_out())
            .field("buffer", &std::any::type_name::<B>())
            .finish()
    }
}

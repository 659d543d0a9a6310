//! Memory regions (`struct ibv_mr`): registered over memory the region owns,
//! whether the crate allocated it ([`Pages`]) or the program handed it over
//! ([`RegisterBuffer`]), or over a dma-buf ([`DmaBuf`]).

use std::ffi::c_int;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::handle::{Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::sys;
use crate::users::Tally;

mod chunk;
mod dmabuf;
mod memory;
mod odp;
mod owned;
mod rereg;
mod view;
mod volatile;
pub use chunk::{Chunk, SharedChunk};
pub use dmabuf::DmaBuf;
pub(crate) use memory::Memory;
pub use memory::{Pages, RegisterBuffer};
pub use odp::{MrAdvice, OdpCaps, OdpGeneralCaps, OdpTransportCaps};
pub use owned::ChunkedRegion;
pub use view::PeerView;
use volatile::{volatile_read, volatile_write};

bitflags::bitflags! {
    /// Access rights of a memory region or a QP (`enum ibv_access_flags`).
    ///
    /// Local read access is always granted. `REMOTE_WRITE` and
    /// `REMOTE_ATOMIC` on a memory region need `LOCAL_WRITE` too.
    #[doc(alias = "ibv_access_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, RDMA read responses).
        const LOCAL_WRITE = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA-write the memory.
        const REMOTE_WRITE = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA-read the memory.
        const REMOTE_READ = sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on the memory.
        const REMOTE_ATOMIC = sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region.
        const MW_BIND = sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        /// `IBV_ACCESS_ZERO_BASED`: remote addresses are offsets from the region's start.
        const ZERO_BASED = sys::ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging: the pages are not pinned,
        /// the device faults them in as it reaches them (see [`OdpCaps`]).
        /// Refused with [`Error::Unsupported`] on a device without
        /// [`OdpGeneralCaps::SUPPORT`], and on rxe, whose on-demand paging
        /// moves data to the wrong bytes (see [`OdpCaps`]).
        const ON_DEMAND = sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
        /// `IBV_ACCESS_HUGETLB`: the memory is backed by huge pages.
        const HUGETLB = sys::ibv_access_flags::IBV_ACCESS_HUGETLB.0;
        /// `IBV_ACCESS_RELAXED_ORDERING`: PCI relaxed ordering (optional: ignored where unsupported).
        const RELAXED_ORDERING = sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
        /// `IBV_ACCESS_FLUSH_GLOBAL`: peers may RDMA FLUSH the memory to
        /// global visibility ([`FlushPlacement::Global`](crate::qp::FlushPlacement::Global)).
        /// Refused with [`Error::Unsupported`] on a device without
        /// [`DeviceCapFlags::FLUSH_GLOBAL`](crate::DeviceCapFlags::FLUSH_GLOBAL).
        const FLUSH_GLOBAL = sys::ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0;
        /// `IBV_ACCESS_FLUSH_PERSISTENT`: peers may RDMA FLUSH the memory to
        /// persistence ([`FlushPlacement::Persistent`](crate::qp::FlushPlacement::Persistent)).
        /// Refused with [`Error::Unsupported`] on a device without
        /// [`DeviceCapFlags::FLUSH_PERSISTENT`](crate::DeviceCapFlags::FLUSH_PERSISTENT);
        /// rxe also refuses it (`EINVAL`) for memory that is not persistent memory.
        const FLUSH_PERSISTENT = sys::ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0;
    }
}

impl RawObject for sys::ibv_mr {
    const DESTROY: &'static str = "ibv_dereg_mr";
    const NAME: &'static str = "memory region";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live MR, once.
        unsafe { sys::ibv_dereg_mr(ptr) }
    }
}

/// The system's page size (`sysconf(_SC_PAGESIZE)`), which every region
/// this crate allocates is aligned to.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// What a region keeps alive until `ibv_dereg_mr` has succeeded: its PD,
/// its memory, and its entry in the PD's user counts.
pub(crate) struct MrKeep {
    pub(crate) pd: ProtectionDomain,
    pub(crate) memory: Memory,
    tally: Tally,
    /// PDs a failed `ibv_rereg_mr` may have moved the region to (the
    /// crate cannot tell whether it did): kept, and counted as users,
    /// until the region is gone.
    maybe_in: Vec<(ProtectionDomain, Tally)>,
    /// Buffers a failed `ibv_rereg_mr` may have moved the region onto:
    /// kept until the region is gone.
    maybe_mapped: Vec<Memory>,
}

/// A region's raw MR and what it keeps; shared by the region, its chunks
/// and the memory windows bound to it.
pub(crate) type MrInner = Owned<sys::ibv_mr, MrKeep>;

/// What every kind of region is, whatever owns its bytes: the shared
/// handle and the access it was registered with. Memory windows and the
/// post paths take this, so they need not know the buffer's type.
pub(crate) struct RegionCore {
    inner: Arc<MrInner>,
    access: AccessFlags,
}

impl RegionCore {
    #[inline]
    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: the MR is live while `self` is; libibverbs changes these
        // fields only in ibv_rereg_mr, which needs `&mut` of the only handle.
        unsafe { &*self.inner.as_ptr() }
    }

    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_mr {
        self.inner.as_ptr()
    }

    /// The shared owner, for objects that keep the region registered (a
    /// memory window bound to it).
    pub(crate) fn inner(&self) -> &Arc<MrInner> {
        &self.inner
    }

    pub(crate) fn memory(&self) -> &Memory {
        &self.inner.keep().memory
    }

    pub(crate) fn len(&self) -> usize {
        self.memory().len
    }

    pub(crate) fn addr(&self) -> u64 {
        self.memory().iova
    }

    pub(crate) fn access(&self) -> AccessFlags {
        self.access
    }

    pub(crate) fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().pd
    }
}

impl fmt::Debug for RegionCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("access", &self.access)
            .finish()
    }
}

/// A registered memory region (`struct ibv_mr`) over memory it owns: a
/// buffer of type `B`, handed back by [`into_inner`](Self::into_inner).
///
/// [`ProtectionDomain::register`] allocates the memory itself ([`Pages`]:
/// page-aligned, zeroed); [`ProtectionDomain::register_owned`] takes a
/// buffer the program already has (a `Vec<u8>`, a memory-mapped file, ...:
/// see [`RegisterBuffer`]), so data moves with no copy.
///
/// Because the device may read or write the memory at any time (a receive,
/// a peer's RDMA write), it is never lent out as a Rust slice while it is
/// registered: data goes in and out by volatile copy with
/// [`write`](Self::write) and [`read`](Self::read), which may see torn data
/// where the device writes meanwhile (see there), or the region is split
/// into [`Chunk`]s ([`into_chunks`](Self::into_chunks),
/// [`split`](Self::split)) where no peer may write it. The region keeps its
/// [`ProtectionDomain`] alive; the memory is freed or handed back only
/// after deregistration has succeeded.
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context};
/// let pd = Context::open_first()?.alloc_pd()?;
/// let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
/// mr.write(0, b"hello")?;
/// let mut back = [0u8; 5];
/// mr.read(0, &mut back)?;
/// assert_eq!(&back, b"hello");
/// println!("addr {:#x} rkey {:#x}", mr.addr(), mr.rkey());
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "ibv_mr")]
pub struct MemoryRegion<B = Pages> {
    core: RegionCore,
    /// The type of the buffer the memory's owner holds (`fn() -> B`: the
    /// region hands a `B` out, it never shares one).
    _buffer: PhantomData<fn() -> B>,
}

impl ProtectionDomain {
    /// Allocates `len` zeroed, page-aligned bytes ([`Pages`]) and registers them.
    #[doc(alias = "ibv_reg_mr")]
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::new(self, len, access)
    }
}

impl MemoryRegion {
    /// Allocates `len` zeroed, page-aligned bytes ([`Pages`]) and registers them in `pd`.
    ///
    /// Refused before any call: `len == 0`, `len` above the device's
    /// `max_mr_size`, and `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE`
    /// (ibv_reg_mr(3) requires it).
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &ProtectionDomain, len: usize, access: AccessFlags) -> Result<Self> {
        owned::check_registration(pd, len, access)?;
        Ok(pd.register_owned(Pages::new(len)?, access)?)
    }
}

impl<B> MemoryRegion<B> {
    fn from_core(core: RegionCore) -> Self {
        MemoryRegion {
            core,
            _buffer: PhantomData,
        }
    }

    /// What memory windows and posts take of the region.
    #[inline]
    pub(crate) fn core(&self) -> &RegionCore {
        &self.core
    }

    /// The region's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Always false: empty regions are refused at registration.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local key, for scatter/gather entries.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.core.raw().lkey
    }

    /// The remote key, for peers' RDMA operations.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.core.raw().rkey
    }

    /// The address the device knows the region's first byte by (its
    /// iova): where peers' RDMA operations and local scatter/gather entries
    /// name it. The buffer's own address unless the region was registered
    /// at another ([`register_owned_at`](ProtectionDomain::register_owned_at)).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.core.addr()
    }

    /// The access rights it was registered with (after a failed
    /// [`rereg_access`](Self::rereg_access), those it may have: see there).
    pub fn access(&self) -> AccessFlags {
        self.core.access
    }

    /// The protection domain it is registered in.
    pub fn pd(&self) -> &ProtectionDomain {
        self.core.pd()
    }

    /// Deregisters the region now and drops its memory, reporting failure.
    ///
    /// On failure the region stays registered and its memory is leaked, so
    /// the device can never touch freed memory. (To have the buffer back,
    /// and the region back on failure, use [`into_inner`](Self::into_inner).)
    #[doc(alias = "ibv_dereg_mr")]
    pub fn close(self) -> Result<()> {
        crate::handle::close_shared(self.core.inner)
    }
}

impl<B: RegisterBuffer> MemoryRegion<B> {
    fn check_range(&self, verb: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(view::outside(verb, offset, len, self.len())),
        }
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// The copy uses volatile stores only (aligned 8-byte words, single
    /// bytes at the edges), so the device or a peer may touch the region
    /// at the same time without undefined behaviour in this process. What
    /// they see is another matter: a peer that RDMA-reads these bytes, or
    /// RDMA-writes them, while the copy runs can see or leave *torn* data,
    /// a mix of old and new bytes; nothing is guaranteed beyond single
    /// bytes (no word, and no order between words, is promised). Ordering
    /// with the peer must come from the protocol: write first, then tell
    /// the peer (a send, a write with immediate, a flag written last).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range("MemoryRegion::write", offset, data.len())?;
        // `offset..offset + data.len()` is inside the registered bytes
        // (checked above), so the `add` stays in them and the destination
        // is valid for writes (`RegisterBuffer`'s contract, kept while the
        // region owns the buffer); `data` cannot overlap it because the
        // bytes are never lent out as a Rust reference. `&mut self`
        // excludes every other Rust access for the duration; the device's
        // accesses are outside Rust's memory model and met only by
        // volatile stores.
        // SAFETY: in bounds, no overlap, no racing Rust access (above).
        unsafe { volatile_write(self.core.memory().ptr.as_ptr().add(offset), data) };
        Ok(())
    }

    /// Copies bytes from the region at `offset` into `out`.
    ///
    /// The copy uses volatile loads only (aligned 8-byte words, single bytes
    /// at the edges), so the device may write the region at the same time
    /// (a peer's RDMA write or atomic on a region registered with
    /// `REMOTE_WRITE` or `REMOTE_ATOMIC`, a receive or an RDMA read
    /// response landing through the raw post path) without undefined
    /// behaviour in this process. The bytes copied from a range written
    /// meanwhile may be *torn*: a mix of old and new values, with nothing
    /// guaranteed beyond single bytes (no 2-, 4- or 8-byte value is read
    /// atomically, and the order between bytes is not promised). Read only
    /// what the protocol says is complete: after a completion, an
    /// immediate, or a flag the peer writes last (and check the flag itself
    /// in a way a torn read cannot fool, e.g. a single byte).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("MemoryRegion::read", offset, out.len())?;
        // `offset..offset + out.len()` is inside the registered bytes
        // (checked above), so the `add` stays in them and the source is
        // valid for reads (`RegisterBuffer`'s contract); `out` cannot
        // overlap it because the bytes are never lent out as a Rust
        // reference. No Rust write can run while `&self` is held (writes
        // take `&mut self`); the device's writes are outside Rust's memory
        // model and met only by volatile loads.
        // SAFETY: in bounds, no overlap, no racing Rust write (above).
        unsafe { volatile_read(self.core.memory().ptr.as_ptr().add(offset), out) };
        Ok(())
    }

    /// The `len` bytes at `offset`, to read in place: a [`PeerView`], whose
    /// loads are atomic, so the device or a peer may write the bytes
    /// meanwhile. No copy is made; [`read`](Self::read) copies instead.
    ///
    /// Refused with [`Error::InvalidArgument`] if the bytes are not all in
    /// the region.
    pub fn view(&self, offset: usize, len: usize) -> Result<PeerView<'_>> {
        self.check_range("MemoryRegion::view", offset, len)?;
        // `offset..offset + len` is inside the registered bytes (checked
        // above), valid for reads while `self` is borrowed (`RegisterBuffer`'s
        // contract, kept while the region owns the buffer). The crate never
        // makes a non-atomic Rust reference to a region's bytes while it is
        // registered, and its only Rust stores into them (`write`) need
        // `&mut self`, which the view's borrow excludes; the device's writes
        // are outside the program.
        // SAFETY: in bounds, valid for the borrow, no non-atomic Rust access (above).
        Ok(unsafe { PeerView::new(self.core.memory().ptr.as_ptr().add(offset), len) })
    }

    /// The whole region copied into a `Vec`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        // SAFETY: the whole of the registered bytes, as argued in `read`.
        unsafe { volatile_read(self.core.memory().ptr.as_ptr(), &mut v) };
        v
    }

    /// Splits the region into [`Chunk`]s of `chunk_len` bytes (the last one
    /// may be shorter): owned, disjoint pieces that can be lent out as
    /// slices and moved into work requests. The memory goes with the last
    /// chunk to be dropped (after deregistration); to have the buffer back
    /// once the chunks are, use [`split`](Self::split).
    ///
    /// Refused for regions registered with `REMOTE_WRITE`, `REMOTE_ATOMIC`
    /// or `MW_BIND` (a memory window bound to the region may give peers
    /// write access): a peer could write them at any time, so they must
    /// never be seen as Rust slices; use [`read`](Self::read) and
    /// [`write`](Self::write) on those. The region is dropped with the
    /// refusal (`split` hands it back).
    pub fn into_chunks(self, chunk_len: usize) -> Result<Vec<Chunk>> {
        self.split(chunk_len)
            .map(|(_, chunks)| chunks)
            .map_err(Error::from)
    }
}

impl<B> fmt::Debug for MemoryRegion<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access())
            .field("buffer", &std::any::type_name::<B>())
            .finish()
    }
}

impl ProtectionDomain {
    /// Registers one region of `count * len` bytes and splits it into
    /// `count` chunks of `len` bytes.
    #[doc(alias = "ibv_reg_mr")]
    pub fn alloc_chunks(
        &self,
        count: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Vec<Chunk>> {
        let total = count.checked_mul(len).ok_or_else(|| {
            Error::invalid(
                "ibv_reg_mr",
                format!("{count} chunks of {len} bytes overflow"),
            )
        })?;
        self.register(total, access)?.into_chunks(len)
    }
}

/// ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is
/// set, then IBV_ACCESS_LOCAL_WRITE must be set too."
fn check_access(verb: &'static str, access: AccessFlags) -> Result<()> {
    let remote = access & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if !remote.is_empty() && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(
            verb,
            format!("{remote:?} requires AccessFlags::LOCAL_WRITE (IBV_ACCESS_LOCAL_WRITE)"),
        ));
    }
    Ok(())
}

/// Why rxe's on-demand paging is refused although it reports it.
const RXE_ODP: &str = "on-demand paging on rxe (its ODP copy, rxe_odp.c of Linux 6.14 to at least \
     7.2.13, ignores the offset within each page: data lands at, and is read from, the page's \
     start, outside the bytes a request names)";

/// The access rights a device must report before a region may ask for
/// them: on-demand paging and the two FLUSH rights. Kernels refuse them
/// otherwise (`EOPNOTSUPP`, or `EINVAL` before they knew the flag); the
/// crate says which capability is missing instead. rxe's on-demand paging
/// is refused too: it moves data to the wrong bytes ([`RXE_ODP`], measured
/// in the sid VM: a write at offset 100 of a page lands at offset 0).
fn check_device_access(pd: &ProtectionDomain, access: AccessFlags) -> Result<()> {
    use crate::DeviceCapFlags as Cap;
    let ctx = pd.context();
    let dev = ctx.attr();
    let has = |cap: Cap| dev.capabilities.contains(cap);
    let odp = access.contains(AccessFlags::ON_DEMAND);
    let missing = if odp && !dev.odp.general.contains(OdpGeneralCaps::SUPPORT) {
        "on-demand paging (IBV_ACCESS_ON_DEMAND: odp_caps.general_caps has no IBV_ODP_SUPPORT)"
    } else if odp && ctx.is_rxe() {
        RXE_ODP
    } else if access.contains(AccessFlags::FLUSH_GLOBAL) && !has(Cap::FLUSH_GLOBAL) {
        "IBV_ACCESS_FLUSH_GLOBAL (the device does not report IB_UVERBS_DEVICE_FLUSH_GLOBAL)"
    } else if access.contains(AccessFlags::FLUSH_PERSISTENT) && !has(Cap::FLUSH_PERSISTENT) {
        "IBV_ACCESS_FLUSH_PERSISTENT (the device does not report IB_UVERBS_DEVICE_FLUSH_PERSISTENT)"
    } else {
        return Ok(());
    };
    Err(Error::Unsupported {
        what: missing,
        device: ctx.name().to_owned(),
        errno: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_needs_local_write() {
        let check = |a| check_access("ibv_reg_mr", a);
        assert!(check(AccessFlags::REMOTE_READ).is_ok());
        assert!(check(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).is_ok());
        let e = check(AccessFlags::REMOTE_WRITE).unwrap_err();
        assert!(e.to_string().contains("IBV_ACCESS_LOCAL_WRITE"), "{e}");
        assert!(check(AccessFlags::REMOTE_ATOMIC).is_err());
    }

    #[test]
    fn access_flags_match_c() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
    }
}

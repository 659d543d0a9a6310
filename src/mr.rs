//! Memory regions (`struct ibv_mr`) that own their buffer.

use std::alloc::{self, Layout};
use std::ffi::c_int;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{check_ptr, Error, Result};
use crate::handle::{Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::sys;
use crate::users::{Tally, UserKind};

mod chunk;
pub use chunk::{Chunk, SharedChunk};

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
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
        /// `IBV_ACCESS_HUGETLB`: the memory is backed by huge pages.
        const HUGETLB = sys::ibv_access_flags::IBV_ACCESS_HUGETLB.0;
        /// `IBV_ACCESS_RELAXED_ORDERING`: PCI relaxed ordering (optional: ignored where unsupported).
        const RELAXED_ORDERING = sys::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
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

/// A page-aligned, zeroed heap buffer that only the memory region touches.
pub(crate) struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `Buffer` is plain heap memory owned by one value; nothing in it is
// tied to a thread.
unsafe impl Send for Buffer {}
// SAFETY: `Buffer` itself offers no access; `MemoryRegion` gives shared
// access only through `&self` reads and exclusive access through `&mut self`.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, page_size()).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })?;
        Some(Buffer { ptr, layout })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once. `Owned`
        // drops its `keep` (which holds this) only after ibv_dereg_mr succeeded.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
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

/// A registered memory region (`struct ibv_mr`) over a buffer it owns.
///
/// The buffer is page-aligned and starts zeroed. Because the device may read
/// or write it at any time (a receive, a peer's RDMA write), it is never lent
/// out as a Rust slice in safe code: data goes in and out by volatile copy
/// with [`write`](Self::write) and [`read`](Self::read), which may see torn
/// data where the device writes meanwhile (see there). The region keeps its
/// [`ProtectionDomain`] alive; the buffer is freed only after deregistration.
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
pub struct MemoryRegion {
    inner: Arc<MrInner>,
    access: AccessFlags,
}

/// What a region keeps: its PD, its buffer, and its entry in the PD's
/// user counts.
pub(crate) type MrInner = Owned<sys::ibv_mr, (ProtectionDomain, Buffer, Tally)>;

impl ProtectionDomain {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it.
    #[doc(alias = "ibv_reg_mr")]
    pub fn register(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion> {
        MemoryRegion::new(self, len, access)
    }
}

impl MemoryRegion {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it in `pd`.
    ///
    /// Refused before any call: `len == 0`, `len` above the device's
    /// `max_mr_size`, and `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE`
    /// (ibv_reg_mr(3) requires it).
    #[doc(alias = "ibv_reg_mr")]
    #[doc(alias = "ibv_reg_mr_iova2")]
    pub fn new(pd: &ProtectionDomain, len: usize, access: AccessFlags) -> Result<Self> {
        const VERB: &str = "ibv_reg_mr";
        check_access(access)?;
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
        let buf = Buffer::new(len)
            .ok_or_else(|| Error::invalid(VERB, format!("cannot allocate {len} bytes")))?;
        let addr = buf.ptr.as_ptr();
        // SAFETY: the PD is live; `addr..addr+len` is a live allocation that
        // `Owned` keeps (in `keep`) until after ibv_dereg_mr. iova = addr, as
        // plain ibv_reg_mr does; the _iova2 form accepts every access flag.
        let raw = unsafe {
            sys::ibv_reg_mr_iova2(pd.as_ptr(), addr.cast(), len, addr as u64, access.bits())
        };
        let raw = check_ptr(VERB, raw)?;
        let tally = Tally::new(pd.users(), UserKind::MemoryRegion, 1);
        // SAFETY: a fresh MR owned by nobody else; it keeps its PD and buffer alive.
        let inner = unsafe { Owned::new(raw, (pd.clone(), buf, tally)) };
        Ok(MemoryRegion {
            inner: Arc::new(inner),
            access,
        })
    }

    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: the MR is live while `self` is; libibverbs does not change
        // these fields after ibv_reg_mr returns.
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

    fn buffer(&self) -> &Buffer {
        &self.inner.keep().1
    }

    /// The region's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.buffer().layout.size()
    }

    /// Always false: empty regions are refused at registration.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The local key, for scatter/gather entries.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// The remote key, for peers' RDMA operations.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// The address peers use for RDMA operations on this region (its iova).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.raw().addr as u64
    }

    /// The access rights it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain it is registered in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().0
    }

    fn check_range(&self, verb: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::invalid(
                verb,
                format!(
                    "bytes {offset}..{} are outside the {}-byte region",
                    offset.saturating_add(len),
                    self.len()
                ),
            )),
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
        // `offset..offset + data.len()` is inside the live buffer (checked
        // above), so the `add` stays in the allocation and the destination
        // is valid for writes; `data` cannot overlap it because the buffer
        // is never lent out as a Rust reference. `&mut self` excludes every
        // other Rust access for the duration; the device's accesses are
        // outside Rust's memory model and met only by volatile stores.
        // SAFETY: in bounds, no overlap, no racing Rust access (above).
        unsafe { volatile_write(self.buffer().ptr.as_ptr().add(offset), data) };
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
        // `offset..offset + out.len()` is inside the live buffer (checked
        // above), so the `add` stays in the allocation and the source is
        // valid for reads; `out` cannot overlap it because the buffer is
        // never lent out as a Rust reference. No Rust write can run while
        // `&self` is held (writes take `&mut self`); the device's writes are
        // outside Rust's memory model and met only by volatile loads.
        // SAFETY: in bounds, no overlap, no racing Rust write (above).
        unsafe { volatile_read(self.buffer().ptr.as_ptr().add(offset), out) };
        Ok(())
    }

    /// The whole region copied into a `Vec`.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.read(0, &mut v).expect("the whole region is in range");
        v
    }

    /// Deregisters the region now and frees its buffer, reporting failure.
    ///
    /// On failure the region stays registered and its buffer is leaked, so
    /// the device can never touch freed memory.
    #[doc(alias = "ibv_dereg_mr")]
    pub fn close(self) -> Result<()> {
        crate::handle::close_shared(self.inner)
    }

    /// Splits the region into [`Chunk`]s of `chunk_len` bytes (the last one
    /// may be shorter): owned, disjoint pieces that can be lent out as
    /// slices and moved into work requests.
    ///
    /// Refused for regions registered with `REMOTE_WRITE`, `REMOTE_ATOMIC`
    /// or `MW_BIND` (a memory window bound to the region may give peers
    /// write access): a peer could write them at any time, so they must
    /// never be seen as Rust slices; use [`read`](Self::read) and
    /// [`write`](Self::write) on those.
    pub fn into_chunks(self, chunk_len: usize) -> Result<Vec<Chunk>> {
        let remote = self.access
            & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::MW_BIND);
        if !remote.is_empty() {
            return Err(Error::invalid(
                "MemoryRegion::into_chunks",
                format!("the region is registered with {remote:?}: peers may write it (directly or through a memory window), so it has no slices"),
            ));
        }
        if chunk_len == 0 {
            return Err(Error::invalid(
                "MemoryRegion::into_chunks",
                "chunk length 0",
            ));
        }
        let len = self.len();
        let local_write = self.access.contains(AccessFlags::LOCAL_WRITE);
        Ok((0..len)
            .step_by(chunk_len)
            .map(|offset| Chunk {
                mr: Arc::clone(&self.inner),
                offset,
                len: chunk_len.min(len - offset),
                local_write,
            })
            .collect())
    }
}

/// The word the volatile copies move at once where the region side is aligned.
const WORD: usize = std::mem::size_of::<u64>();

/// Copies `out.len()` bytes from `src` into `out`, loading from `src` only
/// with volatile reads: single bytes until `src` is 8-byte aligned, aligned
/// `u64` words, then single bytes for the rest. For memory that something
/// outside the program (the device, a peer through it) may write meanwhile:
/// volatile loads are each done once, as written, and no reference to the
/// source is ever made. Bytes written during the copy may come out torn
/// (each byte is one value that byte held; nothing more is promised).
///
/// # Safety
/// `src..src + out.len()` is valid for reads and does not overlap `out`.
unsafe fn volatile_read(src: *const u8, out: &mut [u8]) {
    let len = out.len();
    // `align_offset` may answer "cannot" (usize::MAX); then every byte is
    // copied singly, which is slower but just as correct.
    let head = src.align_offset(WORD).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`, so `src + i` is in the readable range (caller).
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
    while len - i >= WORD {
        // `src + i .. src + i + 8` is in the readable range (`i + 8 <=
        // len`), and `src + i` is 8-byte aligned: `src + head` is (`head <
        // len` here, so it is the real `align_offset`), and `i` advances
        // from `head` in steps of 8.
        // SAFETY: in range and aligned (above).
        let word = unsafe { src.add(i).cast::<u64>().read_volatile() };
        out[i..i + WORD].copy_from_slice(&word.to_ne_bytes());
        i += WORD;
    }
    while i < len {
        // SAFETY: `i < len`, as in the first loop.
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
}

/// Copies `data` to `dst`, storing to `dst` only with volatile writes, in
/// the same pieces as [`volatile_read`].
///
/// # Safety
/// `dst..dst + data.len()` is valid for writes and does not overlap `data`.
unsafe fn volatile_write(dst: *mut u8, data: &[u8]) {
    let len = data.len();
    // As in `volatile_read`: usize::MAX only makes the copy bytewise.
    let head = dst.align_offset(WORD).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`, so `dst + i` is in the writable range (caller).
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
    }
    while len - i >= WORD {
        let word = u64::from_ne_bytes(data[i..i + WORD].try_into().expect("8 bytes"));
        // SAFETY: `dst + i .. dst + i + 8` is in the writable range
        // (`i + 8 <= len`) and 8-byte aligned, as argued in `volatile_read`.
        unsafe { dst.add(i).cast::<u64>().write_volatile(word) };
        i += WORD;
    }
    while i < len {
        // SAFETY: `i < len`, as in the first loop.
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
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
fn check_access(access: AccessFlags) -> Result<()> {
    let remote = access & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if !remote.is_empty() && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(
            "ibv_reg_mr",
            format!("{remote:?} requires AccessFlags::LOCAL_WRITE (IBV_ACCESS_LOCAL_WRITE)"),
        ));
    }
    Ok(())
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_write_needs_local_write() {
        assert!(check_access(AccessFlags::REMOTE_READ).is_ok());
        assert!(check_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).is_ok());
        let e = check_access(AccessFlags::REMOTE_WRITE).unwrap_err();
        assert!(e.to_string().contains("IBV_ACCESS_LOCAL_WRITE"), "{e}");
        assert!(check_access(AccessFlags::REMOTE_ATOMIC).is_err());
    }

    #[test]
    fn access_flags_match_c() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
    }

    #[test]
    fn buffers_are_page_aligned_and_zeroed() {
        let b = Buffer::new(10_000).unwrap();
        assert_eq!(b.ptr.as_ptr() as usize % page_size(), 0);
        // SAFETY: 10_000 bytes were just allocated and zeroed.
        let s = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), 10_000) };
        assert!(s.iter().all(|&x| x == 0));
        assert!(Buffer::new(0).is_none());
    }

    /// A 40-byte, 8-byte-aligned buffer holding 1, 2, 3, ...
    fn numbered() -> [u64; 5] {
        let mut words = [0u64; 5];
        for (i, w) in words.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            for (j, x) in b.iter_mut().enumerate() {
                *x = (i * 8 + j + 1) as u8;
            }
            *w = u64::from_ne_bytes(b);
        }
        words
    }

    fn bytes(words: &[u64; 5]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn volatile_read_copies_every_offset_and_length() {
        let words = numbered();
        let plain = bytes(&words);
        let base = words.as_ptr().cast::<u8>();
        for offset in 0..=(8 + 7) {
            for len in 0..=17 {
                let mut out = vec![0xeeu8; len];
                // SAFETY: offset + len <= 15 + 17 = 32 <= 40 bytes of `words`,
                // which `out` (a separate allocation) does not overlap.
                unsafe { volatile_read(base.add(offset), &mut out) };
                assert_eq!(
                    out,
                    plain[offset..offset + len],
                    "offset {offset} len {len}"
                );
            }
        }
    }

    #[test]
    fn volatile_write_touches_exactly_its_range() {
        let data: Vec<u8> = (0..17u8).map(|b| 0xa0 | b).collect();
        for offset in 0..=(8 + 7) {
            for len in 0..=17 {
                let mut words = numbered();
                let before = bytes(&words);
                let base = words.as_mut_ptr().cast::<u8>();
                // SAFETY: offset + len <= 32 <= 40 bytes of `words`, which
                // `data` (a separate allocation) does not overlap.
                unsafe { volatile_write(base.add(offset), &data[..len]) };
                let after = bytes(&words);
                assert_eq!(
                    after[..offset],
                    before[..offset],
                    "offset {offset} len {len}"
                );
                assert_eq!(
                    after[offset..offset + len],
                    data[..len],
                    "offset {offset} len {len}"
                );
                assert_eq!(
                    after[offset + len..],
                    before[offset + len..],
                    "offset {offset} len {len}"
                );
            }
        }
    }
}

//! The memory a region is registered over: [`RegisterBuffer`], the buffers a
//! program owns and moves into a region, and [`Pages`], the crate's own
//! page-aligned mapping (normal or huge pages).

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// A buffer a program owns that a memory region can be registered over
/// ([`ProtectionDomain::register_owned`](crate::ProtectionDomain::register_owned)).
///
/// The region takes the buffer by value for as long as it is registered, so
/// no Rust code can reach its bytes meanwhile except through the region's
/// own accessors, and hands it back with
/// [`MemoryRegion::into_inner`](crate::MemoryRegion::into_inner) once
/// `ibv_dereg_mr` has succeeded. Implemented for `Vec<u8>` (its `len`
/// bytes, not its capacity), `Box<[u8]>`, `&'static mut [u8]`, [`Pages`],
/// and with the crate's features for `memmap2::MmapMut` (`memmap2`) and
/// `bytes::BytesMut` (`bytes`).
///
/// # Safety
/// For every value `b` of the type, `b.bytes_to_register()` returns bytes
/// that:
/// * nothing but `b` refers to (no other value, handle or thread reads or
///   writes them while `b` lives: `b` owns them exclusively);
/// * stay valid for reads and writes, at the same address, while `b` is not
///   moved and no other method of `b` is called, until `b` is dropped.
///
/// The crate boxes `b` before it asks, and then neither moves `b` nor
/// calls anything of it (other than dropping it) until it hands `b` back,
/// after the device can no longer reach the bytes. Types whose bytes live
/// in their own heap allocation or mapping, like those above, keep them in
/// place when moved as well.
#[doc(alias = "ibv_reg_mr")]
pub unsafe trait RegisterBuffer: Send + 'static {
    /// The bytes to register.
    fn bytes_to_register(&mut self) -> &mut [u8];
}

// SAFETY: a Vec owns its heap allocation exclusively, and the allocation
// stays where it is while the Vec is not used (moving a Vec moves only its
// pointer, length and capacity).
unsafe impl RegisterBuffer for Vec<u8> {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

// SAFETY: as for Vec: an exclusively owned heap allocation that a move
// does not move.
unsafe impl RegisterBuffer for Box<[u8]> {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: a `&'static mut` is the only reference to its bytes for as long
// as it lives, and `'static` bytes never move or go away.
unsafe impl RegisterBuffer for &'static mut [u8] {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self
    }
}

// SAFETY: a `Pages` owns its mapping exclusively (made in `Pages::map`,
// unmapped only in its `Drop`); a move moves only the pointer.
unsafe impl RegisterBuffer for Pages {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self
    }
}

/// A memory-mapped file (or anonymous mapping), registered in place: a
/// region over a file's pages moves data between the device and the page
/// cache with no copy.
///
/// What the crate can promise here is what the mapping promises: creating
/// a file mapping is `unsafe` in memmap2 because another process, or this
/// one through the file, may change or truncate the file meanwhile. The
/// registration pins the pages that back the mapping at registration time
/// (`ibv_reg_mr`), so the device keeps reaching those same pages whatever
/// happens to the file: when the file is truncated, what the device then
/// writes beyond the new end lands in pages no longer part of the file and
/// is lost with them, and this process's own reads of that range
/// ([`MemoryRegion::read`](crate::MemoryRegion::read)) end it with
/// `SIGBUS`, as any access to a mapping past its file's end does.
///
/// Linux 6.5 and later refuse to pin writable shared mappings of files on
/// most file systems for long (`ibv_reg_mr` fails with `EFAULT` when the
/// access includes [`LOCAL_WRITE`](crate::AccessFlags::LOCAL_WRITE)): use
/// a read-only region as a source there, or a tmpfs or hugetlbfs file.
// An MmapMut owns its mapping exclusively (it unmaps it when dropped and a
// move moves only the pointer); the file behind it is the caller's, who
// took on its changes when creating the map (memmap2's constructors are
// `unsafe` for that).
#[cfg(feature = "memmap2")]
#[cfg_attr(docsrs, doc(cfg(feature = "memmap2")))]
// SAFETY: an exclusively owned mapping that stays put (above).
unsafe impl RegisterBuffer for memmap2::MmapMut {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self
    }
}

/// A `bytes` buffer, registered over its `len` initialized bytes.
///
/// A `BytesMut` split from another (`split_off`, `split_to`) shares its
/// allocation with it but never its bytes, so registering one leaves the
/// other free to use; `unsplit` them again after
/// [`into_inner`](crate::MemoryRegion::into_inner).
// A BytesMut's `len` bytes are its own (handles split from the same
// allocation own disjoint ranges), and they move or are reused only through
// `&mut self` methods (reserve, unsplit, ...), which the crate never calls
// on a registered buffer.
#[cfg(feature = "bytes")]
#[cfg_attr(docsrs, doc(cfg(feature = "bytes")))]
// SAFETY: bytes of its own that stay put while it is not used (above).
unsafe impl RegisterBuffer for bytes::BytesMut {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        self
    }
}

/// The bytes a region is registered over, and their owner.
pub(crate) struct Memory {
    /// The first byte (dangling for a dma-buf, which has no CPU address).
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    /// The address the device knows the first byte by: where local and
    /// remote requests name it.
    pub(super) iova: u64,
    owner: Owner,
}

// SAFETY: `Memory` is the address of bytes its owner (which is `Send`)
// owns exclusively, and that owner. Nothing in it is tied to a thread.
unsafe impl Send for Memory {}
// `Memory` itself offers no access to the bytes; its holders follow the
// pointer under their own rules (a region's volatile copies, `read` through
// `&` and `write` through `&mut`; chunks' disjoint slices), and the owner is
// never used through `&` (see `Owner`).
// SAFETY: nothing is reached through `&Memory` but by those rules (above).
unsafe impl Sync for Memory {}

/// The owner of a region's bytes, type-erased (its type is the
/// `B` of the `MemoryRegion<B>` that holds it).
struct Owner(Box<dyn Any + Send>);

// SAFETY: an `Owner` is never used through a shared reference: the box is
// only moved out (`Memory::into_owner`) or dropped, both by value, so
// sharing `&Owner` between threads shares nothing.
unsafe impl Sync for Owner {}

impl Memory {
    pub(super) fn new(ptr: NonNull<u8>, len: usize, iova: u64, owner: Box<dyn Any + Send>) -> Self {
        Memory {
            ptr,
            len,
            iova,
            owner: Owner(owner),
        }
    }

    /// The owner, by value.
    ///
    /// # Safety
    /// The owner was made from a `Box<B>`.
    pub(super) unsafe fn into_owner<B: Any>(self) -> B {
        debug_assert!(self.owner.0.is::<B>());
        let raw = Box::into_raw(self.owner.0).cast::<B>();
        // SAFETY: the box held a `B` (caller), so the data pointer of the
        // fat pointer is a `Box<B>`'s.
        *unsafe { Box::from_raw(raw) }
    }
}

/// Page-aligned, zeroed memory of its own mapping (`mmap` of anonymous
/// memory), normal or huge pages: what
/// [`ProtectionDomain::register`](crate::ProtectionDomain::register)
/// allocates, and a buffer of its own to register with
/// [`register_owned`](crate::ProtectionDomain::register_owned).
///
/// Huge pages (`MAP_HUGETLB`, the system's default huge page size) need
/// far fewer translations: a region of 1 GiB over 2 MiB pages pins 512
/// pages where 4 KiB pages need 262,144 (see the registration figures in
/// the [performance guide](crate::guide::performance)). They come from the
/// pool the administrator reserved (`/proc/sys/vm/nr_hugepages`);
/// [`huge`](Self::huge) refuses with [`Error::HugePages`] when it is short,
/// [`huge_or_normal`](Self::huge_or_normal) falls back to normal pages.
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context, Pages};
/// let pd = Context::open_first()?.alloc_pd()?;
/// let pages = Pages::huge_or_normal(64 << 20)?;
/// println!("huge pages: {}", pages.is_huge());
/// let mr = pd.register_owned(pages, AccessFlags::LOCAL_WRITE)?;
/// let pages = mr.into_inner()?; // deregistered: the bytes are a slice again
/// assert!(pages.iter().all(|&b| b == 0));
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[doc(alias = "MAP_HUGETLB")]
pub struct Pages {
    ptr: NonNull<u8>,
    len: usize,
    /// The mapping's length: `len` rounded up to whole pages.
    map_len: usize,
    page_size: usize,
    huge: bool,
}

// SAFETY: plain memory owned by one value; nothing in it is tied to a thread.
unsafe impl Send for Pages {}
// SAFETY: shared access is `&[u8]` only (Deref); writes need `&mut`.
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zeroed bytes on normal pages, page-aligned.
    ///
    /// [`Error::InvalidArgument`] for `len == 0` or a length that cannot be
    /// rounded up to whole pages; the `mmap` error when the system refuses.
    pub fn new(len: usize) -> Result<Pages> {
        Pages::map(len, super::page_size(), false)
    }

    /// `len` zeroed bytes on huge pages of the system's default size, the
    /// mapping rounded up to whole huge pages.
    ///
    /// [`Error::HugePages`] when the system has no huge pages or not enough
    /// of them free (nothing is mapped then).
    pub fn huge(len: usize) -> Result<Pages> {
        let info = HugeInfo::read();
        if info.page_size == 0 {
            return Err(info.refusal(len, 0));
        }
        Pages::map(len, info.page_size, true)
    }

    /// Huge pages where the system has them free, normal pages otherwise:
    /// [`is_huge`](Self::is_huge) tells which.
    pub fn huge_or_normal(len: usize) -> Result<Pages> {
        match Pages::huge(len) {
            Err(Error::HugePages { .. }) => Pages::new(len),
            other => other,
        }
    }

    fn map(len: usize, page_size: usize, huge: bool) -> Result<Pages> {
        const VERB: &str = "mmap";
        if len == 0 {
            return Err(Error::invalid(VERB, "cannot map 0 bytes"));
        }
        let map_len = len
            .checked_next_multiple_of(page_size)
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid(
                    VERB,
                    format!("{len} bytes cannot be rounded up to pages of {page_size}"),
                )
            })?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if huge {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: a new anonymous mapping at an address of the kernel's
        // choosing; it overlaps nothing the program has.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let errno = crate::error::last_errno(libc::ENOMEM);
            return Err(if huge {
                HugeInfo::read().refusal(len, errno)
            } else {
                Error::Verb { verb: VERB, errno }
            });
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| Error::invalid(VERB, "mapped at address 0"))?;
        Ok(Pages {
            ptr,
            len,
            map_len,
            page_size,
            huge,
        })
    }

    /// Whether the bytes are on huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// The size of the pages the bytes are on.
    pub fn page_size(&self) -> usize {
        self.page_size
    }
}

impl Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `len` bytes of a live mapping this value owns; shared
        // access through `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, exclusive through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once. A region over
        // these pages drops its `Pages` only after ibv_dereg_mr succeeded.
        // munmap of a mapping we own cannot fail in a way we could act on.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len) };
    }
}

impl fmt::Debug for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pages")
            .field("len", &self.len)
            .field("page_size", &self.page_size)
            .field("huge", &self.huge)
            .finish()
    }
}

/// The system's huge pages, from `/proc/meminfo`.
struct HugeInfo {
    page_size: usize,
    free: u64,
    total: u64,
}

impl HugeInfo {
    #[cold]
    fn read() -> HugeInfo {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HugeInfo::parse(&text)
    }

    fn parse(meminfo: &str) -> HugeInfo {
        let field = |name: &str| -> u64 {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        HugeInfo {
            page_size: usize::try_from(field("Hugepagesize").saturating_mul(1024)).unwrap_or(0),
            free: field("HugePages_Free"),
            total: field("HugePages_Total"),
        }
    }

    #[cold]
    fn refusal(&self, bytes: usize, errno: i32) -> Error {
        Error::HugePages {
            bytes,
            page_size: self.page_size,
            free: self.free,
            total: self.total,
            errno,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_huge_fields_are_read() {
        let text = "MemTotal: 100 kB\nHugePages_Total:     512\nHugePages_Free:      17\nHugePages_Rsvd:        0\nHugepagesize:       2048 kB\n";
        let h = HugeInfo::parse(text);
        assert_eq!((h.page_size, h.free, h.total), (2 << 20, 17, 512));
        let none = HugeInfo::parse("MemTotal: 100 kB\n");
        assert_eq!(none.page_size, 0);
        let e = none.refusal(4096, 0).to_string();
        assert!(e.contains("no huge pages"), "{e}");
        let e = h.refusal(1 << 30, libc::ENOMEM).to_string();
        assert!(
            e.contains("17 of the 512") && e.contains("nr_hugepages"),
            "{e}"
        );
    }

    #[test]
    fn pages_are_zeroed_aligned_and_writable() {
        let mut p = Pages::new(10_000).unwrap();
        assert_eq!(p.len(), 10_000);
        assert_eq!(p.as_ptr() as usize % super::super::page_size(), 0);
        assert!(p.iter().all(|&b| b == 0));
        p[9_999] = 7;
        assert_eq!(p[9_999], 7);
        assert!(!p.is_huge());
        assert!(Pages::new(0).is_err());
        assert!(Pages::new(usize::MAX).is_err());
    }

    #[test]
    fn huge_pages_or_their_typed_refusal() {
        match Pages::huge(1) {
            Ok(p) => assert!(p.is_huge() && p.page_size() > super::super::page_size()),
            Err(e) => assert!(matches!(e, Error::HugePages { bytes: 1, .. }), "{e}"),
        }
        let p = Pages::huge_or_normal(1).unwrap();
        assert_eq!(p.len(), 1);
    }
}

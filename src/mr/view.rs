//! Reading in place what peers may write: a view of a registered region's
//! bytes whose every load is atomic, so a write by the device at the same
//! moment is a race the language defines (another agent's store), not
//! undefined behaviour.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8};

use crate::error::{Error, Result};

/// Bytes of a [`MemoryRegion`](super::MemoryRegion) that the device or a
/// peer may write at any moment, read in place: the region's own memory
/// seen as atomic bytes ([`bytes`](Self::bytes)) or atomic 8-byte words
/// ([`words`](Self::words)), with no copy.
///
/// A region peers may write is never lent out as a `&[u8]`: the compiler
/// may assume a `&[u8]` does not change, and a peer's RDMA write would break
/// that. An atomic load may race with another writer, so these views are
/// sound whatever the device does meanwhile. `Relaxed` loads compile to
/// plain loads on x86-64 and AArch64; what they cost over a `&[u8]` is that
/// the compiler neither merges nor vectorizes them. Verifying a 4 KiB
/// message word by word in place takes fewer instructions than copying it
/// out with [`MemoryRegion::read`](super::MemoryRegion::read) and
/// verifying the copy (the bench's `inplace` part measures both).
///
/// What a load sees while a peer writes is the device's business: an
/// RDMA write promises no order between its bytes and no word atomicity (a
/// word read mid-write may mix old and new bytes; only RDMA atomics and
/// `ATOMIC_WRITE` land 8 bytes whole). Read what the protocol says is
/// complete: after the completion of a write with immediate, or after a
/// flag the peer writes in a later message.
///
/// While a view is alive the region is borrowed, so the program's own
/// [`write`](super::MemoryRegion::write) (which takes `&mut`) cannot run;
/// the region stays registered and its memory alive.
///
/// ```no_run
/// use std::sync::atomic::Ordering::Relaxed;
/// use rdma_verbs::{AccessFlags, Context};
/// let pd = Context::open_first()?.alloc_pd()?;
/// let ring = pd.register(
///     64 * 4096,
///     AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
/// )?;
/// // ... a write with immediate says slot 3 is complete ...
/// let slot = ring.view(3 * 4096, 4096)?;
/// let sum = slot.words()?.iter().fold(0u64, |s, w| s.wrapping_add(w.load(Relaxed)));
/// let kind = slot.bytes()[0].load(Relaxed);
/// println!("kind {kind}, checksum {sum:#x}");
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct PeerView<'a> {
    bytes: &'a [AtomicU8],
}

impl<'a> PeerView<'a> {
    /// # Safety
    /// `ptr..ptr + len` is valid for reads for `'a`, is never accessed
    /// through a non-atomic Rust reference during `'a`, and Rust writes to
    /// it during `'a` are atomic or do not happen (the device's writes are
    /// outside the program).
    pub(super) unsafe fn new(ptr: *const u8, len: usize) -> Self {
        // `AtomicU8` has the size and alignment of `u8`, so any byte range
        // is a valid `[AtomicU8]`; its interior mutability makes a shared
        // reference to bytes that change meanwhile allowed.
        // SAFETY: as above; validity and no non-atomic Rust access: the caller.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU8>(), len) };
        PeerView { bytes }
    }

    /// The view's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the view has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes, each loaded on its own (`load(Ordering::Relaxed)` is a
    /// plain byte load).
    #[inline]
    pub fn bytes(&self) -> &'a [AtomicU8] {
        self.bytes
    }

    /// The bytes as 8-byte words in native byte order, for a view that
    /// starts on an 8-byte boundary and is a whole number of words long
    /// (a region's memory is page-aligned unless the program's buffer was
    /// not: see [`RegisterBuffer`](super::RegisterBuffer)).
    ///
    /// Refused with [`Error::InvalidArgument`] otherwise, naming the
    /// address and length.
    #[inline]
    pub fn words(&self) -> Result<&'a [AtomicU64]> {
        let ptr = self.bytes.as_ptr();
        let len = self.bytes.len();
        if ptr.align_offset(8) != 0 || len % 8 != 0 {
            return Err(misaligned(ptr as usize, len));
        }
        // `ptr` is 8-byte aligned and `len` a multiple of 8 (just checked),
        // so the bytes are exactly `len / 8` `AtomicU64`s, which have the
        // size and alignment of `u64`; validity and the absence of
        // non-atomic Rust access carry over from `self` (see `new`).
        // `bytes` and `words` of one view may then race with each other,
        // but only as loads (no store is ever made through a view), and
        // mixed-size atomic loads may race (`std::sync::atomic`, "Memory
        // model for atomic accesses").
        // SAFETY: aligned, whole words, and only loads (above).
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<AtomicU64>(), len / 8) })
    }

    /// The `len` bytes at `offset` of this view.
    ///
    /// Refused with [`Error::InvalidArgument`] if they are not all inside it.
    pub fn slice(&self, offset: usize, len: usize) -> Result<PeerView<'a>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(PeerView {
                bytes: &self.bytes[offset..end],
            }),
            _ => Err(outside("PeerView::slice", offset, len, self.len())),
        }
    }

    /// Copies the view into `out`, which must be as long, as
    /// [`MemoryRegion::read`](super::MemoryRegion::read) copies (volatile
    /// loads, aligned words). A shorter or longer `out` is refused with
    /// [`Error::InvalidArgument`].
    pub fn copy_to(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.len() {
            return Err(Error::invalid(
                "PeerView::copy_to",
                format!(
                    "the view has {} bytes, the buffer {}",
                    self.len(),
                    out.len()
                ),
            ));
        }
        // The view's bytes are valid for reads (see `new`) and cannot
        // overlap `out`, a `&mut` the program holds.
        // SAFETY: readable for `out.len()` bytes, no overlap (above).
        unsafe { super::volatile_read(self.bytes.as_ptr().cast(), out) };
        Ok(())
    }
}

impl fmt::Debug for PeerView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerView")
            .field("addr", &self.bytes.as_ptr())
            .field("len", &self.len())
            .finish()
    }
}

#[cold]
fn misaligned(addr: usize, len: usize) -> Error {
    Error::invalid(
        "PeerView::words",
        format!(
            "the view's {len} bytes at {addr:#x} are not whole 8-byte words on an 8-byte boundary \
             (use bytes(), or a view that starts and ends on one)"
        ),
    )
}

#[cold]
pub(super) fn outside(verb: &'static str, offset: usize, len: usize, total: usize) -> Error {
    Error::invalid(
        verb,
        format!(
            "bytes {offset}..{} are outside the {total}-byte region",
            offset.saturating_add(len)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// Views over a plain buffer that nothing else touches.
    fn with_view<R>(f: impl FnOnce(PeerView<'_>) -> R) -> R {
        let words: Vec<u64> = (1..=8).collect();
        // SAFETY: the Vec's 64 bytes live through `f`, and nothing else
        // reads or writes them meanwhile.
        f(unsafe { PeerView::new(words.as_ptr().cast(), 64) })
    }

    #[test]
    fn words_and_bytes_read_the_same_memory() {
        with_view(|v| {
            let w = v.words().expect("aligned");
            assert_eq!(w.len(), 8);
            assert_eq!(w[2].load(Ordering::Relaxed), 3);
            assert_eq!(v.bytes()[16].load(Ordering::Relaxed), 3u64.to_ne_bytes()[0]);
        });
    }

    #[test]
    fn misaligned_or_partial_words_are_refused_with_the_address() {
        with_view(|v| {
            let e = v.slice(1, 8).unwrap().words().unwrap_err().to_string();
            assert!(e.contains("not whole 8-byte words"), "{e}");
            assert!(v.slice(8, 12).unwrap().words().is_err());
            assert_eq!(v.slice(8, 16).unwrap().words().unwrap().len(), 2);
        });
    }

    #[test]
    fn slices_past_the_end_or_overflowing_are_refused() {
        with_view(|v| {
            assert!(v.slice(64, 0).is_ok());
            let e = v.slice(60, 5).unwrap_err().to_string();
            assert!(e.contains("60..65") && e.contains("64-byte"), "{e}");
            assert!(v.slice(usize::MAX, 2).is_err());
        });
    }

    #[test]
    fn copy_to_needs_the_same_length() {
        with_view(|v| {
            let mut out = [0u8; 8];
            v.slice(8, 8).unwrap().copy_to(&mut out).unwrap();
            assert_eq!(u64::from_ne_bytes(out), 2);
            assert!(v.slice(0, 9).unwrap().copy_to(&mut out).is_err());
        });
    }
}

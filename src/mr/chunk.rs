//! The buffers work requests take: [`Chunk`], an owned piece of a
//! registered region, and [`SharedChunk`], a read-only one many sends may
//! name at once.

use std::fmt;
use std::sync::Arc;

use super::MrInner;
use crate::sys;

/// An owned, disjoint piece of a registered [`MemoryRegion`](super::MemoryRegion): the buffer
/// type work requests take.
///
/// A chunk is either in the caller's hands, where it is an ordinary byte
/// slice ([`as_slice`](Self::as_slice), [`as_mut_slice`](Self::as_mut_slice)),
/// or moved into a posted work request, where the device may use it and no
/// Rust code can reach it; the completion hands it back. Chunks keep their
/// region (and so its protection domain) registered until the last of them
/// is dropped.
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context};
/// let pd = Context::open_first()?.alloc_pd()?;
/// let mut chunks = pd.alloc_chunks(4, 4096, AccessFlags::LOCAL_WRITE)?;
/// chunks[0].as_mut_slice()[..5].copy_from_slice(b"hello");
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
pub struct Chunk {
    pub(super) mr: Arc<MrInner>,
    pub(super) offset: usize,
    pub(super) len: usize,
    /// Whether the region was registered with `LOCAL_WRITE`, so that the
    /// device may write the chunk: copied from the region when the chunk
    /// is made, so the data path tests one flag per entry.
    pub(super) local_write: bool,
}

impl Chunk {
    #[inline]
    fn raw(&self) -> &sys::ibv_mr {
        // SAFETY: the MR is live while any chunk holds it.
        unsafe { &*self.mr.as_ptr() }
    }

    /// The chunk's length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chunk has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key of its region.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// The remote key of its region.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// The chunk's device address (its region's iova plus its offset):
    /// where scatter/gather entries name it.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.mr.keep().memory.iova + self.offset as u64
    }

    #[inline]
    fn ptr(&self) -> *mut u8 {
        // SAFETY: `offset <= len of the memory`, fixed at creation; chunks
        // are made only of regions with CPU-addressable memory
        // (`MemoryRegion::split` needs `B: RegisterBuffer`).
        unsafe { self.mr.keep().memory.ptr.as_ptr().add(self.offset) }
    }

    /// The bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // The range is inside the live buffer and belongs to this chunk alone
        // (chunks are disjoint and not Clone). The device does not write it
        // while the caller holds the chunk: the region has no remote write
        // access (checked in `into_chunks`) and the chunk is not posted
        // (posting moves it away).
        // SAFETY: in bounds, unaliased, not written by the device (see above).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }

    /// The bytes, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }

    /// Where the chunk starts in its region's buffer.
    #[inline]
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Which region the chunk is of (the region's address in memory,
    /// compared, never followed: the region lives while a chunk of it
    /// does).
    #[inline]
    pub(crate) fn region_id(&self) -> usize {
        Arc::as_ptr(&self.mr) as usize
    }

    /// The region's handle (which keeps it registered, and its memory,
    /// while it is held).
    #[inline]
    pub(crate) fn region(&self) -> &Arc<MrInner> {
        &self.mr
    }

    /// The protection domain's object: unique among live PDs of every
    /// context (kernel PD handles restart at 0 in each context).
    #[inline]
    pub(crate) fn pd_ptr(&self) -> *mut sys::ibv_pd {
        self.mr.keep().pd.as_ptr()
    }

    /// Whether the device may write the chunk: its region was registered
    /// with [`AccessFlags::LOCAL_WRITE`](super::AccessFlags::LOCAL_WRITE). Receives, RDMA READ and atomic
    /// destinations need it; the post refuses them otherwise.
    #[inline]
    pub fn local_write(&self) -> bool {
        self.local_write
    }

    /// Whether `other` is a chunk of the same region.
    #[inline]
    pub fn same_region(&self, other: &Chunk) -> bool {
        Arc::ptr_eq(&self.mr, &other.mr)
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chunk")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .finish()
    }
}

/// A read-only [`Chunk`] that many sends and RDMA writes may name at once.
///
/// The device only reads the source of a send or an RDMA write, so one
/// buffer can be the source of any number of outstanding requests, as in C
/// (a stream of writes needs one source buffer, not one per request). A
/// `SharedChunk` is a reference-counted chunk that only ever gives `&[u8]`:
/// [`SendWr::sge_shared`](crate::qp::SendWr::sge_shared) puts a clone in
/// the request, which is let go when the request ends: when the
/// [`Completed`](crate::qp::Completed) that `reclaim`, `reset` or
/// `close_and_reclaim` hands back for it is dropped. Once no
/// clone is left, [`try_into_chunk`](Self::try_into_chunk) gives the
/// writable chunk back. RDMA reads and atomics, which write into their
/// local entries, refuse it.
///
/// ```no_run
/// use rdma_verbs::{AccessFlags, Context, SharedChunk};
/// let pd = Context::open_first()?.alloc_pd()?;
/// let mut chunk = pd.alloc_chunks(1, 4096, AccessFlags::LOCAL_WRITE)?.remove(0);
/// chunk.as_mut_slice().fill(7);
/// let src = SharedChunk::new(chunk);
/// // ... post many sends or writes naming `src`, reclaim their completions ...
/// let chunk = src.try_into_chunk().expect("no request holds it any more");
/// # drop(chunk);
/// # Ok::<(), rdma_verbs::Error>(())
/// ```
#[derive(Clone)]
pub struct SharedChunk(Arc<Chunk>);

impl SharedChunk {
    /// Makes `chunk` read-only and shareable.
    #[inline]
    pub fn new(chunk: Chunk) -> Self {
        SharedChunk(Arc::new(chunk))
    }

    #[inline]
    pub(crate) fn chunk(&self) -> &Chunk {
        &self.0
    }

    /// The bytes (the device may be reading them too).
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The local key of its region.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.0.lkey()
    }

    /// Its address.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.0.addr()
    }

    /// How many handles name it: this one, its other clones, the
    /// outstanding requests that hold one, the [`SendTemplate`](crate::qp::SendTemplate)s
    /// made from it, and each QP that keeps it for the outstanding requests
    /// of a template dropped before they ended.
    #[inline]
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The chunk, writable, if this is its only handle (no clone, no
    /// outstanding request, no QP holds one).
    #[inline]
    pub(crate) fn get_mut(&mut self) -> Option<&mut Chunk> {
        Arc::get_mut(&mut self.0)
    }

    /// The writable chunk back, if no other handle and no outstanding
    /// request holds it; otherwise `self` again.
    #[inline]
    pub fn try_into_chunk(self) -> std::result::Result<Chunk, SharedChunk> {
        Arc::try_unwrap(self.0).map_err(SharedChunk)
    }
}

impl fmt::Debug for SharedChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedChunk")
            .field("chunk", &*self.0)
            .field("holders", &self.holders())
            .finish()
    }
}

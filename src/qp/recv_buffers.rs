//! Receive buffers owned by a queue, io_uring "provided buffers" style:
//! [`RecvBuffers`] holds N registered buffers and keeps them posted on a
//! QP (or an SRQ); a completion yields [`Received`], a borrow of the bytes
//! that came, and the buffer goes back to be posted when the borrow ends.
//!
//! It is built on the chunk-moving receives ([`RecvWr`]) and adds no
//! `unsafe`: each buffer is a [`Chunk`] of one region registered with
//! `LOCAL_WRITE` only (no peer may write it, so its bytes may be read as a
//! slice whenever it is not posted), and a buffer is posted again only
//! through `&mut RecvBuffers`, which a live [`Received`] borrows: the bytes
//! cannot change under the borrow.

use std::sync::atomic::{AtomicU32, Ordering};

use super::completed::{Completed, PostError};
use super::request::RecvWr;
use super::QueuePair;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, Chunk};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;

/// The pools of the process: a pool's receives carry its number in the
/// upper 32 bits of their `wr_id` (the lower 32: the buffer's index).
static NEXT_POOL: AtomicU32 = AtomicU32::new(1);

/// Receive buffers owned by a queue: `count` buffers of `size` bytes in
/// one registered region, posted by [`post`](Self::post) (or
/// [`post_srq`](Self::post_srq)) and taken back, one completion at a time,
/// by [`take`](Self::take).
///
/// ```no_run
/// # fn f(pd: &rdma_verbs::ProtectionDomain, qp: &mut rdma_verbs::QueuePair,
/// #      cq: &rdma_verbs::CompletionQueue) -> Result<(), Box<dyn std::error::Error>> {
/// use rdma_verbs::qp::{RecvBuffers, Taken};
/// let mut bufs = RecvBuffers::new(pd, 64, 4096)?;
/// bufs.post(qp)?;
/// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
/// for wc in cq.poll(&mut wcs)?.iter() {
///     if let Taken::Mine(msg) = bufs.take(qp, wc) {
///         println!("{} bytes: {:?}", msg.len(), &msg[..msg.len().min(8)]);
///     } // the buffer is free again here
/// }
/// bufs.post(qp)?; // posts every free buffer in one call
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RecvBuffers {
    /// Indexed by buffer: `Some` while here (free, or lent to a
    /// [`Received`]), `None` while posted.
    chunks: Vec<Option<Chunk>>,
    /// Buffers to post, in the order they became free.
    free: Vec<u32>,
    /// The indexes of the post call being made (room for all, kept).
    posting: Vec<u32>,
    size: usize,
    id: u32,
    /// The region of every buffer (see `Chunk::region_id`) and its first
    /// buffer's address: buffer `i` is `size` bytes at `base + i * size`.
    region: usize,
    base: u64,
}

/// What [`RecvBuffers::take`] made of a completion.
#[derive(Debug)]
pub enum Taken<'a> {
    /// One of this pool's buffers, with the bytes received.
    Mine(Received<'a>),
    /// Another request of the queue (a send, a receive of another pool or
    /// of the caller's own chunks), handed back as [`QueuePair::reclaim_one`]
    /// would.
    Other(Completed),
    /// The completion ends nothing on this QP (see
    /// [`QueuePair::reclaim`]).
    Nothing,
}

/// The bytes one receive brought, borrowed from its [`RecvBuffers`]; the
/// buffer is free to be posted again when this is dropped.
///
/// Dereferences to the received bytes: `byte_len` of them for a successful
/// completion (on a UD QP, the 40-byte GRH area first), none for a failed
/// or flushed one.
#[derive(Debug)]
pub struct Received<'a> {
    pool: &'a mut RecvBuffers,
    index: u32,
    len: usize,
    ok: bool,
}

impl RecvBuffers {
    /// Registers `count` buffers of `size` bytes (one region, `LOCAL_WRITE`
    /// only) in `pd`. Refused: `count` 0 or above `u32::MAX`, `size` 0.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &ProtectionDomain, count: usize, size: usize) -> Result<Self> {
        const VERB: &str = "ibv_reg_mr";
        if count == 0 || u32::try_from(count).is_err() || size == 0 {
            return Err(Error::invalid(
                VERB,
                format!("{count} receive buffers of {size} bytes: both must be at least 1 (and the count at most {})", u32::MAX),
            ));
        }
        let chunks = pd.alloc_chunks(count, size, AccessFlags::LOCAL_WRITE)?;
        let (region, base) = chunks.first().map_or((0, 0), |c| (c.region_id(), c.addr()));
        Ok(RecvBuffers {
            region,
            base,
            chunks: chunks.into_iter().map(Some).collect(),
            free: (0..count as u32).collect(),
            posting: Vec::with_capacity(count),
            size,
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// How many buffers the pool has.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// Whether the pool has no buffers (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The size of each buffer.
    pub fn buffer_size(&self) -> usize {
        self.size
    }

    /// How many buffers wait to be posted.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// How many buffers are posted (or in doubt after a failed post).
    pub fn posted(&self) -> usize {
        self.chunks.iter().filter(|c| c.is_none()).count()
    }

    #[inline]
    fn wr_id(&self, index: u32) -> u64 {
        (u64::from(self.id) << 32) | u64::from(index)
    }

    /// Posts every free buffer to `qp`'s receive queue in one
    /// `ibv_post_recv` call; returns how many. Nothing free: nothing is
    /// called. Refused as [`QueuePair::post_recv`] refuses (the buffers
    /// stay free); a provider failure leaves them posted (in doubt) until
    /// a completion or a RESET brings them back.
    #[doc(alias = "ibv_post_recv")]
    pub fn post(&mut self, qp: &mut QueuePair) -> Result<usize, PostError> {
        self.post_with(usize::MAX, qp)
    }

    /// Posts at most `n` free buffers (the ones freed last), as
    /// [`post`](Self::post) posts all of them; returns how many.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_up_to(&mut self, qp: &mut QueuePair, n: usize) -> Result<usize, PostError> {
        self.post_with(n, qp)
    }

    /// Posts every free buffer to `srq`, as [`post`](Self::post) does to a
    /// QP; completions of them come through any QP of the SRQ.
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn post_srq(&mut self, srq: &SharedReceiveQueue) -> Result<usize, PostError> {
        self.post_with(usize::MAX, &mut &*srq)
    }

    fn post_with(&mut self, most: usize, to: &mut impl RecvQueue) -> Result<usize, PostError> {
        let n = self.free.len().min(most);
        if n == 0 {
            return Ok(0);
        }
        self.posting.clear();
        // The buffers freed last (a refusal puts them back where they were).
        let start = self.free.len() - n;
        self.posting.extend(self.free.drain(start..));
        let (id, chunks) = (self.id, &mut self.chunks);
        let mut wrs = self.posting.iter().filter_map(|&i| {
            let c = chunks[i as usize].take()?;
            Some(RecvWr::new((u64::from(id) << 32) | u64::from(i)).sge(c))
        });
        match to.post(&mut wrs) {
            Ok(()) => Ok(n),
            Err(e) if e.posted == 0 => {
                // Refused before the call: every chunk came back, in
                // request order.
                let mut back = e.returned.into_iter();
                for &i in &self.posting {
                    self.chunks[i as usize] = back.next();
                }
                self.free.extend_from_slice(&self.posting);
                Err(PostError {
                    error: e.error,
                    posted: 0,
                    returned: Vec::new(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Takes back what completion `wc` ends on `qp` (its receive queue, or
    /// its SRQ): one of this pool's buffers as [`Taken::Mine`], with the
    /// bytes received; anything else as [`Taken::Other`], so nothing is
    /// lost.
    #[inline]
    pub fn take<'a>(&'a mut self, qp: &mut QueuePair, wc: &WorkCompletion) -> Taken<'a> {
        match qp.reclaim_one(wc) {
            None => Taken::Nothing,
            Some(c) => match self.keep(c) {
                Ok(index) => {
                    let ok = wc.is_success();
                    let len = if ok {
                        (wc.byte_len() as usize).min(self.size)
                    } else {
                        0
                    };
                    Taken::Mine(Received {
                        pool: self,
                        index,
                        len,
                        ok,
                    })
                }
                Err(c) => Taken::Other(c),
            },
        }
    }

    /// Puts a request of this pool back (one a RESET handed back through
    /// [`QueuePair::reset`] or [`QueuePair::take_released`], or one the
    /// caller reclaimed itself): its buffer is free again. Another
    /// request comes back as `Err`.
    pub fn give_back(&mut self, c: Completed) -> std::result::Result<(), Completed> {
        let index = self.keep(c)?;
        self.free.push(index);
        Ok(())
    }

    /// Stores a request's chunk in its buffer's place if it is this pool's:
    /// its `wr_id` names a posted buffer of the pool, and its one chunk is
    /// that very buffer (a receive the caller posted with a `wr_id` of the
    /// pool's is not the pool's, whatever its chunks).
    fn keep(&mut self, c: Completed) -> std::result::Result<u32, Completed> {
        let index = (c.wr_id & u64::from(u32::MAX)) as u32;
        let at = self.base + u64::from(index) * self.size as u64;
        let ours = c.wr_id == self.wr_id(index)
            && self.chunks.get(index as usize).is_some_and(Option::is_none)
            && c.only_chunk().is_some_and(|ch| {
                ch.region_id() == self.region && ch.addr() == at && ch.len() == self.size
            });
        if !ours {
            return Err(c);
        }
        // `ours` saw exactly one owned chunk: `into_chunk` gives it.
        self.chunks[index as usize] = c.into_chunk();
        Ok(index)
    }
}

/// Where a pool's receives go: a QP's receive queue or an SRQ (generic,
/// so that the post loop is inlined for each).
trait RecvQueue {
    fn post(&mut self, wrs: impl Iterator<Item = RecvWr>) -> Result<(), PostError>;
}

impl RecvQueue for QueuePair {
    #[inline]
    fn post(&mut self, wrs: impl Iterator<Item = RecvWr>) -> Result<(), PostError> {
        self.post_recv(wrs)
    }
}

impl RecvQueue for &SharedReceiveQueue {
    #[inline]
    fn post(&mut self, wrs: impl Iterator<Item = RecvWr>) -> Result<(), PostError> {
        self.post_recv(wrs)
    }
}

impl Received<'_> {
    /// Whether the receive succeeded (otherwise it holds no bytes).
    pub fn is_success(&self) -> bool {
        self.ok
    }

    /// The buffer's index in its pool.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl std::ops::Deref for Received<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.pool.chunks[self.index as usize] {
            Some(c) => &c.as_slice()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Received<'_> {
    /// The buffer is free to be posted again.
    fn drop(&mut self) {
        self.pool.free.push(self.index);
    }
}

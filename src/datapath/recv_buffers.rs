//! Receive buffers owned by a queue, io_uring "provided buffers" style:
//! [`RecvBuffers`] holds N registered buffers and keeps them posted on a
//! QP (or an SRQ); a completion yields [`Received`], a borrow of the bytes
//! that came, and the buffer goes back to be posted when the borrow ends.
//!
//! # Why it is sound
//!
//! Each buffer is a [`Chunk`] of one region registered with `LOCAL_WRITE`
//! only (no peer may write it), which the pool alone holds the chunks of.
//!
//! * **Posted to a QP, the chunk stays in the pool, and the region stays
//!   registered until the device is done.** The buffer's ledger record
//!   holds nothing ([`Loan::Pooled`]); its `wr_id` names the pool (a
//!   process-unique number, upper 32 bits) and the buffer (lower 32).
//!   While the pool lives, it holds the region itself. Before its first
//!   post to a QP (so also before a provider failure can leave records in
//!   doubt), the QP takes a [`PoolPin`]: a share of the pool's
//!   [`PoolCell`], into which the pool, when it is dropped with a buffer
//!   posted to a QP, moves the region's handle. A QP lets go of a pin only
//!   when no record of the pool is in its ledger: after a RESET or its
//!   destruction (every record handed back), or, once the pool is dropped,
//!   when the last of them leaves (each leaving record looks for others).
//!   So the region, and its memory, stay registered while the device may
//!   write any buffer of it, and go when the last such record ends. A
//!   live pool's own receives ([`take`](RecvBuffers::take)) touch no pin.
//! * **The pool reads a buffer only while it is not posted.** A buffer
//!   posted to a QP is marked so (`Where::Qp`); the mark is cleared only when a record
//!   made by the pool's post ([`Loan::Pooled`], which no other post
//!   makes) with the buffer's `wr_id` comes out of the QP's ledger: by
//!   the ledger's rules (see `ledger.rs`) the device is then done with it.
//!   A receive the caller posted with a `wr_id` of the pool's lends its
//!   own chunks and is not taken for the pool's.
//! * **Posted to an SRQ, the chunk moves** into the SRQ's ledger, as a
//!   chunk-moving receive ([`RecvWr`]) lends it, and comes back only from
//!   a record whose one chunk is that very buffer (its region, offset and
//!   length).
//! * A buffer is posted again only through `&mut RecvBuffers`, which a
//!   live [`Received`] borrows: the bytes cannot change under the borrow.
//! * **Buffers of 0 bytes** have no region and no chunk: their requests
//!   have no entry, so no memory is lent to the device at all.
//!
//! The one `unsafe` of the direct post is the provider call and the raw
//! requests it reads ([`RecvBuffers::post`]): one per buffer, kept by the
//! pool, linked for the call from the pool's own arrays.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

mod qp_side;

pub(crate) use qp_side::{PoolCell, PoolPin};

use super::completed::{Completed, PostError};
use super::entries::{Lent, Loan};
use super::ledger::Kind;
use super::request::RecvWr;
use super::QueuePair;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, Chunk, MrInner};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use crate::sys;

/// The pools of the process: a pool's receives carry its number in the
/// upper 32 bits of their `wr_id` (the lower 32: the buffer's index).
static NEXT_POOL: AtomicU32 = AtomicU32::new(1);

/// Receive buffers owned by a queue: `count` buffers of `size` bytes in
/// one registered region, posted by [`post`](Self::post) (or
/// [`post_srq`](Self::post_srq)) and taken back, one completion at a time,
/// by [`take`](Self::take).
///
/// A post to a QP is direct: the pool checks once per call what every
/// buffer shares (the QP's state and PD, the buffers' size against a UD
/// QP's GRH, room for all of them), and each buffer costs the ledger its
/// record and the raw request, whose entry was filled when the pool was
/// made. The same holds for [`take`](Self::take): a completion of one of
/// the pool's buffers is checked against its ledger record and gives the
/// buffer back without building a [`Completed`].
///
/// Dropping the pool while buffers are posted is sound: the region stays
/// registered for them. A QP that still holds some of them lets go of the
/// region when the last of them ends there (its completion reclaimed
/// through the QP, or a RESET) or when the QP is destroyed. A QP the
/// pool was posted to earlier but that holds none of them keeps the
/// region until it next looks: when one of the pool's requests ends
/// there, when another pool is first posted there, at a RESET, or when
/// it is destroyed.
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
    /// Indexed by buffer: `None` while lent to an SRQ's ledger.
    chunks: Vec<Option<Chunk>>,
    /// Indexed by buffer: where it is (posted to a QP, its chunk is here
    /// and never read meanwhile).
    state: Vec<Where>,
    /// Buffers to post, in the order they became free.
    free: Vec<u32>,
    /// The raw requests of a post to a QP.
    raw: RawRecvs,
    size: usize,
    id: u32,
    /// The region of every buffer (see `Chunk::region_id`): buffer `i` is
    /// the `size` bytes at offset `i * size` of it.
    region: usize,
    /// The region's PD (compared, never followed).
    pd: usize,
    /// The region's handle (which the pool's drop moves into `cell` if
    /// a buffer is posted to a QP); none for buffers of 0 bytes.
    mr: Option<Region>,
    /// What the QPs the pool posts to pin.
    cell: Arc<PoolCell>,
}

/// The handle of a pool's region.
struct Region(Arc<MrInner>);

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", Arc::as_ptr(&self.0) as usize)
    }
}

/// Where a buffer of a [`RecvBuffers`] pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    /// In the pool: free, or lent to a [`Received`].
    Here,
    /// Posted to a QP (its record holds nothing; its chunk is in the pool).
    Qp,
    /// Posted to an SRQ (its chunk is in the SRQ's ledger).
    Srq,
}

/// The raw receive requests of a pool, one per buffer: entry `i` names
/// buffer `i` through `sges[i]`, which is filled when the pool is made (a
/// buffer's address, length and key never change). A post sets the
/// `wr_id`s and links the chain; the pointers are made then, from the
/// arrays' own (a `Vec`'s heap does not move while it is not resized, and
/// these never are).
struct RawRecvs {
    wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
}

// The raw pointers in `wrs` (`sg_list`, `next`) point into the struct's
// own arrays and are followed only by the provider, during a post call
// made through `&mut RecvBuffers`.
// SAFETY: nothing in them is tied to a thread (above).
unsafe impl Send for RawRecvs {}
// SAFETY: `&RawRecvs` gives no access to anything (only `&mut` posts).
unsafe impl Sync for RawRecvs {}

impl std::fmt::Debug for RawRecvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} raw receive requests", self.wrs.len())
    }
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
    /// only) in `pd`. Refused: `count` 0 or above `u32::MAX`, `size` above
    /// `u32::MAX` (an sge's length).
    ///
    /// Buffers of 0 bytes register nothing: each is a receive without an
    /// entry, for RDMA WRITE with immediate (whose data lands in the
    /// writer's target, the immediate in the completion) and zero-length
    /// sends. Its [`Received`] holds no bytes.
    ///
    /// ```no_run
    /// # fn f(pd: &rdma_verbs::ProtectionDomain, qp: &mut rdma_verbs::QueuePair,
    /// #      wc: &rdma_verbs::WorkCompletion) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_verbs::qp::{RecvBuffers, Taken};
    /// let mut imms = RecvBuffers::new(pd, 64, 0)?;
    /// imms.post(qp)?;
    /// if let Taken::Mine(_) = imms.take(qp, wc) {
    ///     println!("a write arrived, immediate {:?}", wc.imm_data());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the counts above, or what
    /// `ibv_reg_mr` answers.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(pd: &ProtectionDomain, count: usize, size: usize) -> Result<Self> {
        const VERB: &str = "ibv_reg_mr";
        if count == 0 || u32::try_from(count).is_err() || u32::try_from(size).is_err() {
            return Err(Error::invalid(
                VERB,
                format!(
                    "{count} receive buffers of {size} bytes: at least 1 buffer, at most {} \
                     of each",
                    u32::MAX
                ),
            ));
        }
        let (chunks, region, mr) = if size == 0 {
            (
                (0..count).map(|_| None).collect::<Vec<Option<Chunk>>>(),
                0,
                None,
            )
        } else {
            let chunks = pd.alloc_chunks(count, size, AccessFlags::LOCAL_WRITE)?;
            let Some(first) = chunks.first() else {
                return Err(Error::invalid(VERB, "internal: no receive buffer was made"));
            };
            let (region, mr) = (first.region_id(), Region(first.region().clone()));
            (chunks.into_iter().map(Some).collect(), region, Some(mr))
        };
        // Buffers of 0 bytes: entries of length 0 that no request counts
        // (`num_sge` 0), so that every request's `sg_list` is in bounds.
        let sges = (chunks.iter())
            .map(|c: &Option<Chunk>| {
                c.as_ref()
                    .map_or(sys::ibv_sge::default(), |c| sys::ibv_sge {
                        addr: c.addr(),
                        length: size as u32,
                        lkey: c.lkey(),
                    })
            })
            .collect();
        let wrs = (0..count)
            .map(|_| sys::ibv_recv_wr {
                num_sge: std::ffi::c_int::from(size > 0),
                ..Default::default()
            })
            .collect();
        Ok(RecvBuffers {
            region,
            pd: pd.as_ptr() as usize,
            chunks,
            state: vec![Where::Here; count],
            free: (0..count as u32).collect(),
            raw: RawRecvs { wrs, sges },
            size,
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            mr,
            cell: Arc::default(),
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
        self.state.iter().filter(|&&w| w != Where::Here).count()
    }

    #[inline]
    fn wr_id(&self, index: u32) -> u64 {
        (u64::from(self.id) << 32) | u64::from(index)
    }

    /// Posts every free buffer to `qp`'s receive queue in one
    /// `ibv_post_recv` call; returns how many. Nothing free: nothing is
    /// called. Refused, with every buffer still free and nothing recorded,
    /// as [`QueuePair::post_recv`] refuses: a QP in RESET or ERR or
    /// receiving through an SRQ, a QP of another PD or with
    /// `max_recv_sge` 0, buffers smaller than a UD QP's 40-byte GRH on a
    /// port that needs one, no room for them all. A provider failure
    /// leaves them posted (in doubt) until a completion or a RESET brings
    /// them back.
    ///
    /// # Errors
    /// A [`PostError`] with every buffer still free, for what is refused
    /// above; or the provider failed (the buffers stay posted, in doubt).
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post(&mut self, qp: &mut QueuePair) -> Result<usize, PostError> {
        self.post_up_to(qp, usize::MAX)
    }

    /// Posts at most `n` free buffers (the ones freed last), as
    /// [`post`](Self::post) posts all of them; returns how many.
    ///
    /// # Errors
    /// As [`post`](Self::post).
    #[doc(alias = "ibv_post_recv")]
    #[inline(always)]
    pub fn post_up_to(&mut self, qp: &mut QueuePair, n: usize) -> Result<usize, PostError> {
        const VERB: &str = "ibv_post_recv";
        let n = self.free.len().min(n);
        if n == 0 {
            return Ok(0);
        }
        if let Some(e) = qp.pool_refusal(self.pd, self.size, n) {
            return Err(super::post::fail(e, 0, Vec::new()));
        }
        let start = self.free.len() - n;
        let head = self.free[start] as usize;
        let ledger = &mut qp.pending_mut().recv.ledger;
        let wrs = self.raw.wrs.as_mut_ptr();
        let sges = self.raw.sges.as_mut_ptr();
        let mut prev: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        for k in start..self.free.len() {
            let i = self.free[k] as usize;
            // A free buffer is here; it is posted from its record on
            // (which holds nothing: the pin keeps the region).
            match self.state.get_mut(i) {
                Some(w @ Where::Here) => *w = Where::Qp,
                _ => {
                    return Err(self.undo_post(
                        qp,
                        start,
                        k,
                        Some(Error::invalid(VERB, "internal: a free buffer is missing")),
                    ))
                }
            }
            let Some(tag) = ledger.insert_made(self.wr_id(i as u32), || Loan::Pooled) else {
                self.state[i] = Where::Here;
                return Err(self.undo_post(qp, start, k, None));
            };
            // `i` < the buffer count, the length of both arrays (a free
            // index is one of the pool's: `state[i]` exists); the pointers
            // come from the arrays' own.
            // SAFETY: in bounds, written through only here, under `&mut self`.
            unsafe {
                let w = wrs.add(i);
                (*w).wr_id = tag;
                (*w).sg_list = sges.add(i);
                (*w).next = std::ptr::null_mut();
                if !prev.is_null() {
                    (*prev).next = w;
                }
                prev = w;
            }
        }
        // Before the call: whatever the provider returns, the records stay
        // (in doubt, at worst), and the pin keeps the region for them once
        // the pool is gone.
        qp.pending_mut().recv.pool_posted(self.id, &self.cell);
        self.free.truncate(start);
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // `head` starts a NULL-terminated chain of the `n` requests linked
        // above, in this pool's arrays (borrowed for the call), each with
        // one entry naming a buffer of the pool's region, which is of the
        // QP's PD and registered with LOCAL_WRITE (checked by
        // `pool_refusal`). The ledger holds each buffer's record, and the
        // QP's pin the region, from here until the device is done with it
        // (its completion, a RESET, the QP's destruction), whatever the
        // provider returns, so the region stays registered, and the buffer
        // is marked posted (unread) meanwhile.
        // SAFETY: a live QP and a chain valid for as long as the device uses it.
        let rc = unsafe { sys::ibv_post_recv(qp.as_ptr(), wrs.add(head), &mut bad) };
        if rc != 0 {
            return Err(super::chain::provider_failed(VERB, rc, n));
        }
        Ok(n)
    }

    /// Takes back the records of this call's first `k - start` buffers
    /// (`free[start..k]`), newest first, after a refusal halfway: they
    /// never reached a device, so their buffers are free again. The error
    /// is `error`, or else the ledger's [`refusal`](super::ledger::Ledger::refusal)
    /// of the call's buffers.
    #[cold]
    #[inline(never)]
    fn undo_post(
        &mut self,
        qp: &mut QueuePair,
        start: usize,
        k: usize,
        error: Option<Error>,
    ) -> PostError {
        const VERB: &str = "ibv_post_recv";
        let ledger = &mut qp.pending_mut().recv.ledger;
        for j in (start..k).rev() {
            let i = self.free[j] as usize;
            if let Some(Loan::Pooled) = ledger.undo_last(self.raw.wrs[i].wr_id) {
                self.state[i] = Where::Here;
            }
        }
        let error = error.unwrap_or_else(|| ledger.refusal(VERB, self.free.len() - start));
        super::post::fail(error, 0, Vec::new())
    }

    /// Posts every free buffer to `srq`, as [`post`](Self::post) does to a
    /// QP (through [`SharedReceiveQueue::post_recv`]); completions of them
    /// come through any QP of the SRQ.
    ///
    /// # Errors
    /// As [`SharedReceiveQueue::post_recv`]: refused with every buffer
    /// still free, or the provider failed (the buffers stay posted).
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn post_srq(&mut self, srq: &SharedReceiveQueue) -> Result<usize, PostError> {
        let n = self.free.len();
        if n == 0 {
            return Ok(0);
        }
        let (id, size, chunks) = (self.id, self.size, &mut self.chunks);
        let mut wrs = self.free.iter().filter_map(|&i| {
            let wr = RecvWr::new((u64::from(id) << 32) | u64::from(i));
            if size == 0 {
                return Some(wr);
            }
            Some(wr.sge(chunks[i as usize].take()?))
        });
        let res = srq.post_recv(&mut wrs);
        if !matches!(&res, Err(e) if e.posted == 0) {
            // Their chunks are in the SRQ's ledger (in doubt, at worst).
            for &i in &self.free {
                self.state[i as usize] = Where::Srq;
            }
        }
        match res {
            Ok(()) => {
                self.free.clear();
                Ok(n)
            }
            Err(e) if e.posted == 0 => {
                // Refused before the call: every chunk came back, in
                // request order.
                let mut back = e.returned.into_iter();
                for &i in &self.free {
                    self.chunks[i as usize] = back.next();
                }
                Err(super::post::fail(e.error, 0, Vec::new()))
            }
            Err(e) => {
                self.free.clear();
                Err(e)
            }
        }
    }

    /// Takes back what completion `wc` ends on `qp` (its receive queue, or
    /// its SRQ): one of this pool's buffers as [`Taken::Mine`], with the
    /// bytes received; anything else as [`Taken::Other`], so nothing is
    /// lost.
    #[inline(always)]
    pub fn take<'a>(&'a mut self, qp: &mut QueuePair, wc: &WorkCompletion) -> Taken<'a> {
        let tag = wc.wr_id();
        // The common case straight on: a receive of the QP's own queue
        // that is one of this pool's buffers. The ledger takes only a tag
        // of its own kind and stamp (unique in the process), which proves
        // the completion is this QP's: no QP number to compare.
        let id = self.id;
        let p = qp.pending_mut();
        let Some(wr_id) = p.recv.ledger.take_if(tag, |load, wr_id| {
            matches!(load, Loan::Pooled) && (wr_id >> 32) as u32 == id
        }) else {
            return self.take_routed(qp, wc);
        };
        // The pool lives (this is its call): its pin stays, for its next
        // post, and needs nothing.
        let ok = wc.is_success();
        qp.recv_half(false).after_ended(wc, Kind::Recv);
        // `keep`'s and `mine_or_other`'s work for a record known to be
        // the pool's, inline (going through them measured 11-18
        // instructions more per receive).
        let index = wr_id as u32;
        match self.state.get_mut(index as usize) {
            Some(w @ Where::Qp) => *w = Where::Here,
            // Never: the pool's records name its posted buffers.
            _ => {
                return Taken::Other(Completed::new(wr_id, true, Kind::Recv, Loan::Pooled));
            }
        }
        Taken::Mine(self.lend(index, wc, ok))
    }

    /// The borrow of buffer `index`, which completion `wc` (successful or
    /// not: `ok`) ended.
    #[inline(always)]
    fn lend(&mut self, index: u32, wc: &WorkCompletion, ok: bool) -> Received<'_> {
        let len = if ok {
            (wc.byte_len() as usize).min(self.size)
        } else {
            0
        };
        Received {
            pool: self,
            index,
            len,
            ok,
        }
    }

    /// [`take`](Self::take) of a completion that is not a posted buffer of
    /// this pool on `qp`'s own receive queue (another receive of that
    /// queue, an SRQ's receive, a send, another QP's): routed as
    /// [`QueuePair::reclaim_one`] routes it.
    #[cold]
    #[inline(never)]
    fn take_routed<'a>(&'a mut self, qp: &mut QueuePair, wc: &WorkCompletion) -> Taken<'a> {
        if !matches!(Kind::of(wc.wr_id()), Some(Kind::Recv | Kind::Srq)) {
            return match qp.reclaim_one(wc) {
                Some(c) => Taken::Other(c),
                None => Taken::Nothing,
            };
        }
        // A receive completion ends at most one request.
        let mut ended = None;
        qp.route::<WorkCompletion, false>(wc, |wr_id, signaled, kind, loan| {
            ended = Some((wr_id, signaled, kind, loan));
        });
        match ended {
            Some((wr_id, signaled, kind, loan)) => {
                self.mine_or_other(wr_id, signaled, kind, loan, wc, wc.is_success())
            }
            None => Taken::Nothing,
        }
    }

    /// The request a receive completion ended: the pool's buffer (lent as
    /// [`Received`]) or another request.
    #[inline(always)]
    fn mine_or_other<'a>(
        &'a mut self,
        wr_id: u64,
        signaled: bool,
        kind: Kind,
        loan: Loan,
        wc: &WorkCompletion,
        ok: bool,
    ) -> Taken<'a> {
        match self.keep(wr_id, loan) {
            Ok(index) => Taken::Mine(self.lend(index, wc, ok)),
            Err(loan) => Taken::Other(Completed::new(wr_id, signaled, kind, loan)),
        }
    }

    /// Puts a request of this pool back (one a RESET handed back through
    /// [`QueuePair::reset`] or [`QueuePair::take_released`], or one the
    /// caller reclaimed itself): its buffer is free again. Another
    /// request comes back as `Err`.
    ///
    /// # Errors
    /// The request back, unchanged, when it is not one of this pool's.
    pub fn give_back(&mut self, c: Completed) -> std::result::Result<(), Completed> {
        let Completed {
            wr_id,
            signaled,
            kind,
            loan,
        } = c;
        match self.keep(wr_id, loan) {
            Ok(index) => {
                self.free.push(index);
                Ok(())
            }
            Err(loan) => Err(Completed {
                wr_id,
                signaled,
                kind,
                loan,
            }),
        }
    }

    /// Takes a request back if it is one of this pool's buffers: a record
    /// of the pool's post to a QP ([`Loan::Pooled`]) whose `wr_id` names a
    /// buffer posted there, or a record of its post to an SRQ whose one
    /// chunk is that very buffer (a receive the caller posted with a
    /// `wr_id` of the pool's is not the pool's, whatever its chunks: the
    /// pool's region has no chunk but the pool's own). For buffers of 0
    /// bytes, an SRQ record holds nothing: a bufferless receive the caller
    /// posted to the SRQ with a `wr_id` of the pool's would be taken for
    /// the pool's (no memory is at stake: the buffers have none). Another
    /// request comes back as `Err`.
    #[inline(always)]
    fn keep(&mut self, wr_id: u64, loan: Loan) -> std::result::Result<u32, Loan> {
        let index = wr_id as u32;
        let i = index as usize;
        if wr_id != self.wr_id(index) {
            return Err(loan);
        }
        match loan {
            Loan::Pooled => match self.state.get_mut(i) {
                Some(w @ Where::Qp) => {
                    *w = Where::Here;
                    Ok(index)
                }
                _ => Err(loan),
            },
            Loan::One(Lent::Own(c))
                if self.state.get(i) == Some(&Where::Srq)
                    && c.region_id() == self.region
                    && c.offset() == i * self.size
                    && c.len() == self.size =>
            {
                self.chunks[i] = Some(c);
                self.state[i] = Where::Here;
                Ok(index)
            }
            // Buffers of 0 bytes lend nothing to the SRQ: the record of
            // one posted there holds nothing either.
            Loan::Empty if self.size == 0 && self.state.get(i) == Some(&Where::Srq) => {
                self.state[i] = Where::Here;
                Ok(index)
            }
            other => Err(other),
        }
    }
}

impl Drop for RecvBuffers {
    /// A buffer still posted to a QP (or in doubt there) needs the region
    /// until that QP lets go of its pin: its handle goes into the cell the
    /// pins share (see the module docs). Buffers posted to an SRQ hold
    /// their own chunks there.
    fn drop(&mut self) {
        let posted = self.state.contains(&Where::Qp);
        let region = self.mr.as_ref().filter(|_| posted);
        self.cell.pool_dropped(region.map(|r| r.0.clone()));
    }
}

impl Received<'_> {
    /// Whether the receive succeeded (otherwise it holds no bytes).
    #[inline]
    pub fn is_success(&self) -> bool {
        self.ok
    }

    /// The buffer's index in its pool.
    #[inline]
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl std::ops::Deref for Received<'_> {
    type Target = [u8];

    #[inline]
    fn deref(&self) -> &[u8] {
        match &self.pool.chunks[self.index as usize] {
            Some(c) => &c.as_slice()[..self.len],
            None => &[],
        }
    }
}

impl Drop for Received<'_> {
    /// The buffer is free to be posted again.
    #[inline]
    fn drop(&mut self) {
        self.pool.free.push(self.index);
    }
}

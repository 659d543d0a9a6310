//! Shared receive queues (`struct ibv_srq`).

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::datapath::{post_recv_chain, Kind, Loan, RecvFacts, RecvLedger, Scratch};
use crate::error::{check_ptr, check_rc, Error, Result};
use crate::handle::{close_counted, take_last, Owned, RawObject};
use crate::pd::ProtectionDomain;
use crate::qp::{Completed, PostError, RecvWr, MAX_SGE};
use crate::sys;
use crate::users::{Tally, UserCounts, UserKind};

/// The most receives an SRQ of this crate holds (the device may allow more).
const MAX_WR: u32 = 1 << 24;

impl RawObject for sys::ibv_srq {
    const DESTROY: &'static str = "ibv_destroy_srq";
    const NAME: &'static str = "shared receive queue";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live SRQ, once.
        unsafe { sys::ibv_destroy_srq(ptr) }
    }
}

/// Outstanding receives of an SRQ, keyed by tag (see the data path's
/// module docs): a completion is accepted once, and only with a stamp this
/// SRQ issued; and scratch space for building chains.
struct SrqPending {
    ledger: RecvLedger<Loan>,
    scratch: Scratch<sys::ibv_recv_wr>,
}

struct SrqKeep {
    _tally: Tally,
    pd: ProtectionDomain,
    /// Its users by kind (queue pairs), for `close`'s refusal.
    users: Arc<UserCounts>,
    max_sge: u32,
    pending: Mutex<SrqPending>,
    /// Where `post_recv` collects the caller's requests before it takes
    /// `pending`'s lock (so that the caller's iterator never runs under
    /// it); taken out for the call and put back after, so that steady
    /// state allocates nothing.
    staging: Mutex<Vec<RecvWr>>,
    /// `pending.ledger.len()`, kept beside the lock for `outstanding`.
    outstanding: AtomicUsize,
}

/// A shared receive queue (`struct ibv_srq`): one pool of receive buffers
/// for many queue pairs.
///
/// Posting and reclaiming take `&self` (a mutex guards the table of
/// outstanding receives), so QPs and threads can share it; clones share the
/// queue. Receives move their chunks in; [`reclaim`](Self::reclaim) hands
/// them back with the completion, on whichever QP it arrives.
#[doc(alias = "ibv_srq")]
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<Owned<sys::ibv_srq, SrqKeep>>,
}

impl ProtectionDomain {
    /// Creates a shared receive queue holding `max_wr` receives of up to
    /// `max_sge` entries, with limit `limit` (0: no limit event).
    ///
    /// # Errors
    /// As [`SharedReceiveQueue::new`].
    #[doc(alias = "ibv_create_srq")]
    pub fn create_srq(&self, max_wr: u32, max_sge: u32, limit: u32) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::new(self, max_wr, max_sge, limit)
    }
}

impl SharedReceiveQueue {
    /// Creates a shared receive queue in `pd`. Refused before the call:
    /// `max_wr` of 0 or above the device's `max_srq_wr`, `max_sge` above
    /// `max_srq_sge` or [`MAX_SGE`], a limit above `max_wr`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a device without SRQs (`max_srq` 0);
    /// [`Error::InvalidArgument`] for the sizes above, before any call;
    /// [`Error::Verb`] with the errno when `ibv_create_srq` fails.
    #[doc(alias = "ibv_create_srq")]
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32, limit: u32) -> Result<Self> {
        const VERB: &str = "ibv_create_srq";
        let dev = pd.context().attr();
        if dev.max_srq == 0 {
            return Err(Error::Unsupported {
                what: "shared receive queues",
                device: pd.context().name().to_owned(),
                errno: None,
            });
        }
        let wr_max = dev.max_srq_wr.min(MAX_WR);
        if max_wr == 0 || max_wr > wr_max {
            return Err(Error::invalid(
                VERB,
                format!("max_wr {max_wr} is outside 1..={wr_max}"),
            ));
        }
        let sge_max = dev.max_srq_sge.min(MAX_SGE as u32);
        if max_sge == 0 || max_sge > sge_max {
            return Err(Error::invalid(
                VERB,
                format!("max_sge {max_sge} is outside 1..={sge_max}"),
            ));
        }
        if limit > max_wr {
            return Err(Error::invalid(
                VERB,
                format!("limit {limit} is above max_wr {max_wr}"),
            ));
        }
        // Zeroed whole, padding included: libibverbs copies the struct's
        // full size into an `ibv_srq_init_attr_ex` and reads `comp_mask`
        // from where this struct's tail padding lies (valgrind found it).
        // SAFETY: all-zero bytes are a valid `ibv_srq_init_attr` (integers
        // and a null pointer).
        let mut attr: sys::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = max_sge;
        attr.attr.srq_limit = limit;
        // SAFETY: the PD is live; `attr` is a valid in/out struct.
        let raw = check_ptr(VERB, unsafe { sys::ibv_create_srq(pd.as_ptr(), &mut attr) })?;
        let slots = attr.attr.max_wr.clamp(max_wr, MAX_WR) as usize;
        let max_sge = attr.attr.max_sge.max(max_sge);
        // The staging vector has room for chains of up to CHAIN_ROOM
        // receives (built on the stack): no post of one allocates, the
        // first included.
        let wrs = crate::datapath::chain_room(slots as u32);
        let keep = SrqKeep {
            _tally: Tally::new(pd.users(), UserKind::SharedReceiveQueue, 1),
            pd: pd.clone(),
            users: UserCounts::new(),
            max_sge,
            pending: Mutex::new(SrqPending {
                ledger: RecvLedger::new(Kind::Srq, slots),
                scratch: Scratch::new(),
            }),
            staging: Mutex::new(Vec::with_capacity(wrs)),
            outstanding: AtomicUsize::new(0),
        };
        // SAFETY: a fresh SRQ owned by nobody else; it keeps its PD alive,
        // and its outstanding buffers until after it is destroyed.
        let inner = unsafe { Owned::new(raw, keep) };
        Ok(SharedReceiveQueue {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.inner.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.keep().pd
    }

    fn pending(&self) -> MutexGuard<'_, SrqPending> {
        // A panic while holding the lock cannot leave the table half-updated
        // in a way that matters for safety: use it anyway.
        self.inner
            .keep()
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// How many receives are outstanding. Takes no lock: it may be called
    /// from anywhere, the caller's iterator of [`post_recv`](Self::post_recv)
    /// included.
    pub fn outstanding(&self) -> usize {
        self.inner.keep().outstanding.load(Ordering::Relaxed)
    }

    /// Posts a chain of receives with one `ibv_post_srq_recv` call.
    ///
    /// Refused before the call, with every chunk handed back: more entries
    /// than the SRQ's `max_sge`, chunks of another PD, chunks of a region
    /// registered without `LOCAL_WRITE` (the device writes receives), more
    /// receives than there is room for. An empty iterator posts nothing and
    /// calls nothing.
    ///
    /// Not checked: room for the 40-byte GRH that a UD QP's receive needs
    /// first on a port that needs a GRH (RoCE), which
    /// [`QueuePair::post_recv`](crate::QueuePair::post_recv) refuses. The
    /// SRQ cannot tell which QPs its receives will serve (one SRQ may serve
    /// RC and UD QPs, on ports of either kind), so a receive of fewer than
    /// 40 bytes is posted; a UD QP on RoCE that takes it fails it and goes
    /// to ERR.
    /// If the provider fails, the SRQ keeps every receive of the call (see
    /// [`PostError`]).
    ///
    /// The iterator runs (and is dropped) before the SRQ's lock is taken,
    /// so it may use this SRQ in any way (post to it, reclaim on it, format
    /// it); its requests are posted after it is done. If it panics, nothing
    /// of this call was recorded or posted.
    ///
    /// # Errors
    /// A [`PostError`]: refused before the call (every chunk handed back
    /// in it, nothing posted; no room is [`Error::QueueFull`]), or the
    /// provider failed (the receives stay in the SRQ's ledger, in doubt).
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn post_recv<I>(&self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        const VERB: &str = "ibv_post_srq_recv";
        let keep = self.inner.keep();
        // Another call (another thread, or the caller's iterator posting
        // again) may have the staging vector: then this one makes its own.
        let mut staged = std::mem::take(&mut *lock(&keep.staging));
        staged.extend(wrs);
        if staged.is_empty() {
            return Ok(());
        }
        let srq = self.as_ptr();
        let facts = RecvFacts {
            pd: keep.pd.as_ptr(),
            max_sge: keep.max_sge,
            // No GRH floor: the SRQ cannot tell which QPs its receives serve.
            floor: 0,
        };
        let result = {
            let mut p = self.pending();
            let p = &mut *p;
            let r = post_recv_chain(
                VERB,
                &mut p.ledger,
                &mut p.scratch,
                &facts,
                staged.drain(..),
                |chain, bad| {
                    // SAFETY: the SRQ is live; a NULL-terminated chain into the
                    // call's stack (and the scratch, under the mutex), naming chunks the ledger holds.
                    unsafe { sys::ibv_post_srq_recv(srq, chain, bad) }
                },
            );
            keep.outstanding.store(p.ledger.len(), Ordering::Relaxed);
            r
        };
        // Keep the larger of the two rooms for the next call.
        let mut slot = lock(&keep.staging);
        if staged.capacity() > slot.capacity() {
            *slot = staged;
        }
        result
    }

    /// Hands back the receive that `wc` ends (a completion of any QP using
    /// this SRQ); returns 1, or 0 when `wc` is not one of this SRQ's
    /// outstanding receives (another queue's, or already reclaimed).
    ///
    /// A failed receive moved its QP to ERR, but the SRQ holds no QP and
    /// this does not change any QP's known
    /// [`state`](crate::QueuePair::state): reclaim through the QP
    /// ([`QueuePair::reclaim`](crate::QueuePair::reclaim), which asks the
    /// device), or [`resync`](crate::QueuePair::resync) it. A
    /// receive that carried a peer's invalidation
    /// ([`invalidated_rkey`](Self::invalidated_rkey)) frees the memory
    /// window it names, as [`QueuePair::reclaim`](crate::QueuePair::reclaim) does.
    pub fn reclaim<C: crate::qp::Completion + ?Sized>(
        &self,
        wc: &C,
        f: impl FnMut(Completed),
    ) -> usize {
        let n = self.reclaim_tag(wc.tag(), f);
        if n > 0 {
            if let Some(rkey) = self.invalidated_rkey(wc) {
                crate::mw::invalidated_by_peer(self.pd().context(), rkey);
            }
        }
        n
    }

    pub(crate) fn reclaim_tag(&self, tag: u64, mut f: impl FnMut(Completed)) -> usize {
        let released = {
            let mut p = self.pending();
            // A receive ends its own request only (free list).
            let r = p.ledger.take_tag(tag, |wr_id, loan| (wr_id, loan));
            self.inner
                .keep()
                .outstanding
                .store(p.ledger.len(), Ordering::Relaxed);
            r
        };
        // `f` runs outside the lock, so it may post to this SRQ again.
        match released {
            Some((wr_id, loan)) => {
                f(Completed::new(wr_id, true, Kind::Srq, loan));
                1
            }
            None => 0,
        }
    }

    /// Destroys the SRQ now and hands back every receive it still held.
    ///
    /// Fails with [`Error::InUse`] while clones or QPs still use it (then
    /// nothing changes). On a failed destroy the SRQ still exists on the
    /// device, so its receives' chunks are leaked with it.
    ///
    /// # Errors
    /// [`Error::InUse`] while clones or QPs use the SRQ (nothing changes);
    /// [`Error::Verb`] when `ibv_destroy_srq` fails (the chunks are then
    /// leaked, never freed under the device).
    #[doc(alias = "ibv_destroy_srq")]
    pub fn close_and_reclaim(self) -> Result<Vec<Completed>> {
        let owned = take_last(self.inner, |k| Some(&*k.users))?;
        let keep = owned.into_keep()?;
        let mut p = keep.pending.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        p.ledger
            .drain(|r| out.push(Completed::new(r.wr_id, false, Kind::Srq, r.payload)));
        Ok(out)
    }

    /// Arms the limit event: when fewer than `limit` receives remain, the
    /// device raises `IBV_EVENT_SRQ_LIMIT_REACHED` (once; arm again after).
    ///
    /// # Errors
    /// [`Error::Verb`] with the errno when `ibv_modify_srq` fails (the
    /// device refused the limit).
    #[doc(alias = "ibv_modify_srq")]
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is live; `attr` is valid; only the limit is masked in.
        let rc = unsafe {
            sys::ibv_modify_srq(
                self.as_ptr(),
                &mut attr,
                sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as c_int,
            )
        };
        check_rc("ibv_modify_srq", rc).map(|_| ())
    }

    /// The SRQ's current `(max_wr, max_sge, srq_limit)`.
    ///
    /// # Errors
    /// [`Error::Verb`] with the errno when `ibv_query_srq` fails.
    #[doc(alias = "ibv_query_srq")]
    pub fn query(&self) -> Result<(u32, u32, u32)> {
        let mut attr = sys::ibv_srq_attr::default();
        // SAFETY: the SRQ is live; `attr` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_srq(self.as_ptr(), &mut attr) };
        check_rc("ibv_query_srq", rc)?;
        Ok((attr.max_wr, attr.max_sge, attr.srq_limit))
    }

    /// Destroys the SRQ now, reporting failure; [`Error::InUse`] while
    /// clones or QPs still use it (the error says how many of each).
    ///
    /// # Errors
    /// [`Error::InUse`] as above (nothing changes); [`Error::Verb`] when
    /// `ibv_destroy_srq` fails (the SRQ is then leaked).
    #[doc(alias = "ibv_destroy_srq")]
    pub fn close(self) -> Result<()> {
        close_counted(self.inner, |k| Some(&k.users))
    }

    /// The SRQ's user counts, for its queue pairs' tallies.
    pub(crate) fn users(&self) -> &Arc<UserCounts> {
        &self.inner.keep().users
    }

    /// Whether `other` is the same SRQ.
    pub fn same_as(&self, other: &SharedReceiveQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// Takes a lock of the SRQ's; a thread that panicked while holding it left
/// nothing half-updated that matters for safety.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

//! Shared receive queues (`struct ibv_srq`).

use std::ffi::c_int;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::cq::WorkCompletion;
use crate::error::{check_ptr, check_rc, Error, Result};
use crate::handle::{close_shared, Owned, RawObject};
use crate::mr::Chunk;
use crate::pd::ProtectionDomain;
use crate::qp::{Completed, PostError, RecvWr, MAX_SGE};
use crate::sys;

const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// A generation never handed out before in this process.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) & ((1 << (64 - INDEX_BITS)) - 1)
}

impl RawObject for sys::ibv_srq {
    const DESTROY: &'static str = "ibv_destroy_srq";
    const NAME: &'static str = "shared receive queue";
    unsafe fn destroy(ptr: *mut Self) -> c_int {
        // SAFETY: the caller (`Owned`) passes a live SRQ, once.
        unsafe { sys::ibv_destroy_srq(ptr) }
    }
}

struct Slot {
    wr_id: u64,
    generation: u64,
    chunks: [Option<Chunk>; MAX_SGE],
}

/// Outstanding receives of an SRQ: a slab indexed by the low 24 bits of the
/// wr_id handed to the device, with a generation in the high 40 bits. Each
/// post call takes a generation from one process-wide counter, so a stale
/// completion, or one of another SRQ or device, never matches a slot.
struct SrqPending {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    recv_wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
}

// SAFETY: the scratch vectors' raw pointers are only meaningful during one
// post, made under the mutex; the rest is `Send`.
unsafe impl Send for SrqPending {}

struct SrqKeep {
    pd: ProtectionDomain,
    max_sge: u32,
    pending: Mutex<SrqPending>,
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
    #[doc(alias = "ibv_create_srq")]
    pub fn create_srq(&self, max_wr: u32, max_sge: u32, limit: u32) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::new(self, max_wr, max_sge, limit)
    }
}

impl SharedReceiveQueue {
    /// Creates a shared receive queue in `pd`. Refused before the call:
    /// `max_wr` of 0 or above the device's `max_srq_wr`, `max_sge` above
    /// `max_srq_sge` or [`MAX_SGE`], a limit above `max_wr`.
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
        let wr_max = dev.max_srq_wr.min(INDEX_MASK as u32);
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
        let mut attr = sys::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: limit,
            },
        };
        // SAFETY: the PD is live; `attr` is a valid in/out struct.
        let raw = check_ptr(VERB, unsafe { sys::ibv_create_srq(pd.as_ptr(), &mut attr) })?;
        let slots = attr.attr.max_wr.clamp(max_wr, INDEX_MASK as u32) as usize;
        let keep = SrqKeep {
            pd: pd.clone(),
            max_sge: attr.attr.max_sge.max(max_sge),
            pending: Mutex::new(SrqPending {
                slots: (0..slots).map(|_| None).collect(),
                free: (0..slots as u32).rev().collect(),
                recv_wrs: Vec::new(),
                sges: Vec::new(),
            }),
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

    /// How many receives are outstanding.
    pub fn outstanding(&self) -> usize {
        let p = self.pending();
        p.slots.len() - p.free.len()
    }

    /// Posts a chain of receives with one `ibv_post_srq_recv` call.
    #[doc(alias = "ibv_post_srq_recv")]
    pub fn post_recv<I>(&self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        const VERB: &str = "ibv_post_srq_recv";
        let mut reqs = crate::qp::post_internal::Batch::new();
        let keep = self.inner.keep();
        let mut error = None;
        for wr in wrs {
            if error.is_none() {
                error = crate::qp::post_internal::check_recv(
                    &wr,
                    keep.max_sge as usize,
                    keep.pd.handle(),
                    VERB,
                )
                .err();
            }
            reqs.push(wr);
        }
        let n = reqs.len();
        let mut p = self.pending();
        if error.is_none() && n > p.free.len() {
            error = Some(Error::invalid(
                VERB,
                format!("{n} receive(s) but only {} free slots", p.free.len()),
            ));
        }
        if let Some(e) = error {
            return Err(reqs.refuse(e));
        }
        let generation = next_generation();
        let free_len = p.free.len();
        // The slots the chain uses: the last `n` entries of the free list, in
        // the order `pop` will hand them out below.
        let p = &mut *p;
        let free = &p.free;
        let id_of = |i: usize| (generation << INDEX_BITS) | u64::from(free[free_len - 1 - i]);
        crate::qp::post_internal::build_recv_chain(&mut p.recv_wrs, &mut p.sges, &reqs, id_of);
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the SRQ is live; a NULL-terminated chain into the scratch
        // vectors, naming chunks that move into the slab below.
        let rc =
            unsafe { sys::ibv_post_srq_recv(self.as_ptr(), p.recv_wrs.as_mut_ptr(), &mut bad) };
        let posted = crate::qp::post_internal::posted_count(rc, bad, &p.recv_wrs, n);
        reqs.settle(rc, posted, VERB, |_, mut wr| {
            let index = p.free.pop().expect("checked: enough free slots");
            p.slots[index as usize] = Some(Slot {
                wr_id: wr.wr_id,
                generation,
                chunks: wr.sges.take(),
            });
        })
    }

    /// Hands back the receive that `wc` (a completion of any QP using this
    /// SRQ) ends; returns 1, or 0 when `wc` is not one of this SRQ's.
    pub fn reclaim(&self, wc: &WorkCompletion, mut f: impl FnMut(Completed)) -> usize {
        let id = wc.wr_id();
        let (index, generation) = ((id & INDEX_MASK) as usize, id >> INDEX_BITS);
        let mut p = self.pending();
        let hit = matches!(p.slots.get(index), Some(Some(s)) if s.generation == generation);
        if !hit {
            return 0;
        }
        let slot = p.slots[index].take().expect("checked");
        p.free.push(index as u32);
        drop(p);
        f(Completed {
            wr_id: slot.wr_id,
            signaled: true,
            chunks: slot.chunks,
        });
        1
    }

    /// Arms the limit event: when fewer than `limit` receives remain, the
    /// device raises `IBV_EVENT_SRQ_LIMIT_REACHED` (once; arm again after).
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
    #[doc(alias = "ibv_query_srq")]
    pub fn query(&self) -> Result<(u32, u32, u32)> {
        let mut attr = sys::ibv_srq_attr::default();
        // SAFETY: the SRQ is live; `attr` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_srq(self.as_ptr(), &mut attr) };
        check_rc("ibv_query_srq", rc)?;
        Ok((attr.max_wr, attr.max_sge, attr.srq_limit))
    }

    /// Destroys the SRQ now, reporting failure; [`Error::InUse`] while
    /// clones or QPs still use it.
    #[doc(alias = "ibv_destroy_srq")]
    pub fn close(self) -> Result<()> {
        close_shared(self.inner)
    }

    /// Whether `other` is the same SRQ.
    pub fn same_as(&self, other: &SharedReceiveQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("outstanding", &self.outstanding())
            .finish()
    }
}

//! What a QP keeps and checks for the
//! [`RecvBuffers`](super::RecvBuffers) pools posted to it: a pin per pool
//! (a share of the pool's [`PoolCell`], which keeps a dropped pool's
//! region while its buffers may be posted; see the parent module's docs),
//! and the checks a pool's post makes once per call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use super::super::entries::Loan;
use super::super::ledger::RecvLedger;
use super::super::queues::RecvQueue;
use super::super::QueuePair;
use crate::error::Error;
use crate::mr::MrInner;

/// What a [`RecvBuffers`](super::RecvBuffers) pool shares with the QPs it
/// posts to: once the pool is dropped (`dropped`), the region's handle if
/// a buffer was still posted to a QP then, which the QPs' pins keep (see
/// the parent module's docs).
#[derive(Default)]
pub(crate) struct PoolCell {
    dropped: AtomicBool,
    region: OnceLock<Arc<MrInner>>,
}

impl std::fmt::Debug for PoolCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCell")
            .field("dropped", &self.dropped)
            .field("region", &self.region.get().map(Arc::as_ptr))
            .finish()
    }
}

/// A QP's record of a [`RecvBuffers`](super::RecvBuffers) pool posted to
/// its receive queue, taken before the first post there: a share of the pool's
/// [`PoolCell`], kept while the QP's receive ledger may hold a record of
/// the pool ([`Loan::Pooled`] with the pool's number).
pub(crate) struct PoolPin {
    id: u32,
    cell: Arc<PoolCell>,
}

impl PoolCell {
    /// The pool is being dropped: `region` is its region's handle if a
    /// buffer is still posted to a QP (or in doubt there), for the pins to
    /// keep.
    pub(super) fn pool_dropped(&self, region: Option<Arc<MrInner>>) {
        if let Some(r) = region {
            // Set once, here (a pool is dropped once).
            let _ = self.region.set(r);
        }
        // After the handle: a QP that sees `dropped` sees the handle too.
        self.dropped.store(true, Ordering::Release);
    }
}

impl RecvQueue {
    /// Makes sure the QP pins pool `id` (its `cell`), before a post call
    /// hands the device any of its buffers.
    #[inline(always)]
    pub(super) fn pool_posted(&mut self, id: u32, cell: &Arc<PoolCell>) {
        match self.pools.first() {
            Some(p) if p.id == id => {}
            _ => self.pool_pin(id, cell),
        }
    }

    /// A record of the pool named by `wr_id`'s upper half left the
    /// receive ledger other than through the pool's own
    /// [`take`](super::RecvBuffers::take): if the pool is gone, its pin
    /// goes with its last record.
    #[inline(always)]
    pub(in crate::datapath) fn pool_ended(&mut self, wr_id: u64) {
        let id = (wr_id >> 32) as u32;
        if let Some(i) = self.pools.iter().position(|p| p.id == id) {
            if self.pools[i].cell.dropped.load(Ordering::Acquire) && !self.pool_held(id) {
                self.pools.swap_remove(i);
            }
        }
    }

    /// Whether the receive ledger holds a record of pool `id` (visits
    /// every slot: cold paths only).
    #[cold]
    #[inline(never)]
    fn pool_held(&self, id: u32) -> bool {
        self.ledger
            .any_live(|wr_id, load| matches!(load, Loan::Pooled) && (wr_id >> 32) as u32 == id)
    }

    /// Pins pool `id` if it is not pinned yet (letting go first of the
    /// pins of dropped pools with no record left, so that there are never
    /// more pins than live pools and pools with records here).
    #[cold]
    #[inline(never)]
    fn pool_pin(&mut self, id: u32, cell: &Arc<PoolCell>) {
        if self.pools.iter().any(|p| p.id == id) {
            return;
        }
        let mut i = 0;
        while i < self.pools.len() {
            let p = &self.pools[i];
            if p.cell.dropped.load(Ordering::Acquire) && !self.pool_held(p.id) {
                self.pools.swap_remove(i);
            } else {
                i += 1;
            }
        }
        self.pools.push(PoolPin {
            id,
            cell: cell.clone(),
        });
    }
}

impl QueuePair {
    /// Why `n` buffers of `size` bytes of a pool in PD `pd` cannot be
    /// posted to this QP's receive queue now, if they cannot (the checks
    /// [`post_recv`](Self::post_recv) makes per request, made once for
    /// all of them).
    #[inline(always)]
    pub(super) fn pool_refusal(&mut self, pd: usize, size: usize, n: usize) -> Option<Error> {
        const VERB: &str = "ibv_post_recv";
        if let Some(e) = self.recv_half(false).recv_refusal(VERB) {
            return Some(e);
        }
        let floor = self.recv_floor();
        let q = &mut self.pending_mut().recv;
        let (ledger, facts) = (&q.ledger, &mut q.facts);
        facts.floor = floor;
        let (other_pd, room) = (facts.pd as usize != pd, ledger.room());
        if other_pd || facts.max_sge == 0 || size < floor as usize || room < n {
            let max_sge = facts.max_sge;
            return Some(pool_refused(other_pd, max_sge, floor, size, n, ledger));
        }
        None
    }
}

/// The error of a refused pool post (see `QueuePair::pool_refusal`), past
/// the QP's state.
#[cold]
#[inline(never)]
fn pool_refused(
    other_pd: bool,
    max_sge: u32,
    floor: u32,
    size: usize,
    n: usize,
    ledger: &RecvLedger<Loan>,
) -> Error {
    const VERB: &str = "ibv_post_recv";
    if other_pd {
        Error::invalid(
            VERB,
            "the receive buffers are of another protection domain than the QP",
        )
    } else if max_sge == 0 {
        Error::invalid(
            VERB,
            "the QP was created with max_recv_sge 0: a receive buffer needs one entry",
        )
    } else if size < floor as usize {
        Error::invalid(
            VERB,
            format!(
                "receive buffers of {size} bytes on a UD QP whose port needs a GRH: the device \
                 writes the {floor}-byte GRH first, so a buffer needs at least {floor} bytes"
            ),
        )
    } else {
        ledger.refusal(VERB, n)
    }
}

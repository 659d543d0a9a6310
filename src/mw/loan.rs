//! The loan bookkeeping: what a bind or invalidation request holds
//! ([`MwLoan`]) until the device is done with it, how the window's state
//! moves when its completion is reclaimed, and how it is put back when the
//! request did not run or its fate is unknown.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{slot, MemoryWindow, MwInner, MwState};
use crate::mr::{MrInner, RegionCore};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MwOp {
    Bind,
    Invalidate,
}

/// What a bind or invalidation request holds until the device is done with
/// it: its window, and what the window had before (region, state, rkey),
/// to put back if the request did not run.
pub(crate) struct MwLoan {
    mw: Arc<MwInner>,
    op: MwOp,
    old: Option<Arc<MrInner>>,
    old_state: MwState,
    old_rkey: u32,
    settled: bool,
}

impl MwLoan {
    /// Puts the window back as it was: the request did not run.
    ///
    /// `seen` says whether the device saw the request (a failed or flushed
    /// completion) or not (an aborted batch). In the first case the region
    /// the slot held meanwhile is kept until the window is deallocated: a
    /// later bind of a type 1 window on another QP may have run and reach
    /// it (holding longer is always safe; each region is held once).
    fn undo(&mut self, seen: bool) {
        self.settled = true;
        let mut s = slot(&self.mw);
        s.state = self.old_state;
        let newer = std::mem::replace(&mut s.bound, self.old.take());
        if let Some(n) = newer.filter(|_| seen) {
            let held = s.bound.iter().chain(&s.stale).any(|m| Arc::ptr_eq(m, &n));
            if !held {
                s.stale.push(n);
            }
        }
        self.mw.keep().rkey.store(self.old_rkey, Ordering::Relaxed);
    }

    /// The request never reached the device (an aborted batch, no room).
    pub(crate) fn restore(mut self) {
        self.undo(false);
    }

    /// The request's completion (or a later one) was reclaimed: it ran
    /// (`ran`), or it failed or was flushed and did not.
    pub(crate) fn settle(&mut self, ran: bool) {
        if !ran {
            self.undo(true);
            return;
        }
        self.settled = true;
        let mut s = slot(&self.mw);
        s.state = match self.op {
            MwOp::Bind => MwState::Bound,
            MwOp::Invalidate => MwState::Free,
        };
        // The region the window had before is let go with the loan.
    }
}

impl Drop for MwLoan {
    /// Handed back by a RESET or the QP's destruction: the request may or
    /// may not have run. The window keeps every region it may reach, and
    /// is not invalidated again (a free window invalidated crashes rxe).
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut s = slot(&self.mw);
        s.state = MwState::Unknown;
        if let Some(old) = self.old.take() {
            let held = s.bound.iter().chain(&s.stale).any(|m| Arc::ptr_eq(m, &old));
            if !held {
                s.stale.push(old);
            }
        }
    }
}

impl MemoryWindow {
    /// Records a bind to `mr` with `rkey` (posted now) and returns what the
    /// request must hold until the device is done with it.
    pub(super) fn lend_bind(&mut self, mr: &RegionCore, rkey: u32) -> MwLoan {
        let mut s = slot(&self.inner);
        let old = s.bound.replace(Arc::clone(mr.inner()));
        let old_state = std::mem::replace(&mut s.state, MwState::Binding);
        drop(s);
        let old_rkey = self.inner.keep().rkey.swap(rkey, Ordering::Relaxed);
        MwLoan {
            mw: Arc::clone(&self.inner),
            op: MwOp::Bind,
            old,
            old_state,
            old_rkey,
            settled: false,
        }
    }

    /// Records a local invalidation (posted now).
    pub(super) fn lend_invalidate(&mut self) -> MwLoan {
        let mut s = slot(&self.inner);
        let old = s.bound.take();
        let old_state = std::mem::replace(&mut s.state, MwState::Invalidating);
        drop(s);
        MwLoan {
            mw: Arc::clone(&self.inner),
            op: MwOp::Invalidate,
            old,
            old_state,
            old_rkey: self.rkey(),
            settled: false,
        }
    }
}

/// Undoes a request's bookkeeping that never reached the device.
pub(crate) fn restore(loan: crate::datapath::SendLoan) {
    if let Some(mw) = loan.2 {
        mw.restore();
    }
}

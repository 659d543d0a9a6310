//! Getting requests back: completions routed by their tags
//! ([`QueuePair::reclaim`], [`reclaim_one`](QueuePair::reclaim_one),
//! [`reclaim_chunks`](QueuePair::reclaim_chunks)), and everything at once
//! after a RESET or the QP's destruction.

use super::completed::{Completed, Completion};
use super::entries::{Loan, SendLoan};
use super::ledger::Kind;
use super::queues::{RecvQueue, SendQueue};
use super::{QpState, QueuePair};
use crate::error::Result;
use crate::mr::Chunk;

impl SendQueue {
    /// Ends what send completion `tag` ends (`ok`: it succeeded), oldest
    /// first: window loans settle, side entries are let go. `QUIET`: `on`
    /// needs only the loans that hold something (a completion that ends
    /// only empty ones may visit none of them).
    #[inline(always)]
    pub(super) fn complete<const QUIET: bool>(
        &mut self,
        tag: u64,
        ok: bool,
        on: &mut impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        // The common quiet case (only inert payloads outstanding) first,
        // before any callback is built.
        let light = if QUIET {
            self.ledger.complete_light(tag)
        } else {
            None
        };
        let n = match light {
            Some(n) => n,
            None => self.complete_each::<QUIET>(tag, ok, on),
        };
        // The template sources no outstanding request (and no template)
        // needs any more go back now, as a request's own handle would.
        if n > 0 && !self.pins.is_empty() {
            self.settle_pins();
        }
        n
    }

    /// [`complete`](Self::complete)'s walk: `on` for each request handed
    /// back (every one, or with `QUIET` those that lent something).
    #[inline(always)]
    fn complete_each<const QUIET: bool>(
        &mut self,
        tag: u64,
        ok: bool,
        on: &mut impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        let (send, side) = (&mut self.ledger, &mut self.side);
        let each = |r: super::ledger::Released<Loan>| {
            let loan = match r.payload {
                Loan::Side => side_loan(side, r.slot, ok || !r.own),
                loan => loan,
            };
            on(r.wr_id, r.own, Kind::Send, loan)
        };
        if QUIET {
            send.complete_quiet(tag, each)
        } else {
            send.complete(tag, each)
        }
    }
}

impl RecvQueue {
    /// Ends the receive completion `tag` names: the one way a completion
    /// takes a receive out of the QP's receive ledger. A pool's buffer
    /// also leaves its pool's pin.
    #[inline(always)]
    pub(super) fn complete(
        &mut self,
        tag: u64,
        on: &mut impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        // A receive completion ends its own request only (free list): no
        // loop, one call of `on`.
        let mut pooled = None;
        let ended = self.ledger.take_tag(tag, |wr_id, loan| {
            if let Loan::Pooled = loan {
                pooled = Some(wr_id);
            }
            on(wr_id, true, Kind::Recv, loan)
        });
        if let Some(wr_id) = pooled {
            self.pool_ended(wr_id);
        }
        usize::from(ended.is_some())
    }
}

/// What a send kept in the side table at `slot`, taken out: a window
/// bind or invalidation ran (`ran`) if its completion, or a later one,
/// succeeded (send queues stop at an error), and the window's state
/// follows; an address handle is let go.
#[inline(never)]
fn side_loan(side: &mut [SendLoan], slot: usize, ran: bool) -> Loan {
    let (loan, _ah, mw) = std::mem::take(&mut side[slot]);
    if let Some(mut mw) = mw {
        mw.settle(ran);
    }
    loan
}

impl QueuePair {
    /// Hands back the requests that completion `wc` ends, calling `f` for
    /// each (oldest first); returns how many.
    ///
    /// The completion's tag says which queue it belongs to: this QP's send
    /// queue (a send completion ends its send and every send posted before
    /// it, as send queues complete in order), its receive queue, or its SRQ
    /// (handed to [`SharedReceiveQueue::reclaim`](crate::SharedReceiveQueue::reclaim)).
    /// A completion ends something only the first time, and only on the
    /// queue that issued its tag: completions of other QPs (of any device
    /// or context), of QPs destroyed before, from before a RESET, or already
    /// reclaimed, end nothing. Works for failed and flushed completions
    /// too, whose opcode the device leaves undefined. Allocates nothing.
    #[inline]
    pub fn reclaim<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
        mut f: impl FnMut(Completed),
    ) -> usize {
        self.route::<C, false>(wc, |wr_id, own, kind, loan| {
            f(Completed::new(wr_id, own, kind, loan))
        })
    }

    /// Hands back the request completion `wc` names, by value, so that its
    /// chunks can be posted again at once (the QP is not borrowed by a
    /// callback): the common case of receives and of send queues whose
    /// every request is signalled. `None` if the completion ends nothing
    /// here (see [`reclaim`](Self::reclaim)).
    ///
    /// A send completion also ends every earlier send (unsignalled ones,
    /// or signalled ones not reclaimed yet): those go to
    /// [`take_released`](Self::take_released), oldest first, where nothing
    /// is lost (they allocate there; a stream of unsignalled sends is
    /// better served by [`reclaim_chunks`](Self::reclaim_chunks)).
    ///
    /// Two `Option`s stand between a completion and its chunk: this one
    /// (the completion may end nothing here: another QP's, a raw post's),
    /// and [`Completed::into_chunk`](crate::qp::Completed::into_chunk)'s
    /// (the request may have lent no chunk of its own). Loops that know
    /// both answers need neither: receives into a
    /// [`RecvBuffers`](crate::qp::RecvBuffers) pool come back from one
    /// [`take`](crate::qp::RecvBuffers::take) as the received bytes, and
    /// send chunks go straight into a free list with
    /// [`reclaim_chunks`](Self::reclaim_chunks) (see the guide's
    /// request/response loop, [`guide::examples`](crate::guide::examples)).
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::qp::RecvWr;
    /// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    /// for wc in cq.poll(&mut wcs)?.iter() {
    ///     if let Some(done) = qp.reclaim_one(wc) {
    ///         // Repost the receive's chunk at once.
    ///         if let Some(chunk) = done.into_chunk() {
    ///             qp.post_recv([RecvWr::new(7).sge(chunk)])?;
    ///         }
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn reclaim_one<C: Completion + ?Sized>(&mut self, wc: &C) -> Option<Completed> {
        self.reclaim_one_routed(wc)
    }

    /// Hands back the requests that completion `wc` ends, as
    /// [`reclaim`](Self::reclaim) does, but in one call and without a
    /// record per request: the owned chunks of all of them go to `chunks`,
    /// oldest request first and in scatter/gather order within each
    /// ([`SharedChunk`](crate::SharedChunk) clones are let go). Returns how many requests ended.
    ///
    /// For streams where the `wr_id`s of the requests are not needed: one
    /// signalled completion ending a run of a hundred unsignalled writes
    /// is one call with no callback per write. Allocates nothing unless
    /// `chunks` grows.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// let mut free = Vec::with_capacity(128);
    /// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    /// for wc in cq.poll(&mut wcs)?.iter() {
    ///     qp.reclaim_chunks(wc, &mut free);
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn reclaim_chunks<C: Completion + ?Sized, E: Extend<Chunk>>(
        &mut self,
        wc: &C,
        chunks: &mut E,
    ) -> usize {
        self.route::<C, true>(wc, |_, _, _, loan| loan.give_owned(chunks))
    }

    /// Moves the QP to RESET (`ibv_modify_qp` with `IBV_QP_STATE` only)
    /// and hands back every request it still held, oldest first, sends
    /// before receives: the device forgets them all in RESET.
    ///
    /// Requests whose completions were lost (a CQ overrun) or never come
    /// (receives on rxe in ERR, posts the provider failed) come back here.
    /// Completions of them still in a CQ end nothing afterwards. Also
    /// returns what an earlier move to RESET through [`modify`](Self::modify)
    /// left in [`take_released`](Self::take_released).
    ///
    /// # Errors
    /// What [`modify`](Self::modify) answers when the move to RESET is
    /// refused or fails; the requests then stay outstanding.
    #[doc(alias = "ibv_modify_qp")]
    pub fn reset(&mut self) -> Result<Vec<Completed>> {
        self.modify(&super::QpAttr::new().state(QpState::Reset))?;
        Ok(self.take_released())
    }

    /// The requests a move to RESET (through [`modify`](Self::modify), a
    /// typed transition or [`reset`](Self::reset)) handed back and that were
    /// not taken yet; empty otherwise.
    pub fn take_released(&mut self) -> Vec<Completed> {
        self.pending_mut().send.take_released()
    }

    /// Destroys the QP now and hands back every request it still held
    /// (and what a RESET left in [`take_released`](Self::take_released)).
    ///
    /// On failure the QP still exists on the device, so its requests'
    /// chunks are leaked with it, never handed back or freed.
    ///
    /// # Errors
    /// What `ibv_destroy_qp` answers; the QP and every request's chunks
    /// are then leaked, never freed under the device.
    #[doc(alias = "ibv_destroy_qp")]
    pub fn close_and_reclaim(self) -> Result<Vec<Completed>> {
        Ok(self.into_keep()?.into_all())
    }
}

//! Posting receives to a QP's receive queue: a chain ([`QueuePair::post_recv`])
//! or one request ([`QueuePair::post_recv_one`]), and the receive post loop
//! QPs and SRQs share ([`post_recv_chain`]).

use std::ffi::c_int;

use super::super::chain::{post_chain, Chain, Room, Scratch, Stack};
use super::super::completed::PostError;
use super::super::entries::Loan;
use super::super::ledger::RecvLedger;
use super::super::request::RecvWr;
use super::super::QueuePair;
use super::RecvFacts;
use crate::sys;

impl QueuePair {
    /// Posts a chain of receive requests with one `ibv_post_recv` call.
    ///
    /// Refused before the call, with every chunk handed back: a QP whose
    /// known state is RESET or ERR (in ERR the verbs would flush the
    /// receive, but rxe on Linux 6.1 never completes it), a QP that
    /// receives through an SRQ, more entries than `max_recv_sge` or
    /// [`MAX_SGE`](crate::qp::MAX_SGE), chunks of another PD, chunks of a region registered
    /// without `LOCAL_WRITE` (the device writes receives: it would fail
    /// the receive and move the QP to ERR), on a UD QP bound to a port that
    /// needs a GRH (RoCE, or `IBV_QPF_GRH_REQUIRED`) a receive of fewer
    /// than 40 bytes in all (the device writes the 40-byte GRH first, and
    /// on such a port every datagram carries one), and no room in the
    /// receive queue. On an InfiniBand port without that flag the 40 bytes
    /// are not checked: a datagram may come without a GRH (its payload still
    /// starts at byte 40, ibv_post_recv(3)). A receive without a buffer
    /// ([`RecvWr::new`](crate::qp::RecvWr::new) alone) is allowed: it takes an RDMA WRITE with
    /// immediate (or a zero-length send).
    /// An empty iterator posts nothing and calls nothing.
    ///
    /// # Errors
    /// A [`PostError`]: refused before the call (every chunk handed back
    /// in it, nothing posted), or the provider failed (the requests stay in
    /// the ledger, in doubt).
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post_recv<I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        self.recv_half(true).post_recv(wrs)
    }

    /// Posts one receive: [`post_recv`](Self::post_recv) with a single
    /// request, as a loop that reposts each completed receive at once
    /// posts, without an iterator or a chain. The raw request is built on
    /// the stack, as a C program builds it. Refused, with the chunks
    /// handed back and nothing recorded, as `post_recv` refuses; a
    /// provider failure keeps the request in the ledger (in doubt, see
    /// [`PostError`]).
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, cq: &rdma_verbs::CompletionQueue) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_verbs::qp::RecvWr;
    /// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    /// for wc in cq.poll(&mut wcs)?.iter() {
    ///     if let Some(chunk) = qp.reclaim_one(wc).and_then(|done| done.into_chunk()) {
    ///         qp.post_recv_one(RecvWr::new(7).sge(chunk))?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv).
    #[doc(alias = "ibv_post_recv")]
    #[inline(always)]
    pub fn post_recv_one(&mut self, wr: RecvWr) -> Result<(), PostError> {
        self.recv_half(true).post_recv_one(wr)
    }
}

/// Fills a receive's raw form in place.
#[inline(always)]
fn fill_recv(wr: &RecvWr, raw: &mut sys::ibv_recv_wr, sges: &mut [sys::ibv_sge]) {
    raw.num_sge = wr.data.fill(sges) as c_int;
}

/// Posts the receives of `reqs` to a QP's receive queue or an SRQ through
/// `call`, after the checks every receive gets.
#[inline]
pub(crate) fn post_recv_chain(
    verb: &'static str,
    ledger: &mut RecvLedger<Loan>,
    scratch: &mut Scratch<sys::ibv_recv_wr>,
    facts: &RecvFacts,
    reqs: impl Iterator<Item = RecvWr>,
    call: impl FnOnce(*mut sys::ibv_recv_wr, &mut *mut sys::ibv_recv_wr) -> c_int,
) -> Result<(), PostError> {
    // Receives never lend beside their entries: no side table.
    let mut no_side = Vec::new();
    let mut stack = Stack::new();
    let chain = Chain {
        ledger,
        side: &mut no_side,
        scratch: Room::new(&mut stack, scratch),
        n: 0,
    };
    post_chain(
        verb,
        chain,
        reqs,
        |wr| facts.fast(wr),
        |wr| facts.check(verb, wr),
        fill_recv,
        |ledger, _, wr: RecvWr| ledger.insert(wr.wr_id, wr.data.into_loan()),
        |wr, out| wr.data.give_back(out),
        call,
    )
}

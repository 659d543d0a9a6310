//! A QP's send half and receive half: the one implementation of posting
//! and reclaiming, for a whole [`QueuePair`] and for a split one.
//!
//! # Two threads on one QP
//!
//! [`QueuePair::split`] lends the QP's two queues out as a [`SendHalf`]
//! and a [`RecvHalf`] (for scoped threads); [`QueuePair::into_split`]
//! gives them away as [`OwnedSendHalf`](super::OwnedSendHalf) and
//! [`OwnedRecvHalf`](super::OwnedRecvHalf) (for threads and tasks of their
//! own), which [`reunite`](super::OwnedSendHalf::reunite) puts back
//! together. Each half posts and reclaims its own queue's requests only.
//! The methods of a whole `QueuePair` (`post_send`, `post_recv`,
//! `reclaim`, ...) are these same methods on a half made for the call.
//!
//! # One send, from post to reclaim
//!
//! 1. `post.rs`: [`QueuePair::post_send`] makes the [`SendHalf`] of the
//!    call (`halves.rs`: the QP's `QpCommon` and its [`SendQueue`],
//!    `queues.rs`) and calls [`SendHalf::post_send`].
//! 2. `halves.rs`: the QP's known state is read (one atomic load, which
//!    also says whether a leaked batch holds the send-queue lock); the
//!    call goes to `post_chain`.
//! 3. `chain.rs`: `post_chain`, the one post loop: per request the fast
//!    check (`SendFacts`, `post.rs`), the raw request filled on the call's
//!    stack (`fill_send`, `post.rs`), the request's `Loan` (its chunks,
//!    `entries.rs`) moved into the `Ledger` (`ledger.rs`), whose tag
//!    becomes the `wr_id`; then one `ibv_post_send`. A refusal or a
//!    panicking iterator takes the call's requests back out (`Chain`'s
//!    undo).
//! 4. `reclaim.rs`: [`QueuePair::reclaim`] routes the completion by its
//!    tag's kind (`route`, `halves.rs`) to the send half, whose
//!    `SendQueue::complete` takes the requests it ends out of the ledger
//!    and hands each back as a [`Completed`] (`completed.rs`).
//!
//! Eight files of `datapath/` (`post.rs`, `halves.rs`, `queues.rs`,
//! `chain.rs`, `entries.rs`, `ledger.rs`, `reclaim.rs`, `completed.rs`)
//! and fifteen names: `QueuePair::post_send`, `SendHalf`, `QpCommon`,
//! `SendQueue`, `post_chain`, `SendFacts`, `fill_send`, `Loan`, `Ledger`,
//! the tag, `Chain`, `QueuePair::reclaim`, `route`,
//! `SendQueue::complete`, `Completed`.
//!
//! # Why two halves on two threads are sound
//!
//! * **Nothing of the crate's is shared mutably.** A send half changes
//!   only its [`SendQueue`] (ledger, side table, scratch, template pins),
//!   a receive half only its [`RecvQueue`] (ledger, scratch, pool pins):
//!   disjoint borrows of the QP's bookkeeping, or owned outright by an
//!   owned half. What both read, `QpCommon`, is never changed through a
//!   half, but for the known state, one atomic word.
//! * **The provider serializes each queue.** A send half calls
//!   `ibv_post_send`, a receive half `ibv_post_recv`, on the same QP at
//!   the same time, as C programs do: libibverbs' verbs are thread-safe,
//!   and providers lock the send and the receive queue apart (rxe's
//!   `sq.lock` and `rq.lock`, mlx5's `sq.lock` and `rq.lock`). A failed
//!   completion may make a half ask the device for the QP's state
//!   (`ibv_query_qp`, a system call).
//! * **A completion goes only to the half whose queue issued its tag.** A
//!   receive completion offered to the send half (or the reverse) names a
//!   kind that is not the half's: it ends nothing, as a completion of
//!   another QP ends nothing. Receives of the QP's SRQ go to the receive
//!   half, which hands them to the SRQ (which locks its own ledger).
//! * **What needs the whole QP waits for it.** RESET, modify and close
//!   take `&mut QueuePair` or the `QueuePair` itself: the borrow checker
//!   refuses them while a borrowed half lives, and owned halves have no
//!   way to them until they are reunited.

use std::ptr::NonNull;

use super::chain::{post_chain, refuse_all, Chain, Room, Stack};
use super::completed::{Completed, Completion, PostError};
use super::entries::Loan;
use std::sync::Arc;

use super::chain::refused_entry;
use super::ledger::Kind;
use super::post::{check_send, fill_send, lend_send, post_recv_chain, send_refusal};
use super::queues::{RecvQueue, SendQueue};
use super::request::{RecvWr, SendWr};
use super::{QpState, QpType, QueuePair};
use crate::error::Error;
use crate::mr::Chunk;
use crate::pd::ProtectionDomain;
use crate::qp::known::{query_state, Known};
use crate::srq::SharedReceiveQueue;
use crate::sys;

/// What both halves read of their QP, kept with it from its creation; a
/// half changes none of it but the known state (one atomic word).
pub(crate) struct QpCommon {
    raw: NonNull<sys::ibv_qp>,
    pub(crate) pd: ProtectionDomain,
    pub(crate) srq: Option<SharedReceiveQueue>,
    /// The QP's known state (see `QueuePair::known`).
    known: Arc<Known>,
    qp_type: QpType,
}

// `raw` is the QP this is kept with, live while a half can reach it (a
// half borrows its `QueuePair`, or an owned half's joint keeps it),
// through which a half calls only `ibv_post_send` (the send half),
// `ibv_post_recv` (the receive half) and `ibv_query_qp`: thread-safe verbs
// whose providers lock the send and the receive queue apart. The other
// fields are `Send` and `Sync`.
// SAFETY: so `QpCommon` may move to another thread (above).
unsafe impl Send for QpCommon {}
// SAFETY: as for `Send`; through `&QpCommon` only those verbs are called
// and only the atomic known state is written.
unsafe impl Sync for QpCommon {}

impl QpCommon {
    pub(crate) fn new(
        raw: NonNull<sys::ibv_qp>,
        pd: ProtectionDomain,
        srq: Option<SharedReceiveQueue>,
        known: Arc<Known>,
        qp_type: QpType,
    ) -> Self {
        QpCommon {
            raw,
            pd,
            srq,
            known,
            qp_type,
        }
    }

    #[inline(always)]
    fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.raw.as_ptr()
    }

    #[inline(always)]
    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live while a half can reach this; `qp_num` is
        // set at creation and never changes.
        unsafe { (*self.as_ptr()).qp_num }
    }

    #[inline(always)]
    fn state(&self) -> QpState {
        self.known.state()
    }

    /// Whether completion `wc` may be this QP's: it names this QP's number
    /// or none. Needed only for SRQ receives: a send or receive tag ends
    /// something only on the queue that issued its stamp (unique in the
    /// process), while an SRQ's receive may complete on any QP of the SRQ,
    /// and the QP the completion names is the one whose state it moves.
    #[inline(always)]
    fn names_us<C: Completion + ?Sized>(&self, wc: &C) -> bool {
        wc.local_qp_num().is_none_or(|n| n == self.qp_num())
    }

    /// A failed or flushed completion (raw status `status`) of one of this
    /// QP's requests (`kind`: its queue) was reclaimed: the first failure
    /// is recorded for [`QueuePair::explain`], and the known state follows
    /// the device (below).
    #[cold]
    #[inline(never)]
    fn failed(&self, kind: Kind, status: u32) {
        let k = match kind {
            Kind::Send => 0,
            Kind::Recv => 1,
            Kind::Srq => 2,
        };
        self.known.note_failure(status, k);
        if self.state() != QpState::Err {
            self.device_failed(kind);
        }
    }

    /// A failed or flushed completion of one of this QP's requests was
    /// reclaimed (`kind`: its queue): the device moved the QP, and the
    /// known state follows.
    ///
    /// A flush happens only in ERR, and an error moves the QP to ERR,
    /// except a send's on UD or UC, which the verbs move to SQE (rxe: ERR).
    /// The request was outstanding, so the QP was not reset since it was
    /// posted, and ERR has no way out but RESET: for the QP's own queues
    /// ERR still holds. Receives of the QP's SRQ outlive a RESET of the QP,
    /// so such a completion may be older than one; those and the UD/UC
    /// sends ask the device (and store its answer unless a move was
    /// recorded meanwhile).
    #[cold]
    #[inline(never)]
    fn device_failed(&self, kind: Kind) {
        match kind {
            Kind::Recv => self.known.set(QpState::Err),
            Kind::Send if self.qp_type == QpType::Rc => self.known.set(QpState::Err),
            // SAFETY: the QP is live for the call (see `as_ptr`).
            _ => self
                .known
                .follow_device(|| unsafe { query_state(self.as_ptr()) }),
        }
    }
}

/// The send queue of a QP, lent out by [`QueuePair::split`]: posts sends
/// and reclaims their completions while a [`RecvHalf`] of the same QP
/// does the same for receives, on another thread if need be.
///
/// Each method is the [`QueuePair`] method of the same name, on the send
/// queue alone; a receive completion offered to it ends nothing (returns
/// 0 or `None`). `Send`: a half moves to a scoped thread; not `Sync`, as
/// its methods that do something take `&mut self`.
///
/// ```no_run
/// # fn f(mut qp: rdma_verbs::QueuePair, cq: rdma_verbs::CompletionQueue,
/// #      chunks: Vec<rdma_verbs::Chunk>) {
/// use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
/// let (mut tx, mut rx) = qp.split();
/// std::thread::scope(|s| {
///     s.spawn(move || {
///         for (i, c) in chunks.into_iter().enumerate() {
///             tx.post_send([SendWr::new(i as u64, SendOp::Send).sge(c)]).unwrap();
///         }
///     });
///     s.spawn(move || rx.post_recv([RecvWr::new(1)]).unwrap());
/// });
/// # let _ = cq; }
/// ```
#[doc(alias = "ibv_post_send")]
pub struct SendHalf<'q> {
    qp: &'q QpCommon,
    q: &'q mut SendQueue,
}

/// The receive queue of a QP, lent out by [`QueuePair::split`]: posts
/// receives and reclaims their completions (its SRQ's too, for a QP that
/// has one) while a [`SendHalf`] of the same QP works on sends.
///
/// Each method is the [`QueuePair`] method of the same name, on the
/// receive queue alone; a send completion offered to it ends nothing.
/// `Send`, not `Sync` (see [`SendHalf`]).
#[doc(alias = "ibv_post_recv")]
pub struct RecvHalf<'q> {
    qp: &'q QpCommon,
    q: &'q mut RecvQueue,
}

impl<'q> SendHalf<'q> {
    #[inline(always)]
    pub(super) fn new(qp: &'q QpCommon, q: &'q mut SendQueue) -> Self {
        SendHalf { qp, q }
    }

    /// The same as [`QueuePair::post_send`], on this half's QP.
    ///
    /// # Errors
    /// A [`PostError`] as `QueuePair::post_send` returns one: refused
    /// before the call (every chunk handed back in it, nothing posted), or
    /// the provider failed (the requests stay in the ledger, in doubt).
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post_send<'a, I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = SendWr<'a>>,
    {
        const VERB: &str = "ibv_post_send";
        if !self.qp.known.sends() {
            let error = send_refusal(VERB, &self.qp.known);
            return refuse_all(error, wrs.into_iter(), |w, out| w.data.give_back(out));
        }
        let raw = self.qp.as_ptr();
        let ctx = self.qp.pd.context();
        let q = &mut *self.q;
        let facts = q.facts;
        let mut stack = Stack::new();
        let chain = Chain {
            ledger: &mut q.ledger,
            side: &mut q.side,
            scratch: Room::new(&mut stack, &mut q.scratch),
            n: 0,
        };
        post_chain(
            VERB,
            chain,
            wrs.into_iter(),
            |wr| facts.fast(wr),
            |wr| check_send(&facts, ctx, raw, wr),
            |wr, raw, sges| fill_send(wr, raw, sges),
            |ledger, side, wr| lend_send(ledger, side, wr),
            |wr, out| wr.data.give_back(out),
            |chain, bad| {
                // `chain` is a NULL-terminated chain whose sg_lists point
                // into the call's raw requests, both unchanged until the call
                // returns; every entry names a chunk now held by the ledger
                // (which keeps it until the device is provably done) or
                // inline data borrowed for the call; UD entries name live
                // address handles, kept in the side table too.
                // SAFETY: a live QP and a valid chain over memory that outlives its use (above).
                unsafe { sys::ibv_post_send(raw, chain, bad) }
            },
        )
    }

    /// The same as [`QueuePair::reclaim`], except that only this QP's
    /// send completions end anything.
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

    /// The same as [`QueuePair::reclaim_one`], except that only this QP's
    /// send completions end anything (earlier sends it ends go to
    /// [`take_released`](Self::take_released)).
    #[inline]
    pub fn reclaim_one<C: Completion + ?Sized>(&mut self, wc: &C) -> Option<Completed> {
        let mut one = One::default();
        self.route::<C, false>(wc, |wr_id, own, kind, loan| {
            one.add(Completed::new(wr_id, own, kind, loan))
        });
        one.finish(self.q)
    }

    /// The same as [`QueuePair::reclaim_chunks`], except that only this
    /// QP's send completions end anything.
    #[inline]
    pub fn reclaim_chunks<C: Completion + ?Sized, E: Extend<Chunk>>(
        &mut self,
        wc: &C,
        chunks: &mut E,
    ) -> usize {
        self.route::<C, true>(wc, |_, _, _, loan| loan.give_owned(chunks))
    }

    /// The same as [`QueuePair::take_released`]: the sends that
    /// [`reclaim_one`](Self::reclaim_one) ended beside the one it named.
    pub fn take_released(&mut self) -> Vec<Completed> {
        self.q.take_released()
    }

    /// How many sends are outstanding (as [`QueuePair::outstanding_sends`]).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.q.ledger.len()
    }

    /// The QP's known state (as [`QueuePair::state`]).
    #[inline]
    pub fn state(&self) -> QpState {
        self.qp.state()
    }

    /// The QP's number.
    #[inline]
    pub fn qp_num(&self) -> crate::qp::QpNum {
        crate::qp::QpNum::truncate(self.qp.qp_num())
    }

    /// Routes `wc` to the send ledger if it is this QP's send completion.
    #[inline(always)]
    pub(super) fn route<C: Completion + ?Sized, const QUIET: bool>(
        &mut self,
        wc: &C,
        on: impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        // The stamp alone proves the QP (see `QpCommon::names_us`).
        let tag = wc.tag();
        if Kind::of(tag) != Some(Kind::Send) {
            return 0;
        }
        self.ended::<C, QUIET>(wc, tag, on)
    }

    /// Ends what send completion `wc` (tag `tag`, this QP's send kind)
    /// ends; a failure moves the known state.
    #[inline(always)]
    pub(super) fn ended<C: Completion + ?Sized, const QUIET: bool>(
        &mut self,
        wc: &C,
        tag: u64,
        mut on: impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        let ok = wc.succeeded();
        let n = self.q.complete::<QUIET>(tag, ok, &mut on);
        if n > 0 && !ok {
            self.qp.failed(Kind::Send, wc.status_code());
        }
        n
    }
}

impl<'q> RecvHalf<'q> {
    #[inline(always)]
    pub(super) fn new(qp: &'q QpCommon, q: &'q mut RecvQueue) -> Self {
        RecvHalf { qp, q }
    }

    /// The same as [`QueuePair::post_recv`], on this half's QP.
    ///
    /// # Errors
    /// A [`PostError`] as `QueuePair::post_recv` returns one.
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub fn post_recv<I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        const VERB: &str = "ibv_post_recv";
        if self.takes_no_recvs() {
            let error = Some(self.recv_refused(VERB));
            return refuse_all(error, wrs.into_iter(), |w, out| w.data.give_back(out));
        }
        let raw = self.qp.as_ptr();
        let q = &mut *self.q;
        let facts = q.facts;
        post_recv_chain(
            VERB,
            &mut q.ledger,
            &mut q.scratch,
            &facts,
            wrs.into_iter(),
            |chain, bad| {
                // SAFETY: live QP; a NULL-terminated chain into the call's
                // stack (and the queue's scratch), naming chunks the ledger holds.
                unsafe { sys::ibv_post_recv(raw, chain, bad) }
            },
        )
    }

    /// The same as [`QueuePair::post_recv_one`], on this half's QP.
    ///
    /// # Errors
    /// A [`PostError`] as `QueuePair::post_recv` returns one.
    #[doc(alias = "ibv_post_recv")]
    #[inline(always)]
    pub fn post_recv_one(&mut self, wr: RecvWr) -> Result<(), PostError> {
        const VERB: &str = "ibv_post_recv";
        // One writable chunk of this PD that holds the floor (or none where
        // there is no floor), and room: the common case. Anything else
        // takes `post_recv`'s path, which refuses it with the reason.
        if self.takes_no_recvs() || !self.q.facts.fast(&wr) || self.q.ledger.room() == 0 {
            return post_recv_refused(self.qp, self.q, wr);
        }
        let mut sge = sys::ibv_sge::default();
        let num_sge = wr.data.fill(std::slice::from_mut(&mut sge)) as std::ffi::c_int;
        let tag = match self.q.ledger.insert(wr.wr_id, wr.data.into_loan()) {
            Ok(tag) => tag,
            Err(loan) => return Err(refused_entry(VERB, &self.q.ledger, loan)),
        };
        let mut raw = sys::ibv_recv_wr {
            wr_id: tag,
            num_sge,
            ..Default::default()
        };
        if num_sge > 0 {
            raw.sg_list = &mut sge;
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // `raw` is one request (`next` NULL) whose entry, if any, lives on
        // this stack frame for the call and names the chunk the ledger now
        // holds (checked: of this PD, writable by the device) until the
        // device is done with it, whatever the provider returns.
        // SAFETY: a live QP, and a request valid for the call (above).
        let rc = unsafe { sys::ibv_post_recv(self.qp.as_ptr(), &mut raw, &mut bad) };
        if rc != 0 {
            return Err(super::chain::provider_failed(VERB, rc, 1));
        }
        Ok(())
    }

    /// The same as [`QueuePair::reclaim`], except that only this QP's
    /// receive completions (and its SRQ's) end anything.
    #[inline]
    pub fn reclaim<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
        mut f: impl FnMut(Completed),
    ) -> usize {
        self.route::<C>(wc, |wr_id, own, kind, loan| {
            f(Completed::new(wr_id, own, kind, loan))
        })
    }

    /// The same as [`QueuePair::reclaim_one`], except that only this QP's
    /// receive completions (and its SRQ's) end anything.
    #[inline]
    pub fn reclaim_one<C: Completion + ?Sized>(&mut self, wc: &C) -> Option<Completed> {
        let mut named = None;
        self.route::<C>(wc, |wr_id, own, kind, loan| {
            named = Some(Completed::new(wr_id, own, kind, loan))
        });
        named
    }

    /// The same as [`QueuePair::reclaim_chunks`], except that only this
    /// QP's receive completions (and its SRQ's) end anything.
    #[inline]
    pub fn reclaim_chunks<C: Completion + ?Sized, E: Extend<Chunk>>(
        &mut self,
        wc: &C,
        chunks: &mut E,
    ) -> usize {
        self.route::<C>(wc, |_, _, _, loan| loan.give_owned(chunks))
    }

    /// How many receives are outstanding (as
    /// [`QueuePair::outstanding_recvs`]).
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.q.ledger.len()
    }

    /// The QP's known state (as [`QueuePair::state`]).
    #[inline]
    pub fn state(&self) -> QpState {
        self.qp.state()
    }

    /// The QP's number.
    #[inline]
    pub fn qp_num(&self) -> crate::qp::QpNum {
        crate::qp::QpNum::truncate(self.qp.qp_num())
    }

    /// Routes `wc` to the receive ledger or the SRQ if it is a receive
    /// completion of this QP's.
    #[inline(always)]
    fn route<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
        on: impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        let tag = wc.tag();
        match Kind::of(tag) {
            Some(Kind::Recv) => self.ended(wc, tag, Kind::Recv, on),
            Some(Kind::Srq) if self.qp.names_us(wc) => self.ended(wc, tag, Kind::Srq, on),
            _ => 0,
        }
    }

    /// Ends the receive completion `wc` (tag `tag` of `kind`, a receive
    /// kind) names: a peer's SEND_WITH_INV invalidated a window, a failure
    /// moves the known state.
    #[inline(always)]
    pub(super) fn ended<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
        tag: u64,
        kind: Kind,
        mut on: impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        let n = match kind {
            Kind::Recv => self.q.complete(tag, &mut on),
            Kind::Srq => self.qp.srq.as_ref().map_or(0, |srq| {
                srq.reclaim_tag(tag, |c| on(c.wr_id, c.signaled, Kind::Srq, c.loan))
            }),
            Kind::Send => 0,
        };
        if n > 0 {
            self.after_ended(wc, kind);
        }
        n
    }

    /// After receive completion `wc` (of `kind`) ended a request: a peer's
    /// SEND_WITH_INV invalidated a window, a failure moved the QP.
    #[inline(always)]
    pub(super) fn after_ended<C: Completion + ?Sized>(&self, wc: &C, kind: Kind) {
        let connected = matches!(self.qp.qp_type, QpType::Rc | QpType::Uc);
        let ctx = self.qp.pd.context();
        if let Some(rkey) = crate::mw::peer_invalidated(ctx, wc, connected) {
            crate::mw::invalidated_by_peer(ctx, rkey);
        }
        if !wc.succeeded() {
            self.qp.failed(kind, wc.status_code());
        }
    }

    /// Whether the QP takes no receive now: its known state is RESET or
    /// ERR (in ERR the verbs would flush a receive, but rxe on Linux 6.1
    /// never completes it), or it receives through an SRQ.
    #[inline(always)]
    fn takes_no_recvs(&self) -> bool {
        matches!(self.qp.state(), QpState::Reset | QpState::Err) || self.qp.srq.is_some()
    }

    /// Why the QP takes no receive now (see `takes_no_recvs`), if it
    /// does not: the first check of every receive post.
    #[inline(always)]
    pub(super) fn recv_refusal(&self, verb: &'static str) -> Option<Error> {
        self.takes_no_recvs().then(|| self.recv_refused(verb))
    }

    #[cold]
    #[inline(never)]
    fn recv_refused(&self, verb: &'static str) -> Error {
        if self.qp.srq.is_some() {
            Error::invalid(verb, "the QP receives through its SRQ: post to the SRQ")
        } else {
            Error::QpState {
                verb,
                state: self.qp.state(),
                needs: "receives need INIT, RTR, RTS, SQD or SQE",
            }
        }
    }
}

/// [`RecvHalf::post_recv_one`]'s request that the common case does not
/// take: `post_recv` checks it and refuses it with the reason (or, where
/// only the fast check was too strict, posts it). Its half's parts, not
/// the half, so that the common case keeps them in registers.
#[cold]
#[inline(never)]
fn post_recv_refused(qp: &QpCommon, q: &mut RecvQueue, wr: RecvWr) -> Result<(), PostError> {
    RecvHalf::new(qp, q).post_recv(std::iter::once(wr))
}

/// [`reclaim_one`](SendHalf::reclaim_one)'s collection: the request the
/// completion named, and any earlier ones it ended.
#[derive(Default)]
struct One {
    named: Option<Completed>,
    earlier: Option<Vec<Completed>>,
}

impl One {
    #[inline(always)]
    fn add(&mut self, c: Completed) {
        if c.signaled {
            self.named = Some(c);
        } else {
            self.earlier.get_or_insert_with(Vec::new).push(c);
        }
    }

    /// The named request; the earlier ones go to `q`'s released list.
    #[inline(always)]
    fn finish(self, q: &mut SendQueue) -> Option<Completed> {
        if let Some(mut e) = self.earlier {
            q.keep_released(&mut e);
        }
        self.named
    }
}

impl QueuePair {
    /// The facts both halves read and the two queues: disjoint borrows of
    /// the QP's keep.
    #[inline(always)]
    fn queues(&mut self) -> (&QpCommon, &mut SendQueue, &mut RecvQueue) {
        let (common, pending) = self.parts();
        (common, &mut pending.send, &mut pending.recv)
    }

    /// The send half, for one call of a `QueuePair` method.
    #[inline(always)]
    pub(super) fn send_half(&mut self) -> SendHalf<'_> {
        let (shared, send, _) = self.queues();
        SendHalf::new(shared, send)
    }

    /// The receive half, for one call of a `QueuePair` method (`floor`:
    /// set the receive floor of the QP's port first, for a post).
    #[inline(always)]
    pub(super) fn recv_half(&mut self, floor: bool) -> RecvHalf<'_> {
        let floor = if floor { Some(self.recv_floor()) } else { None };
        let (shared, _, recv) = self.queues();
        if let Some(floor) = floor {
            recv.facts.floor = floor;
        }
        RecvHalf::new(shared, recv)
    }

    /// Lends the QP's send queue and receive queue out as two halves that
    /// two threads can post to and reclaim from at once, with no lock
    /// between them (see [`SendHalf`] and [`RecvHalf`]).
    ///
    /// While the halves live, the QP cannot be modified, reset or closed
    /// (they borrow it); once they are dropped it is whole again, with
    /// every request they posted outstanding on it. For halves that
    /// outlive a borrow, see [`into_split`](Self::into_split).
    pub fn split(&mut self) -> (SendHalf<'_>, RecvHalf<'_>) {
        let floor = self.recv_floor();
        let (shared, send, recv) = self.queues();
        recv.facts.floor = floor;
        (SendHalf::new(shared, send), RecvHalf::new(shared, recv))
    }

    /// Routes completion `wc` by its tag's kind to the send or the receive
    /// half: the one routing of a whole QP's `reclaim` calls.
    #[inline(always)]
    pub(super) fn route<C: Completion + ?Sized, const QUIET: bool>(
        &mut self,
        wc: &C,
        on: impl FnMut(u64, bool, Kind, Loan),
    ) -> usize {
        let (shared, send, recv) = self.queues();
        let tag = wc.tag();
        // Each kind a constant in its arm, so that `ended` folds its own
        // match on it. Only an SRQ's receive needs the QP's number (see
        // `QpCommon::names_us`).
        match Kind::of(tag) {
            Some(Kind::Send) => SendHalf::new(shared, send).ended::<C, QUIET>(wc, tag, on),
            Some(Kind::Recv) => RecvHalf::new(shared, recv).ended(wc, tag, Kind::Recv, on),
            Some(Kind::Srq) if shared.names_us(wc) => {
                RecvHalf::new(shared, recv).ended(wc, tag, Kind::Srq, on)
            }
            _ => 0,
        }
    }

    /// The same as [`SendHalf::reclaim_one`] or [`RecvHalf::reclaim_one`],
    /// by the completion's kind.
    #[inline(always)]
    pub(super) fn reclaim_one_routed<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
    ) -> Option<Completed> {
        let mut one = One::default();
        self.route::<C, false>(wc, |wr_id, own, kind, loan| {
            one.add(Completed::new(wr_id, own, kind, loan))
        });
        one.finish(&mut self.pending_mut().send)
    }
}

// Both halves go to other threads.
const _: () = {
    const fn send<T: Send>() {}
    send::<SendHalf<'static>>();
    send::<RecvHalf<'static>>();
};

//! The data path: posting work requests and getting their buffers back.
//!
//! # Ownership of posted buffers
//!
//! The device reads and writes posted memory behind the compiler's back, so
//! safe code must never be able to touch (or free) memory while a work
//! request that names it may still be used by the device. This module makes
//! that a matter of ownership, as io_uring bindings do:
//!
//! * buffers are [`Chunk`]s: owned, disjoint pieces of a registered region;
//! * [`SendWr`] and [`RecvWr`] take their chunks *by value*; posting moves
//!   them into the queue's ledger of outstanding requests, where no Rust
//!   code can reach them;
//! * they come back only once the device is provably done with them:
//!   [`QueuePair::reclaim`] with the completion that ends the request
//!   (successful, failed or flushed; a send completion also ends every
//!   earlier send, as send queues complete in order), or
//!   [`QueuePair::reset`] / [`QueuePair::take_released`] after a move to
//!   RESET, or [`QueuePair::close_and_reclaim`] after the QP is destroyed.
//!   Dropping the QP destroys it first and only then drops what was
//!   outstanding; should destruction fail, the chunks are leaked rather
//!   than freed under the device.
//!
//! # Why a completion cannot hand back a buffer in use
//!
//! Every `wr_id` the safe path hands the device is a *tag*: two bits for
//! the kind of queue (a QP's send queue, a QP's receive queue, an SRQ) and
//! a 62-bit stamp that no other request of the process ever gets (stamps
//! come in blocks from one process-wide counter, a block belongs to one
//! queue for good, and the counter refuses to wrap). A queue accepts a
//! completion only if the tag's kind is its own and the stamp is exactly
//! that of a request it still holds, and then forgets the stamp. So a
//! completion of another QP, SRQ, device or context, of a QP destroyed
//! before, one reclaimed already, or one from before a RESET, ends nothing,
//! and `reclaim` routes by the kind (an SRQ tag goes to the QP's SRQ),
//! never by trying one table and then another. [`WorkCompletion`](crate::WorkCompletion)s cannot
//! be made up in safe code except as all-zero (tag `0`, which is never
//! issued). The bookkeeping is a pure module with a randomized
//! state-machine test against a model.
//!
//! # A failed post proves nothing
//!
//! A provider may queue a request and still report failure (rxe writes a
//! send into its ring, then fails the doorbell below RTS). So when
//! `ibv_post_send`/`ibv_post_recv` fail, every request of the call stays
//! in the ledger ("in doubt", counted in [`PostError::posted`]) until a
//! completion, a RESET or the QP's destruction proves the device is done;
//! nothing is handed back early. To keep that rare, what the verbs forbid
//! is refused *before* the call, with the chunks handed back in the error:
//! sends below RTS and receives in RESET or ERR (from the known
//! [`state`](QueuePair::state)), empty calls (the provider is never asked),
//! more requests than the queue has room for, entry counts, inline sizes,
//! operations the transport lacks, chunks and address handles of another
//! protection domain. So is what the device is sure to fail, which would
//! move the QP to ERR: entries the device must write (receives, RDMA READ
//! and atomic destinations) in a region registered without `LOCAL_WRITE`
//! (each chunk carries that flag, one test per entry), UD receives with no
//! room for the 40-byte GRH on a port where every datagram carries one,
//! and atomics on a device whose `atomic_cap` is NONE.
//!
//! What the device does fail moves the known state: reclaiming a failed or
//! flushed completion records ERR (see [`QueuePair::state`]).
//!
//! Chunks are never taken from a region that peers may write
//! (`REMOTE_WRITE`, `REMOTE_ATOMIC`): such memory is only reachable by copy
//! ([`MemoryRegion::read`](crate::MemoryRegion::read) and
//! [`write`](crate::MemoryRegion::write)), never as a Rust slice. Inline
//! data is copied by the provider during the post, so it is borrowed only
//! for the call. Remote addresses ([`RemoteAddr`](super::RemoteAddr)) are numbers naming the
//! peer's memory, which the peer's own registration protects.
//!
//! The ledgers are allocated when the QP is created (room for every work
//! request the queues hold, 48 bytes a slot), and a chain of requests is
//! filled in place into raw requests the QP keeps (as a C program fills
//! its own `ibv_send_wr` array), then handed to the provider in one call:
//! in steady state, posting and reclaiming allocate nothing.
//!
//! # The cost of it
//!
//! Per request the safe path does what soundness needs and little more:
//! the checks below (for the common request an opcode
//! bit, a PD compare, a destination test; facts about the QP were found at
//! creation), one ledger insert (a slot found by a mask, a stamp, three
//! stores), the raw request's fields written in place, and at completion
//! one compare of the full stamp and the hand-back. Refusals, undo and
//! growth are `#[cold]` functions; nothing on the happy path builds an
//! error or moves a large value.
//!
//! # The raw path
//!
//! [`QueuePair::post_send_raw`] and [`QueuePair::post_recv_raw`] are
//! `unsafe`: their caller promises what the ledger proves on the safe
//! path. The memory every entry names stays allocated and is not touched
//! by Rust in a way that conflicts with the device until the request's
//! completion was polled or the QP was reset or destroyed (and a failed
//! post does not end that promise); and those completions, which carry the
//! caller's own `wr_id`s, are never given to [`QueuePair::reclaim`]. The
//! two paths may share a QP; a raw `wr_id` whose top two bits are not `00`
//! could then be taken for a tag, which is why the promise is needed.

use std::ffi::c_int;

use super::chain::CHAIN_ROOM;
use super::completed::PostError;
use super::entries::Data;
use super::entries::{Loan, SendLoan};
use super::ex::SendOpsFlags;
use super::ledger::SendLedger;

mod recv;
use super::request::{RecvWr, SendOp, SendWr, MAX_SGE};
use super::{QpType, QueuePair};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::mr::Chunk;
use crate::sys;
pub(crate) use recv::post_recv_chain;

/// How many requests of a queue of `max_wr` requests a chain of up to
/// [`CHAIN_ROOM`] holds at most (the room a staging vector is made with).
pub(crate) fn chain_room(max_wr: u32) -> usize {
    (max_wr as usize).clamp(1, CHAIN_ROOM)
}

pub(crate) fn fail(error: Error, posted: usize, returned: Vec<Chunk>) -> PostError {
    PostError {
        error,
        posted,
        returned,
    }
}

/// The refusal of anything that takes the provider's send-queue lock on a
/// QP whose [`WrBatch`](super::WrBatch) was leaked while open.
#[cold]
#[inline(never)]
pub(crate) fn leaked_batch(verb: &'static str) -> Error {
    Error::GuardLeaked {
        verb,
        guard: "a WrBatch of this QP",
        lock: "the send queue's lock (ibv_wr_start without ibv_wr_complete or ibv_wr_abort)",
        can: "the QP can no longer send; it can still receive, be moved to RESET \
              (QueuePair::reset hands every request back, the leaked batch's included, \
              none of which reached the device) and be closed",
    }
}

impl QueuePair {
    /// The refusal of a send (`post_send`, a batch, a memory-window bind or
    /// invalidation) from the QP's known state, or because a leaked batch
    /// holds the provider's send-queue lock.
    #[inline]
    pub(crate) fn send_refusal(&self, verb: &'static str) -> Option<Error> {
        if !self.known().sends() {
            return send_refusal(verb, self.known());
        }
        None
    }
}

/// The refusal of a send because a leaked batch holds the provider's
/// send-queue lock, or in the known state (sends need RTS, SQD, SQE or
/// ERR); `None` if neither holds any more.
#[cold]
#[inline(never)]
pub(super) fn send_refusal(verb: &'static str, known: &crate::qp::Known) -> Option<Error> {
    if known.sends_locked() {
        return Some(leaked_batch(verb));
    }
    if known.sends() {
        return None;
    }
    Some(Error::QpState {
        verb,
        state: known.state(),
        needs: "sends need RTS, SQD, SQE or ERR",
    })
}

impl QueuePair {
    /// Posts one memory-window request (a bind or an invalidation) that
    /// lends `loan`: recorded through `SendQueue::lend_window`
    /// (`queues.rs`), then `call(tag)` hands it to the provider. A provider
    /// failure keeps it in the ledger (in doubt), as for
    /// [`post_send`](Self::post_send).
    pub(crate) fn post_one_loan(
        &mut self,
        verb: &'static str,
        wr_id: u64,
        loan: crate::mw::MwLoan,
        call: impl FnOnce(u64) -> c_int,
    ) -> Result<(), PostError> {
        let tag = self.pending_mut().send.lend_window(verb, wr_id, loan)?;
        let rc = call(tag);
        crate::error::check_rc(verb, rc)
            .map(|_| ())
            .map_err(|error| fail(error, 1, Vec::new()))
    }

    /// How many send requests are outstanding (posted, not yet reclaimed),
    /// including those of a failed post that the provider may have queued.
    #[inline]
    pub fn outstanding_sends(&self) -> usize {
        self.pending().send.ledger.len()
    }

    /// How many receive requests are outstanding.
    #[inline]
    pub fn outstanding_recvs(&self) -> usize {
        self.pending().recv.ledger.len()
    }

    /// Bytes of per-QP bookkeeping the safe data path keeps (ledger slots,
    /// side table, raw request scratch), as allocated now.
    pub fn bookkeeping_bytes(&self) -> usize {
        self.pending().bytes()
    }

    /// Posts a chain of send requests with one `ibv_post_send` call.
    ///
    /// Each request's chunks move into the QP until [`reclaim`](Self::reclaim)
    /// (or a RESET, or destruction) hands them back. Refused before the
    /// call, with every chunk handed back in the error: a QP whose known
    /// [`state`](Self::state) is RESET, INIT or RTR (sends need RTS, SQD,
    /// SQE or ERR), operations the QP type cannot do (those outside
    /// [`SendOpsFlags::for_transport`](super::SendOpsFlags::for_transport)), UD destinations,
    /// entry counts against `max_send_sge` and [`MAX_SGE`], inline sizes
    /// against `max_inline_data`, atomics' 8-byte entry and alignment,
    /// atomics on a device whose `atomic_cap` is NONE, RDMA READ and
    /// atomic destinations in a region registered without `LOCAL_WRITE`
    /// (the device would fail the request and move the QP to ERR),
    /// chunks and address handles of another PD, and no room in the send
    /// queue. An empty iterator posts nothing and calls nothing. If the
    /// provider fails, see [`PostError`]. Allocates nothing for chains of
    /// up to eight requests, the first post included (the room is made
    /// with the QP); a longer chain grows the room once.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, chunk: rdma_verbs::Chunk) {
    /// use rdma_verbs::qp::{SendOp, SendWr};
    /// if let Err(e) = qp.post_send([SendWr::new(1, SendOp::Send).sge(chunk)]) {
    ///     eprintln!("{e}; {} chunk(s) back", e.returned.len());
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// A [`PostError`]: refused before the call, with every chunk handed
    /// back in it and nothing posted; or the provider failed, and the
    /// requests stay in the ledger (in doubt, counted in `posted`).
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post_send<'a, I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = SendWr<'a>>,
    {
        self.send_half().post_send(wrs)
    }

    /// Posts a raw chain of send requests, bypassing the buffer ownership of
    /// [`post_send`](Self::post_send): the expert path.
    ///
    /// Completions of these requests carry the caller's own `wr_id`s; the
    /// caller handles them itself and never passes them to
    /// [`reclaim`](Self::reclaim). No state or size check is made.
    ///
    /// # Safety
    /// `wr` is a valid NULL-terminated chain; every `sg_list` entry names
    /// memory registered in this QP's PD that stays allocated, and is not
    /// accessed by Rust code in a way that conflicts with the device (no
    /// references to memory the device writes), until the request's
    /// completion has been polled or the QP has been reset or destroyed,
    /// *even if this call fails* (a provider may queue a request and still
    /// report failure); UD requests name address handles that outlive them
    /// likewise; and the completions of these requests are never passed to
    /// [`reclaim`](Self::reclaim) (their `wr_id`s are the caller's, and
    /// could look like the safe path's tags).
    ///
    /// # Errors
    /// [`Error::Verb`] with the provider's errno when
    /// `ibv_post_send` fails (the request may still have been queued).
    #[doc(alias = "ibv_post_send")]
    pub unsafe fn post_send_raw(&mut self, wr: &mut sys::ibv_send_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the caller vouches for the chain.
        let rc = unsafe { sys::ibv_post_send(self.as_ptr(), wr, &mut bad) };
        crate::error::check_rc("ibv_post_send", rc).map(|_| ())
    }

    /// Posts a raw chain of receive requests: the expert path, as
    /// [`post_send_raw`](Self::post_send_raw).
    ///
    /// # Safety
    /// As for [`post_send_raw`](Self::post_send_raw): the memory every entry
    /// names stays allocated and untouched by Rust until its completion has
    /// been polled or the QP has been reset or destroyed, even if this call
    /// fails, and those completions are never passed to
    /// [`reclaim`](Self::reclaim).
    ///
    /// # Errors
    /// [`Error::Verb`] with the provider's errno when
    /// `ibv_post_recv` fails (the request may still have been queued).
    #[doc(alias = "ibv_post_recv")]
    pub unsafe fn post_recv_raw(&mut self, wr: &mut sys::ibv_recv_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the caller vouches for the chain.
        let rc = unsafe { sys::ibv_post_recv(self.as_ptr(), wr, &mut bad) };
        crate::error::check_rc("ibv_post_recv", rc).map(|_| ())
    }
}

/// The full check of a send that the fast check did not pass, with the
/// SEND_WITH_INV window check.
#[cold]
#[inline(never)]
pub(super) fn check_send(
    facts: &SendFacts,
    ctx: &Context,
    qp: *mut sys::ibv_qp,
    wr: &SendWr<'_>,
) -> Result<()> {
    facts.check(wr)?;
    if let SendOp::SendWithInv(rkey) = wr.op {
        crate::mw::check_send_inv("ibv_post_send", ctx, qp, rkey)?;
    }
    Ok(())
}

/// Fills the opcode, flags, entries and operation fields of `wr`'s raw
/// form in place (its `wr_id` and links are set later).
#[inline(always)]
pub(super) fn fill_send(wr: &SendWr<'_>, raw: &mut sys::ibv_send_wr, sges: &mut [sys::ibv_sge]) {
    raw.num_sge = wr.data.fill(sges) as c_int;
    raw.opcode = wr.op.opcode();
    raw.send_flags = wr.flags;
    fill_op(&wr.op, raw);
    if let Some((ah, qpn, qkey)) = &wr.ud {
        raw.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ah.as_ptr(),
            remote_qpn: qpn.get(),
            remote_qkey: qkey.0,
        };
    }
}

/// Writes `op`'s operation fields (immediate data, the rkey to invalidate,
/// the remote address of an RDMA or atomic operation) into `raw`.
#[inline(always)]
pub(super) fn fill_op(op: &SendOp, raw: &mut sys::ibv_send_wr) {
    match *op {
        SendOp::Send => {}
        SendOp::SendWithImm(imm) => raw.__bindgen_anon_1.imm_data = imm.to_be(),
        SendOp::SendWithInv(rkey) => raw.__bindgen_anon_1.invalidate_rkey = rkey,
        SendOp::RdmaWrite(r) | SendOp::RdmaRead(r) => {
            raw.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey,
            }
        }
        SendOp::RdmaWriteWithImm(r, imm) => {
            raw.__bindgen_anon_1.imm_data = imm.to_be();
            raw.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: r.addr,
                rkey: r.rkey,
            };
        }
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: remote.addr,
                compare_add: compare,
                swap,
                rkey: remote.rkey,
            }
        }
        SendOp::FetchAdd { remote, add } => {
            raw.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                remote_addr: remote.addr,
                compare_add: add,
                swap: 0,
                rkey: remote.rkey,
            }
        }
    }
}

/// Moves what a send lends into the ledger (a UD destination's handle to
/// the side table); its tag, or its loan back.
#[inline(always)]
pub(super) fn lend_send(
    ledger: &mut SendLedger<Loan>,
    side: &mut Vec<SendLoan>,
    wr: SendWr<'_>,
) -> Result<u64, Loan> {
    let SendWr {
        wr_id, data, ud, ..
    } = wr;
    let loan = data.into_loan();
    match ud {
        None => ledger.insert(wr_id, loan),
        Some((ah, _, _)) => lend_side(ledger, side, wr_id, (loan, Some(ah), None)).map_err(|l| l.0),
    }
}

/// Records a send that lends `loan` beside its entries: [`Loan::Side`] in
/// the ledger, `loan` in the side table at its slot (the table made on
/// first use); its tag, or the loan back.
#[inline(never)]
pub(super) fn lend_side(
    ledger: &mut SendLedger<Loan>,
    side: &mut Vec<SendLoan>,
    wr_id: u64,
    loan: SendLoan,
) -> Result<u64, SendLoan> {
    match ledger.insert(wr_id, Loan::Side) {
        Ok(tag) => {
            if side.is_empty() {
                side.resize_with(ledger.slot_count(), SendLoan::default);
            }
            side[ledger.slot_of(tag)] = loan;
            Ok(tag)
        }
        Err(_) => Err(loan),
    }
}

// The checks every request gets before any call, from facts about its
// queue found once, when the queue is created (`SendFacts`, `RecvFacts`).
// The common request (a send or RDMA write of one entry, inline data or
// none; a receive of one chunk) passes `SendFacts::fast` /
// `RecvFacts::fast`: an opcode bit, a destination presence, a PD compare
// and a length or flag test. Anything else takes the full check, which
// says exactly what is wrong; the refusal messages are built only there.

/// What the checks of a send need to know of its QP, found at creation.
#[derive(Clone, Copy)]
pub(crate) struct SendFacts {
    pub(crate) qp_type: QpType,
    pub(crate) pd: *mut sys::ibv_pd,
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    /// Whether the device does atomics (`atomic_cap` is not NONE).
    pub(crate) atomics: bool,
    /// The operations the fast check lets through: the transport's sends
    /// and RDMA writes (which read their entries and take inline data).
    fast_ops: SendOpsFlags,
    ud: bool,
}

// SAFETY: `pd` is only compared with other PDs' addresses, never followed.
unsafe impl Send for SendFacts {}
// SAFETY: as for `Send`.
unsafe impl Sync for SendFacts {}

impl SendFacts {
    pub(crate) fn new(
        qp_type: QpType,
        pd: *mut sys::ibv_pd,
        max_sge: u32,
        max_inline: u32,
        atomics: bool,
    ) -> Self {
        let plain = SendOpsFlags::SEND
            | SendOpsFlags::SEND_WITH_IMM
            | SendOpsFlags::RDMA_WRITE
            | SendOpsFlags::RDMA_WRITE_WITH_IMM;
        SendFacts {
            qp_type,
            pd,
            max_sge,
            max_inline,
            atomics,
            fast_ops: SendOpsFlags::for_transport(qp_type) & plain,
            ud: qp_type == QpType::Ud,
        }
    }

    /// Whether `wr` certainly passes [`check`](Self::check): a plain send
    /// or write of one entry of this PD, inline data that fits, or no
    /// data, with a destination exactly when the QP is UD. `false` says
    /// nothing (the full check decides).
    #[inline(always)]
    pub(crate) fn fast(&self, wr: &SendWr<'_>) -> bool {
        let data = match &wr.data {
            Data::One(l, _) => self.max_sge >= 1 && l.chunk().pd_ptr() == self.pd,
            Data::Inline(d) => d.len() <= self.max_inline as usize,
            Data::None => true,
            Data::Many(_) => false,
        };
        let dest = match &wr.ud {
            None => !self.ud,
            Some((ah, _, _)) => self.ud && ah.pd().as_ptr() == self.pd,
        };
        data && dest && self.fast_ops.contains(SendOpsFlags::of(&wr.op))
    }

    /// The checks of [`QueuePair::post_send`](super::QueuePair::post_send)
    /// (and of a batch's `post`), with the message of the first that fails.
    #[cold]
    #[inline(never)]
    pub(crate) fn check(&self, wr: &SendWr<'_>) -> Result<()> {
        const VERB: &str = "ibv_post_send";
        let t = self.qp_type;
        let op = &wr.op;
        let invalid = |msg: String| Err(Error::invalid(VERB, msg));
        // One list of what each transport can post, shared with the
        // extended path's `send_ops` check.
        if !SendOpsFlags::for_transport(t).contains(SendOpsFlags::of(op)) {
            return invalid(format!("{} QPs cannot post {}", t.short_name(), op.name()));
        }
        match (t == QpType::Ud, &wr.ud) {
            (true, None) => return invalid("a UD send needs a destination (SendWr::ud)".into()),
            (false, Some(_)) => {
                return invalid(format!("{} sends take no UD destination", t.short_name()))
            }
            (true, Some((ah, _, _))) if ah.pd().as_ptr() != self.pd => {
                return invalid("the address handle belongs to another protection domain".into())
            }
            _ => {}
        }
        if let Some(why) = wr.data.refusal() {
            return invalid(why);
        }
        check_entries(
            VERB,
            &wr.data,
            self.max_sge,
            "the QP's max_send_sge",
            self.pd,
        )?;
        if op.writes_local() {
            if wr.data.has_shared() {
                return invalid(format!(
                    "{} writes into its local entries, and a SharedChunk is read-only",
                    op.name()
                ));
            }
            check_writable(VERB, &wr.data, op.name())?;
        }
        if op.is_atomic() && !self.atomics {
            return invalid(format!(
                "{}: the device's atomic_cap is NONE, it performs no atomics",
                op.name()
            ));
        }
        check_payload(wr, self.max_inline)
    }
}

/// The part of [`SendFacts::check`] that looks at what the operation
/// carries: inline data (which operations take it, and how much), an
/// atomic's one 8-byte entry and aligned address, an RDMA read's entries.
fn check_payload(wr: &SendWr<'_>, max_inline: u32) -> Result<()> {
    const VERB: &str = "ibv_post_send";
    let op = &wr.op;
    let invalid = |msg: String| Err(Error::invalid(VERB, msg));
    if let Some(data) = wr.inline_data() {
        if !matches!(
            op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::SendWithInv(_)
                | SendOp::RdmaWrite(_)
                | SendOp::RdmaWriteWithImm(..)
        ) {
            return invalid(format!("{} cannot carry inline data", op.name()));
        }
        if data.len() > max_inline as usize {
            return invalid(format!(
                "{} inline bytes but the QP's max_inline_data is {max_inline}",
                data.len(),
            ));
        }
    }
    if let SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } = op {
        if wr.data.chunk_count() != 1 || wr.data.total() != 8 {
            return invalid(
                "an atomic needs exactly one 8-byte local entry for the old value".into(),
            );
        }
        if remote.addr % 8 != 0 {
            return invalid(format!(
                "atomic remote address {:#x} is not 8-byte aligned",
                remote.addr
            ));
        }
    }
    if matches!(op, SendOp::RdmaRead(_)) && wr.data.chunk_count() == 0 {
        return invalid("an RDMA read needs local entries to read into".into());
    }
    Ok(())
}

/// The entry checks every request gets: at most `max_sge` entries (the
/// queue's limit, called `limit` in the message), and every chunk in
/// protection domain `pd`.
fn check_entries(
    verb: &'static str,
    data: &Data<'_>,
    max_sge: u32,
    limit: &str,
    pd: *mut sys::ibv_pd,
) -> Result<()> {
    let n = data.chunk_count();
    if n > max_sge as usize {
        return Err(Error::invalid(
            verb,
            format!("{n} entries but {limit} is {max_sge}"),
        ));
    }
    debug_assert!(n <= MAX_SGE);
    if data.entries().any(|(c, _)| c.pd_ptr() != pd) {
        return Err(Error::invalid(
            verb,
            "a chunk belongs to another protection domain",
        ));
    }
    Ok(())
}

/// Refuses entries the device must write (`what`: a receive, an RDMA
/// READ's or an atomic's destination) whose region was registered without
/// `LOCAL_WRITE`: the device would fail the request and move the QP to
/// ERR. One flag test per entry (the chunk carries it).
fn check_writable(verb: &'static str, data: &Data<'_>, what: &str) -> Result<()> {
    match data.entries().position(|(c, _)| !c.local_write()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            verb,
            format!(
                "entry {i}'s region was registered without LOCAL_WRITE \
                 (AccessFlags::LOCAL_WRITE), and {what} writes into it: \
                 the device would fail the request and move the QP to ERR"
            ),
        )),
    }
}

/// What the checks of a receive need to know of its queue (a QP's
/// receive queue or an SRQ).
#[derive(Clone, Copy)]
pub(crate) struct RecvFacts {
    pub(crate) pd: *mut sys::ibv_pd,
    pub(crate) max_sge: u32,
    /// The fewest bytes a receive may have in all (a UD QP's 40-byte GRH on
    /// a port that needs one, else 0).
    pub(crate) floor: u32,
}

// SAFETY: `pd` is only compared with other PDs' addresses, never followed.
unsafe impl Send for RecvFacts {}
// SAFETY: as for `Send`.
unsafe impl Sync for RecvFacts {}

impl RecvFacts {
    /// Whether `wr` certainly passes [`check`](Self::check): one writable
    /// chunk of this PD that holds the floor, or no buffer where there is
    /// no floor.
    #[inline(always)]
    pub(crate) fn fast(&self, wr: &RecvWr) -> bool {
        match &wr.data {
            Data::One(l, len) => {
                let c = l.chunk();
                self.max_sge >= 1 && c.pd_ptr() == self.pd && c.local_write() && *len >= self.floor
            }
            Data::None => self.floor == 0,
            _ => false,
        }
    }

    /// The checks a receive gets before any call, for QPs and SRQs alike:
    /// the entry checks, every entry writable by the device, and at least
    /// `floor` bytes in all.
    #[cold]
    #[inline(never)]
    pub(crate) fn check(&self, verb: &'static str, wr: &RecvWr) -> Result<()> {
        if let Some(why) = wr.data.refusal() {
            return Err(Error::invalid(verb, why));
        }
        check_entries(verb, &wr.data, self.max_sge, "max_recv_sge", self.pd)?;
        check_writable(verb, &wr.data, "a receive")?;
        if self.floor > 0 && wr.data.total() < u64::from(self.floor) {
            return Err(Error::invalid(
                verb,
                format!(
                    "a UD receive of {} bytes on a port that needs a GRH: the device writes the \
                     {GRH_LEN}-byte GRH first, so a receive needs at least {} bytes \
                     (the payload starts at byte {GRH_LEN})",
                    wr.data.total(),
                    self.floor
                ),
            ));
        }
        Ok(())
    }
}

/// The bytes of a Global Routing Header, which the device writes at the
/// start of every UD receive (ibv_post_recv(3)).
pub(crate) const GRH_LEN: u32 = 40;

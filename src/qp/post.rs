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
//! never by trying one table and then another. [`WorkCompletion`]s cannot
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
//! for the call. Remote addresses ([`RemoteAddr`]) are numbers naming the
//! peer's memory, which the peer's own registration protects.
//!
//! The ledgers are allocated when the QP is created (room for every work
//! request the queues hold), and a chain of requests is built in scratch
//! space the QP keeps, then handed to the provider in one call: in steady
//! state, posting and reclaiming allocate nothing.
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
use std::fmt;

use super::ex::SendOpsFlags;
use super::ledger::{Kind, Ledger};
use super::values::{QKey, QpNum};
use super::{QpCaps, QpState, QpType, QueuePair};
use crate::ah::AddressHandle;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::mr::{Chunk, SharedChunk};
use crate::sys;

/// The most scatter/gather entries one work request of the safe API takes.
pub const MAX_SGE: usize = 4;

/// A request's chunks, in scatter/gather order.
pub(crate) type Chunks = [Option<Lent>; MAX_SGE];

/// A chunk lent to the device: owned (handed back when the request ends)
/// or a clone of a [`SharedChunk`] (let go when it ends).
pub(crate) enum Lent {
    Own(Chunk),
    Shared(SharedChunk),
}

impl Lent {
    #[inline]
    fn chunk(&self) -> &Chunk {
        match self {
            Lent::Own(c) => c,
            Lent::Shared(s) => s.chunk(),
        }
    }
}

/// Where in a peer's memory an RDMA or atomic operation goes: the address
/// and rkey of the peer's registered region (as the peer announced them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The peer's address (its region's `addr` plus an offset).
    pub addr: u64,
    /// The peer region's rkey.
    pub rkey: u32,
}

/// A completion that can hand requests back: a [`WorkCompletion`] of
/// [`CompletionQueue::poll`](crate::CompletionQueue::poll), or an extended
/// CQ's [`PolledWc`](crate::PolledWc). Sealed: only this crate's types.
pub trait Completion: sealed::Sealed {
    /// The `wr_id` the device reported (the crate's tag, for requests of
    /// the safe path).
    #[doc(hidden)]
    fn tag(&self) -> u64;
    /// The local QP number, when the completion carries it (an extended CQ
    /// created without `qp_num` does not: its tags alone route it, which
    /// suffices, as a tag names one request of one queue).
    #[doc(hidden)]
    fn local_qp_num(&self) -> Option<u32>;
    /// Whether the status is success.
    #[doc(hidden)]
    fn succeeded(&self) -> bool;
    /// The flags, for a completion that carries the immediate/
    /// invalidated-rkey word; `None` when it does not carry it.
    #[doc(hidden)]
    fn inv_flags(&self) -> Option<crate::WcFlags>;
    /// The immediate/invalidated-rkey word (only asked when
    /// [`inv_flags`](Self::inv_flags) is `Some`).
    #[doc(hidden)]
    fn inv_word(&self) -> u32;
    /// The opcode.
    #[doc(hidden)]
    fn wc_opcode(&self) -> Result<crate::WcOpcode, u32>;
}

pub(crate) mod sealed {
    /// Keeps [`Completion`](super::Completion) to this crate's types.
    pub trait Sealed {}
}

impl sealed::Sealed for WorkCompletion {}

impl Completion for WorkCompletion {
    #[inline]
    fn tag(&self) -> u64 {
        self.wr_id()
    }
    #[inline]
    fn local_qp_num(&self) -> Option<u32> {
        Some(self.qp_num())
    }
    #[inline]
    fn succeeded(&self) -> bool {
        self.is_success()
    }
    #[inline]
    fn inv_flags(&self) -> Option<crate::WcFlags> {
        Some(self.flags())
    }
    #[inline]
    fn inv_word(&self) -> u32 {
        self.ex_data()
    }
    #[inline]
    fn wc_opcode(&self) -> Result<crate::WcOpcode, u32> {
        self.opcode()
    }
}

/// The operation of a send work request (`enum ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`, with 32 bits of immediate data (host order).
    SendWithImm(u32),
    /// `IBV_WR_SEND_WITH_INV`: a send that also invalidates the peer's
    /// memory window (or fast-registered region) with this rkey, which the
    /// peer's receive completion reports
    /// ([`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey)).
    /// RC and UC only.
    SendWithInv(u32),
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite(RemoteAddr),
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: a write that also consumes a receive
    /// at the peer, carrying the immediate data.
    RdmaWriteWithImm(RemoteAddr, u32),
    /// `IBV_WR_RDMA_READ`: the local chunks receive the peer's bytes.
    RdmaRead(RemoteAddr),
    /// `IBV_WR_ATOMIC_CMP_AND_SWP` on the 8 bytes at `remote` (8-aligned);
    /// the local 8-byte chunk receives the old value.
    ///
    /// The target and the returned value are 64-bit integers in the hosts'
    /// byte order on rxe and current NICs (measured on rxe: the `rdma_ops`
    /// example and the device tests read them with `u64::from_ne_bytes`);
    /// some old adapters returned the old value big-endian.
    CompareSwap {
        /// The peer's 8 bytes.
        remote: RemoteAddr,
        /// Swap only if the value equals this.
        compare: u64,
        /// The new value.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD` on the 8 bytes at `remote` (8-aligned);
    /// the local 8-byte chunk receives the old value.
    FetchAdd {
        /// The peer's 8 bytes.
        remote: RemoteAddr,
        /// What to add.
        add: u64,
    },
}

impl SendOp {
    fn opcode(&self) -> sys::ibv_wr_opcode::Type {
        use sys::ibv_wr_opcode as o;
        match self {
            SendOp::Send => o::IBV_WR_SEND,
            SendOp::SendWithImm(_) => o::IBV_WR_SEND_WITH_IMM,
            SendOp::SendWithInv(_) => o::IBV_WR_SEND_WITH_INV,
            SendOp::RdmaWrite(_) => o::IBV_WR_RDMA_WRITE,
            SendOp::RdmaWriteWithImm(..) => o::IBV_WR_RDMA_WRITE_WITH_IMM,
            SendOp::RdmaRead(_) => o::IBV_WR_RDMA_READ,
            SendOp::CompareSwap { .. } => o::IBV_WR_ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => o::IBV_WR_ATOMIC_FETCH_AND_ADD,
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm(_) => "SEND_WITH_IMM",
            SendOp::SendWithInv(_) => "SEND_WITH_INV",
            SendOp::RdmaWrite(_) => "RDMA_WRITE",
            SendOp::RdmaWriteWithImm(..) => "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead(_) => "RDMA_READ",
            SendOp::CompareSwap { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
        }
    }

    pub(super) fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// Scatter/gather entries: chunks with the number of bytes to use of each.
pub(crate) struct Sges {
    chunks: Chunks,
    pub(super) lens: [u32; MAX_SGE],
    pub(super) n: usize,
    /// Entries beyond `MAX_SGE`, or given with a length past their chunk's
    /// end or above `u32::MAX`: counted, and their chunks kept (never
    /// dropped) so that the refusal at post time hands them back.
    refused: usize,
    // Boxed: 8 bytes in every request, for a rare refusal.
    overflow: Option<Box<Refused>>,
}

/// The refused entries of a request: their owned chunks, and why the
/// first was refused.
struct Refused {
    chunks: Vec<Chunk>,
    why: String,
}

/// Why entry `index` of `len` bytes of a `chunk_len`-byte chunk, coming
/// after `n` accepted entries, cannot be taken; `None` if it can. Lengths
/// are refused, never truncated to the sge's 32 bits.
fn sge_refusal(index: usize, n: usize, len: usize, chunk_len: usize) -> Option<String> {
    if n >= MAX_SGE {
        Some(format!("entry {index} is one more than {MAX_SGE} entries"))
    } else if len > chunk_len {
        Some(format!(
            "entry {index}: length {len} is more than its chunk's {chunk_len} bytes"
        ))
    } else if u32::try_from(len).is_err() {
        Some(format!(
            "entry {index}: length {len} does not fit an sge's 32-bit length (at most {})",
            u32::MAX
        ))
    } else {
        None
    }
}

impl Sges {
    #[inline]
    fn new() -> Self {
        Sges {
            chunks: Default::default(),
            lens: [0; MAX_SGE],
            n: 0,
            refused: 0,
            overflow: None,
        }
    }

    #[inline]
    fn push(&mut self, chunk: Lent, len: usize) {
        let index = self.n + self.refused;
        let why = sge_refusal(index, self.n, len, chunk.chunk().len());
        match u32::try_from(len) {
            Ok(len32) if why.is_none() && self.refused == 0 => {
                self.chunks[self.n] = Some(chunk);
                self.lens[self.n] = len32;
                self.n += 1;
            }
            _ => {
                self.refused += 1;
                let r = self.overflow.get_or_insert_with(|| {
                    Box::new(Refused {
                        chunks: Vec::new(),
                        why: why.unwrap_or_default(),
                    })
                });
                if let Lent::Own(c) = chunk {
                    r.chunks.push(c);
                }
            }
        }
    }

    #[inline]
    fn total(&self) -> u64 {
        self.lens[..self.n].iter().map(|&l| u64::from(l)).sum()
    }

    /// The entry `i < n`.
    #[inline]
    pub(super) fn entry(&self, i: usize) -> Option<&Chunk> {
        self.chunks[i].as_ref().map(Lent::chunk)
    }

    /// Whether an entry is a [`SharedChunk`] (which the device may only read).
    #[inline]
    fn has_shared(&self) -> bool {
        self.chunks[..self.n]
            .iter()
            .any(|c| matches!(c, Some(Lent::Shared(_))))
    }

    /// Appends a raw entry for each chunk to `out`.
    #[inline]
    fn raw_into(&self, out: &mut Vec<sys::ibv_sge>) {
        out.extend(self.raw_entries());
    }

    /// The raw entry of each chunk, in order.
    #[inline]
    pub(super) fn raw_entries(&self) -> impl Iterator<Item = sys::ibv_sge> + '_ {
        (0..self.n).filter_map(|i| {
            self.entry(i).map(|c| sys::ibv_sge {
                addr: c.addr(),
                length: self.lens[i],
                lkey: c.lkey(),
            })
        })
    }

    /// The entry checks every request gets before any call: no chunk past
    /// [`MAX_SGE`] (or given a length past its end), at most `max_sge`
    /// entries (the queue's limit, called `limit` in the message), and
    /// every chunk in protection domain `pd`.
    #[inline]
    fn check(
        &self,
        verb: &'static str,
        max_sge: usize,
        limit: &str,
        pd: *mut sys::ibv_pd,
    ) -> Result<()> {
        if self.refused > 0 {
            let why = self.overflow.as_ref().map_or("", |r| r.why.as_str());
            return Err(Error::invalid(
                verb,
                format!(
                    "{why} ({} entries given, {} refused)",
                    self.n + self.refused,
                    self.refused
                ),
            ));
        }
        if self.n > max_sge {
            return Err(Error::invalid(
                verb,
                format!("{} entries but {limit} is {max_sge}", self.n),
            ));
        }
        for i in 0..self.n {
            if self.entry(i).is_some_and(|c| c.pd_ptr() != pd) {
                return Err(Error::invalid(
                    verb,
                    "a chunk belongs to another protection domain",
                ));
            }
        }
        Ok(())
    }

    /// Refuses entries the device must write (`what`: a receive, an RDMA
    /// READ's or an atomic's destination) whose region was registered
    /// without `LOCAL_WRITE`: the device would fail the request and move
    /// the QP to ERR. One flag test per entry (the chunk carries it).
    #[inline]
    fn check_writable(&self, verb: &'static str, what: &str) -> Result<()> {
        match (0..self.n).find(|&i| self.entry(i).is_some_and(|c| !c.local_write())) {
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

    /// Moves the owned chunks to `out` (a refused request's).
    #[inline]
    pub(crate) fn drain_into(&mut self, out: &mut Vec<Chunk>) {
        for c in self.chunks.iter_mut() {
            if let Some(Lent::Own(c)) = c.take() {
                out.push(c);
            }
        }
        if let Some(mut more) = self.overflow.take() {
            out.append(&mut more.chunks);
        }
        self.n = 0;
    }

    #[inline]
    pub(crate) fn take(&mut self) -> Chunks {
        self.n = 0;
        std::mem::take(&mut self.chunks)
    }
}

/// The owned chunks of `chunks`, in order; shared ones are let go.
#[inline]
fn owned(chunks: Chunks) -> impl Iterator<Item = Chunk> {
    chunks.into_iter().flatten().filter_map(|c| match c {
        Lent::Own(c) => Some(c),
        Lent::Shared(_) => None,
    })
}

/// Gives `chunks`' owned chunks to `out`, in order; shared ones are let
/// go. A request's entries fill a prefix of the array, so the first empty
/// entry ends it.
#[inline]
pub(super) fn give_owned<E: Extend<Chunk>>(chunks: Chunks, out: &mut E) {
    for c in chunks {
        match c {
            Some(Lent::Own(c)) => out.extend(Some(c)),
            Some(Lent::Shared(_)) => {}
            None => break,
        }
    }
}

/// A send work request (`struct ibv_send_wr`) that owns its buffers.
///
/// Signalled by default (`IBV_SEND_SIGNALED`): every request produces a
/// completion unless [`unsignaled`](Self::unsignaled) is asked for.
///
/// ```no_run
/// # fn f(qp: &mut rdma_verbs::QueuePair, chunk: rdma_verbs::Chunk) -> rdma_verbs::Result<()> {
/// use rdma_verbs::qp::{SendOp, SendWr};
/// qp.post_send([SendWr::new(1, SendOp::Send).sge(chunk)])?;
/// # Ok(()) }
/// ```
#[doc(alias = "ibv_send_wr")]
pub struct SendWr<'a> {
    pub(super) wr_id: u64,
    pub(super) op: SendOp,
    pub(super) sges: Sges,
    pub(super) inline: Option<&'a [u8]>,
    pub(super) flags: u32,
    pub(super) ud: Option<(AddressHandle, QpNum, QKey)>,
}

impl<'a> SendWr<'a> {
    /// A signalled request `op` with the caller's `wr_id` (handed back in
    /// [`Completed::wr_id`]).
    #[inline]
    pub fn new(wr_id: u64, op: SendOp) -> Self {
        SendWr {
            wr_id,
            op,
            sges: Sges::new(),
            inline: None,
            flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ud: None,
        }
    }

    /// Adds a whole chunk as the next scatter/gather entry.
    #[inline]
    pub fn sge(self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.sge_len(chunk, len)
    }

    /// Adds the first `len` bytes of a chunk as the next entry.
    #[inline]
    pub fn sge_len(mut self, chunk: Chunk, len: usize) -> Self {
        self.sges.push(Lent::Own(chunk), len);
        self
    }

    /// Adds the first `len` bytes of a read-only [`SharedChunk`] as the next
    /// entry: for sends and RDMA writes, whose source the device only reads.
    /// The request holds a clone of `shared` until it ends, so many
    /// outstanding requests may name one buffer (a stream of writes from one
    /// source, as in C), and [`SharedChunk::try_into_chunk`] gives the chunk
    /// back once the last of them has been reclaimed. Refused at post time
    /// for RDMA reads and atomics, which write into their local entries.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, chunk: rdma_verbs::Chunk, remote: rdma_verbs::qp::RemoteAddr) -> rdma_verbs::Result<()> {
    /// use rdma_verbs::qp::{SendOp, SendWr};
    /// use rdma_verbs::SharedChunk;
    /// let src = SharedChunk::new(chunk);
    /// qp.post_send((0..4).map(|i| {
    ///     SendWr::new(i, SendOp::RdmaWrite(remote)).sge_shared(&src, 64).unsignaled()
    /// }))?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn sge_shared(mut self, shared: &SharedChunk, len: usize) -> Self {
        self.sges.push(Lent::Shared(shared.clone()), len);
        self
    }

    /// Sends `data` inline (`IBV_SEND_INLINE`): the provider copies it during
    /// the post, so it is only borrowed. For sends and RDMA writes, up to the
    /// QP's `max_inline_data`; not with chunks.
    #[inline]
    pub fn inline(mut self, data: &'a [u8]) -> Self {
        self.inline = Some(data);
        self.flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }

    /// No completion for this request on success (clears `IBV_SEND_SIGNALED`);
    /// its chunks come back with the next signalled completion.
    #[inline]
    pub fn unsignaled(mut self) -> Self {
        self.flags &= !sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// `IBV_SEND_SOLICITED`: wake a peer waiting for solicited events.
    #[inline]
    pub fn solicited(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// `IBV_SEND_FENCE`: wait for earlier RDMA reads and atomics first.
    #[inline]
    pub fn fence(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// The UD destination: address handle, remote QP number and Q_Key.
    #[inline]
    pub fn ud(mut self, ah: &AddressHandle, remote_qpn: QpNum, remote_qkey: QKey) -> Self {
        self.ud = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }

    #[inline]
    fn signaled(&self) -> bool {
        self.flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }

    /// Takes what the request lends the device (its chunks and UD address
    /// handle), leaving the rest to be dropped.
    #[inline]
    pub(super) fn lend(&mut self) -> SendLoan {
        (self.sges.take(), self.ud.take().map(|u| u.0), None)
    }
}

impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr_id)
            .field("op", &self.op)
            .field("sges", &self.sges.n)
            .field("inline", &self.inline.map(<[u8]>::len))
            .field("signaled", &self.signaled())
            .finish()
    }
}

/// A receive work request (`struct ibv_recv_wr`) that owns its buffers.
#[doc(alias = "ibv_recv_wr")]
pub struct RecvWr {
    pub(crate) wr_id: u64,
    pub(crate) sges: Sges,
}

impl RecvWr {
    /// A receive with the caller's `wr_id`.
    #[inline]
    pub fn new(wr_id: u64) -> Self {
        RecvWr {
            wr_id,
            sges: Sges::new(),
        }
    }

    /// Adds a whole chunk as the next scatter entry.
    #[inline]
    pub fn sge(mut self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.sges.push(Lent::Own(chunk), len);
        self
    }
}

impl fmt::Debug for RecvWr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvWr")
            .field("wr_id", &self.wr_id)
            .field("sges", &self.sges.n)
            .finish()
    }
}

/// A finished work request, with its buffers.
pub struct Completed {
    /// The caller's `wr_id`.
    pub wr_id: u64,
    /// Whether this request is the one the completion being reclaimed
    /// names. False for an earlier send that completion ends with it
    /// (unsignalled, or signalled but not reclaimed yet), and for requests
    /// handed back by a RESET or by destroying the queue, which may or may
    /// not have run.
    pub signaled: bool,
    pub(crate) chunks: Chunks,
}

impl Completed {
    /// The request's chunks, in scatter/gather order ([`SharedChunk`]
    /// entries are not among them: the request's clone is let go).
    #[inline]
    pub fn chunks(self) -> impl Iterator<Item = Chunk> {
        owned(self.chunks)
    }

    /// The first chunk (for the common single-entry request).
    #[inline]
    pub fn into_chunk(self) -> Option<Chunk> {
        self.chunks().next()
    }
}

impl fmt::Debug for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completed")
            .field("wr_id", &self.wr_id)
            .field("signaled", &self.signaled)
            .field("chunks", &self.chunks.iter().flatten().count())
            .finish()
    }
}

/// A post that did not go through.
///
/// Either the crate refused it before calling the provider (`posted` is 0,
/// and `returned` holds the chunks of every request of the call), or the
/// provider failed: then it may have queued any of the requests anyway, so
/// the queue keeps all of them (`posted` is the number of requests of the
/// call, `returned` is empty) until a completion, a RESET or the QP's
/// destruction hands them back.
pub struct PostError {
    /// What went wrong.
    pub error: Error,
    /// How many requests of the call the queue now holds (posted, or
    /// possibly queued by a provider that then failed).
    pub posted: usize,
    /// The chunks of the requests that were not posted.
    pub returned: Vec<Chunk>,
}

impl fmt::Debug for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostError")
            .field("error", &self.error)
            .field("posted", &self.posted)
            .field("returned", &self.returned.len())
            .finish()
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.posted {
            0 => write!(f, "{} (nothing posted)", self.error),
            n => write!(
                f,
                "{} ({n} request(s) kept until a completion or RESET: the provider may have queued them)",
                self.error
            ),
        }
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Error> for PostError {
    /// A refusal that lent nothing: `posted` 0, no chunks returned (for
    /// `?` on calls such as [`QueuePair::start_batch`] in a function that
    /// returns `PostError`).
    fn from(error: Error) -> Self {
        fail(error, 0, Vec::new())
    }
}

impl From<PostError> for Error {
    /// Keeps the error; the returned chunks are dropped.
    fn from(e: PostError) -> Self {
        e.error
    }
}

/// What a send request lends the device: its chunks, the address handle a
/// UD send names, and for a memory-window bind or invalidation the window
/// and the region it was bound to before.
pub(crate) type SendLoan = (Chunks, Option<AddressHandle>, Option<crate::mw::MwLoan>);

/// Outstanding requests of one QP, requests handed back by a RESET, and
/// scratch space to build chains in.
pub(crate) struct Pending {
    pub(super) send: Ledger<SendLoan>,
    recv: Ledger<Chunks>,
    released: Vec<Completed>,
    send_wrs: Vec<sys::ibv_send_wr>,
    recv_wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
    /// The tags of the open `ibv_wr_*` batch, in post order (room for the
    /// whole send queue, allocated with the QP).
    pub(super) batch: Vec<u64>,
    /// Between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`: the
    /// provider holds the send queue's lock. Still set when no batch is
    /// alive means the `WrBatch` was leaked (`mem::forget`): the lock is
    /// held for good, so nothing may take it again.
    pub(crate) batch_open: bool,
}

// SAFETY: the raw pointers inside the scratch vectors are only meaningful
// during one post call on the thread making it, and are rewritten before
// every use; everything else in `Pending` is `Send` already.
unsafe impl Send for Pending {}
// SAFETY: `Pending` is only reached through `&mut QueuePair` (and `&self`
// readers only look at the ledgers' counts).
unsafe impl Sync for Pending {}

/// The longest chain the scratch space is made for when a queue is
/// created: posts of up to this many requests never allocate, even the
/// first (longer chains grow the scratch once).
pub(crate) const CHAIN_ROOM: usize = 8;

/// Scratch room for chains of up to [`CHAIN_ROOM`] requests on a queue of
/// `max_wr` requests with up to `max_sge` entries each (an inline send
/// takes one): `(requests, entries)`.
pub(crate) fn chain_room(max_wr: u32, max_sge: u32) -> (usize, usize) {
    let wrs = (max_wr as usize).min(CHAIN_ROOM);
    (wrs, wrs * (max_sge as usize).clamp(1, MAX_SGE))
}

impl Pending {
    /// The bookkeeping of a QP with `caps` (as created), with scratch room
    /// for chains of up to [`CHAIN_ROOM`] requests, so that no post of
    /// such a chain allocates, the first included.
    pub(crate) fn new(caps: &QpCaps) -> Self {
        let (send_wrs, send_sges) = chain_room(caps.max_send_wr, caps.max_send_sge);
        let (recv_wrs, recv_sges) = chain_room(caps.max_recv_wr, caps.max_recv_sge);
        Pending {
            send: Ledger::new(Kind::Send, caps.max_send_wr as usize),
            recv: Ledger::new(Kind::Recv, caps.max_recv_wr as usize),
            released: Vec::new(),
            send_wrs: Vec::with_capacity(send_wrs),
            recv_wrs: Vec::with_capacity(recv_wrs),
            sges: Vec::with_capacity(send_sges.max(recv_sges)),
            batch: Vec::new(),
            batch_open: false,
        }
    }

    /// Makes room for a batch as long as the send queue (extended QPs).
    pub(crate) fn reserve_batch(&mut self, max_send_wr: usize) {
        self.batch.reserve_exact(max_send_wr);
    }

    /// After a RESET: the device has forgotten every request, so they all
    /// go to `released`, oldest first, sends before receives.
    pub(crate) fn release_all(&mut self) {
        let out = &mut self.released;
        self.send
            .drain(|r| out.push(completed(r.wr_id, false, r.payload.0)));
        self.recv
            .drain(|r| out.push(completed(r.wr_id, false, r.payload)));
    }

    /// Everything still held, for a destroyed QP: `released` first.
    pub(crate) fn into_all(mut self) -> Vec<Completed> {
        self.release_all();
        self.released
    }
}

pub(super) fn completed(wr_id: u64, signaled: bool, chunks: Chunks) -> Completed {
    Completed {
        wr_id,
        signaled,
        chunks,
    }
}

pub(crate) fn fail(error: Error, posted: usize, returned: Vec<Chunk>) -> PostError {
    PostError {
        error,
        posted,
        returned,
    }
}

/// The refusal of `n` send requests when the send queue has room for
/// `room` with `held` outstanding.
pub(super) fn send_queue_full(verb: &'static str, n: usize, room: usize, held: usize) -> Error {
    Error::invalid(
        verb,
        format!("{n} request(s) but the send queue has room for {room} ({held} outstanding)"),
    )
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
        if self.pending().batch_open {
            return Some(leaked_batch(verb));
        }
        send_state_error(verb, self.state())
    }
}

/// The refusal of a send in `state` (sends need RTS, SQD, SQE or ERR).
#[inline]
pub(super) fn send_state_error(verb: &'static str, state: QpState) -> Option<Error> {
    match state {
        QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err => None,
        state => Some(Error::QpState {
            verb,
            state,
            needs: "sends need RTS, SQD, SQE or ERR",
        }),
    }
}

impl QueuePair {
    /// Posts one request that lends no chunks (a memory-window bind or
    /// invalidation): records `loan` under a fresh tag in the send ledger,
    /// then `call(tag)` hands it to the provider. No room: refused with the
    /// loan handed to `undo`. A provider failure keeps it in the ledger
    /// (in doubt), as for [`post_send`](Self::post_send).
    pub(crate) fn post_one_loan(
        &mut self,
        verb: &'static str,
        wr_id: u64,
        loan: SendLoan,
        undo: impl FnOnce(SendLoan),
        call: impl FnOnce(u64) -> c_int,
    ) -> Result<(), PostError> {
        let ledger = &mut self.pending_mut().send;
        let (room, held) = (ledger.room(), ledger.len());
        let tag = match ledger.insert(wr_id, loan) {
            Ok(tag) => tag,
            Err(loan) => {
                undo(loan);
                let error = if room == 0 {
                    send_queue_full(verb, 1, room, held)
                } else {
                    Error::TagsExhausted { verb }
                };
                return Err(fail(error, 0, Vec::new()));
            }
        };
        let rc = call(tag);
        crate::error::check_rc(verb, rc)
            .map(|_| ())
            .map_err(|error| fail(error, 1, Vec::new()))
    }
}

/// What the checks of a send need to know of its QP (read once per call).
pub(super) struct SendCheck {
    pub(super) qp_type: QpType,
    pub(super) pd: *mut sys::ibv_pd,
    pub(super) max_sge: u32,
    pub(super) max_inline: u32,
    /// Whether the device does atomics (`atomic_cap` is not NONE).
    pub(super) atomics: bool,
}

impl SendCheck {
    /// The checks of [`QueuePair::post_send`] for the QP `qp`.
    pub(super) fn of(qp: &QueuePair) -> Self {
        let caps = qp.caps();
        SendCheck {
            qp_type: qp.qp_type(),
            pd: qp.pd().as_ptr(),
            max_sge: caps.max_send_sge,
            max_inline: caps.max_inline_data,
            atomics: qp.pd().context().attr().atomic_cap != crate::device_attr::AtomicCap::None,
        }
    }

    pub(super) fn check(&self, wr: &SendWr<'_>) -> Result<()> {
        const VERB: &str = "ibv_post_send";
        let t = self.qp_type;
        let op = &wr.op;
        // One list of what each transport can post, shared with the
        // extended path's `send_ops` check.
        let allowed = SendOpsFlags::for_transport(t).contains(SendOpsFlags::of(op));
        if !allowed {
            return Err(Error::invalid(
                VERB,
                format!("{} QPs cannot post {}", t.short_name(), op.name()),
            ));
        }
        match (t == QpType::Ud, wr.ud.is_some()) {
            (true, false) => {
                return Err(Error::invalid(
                    VERB,
                    "a UD send needs a destination (SendWr::ud)",
                ))
            }
            (false, true) => {
                return Err(Error::invalid(
                    VERB,
                    format!("{} sends take no UD destination", t.short_name()),
                ))
            }
            _ => {}
        }
        if let Some((ah, _, _)) = &wr.ud {
            if ah.pd().as_ptr() != self.pd {
                return Err(Error::invalid(
                    VERB,
                    "the address handle belongs to another protection domain",
                ));
            }
        }
        wr.sges.check(
            VERB,
            self.max_sge as usize,
            "the QP's max_send_sge",
            self.pd,
        )?;
        if matches!(op, SendOp::RdmaRead(_)) || op.is_atomic() {
            if wr.sges.has_shared() {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "{} writes into its local entries, and a SharedChunk is read-only",
                        op.name()
                    ),
                ));
            }
            wr.sges.check_writable(VERB, op.name())?;
        }
        if op.is_atomic() && !self.atomics {
            return Err(Error::invalid(
                VERB,
                format!(
                    "{}: the device's atomic_cap is NONE, it performs no atomics",
                    op.name()
                ),
            ));
        }
        if let Some(data) = wr.inline {
            if wr.sges.n > 0 {
                return Err(Error::invalid(
                    VERB,
                    "inline data and chunks in one request",
                ));
            }
            if !matches!(
                op,
                SendOp::Send
                    | SendOp::SendWithImm(_)
                    | SendOp::SendWithInv(_)
                    | SendOp::RdmaWrite(_)
                    | SendOp::RdmaWriteWithImm(..)
            ) {
                return Err(Error::invalid(
                    VERB,
                    format!("{} cannot carry inline data", op.name()),
                ));
            }
            if data.len() > self.max_inline as usize {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "{} inline bytes but the QP's max_inline_data is {}",
                        data.len(),
                        self.max_inline
                    ),
                ));
            }
        }
        if op.is_atomic() {
            let remote = match op {
                SendOp::CompareSwap { remote, .. } | SendOp::FetchAdd { remote, .. } => remote,
                _ => unreachable!("is_atomic"),
            };
            if wr.sges.n != 1 || wr.sges.total() != 8 {
                return Err(Error::invalid(
                    VERB,
                    "an atomic needs exactly one 8-byte local entry for the old value",
                ));
            }
            if remote.addr % 8 != 0 {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "atomic remote address {:#x} is not 8-byte aligned",
                        remote.addr
                    ),
                ));
            }
        }
        if matches!(op, SendOp::RdmaRead(_)) && wr.sges.n == 0 {
            return Err(Error::invalid(
                VERB,
                "an RDMA read needs local entries to read into",
            ));
        }
        Ok(())
    }
}

impl QueuePair {
    /// How many send requests are outstanding (posted, not yet reclaimed),
    /// including those of a failed post that the provider may have queued.
    #[inline]
    pub fn outstanding_sends(&self) -> usize {
        self.pending().send.len()
    }

    /// How many receive requests are outstanding.
    #[inline]
    pub fn outstanding_recvs(&self) -> usize {
        self.pending().recv.len()
    }

    /// Posts a chain of send requests with one `ibv_post_send` call.
    ///
    /// Each request's chunks move into the QP until [`reclaim`](Self::reclaim)
    /// (or a RESET, or destruction) hands them back. Refused before the
    /// call, with every chunk handed back in the error: a QP whose known
    /// [`state`](Self::state) is RESET, INIT or RTR (sends need RTS, SQD,
    /// SQE or ERR), operations the QP type cannot do (those outside
    /// [`SendOpsFlags::for_transport`]), UD destinations,
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
    #[doc(alias = "ibv_post_send")]
    pub fn post_send<'a, I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = SendWr<'a>>,
    {
        const VERB: &str = "ibv_post_send";
        let error = self.send_refusal(VERB);
        let checks = SendCheck::of(self);
        let qp = self.as_ptr();
        let (pd, p) = self.pd_and_pending_mut();
        let ctx = pd.context();
        post_chain(
            VERB,
            &mut p.send,
            &mut p.send_wrs,
            &mut p.sges,
            wrs.into_iter(),
            error,
            |wr| {
                checks.check(wr)?;
                if let SendOp::SendWithInv(rkey) = wr.op {
                    crate::mw::check_send_inv(VERB, ctx, qp, rkey)?;
                }
                Ok(())
            },
            raw_send,
            |wr| (wr.wr_id, wr.lend()),
            |loan: SendLoan, out| give_owned(loan.0, out),
            |n, room, held| send_queue_full(VERB, n, room, held),
            |chain, bad| {
                // `chain` is a NULL-terminated chain whose sg_lists point
                // into the scratch entries, both unchanged until the call
                // returns; every entry names a chunk now held by the ledger
                // (which keeps it until the device is provably done) or
                // inline data borrowed for the call; UD entries name live
                // address handles, kept in the ledger too.
                // SAFETY: a live QP and a valid chain over memory that outlives its use (above).
                unsafe { sys::ibv_post_send(qp, chain, bad) }
            },
        )
    }

    /// Posts a chain of receive requests with one `ibv_post_recv` call.
    ///
    /// Refused before the call, with every chunk handed back: a QP whose
    /// known state is RESET or ERR (in ERR the verbs would flush the
    /// receive, but rxe on Linux 6.1 never completes it), a QP that
    /// receives through an SRQ, more entries than `max_recv_sge` or
    /// [`MAX_SGE`], chunks of another PD, chunks of a region registered
    /// without `LOCAL_WRITE` (the device writes receives: it would fail
    /// the receive and move the QP to ERR), on a UD QP bound to a port that
    /// needs a GRH (RoCE, or `IBV_QPF_GRH_REQUIRED`) a receive of fewer
    /// than 40 bytes in all (the device writes the 40-byte GRH first, and
    /// on such a port every datagram carries one), and no room in the
    /// receive queue. On an InfiniBand port without that flag the 40 bytes
    /// are not checked: a datagram may come without a GRH (its payload still
    /// starts at byte 40, ibv_post_recv(3)).
    /// An empty iterator posts nothing and calls nothing.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv<I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        const VERB: &str = "ibv_post_recv";
        let error = match self.state() {
            state @ (QpState::Reset | QpState::Err) => Some(Error::QpState {
                verb: VERB,
                state,
                needs: "receives need INIT, RTR, RTS, SQD or SQE",
            }),
            _ if self.uses_srq() => Some(Error::invalid(
                VERB,
                "the QP receives through its SRQ: post to the SRQ",
            )),
            _ => None,
        };
        let max_sge = self.caps().max_recv_sge as usize;
        let pd = self.pd().as_ptr();
        let floor = self.recv_floor();
        let qp = self.as_ptr();
        let p = self.pending_mut();
        post_recv_chain(
            VERB,
            &mut p.recv,
            &mut p.recv_wrs,
            &mut p.sges,
            wrs.into_iter(),
            error,
            max_sge,
            pd,
            floor,
            |n, room, held| {
                Error::invalid(
                    VERB,
                    format!("{n} request(s) but the receive queue has room for {room} ({held} outstanding)"),
                )
            },
            |chain, bad| {
                // SAFETY: live QP; a NULL-terminated chain into the scratch
                // vectors, naming chunks the ledger holds.
                unsafe { sys::ibv_post_recv(qp, chain, bad) }
            },
        )
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
    #[doc(alias = "ibv_post_recv")]
    pub unsafe fn post_recv_raw(&mut self, wr: &mut sys::ibv_recv_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the caller vouches for the chain.
        let rc = unsafe { sys::ibv_post_recv(self.as_ptr(), wr, &mut bad) };
        crate::error::check_rc("ibv_post_recv", rc).map(|_| ())
    }

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
        self.route(wc, |wr_id, own, chunks| f(completed(wr_id, own, chunks)))
    }

    /// The one routing of a completion: by the tag's kind to this QP's
    /// send or receive ledger or to its SRQ, `on(wr_id, own, chunks)` for
    /// each request it ends, oldest first.
    #[inline]
    fn route<C: Completion + ?Sized>(
        &mut self,
        wc: &C,
        mut on: impl FnMut(u64, bool, Chunks),
    ) -> usize {
        if wc.local_qp_num().is_some_and(|n| n != self.qp_num()) {
            return 0;
        }
        let tag = wc.tag();
        let kind = Kind::of(tag);
        let n = match kind {
            Some(Kind::Send) => {
                let ok = wc.succeeded();
                self.pending_mut().send.complete(tag, |mut r| {
                    // A window bind or invalidation ran if its completion
                    // (or a later one: send queues stop at an error)
                    // succeeded; the window's state follows.
                    if let Some(loan) = r.payload.2.as_mut() {
                        loan.settle(ok || !r.own);
                    }
                    on(r.wr_id, r.own, r.payload.0)
                })
            }
            Some(Kind::Recv) => self
                .pending_mut()
                .recv
                .complete(tag, |r| on(r.wr_id, r.own, r.payload)),
            Some(Kind::Srq) => self.srq().map_or(0, |srq| {
                srq.reclaim_tag(tag, |c| on(c.wr_id, c.signaled, c.chunks))
            }),
            None => 0,
        };
        if n > 0 && matches!(kind, Some(Kind::Recv | Kind::Srq)) {
            if let Some(rkey) = self.invalidated_rkey(wc) {
                crate::mw::invalidated_by_peer(self.pd().context(), rkey);
            }
        }
        if n > 0 && !wc.succeeded() && self.state() != QpState::Err {
            self.device_failed(kind);
        }
        n
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
    /// sends ask the device.
    #[cold]
    #[inline(never)]
    fn device_failed(&mut self, kind: Option<Kind>) {
        match kind {
            Some(Kind::Recv) => self.set_known(QpState::Err, None),
            Some(Kind::Send) if self.qp_type() == QpType::Rc => self.set_known(QpState::Err, None),
            // A failed query leaves the known state; `resync` reports it.
            _ => {
                let _ = self.resync();
            }
        }
    }

    /// Hands back the requests that completion `wc` ends, as
    /// [`reclaim`](Self::reclaim) does, but in one call and without a
    /// record per request: the owned chunks of all of them go to `chunks`,
    /// oldest request first and in scatter/gather order within each
    /// ([`SharedChunk`] clones are let go). Returns how many requests ended.
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
        self.route(wc, |_, _, lent| give_owned(lent, chunks))
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
    #[doc(alias = "ibv_modify_qp")]
    pub fn reset(&mut self) -> Result<Vec<Completed>> {
        self.modify(&super::QpAttr::new().state(QpState::Reset))?;
        Ok(self.take_released())
    }

    /// The requests a move to RESET (through [`modify`](Self::modify), a
    /// typed transition or [`reset`](Self::reset)) handed back and that were
    /// not taken yet; empty otherwise.
    pub fn take_released(&mut self) -> Vec<Completed> {
        std::mem::take(&mut self.pending_mut().released)
    }

    /// Destroys the QP now and hands back every request it still held
    /// (and what a RESET left in [`take_released`](Self::take_released)).
    ///
    /// On failure the QP still exists on the device, so its requests'
    /// chunks are leaked with it, never handed back or freed.
    #[doc(alias = "ibv_destroy_qp")]
    pub fn close_and_reclaim(self) -> Result<Vec<Completed>> {
        Ok(self.into_keep()?.into_all())
    }
}

/// Fills `raw.sg_list` (as an index into `sges`, linked later), the opcode,
/// flags and operation fields of `wr`'s raw form.
fn raw_send(wr: &SendWr<'_>, sges: &mut Vec<sys::ibv_sge>) -> sys::ibv_send_wr {
    let sg_start = sges.len();
    if let Some(data) = wr.inline {
        sges.push(sys::ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        });
    } else {
        wr.sges.raw_into(sges);
    }
    let mut raw = sys::ibv_send_wr {
        num_sge: (sges.len() - sg_start) as c_int,
        opcode: wr.op.opcode(),
        send_flags: wr.flags,
        ..Default::default()
    };
    raw.sg_list = sg_start as *mut sys::ibv_sge;
    match wr.op {
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
    if let Some((ah, qpn, qkey)) = &wr.ud {
        raw.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: ah.as_ptr(),
            remote_qpn: qpn.get(),
            remote_qkey: qkey.0,
        };
    }
    raw
}

/// Fills `raw.sg_list` (as an index, linked later) of a receive's raw form.
fn raw_recv(wr: &RecvWr, sges: &mut Vec<sys::ibv_sge>) -> sys::ibv_recv_wr {
    let start = sges.len();
    wr.sges.raw_into(sges);
    sys::ibv_recv_wr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: start as *mut sys::ibv_sge,
        num_sge: (sges.len() - start) as c_int,
    }
}

/// Posts the receives of `reqs` to a QP's receive queue or an SRQ through
/// `call`, after the checks every receive gets (`error` is a refusal known
/// before looking at them, such as the QP's state).
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_recv_chain(
    verb: &'static str,
    ledger: &mut Ledger<Chunks>,
    wrs: &mut Vec<sys::ibv_recv_wr>,
    sges: &mut Vec<sys::ibv_sge>,
    reqs: impl Iterator<Item = RecvWr>,
    error: Option<Error>,
    max_sge: usize,
    pd: *mut sys::ibv_pd,
    min_len: u32,
    no_room: impl FnOnce(usize, usize, usize) -> Error,
    call: impl FnOnce(*mut sys::ibv_recv_wr, &mut *mut sys::ibv_recv_wr) -> c_int,
) -> Result<(), PostError> {
    post_chain(
        verb,
        ledger,
        wrs,
        sges,
        reqs,
        error,
        |wr| check_recv(wr, max_sge, pd, min_len, verb),
        raw_recv,
        |wr| (wr.wr_id, wr.sges.take()),
        give_owned,
        no_room,
        call,
    )
}

/// The one place requests enter a ledger and reach a provider.
///
/// Each request of `reqs` is checked (`check`, unless the call is refused
/// already: `error`), its raw form built in place by `raw` into the scratch
/// vectors `wrs`/`sges` (which keep their capacity, so steady state
/// allocates nothing), and its loan (`lend`) moved into `ledger`, whose tag
/// becomes the raw `wr_id`. If any request is refused (a failed check, no
/// room: `no_room(requests, room, outstanding)`, no tags left), the call's
/// requests are taken back out of the ledger, newest first, and every chunk
/// of the call comes back in the error, in request order; nothing reached
/// the device. Otherwise the chain is linked and handed to `call` (the
/// provider's post); on success, or on a provider failure, the ledger keeps
/// every request (see [`PostError`]). An empty `reqs` calls nothing.
#[allow(clippy::too_many_arguments)]
fn post_chain<W: HasSges, R: ChainLink, L>(
    verb: &'static str,
    ledger: &mut Ledger<L>,
    wrs: &mut Vec<R>,
    sges: &mut Vec<sys::ibv_sge>,
    reqs: impl Iterator<Item = W>,
    mut error: Option<Error>,
    check: impl Fn(&W) -> Result<()>,
    raw: impl Fn(&W, &mut Vec<sys::ibv_sge>) -> R,
    lend: impl Fn(&mut W) -> (u64, L),
    unlend: impl Fn(L, &mut Vec<Chunk>),
    no_room: impl FnOnce(usize, usize, usize) -> Error,
    call: impl FnOnce(*mut R, &mut *mut R) -> c_int,
) -> Result<(), PostError> {
    wrs.clear();
    sges.clear();
    let (room, held) = (ledger.room(), ledger.len());
    let mut n = 0;
    let mut full = false;
    // Chunks of requests not lent (refused): in request order.
    let mut back = Vec::new();
    // The caller's iterator runs below (its `next` and its drop): if it
    // panics, the requests this call put in the ledger never reach the
    // device, and the guard takes them out again as the stack unwinds.
    let mut g = UndoOnUnwind {
        ledger,
        wrs,
        armed: true,
    };
    let (ledger, wrs) = (&mut *g.ledger, &mut *g.wrs);
    for mut wr in reqs {
        n += 1;
        if error.is_none() {
            error = check(&wr).err();
        }
        if error.is_some() || full {
            wr.sges_mut().drain_into(&mut back);
            continue;
        }
        let mut r = raw(&wr, sges);
        // Takes what the request lends, in place (the rest is dropped).
        let (wr_id, loan) = lend(&mut wr);
        match ledger.insert(wr_id, loan) {
            Ok(tag) => {
                r.set_wr_id(tag);
                wrs.push(r);
            }
            Err(loan) => {
                unlend(loan, &mut back);
                if ledger.room() == 0 {
                    full = true;
                } else {
                    error = Some(Error::TagsExhausted { verb });
                }
            }
        }
    }
    // The caller's iterator is used up and dropped: no caller code runs
    // from here on.
    g.armed = false;
    let (ledger, wrs) = (&mut *g.ledger, &mut *g.wrs);
    if n == 0 {
        return Ok(());
    }
    if let Some(error) = error.or_else(|| full.then(|| no_room(n, room, held))) {
        // Take this call's requests back out, newest first (nothing reached
        // the device), and return their chunks ahead of the rest.
        let mut undone = Vec::with_capacity(wrs.len());
        for w in wrs.iter().rev() {
            undone.extend(ledger.undo_last(w.wr_id()));
        }
        let mut all = Vec::new();
        for loan in undone.into_iter().rev() {
            unlend(loan, &mut all);
        }
        all.append(&mut back);
        return Err(fail(error, 0, all));
    }
    link_chain(wrs, sges);
    let mut bad: *mut R = std::ptr::null_mut();
    let rc = call(wrs.as_mut_ptr(), &mut bad);
    // Whatever `bad` says, a failed provider may have queued any request of
    // the chain: the ledger keeps them all.
    crate::error::check_rc(verb, rc)
        .map(|_| ())
        .map_err(|error| fail(error, n, Vec::new()))
}

/// Takes a post call's requests back out of the ledger if the caller's
/// iterator panics while the chain is built (none of them reached the
/// device): no queue room is lost to requests that were never posted.
/// Their chunks are dropped with the unwinding (they go back to their
/// region, as any dropped chunk does).
struct UndoOnUnwind<'a, R: ChainLink, L> {
    ledger: &'a mut Ledger<L>,
    wrs: &'a mut Vec<R>,
    armed: bool,
}

impl<R: ChainLink, L> Drop for UndoOnUnwind<'_, R, L> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Newest first: each is the ledger's latest insert at its turn.
        for w in self.wrs.iter().rev() {
            drop(self.ledger.undo_last(w.wr_id()));
        }
        self.wrs.clear();
    }
}

/// Work requests that carry scatter/gather entries.
pub(crate) trait HasSges {
    fn sges_mut(&mut self) -> &mut Sges;
}

impl HasSges for SendWr<'_> {
    fn sges_mut(&mut self) -> &mut Sges {
        &mut self.sges
    }
}

impl HasSges for RecvWr {
    fn sges_mut(&mut self) -> &mut Sges {
        &mut self.sges
    }
}

/// The checks a receive gets before any call, for QPs and SRQs alike:
/// the entry checks, every entry writable by the device, and at least
/// `min_len` bytes in all (a UD QP's 40-byte GRH on a port that needs one,
/// else 0).
pub(crate) fn check_recv(
    wr: &RecvWr,
    max_sge: usize,
    pd: *mut sys::ibv_pd,
    min_len: u32,
    verb: &'static str,
) -> Result<()> {
    wr.sges.check(verb, max_sge, "max_recv_sge", pd)?;
    wr.sges.check_writable(verb, "a receive")?;
    if min_len > 0 && wr.sges.total() < u64::from(min_len) {
        return Err(Error::invalid(
            verb,
            format!(
                "a UD receive of {} bytes on a port that needs a GRH: the device writes the \
                 {GRH_LEN}-byte GRH first, so a receive needs at least {min_len} bytes \
                 (the payload starts at byte {GRH_LEN})",
                wr.sges.total()
            ),
        ));
    }
    Ok(())
}

/// The bytes of a Global Routing Header, which the device writes at the
/// start of every UD receive (ibv_post_recv(3)).
pub(crate) const GRH_LEN: u32 = 40;

/// The fields the two raw request types chain with.
pub(crate) trait ChainLink: Sized {
    /// While building, `sg_list` holds the request's first index into the
    /// entry vector, not a pointer.
    fn sg_start(&self) -> usize;
    fn has_sges(&self) -> bool;
    fn set_links(&mut self, sg_list: *mut sys::ibv_sge, next: *mut Self);
    fn wr_id(&self) -> u64;
    fn set_wr_id(&mut self, id: u64);
}

macro_rules! chain_link {
    ($t:ty) => {
        impl ChainLink for $t {
            fn sg_start(&self) -> usize {
                self.sg_list as usize
            }
            fn has_sges(&self) -> bool {
                self.num_sge > 0
            }
            fn set_links(&mut self, sg_list: *mut sys::ibv_sge, next: *mut Self) {
                self.sg_list = sg_list;
                self.next = next;
            }
            fn wr_id(&self) -> u64 {
                self.wr_id
            }
            fn set_wr_id(&mut self, id: u64) {
                self.wr_id = id;
            }
        }
    };
}
chain_link!(sys::ibv_send_wr);
chain_link!(sys::ibv_recv_wr);

/// Turns the start indexes in `sg_list` into pointers into `sges` and links
/// the requests into a NULL-terminated chain, once neither vector grows.
/// Every pointer is derived from the two base pointers, which the post call
/// then receives (`Vec::as_mut_ptr` makes no reference to the elements).
fn link_chain<W: ChainLink>(wrs: &mut [W], sges: &mut [sys::ibv_sge]) {
    let base = sges.as_mut_ptr();
    let wbase = wrs.as_mut_ptr();
    let n = wrs.len();
    for i in 0..n {
        // SAFETY: `i < n`, so `wbase + i` is an initialised element of `wrs`,
        // which this function borrows mutably; no other reference to it exists.
        let w = unsafe { &mut *wbase.add(i) };
        let sg = if w.has_sges() {
            base.wrapping_add(w.sg_start())
        } else {
            std::ptr::null_mut()
        };
        let next = if i + 1 < n {
            wbase.wrapping_add(i + 1)
        } else {
            std::ptr::null_mut()
        };
        w.set_links(sg, next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_lengths_are_refused_not_truncated() {
        let big = u32::MAX as usize + 1;
        // A length above u32::MAX, even of a chunk that long.
        let why = sge_refusal(0, 0, big, usize::MAX).expect("refused");
        assert!(
            why.contains("length 4294967296") && why.contains("32-bit"),
            "{why}"
        );
        let why = sge_refusal(2, 2, usize::MAX, 64).expect("refused");
        assert!(
            why.contains("entry 2") && why.contains("length 18446744073709551615"),
            "{why}"
        );
        assert!(why.contains("chunk's 64 bytes"), "{why}");
        let why = sge_refusal(MAX_SGE, MAX_SGE, 1, 64).expect("refused");
        assert!(why.contains(&format!("than {MAX_SGE} entries")), "{why}");
        assert_eq!(sge_refusal(0, 0, u32::MAX as usize, usize::MAX), None);
        assert_eq!(sge_refusal(0, 0, 0, 0), None);
        assert_eq!(sge_refusal(MAX_SGE - 1, MAX_SGE - 1, 64, 64), None);
    }
}

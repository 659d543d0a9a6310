//! The data path: posting work requests and getting their buffers back.
//!
//! # Ownership of posted buffers
//!
//! The device reads and writes posted memory behind the compiler's back, so
//! safe code must never be able to touch (or free) memory while a work
//! request that names it is outstanding. This module makes that a matter of
//! ownership, as io_uring bindings do:
//!
//! * buffers are [`Chunk`]s: owned, disjoint pieces of a registered region;
//! * [`SendWr`] and [`RecvWr`] take their chunks *by value*; posting moves
//!   them into the queue pair's table of outstanding requests, where no Rust
//!   code can reach them;
//! * [`QueuePair::reclaim`] hands them back with the completion that ends
//!   the request, successful or flushed. A signalled send completion also
//!   ends every unsignalled send posted before it (send queues complete in
//!   order), so those chunks come back with it;
//! * dropping the QP destroys it first, which stops the device, and only
//!   then frees what was outstanding; should destruction fail, the chunks
//!   are leaked rather than freed under the device. Moving the QP to RESET
//!   discards outstanding requests without completions, so their chunks are
//!   dropped then.
//!
//! Chunks are never taken from a region that peers may write
//! (`REMOTE_WRITE`, `REMOTE_ATOMIC`): such memory is only reachable by copy
//! ([`MemoryRegion::read`](crate::MemoryRegion::read) and
//! [`write`](crate::MemoryRegion::write)), never as a Rust slice. Inline
//! data is copied by the provider during the post, so it is borrowed only
//! for the call. Remote addresses (`RemoteAddr`) are numbers naming the
//! peer's memory, which the peer's own registration protects.
//!
//! The table is allocated when the QP is created (one slot per work request
//! the queues hold), and a chain of requests is built in scratch space the
//! QP keeps, then handed to the provider in one call: in steady state,
//! posting and reclaiming allocate nothing.
//!
//! For expert use the raw path remains: [`QueuePair::post_send_raw`] and
//! [`QueuePair::post_recv_raw`] are `unsafe`, and their caller keeps the
//! buffers alive.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::fmt;

use super::values::{QKey, QpNum};
use super::{QpCaps, QpType, QueuePair};
use crate::ah::AddressHandle;
use crate::cq::WorkCompletion;
use crate::error::{Error, Result};
use crate::mr::Chunk;
use crate::sys;

/// The most scatter/gather entries one work request of the safe API takes.
pub const MAX_SGE: usize = 4;

const RECV_BIT: u64 = 1 << 63;

/// Each QP numbers its requests from a range of its own, taken from one
/// process-wide counter, so that no two QPs (of any device) ever hand the
/// device the same `wr_id`. [`QueuePair::reclaim`] then only accepts a
/// `wr_id` it issued itself: a completion of another QP, of a QP destroyed
/// before, or of another device cannot give back a buffer still in use.
const RANGE: u64 = 1 << 36;

/// A fresh, never used range start (ranges go up; 2^27 of them fit below
/// the receive bit).
fn fresh_range() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(RANGE);
    NEXT.fetch_add(RANGE, std::sync::atomic::Ordering::Relaxed) & !RECV_BIT
}

/// The first sequence number of a chain of `n`, moving to a fresh range
/// when the current one cannot hold it.
fn take_seqs(next: &mut u64, range_start: &mut u64, n: usize) -> u64 {
    if *next + n as u64 > *range_start + RANGE {
        *range_start = fresh_range();
        *next = *range_start;
    }
    *next
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

/// The operation of a send work request (`enum ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`, with 32 bits of immediate data (host order).
    SendWithImm(u32),
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
            SendOp::RdmaWrite(_) => o::IBV_WR_RDMA_WRITE,
            SendOp::RdmaWriteWithImm(..) => o::IBV_WR_RDMA_WRITE_WITH_IMM,
            SendOp::RdmaRead(_) => o::IBV_WR_RDMA_READ,
            SendOp::CompareSwap { .. } => o::IBV_WR_ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => o::IBV_WR_ATOMIC_FETCH_AND_ADD,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm(_) => "SEND_WITH_IMM",
            SendOp::RdmaWrite(_) => "RDMA_WRITE",
            SendOp::RdmaWriteWithImm(..) => "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead(_) => "RDMA_READ",
            SendOp::CompareSwap { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
        }
    }

    fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// Scatter/gather entries: chunks with the number of bytes to use of each.
pub(crate) struct Sges {
    chunks: [Option<Chunk>; MAX_SGE],
    lens: [u32; MAX_SGE],
    n: usize,
    /// A chunk beyond `MAX_SGE` or longer than it is, refused at post time.
    overflow: Option<Chunk>,
}

impl Sges {
    fn new() -> Self {
        Sges {
            chunks: Default::default(),
            lens: [0; MAX_SGE],
            n: 0,
            overflow: None,
        }
    }

    fn push(&mut self, chunk: Chunk, len: usize) {
        match u32::try_from(len) {
            Ok(len)
                if self.n < MAX_SGE && len as usize <= chunk.len() && self.overflow.is_none() =>
            {
                self.chunks[self.n] = Some(chunk);
                self.lens[self.n] = len;
                self.n += 1;
            }
            _ => self.overflow = Some(chunk),
        }
    }

    fn total(&self) -> u64 {
        self.lens[..self.n].iter().map(|&l| u64::from(l)).sum()
    }

    pub(crate) fn drain_into(&mut self, out: &mut Vec<Chunk>) {
        out.extend(self.chunks.iter_mut().filter_map(Option::take));
        out.extend(self.overflow.take());
        self.n = 0;
    }

    pub(crate) fn take(&mut self) -> [Option<Chunk>; MAX_SGE] {
        self.n = 0;
        std::mem::take(&mut self.chunks)
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
    wr_id: u64,
    op: SendOp,
    sges: Sges,
    inline: Option<&'a [u8]>,
    flags: u32,
    ud: Option<(AddressHandle, QpNum, QKey)>,
}

impl<'a> SendWr<'a> {
    /// A signalled request `op` with the caller's `wr_id` (handed back in
    /// [`Completed::wr_id`]).
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
    pub fn sge(self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.sge_len(chunk, len)
    }

    /// Adds the first `len` bytes of a chunk as the next entry.
    pub fn sge_len(mut self, chunk: Chunk, len: usize) -> Self {
        self.sges.push(chunk, len);
        self
    }

    /// Sends `data` inline (`IBV_SEND_INLINE`): the provider copies it during
    /// the post, so it is only borrowed. For sends and RDMA writes, up to the
    /// QP's `max_inline_data`; not with chunks.
    pub fn inline(mut self, data: &'a [u8]) -> Self {
        self.inline = Some(data);
        self.flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }

    /// No completion for this request on success (clears `IBV_SEND_SIGNALED`);
    /// its chunks come back with the next signalled completion.
    pub fn unsignaled(mut self) -> Self {
        self.flags &= !sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// `IBV_SEND_SOLICITED`: wake a peer waiting for solicited events.
    pub fn solicited(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// `IBV_SEND_FENCE`: wait for earlier RDMA reads and atomics first.
    pub fn fence(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// The UD destination: address handle, remote QP number and Q_Key.
    pub fn ud(mut self, ah: &AddressHandle, remote_qpn: QpNum, remote_qkey: QKey) -> Self {
        self.ud = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }

    fn signaled(&self) -> bool {
        self.flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
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
    pub fn new(wr_id: u64) -> Self {
        RecvWr {
            wr_id,
            sges: Sges::new(),
        }
    }

    /// Adds a whole chunk as the next scatter entry.
    pub fn sge(mut self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.sges.push(chunk, len);
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
    /// Whether this request produced the completion being reclaimed (rather
    /// than being an earlier unsignalled send that it implies).
    pub signaled: bool,
    pub(crate) chunks: [Option<Chunk>; MAX_SGE],
}

impl Completed {
    /// The request's chunks, in scatter/gather order.
    pub fn chunks(self) -> impl Iterator<Item = Chunk> {
        self.chunks.into_iter().flatten()
    }

    /// The first chunk (for the common single-entry request).
    pub fn into_chunk(self) -> Option<Chunk> {
        self.chunks.into_iter().flatten().next()
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

/// A post that did not go through: the error, and the chunks of every
/// request that was not posted (requests before the failing one were).
pub struct PostError {
    /// What went wrong.
    pub error: Error,
    /// How many requests of the call were posted.
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
        write!(
            f,
            "{} ({} request(s) posted before it)",
            self.error, self.posted
        )
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<PostError> for Error {
    /// Keeps the error; the returned chunks are dropped.
    fn from(e: PostError) -> Self {
        e.error
    }
}

struct SendSlot {
    seq: u64,
    wr_id: u64,
    chunks: [Option<Chunk>; MAX_SGE],
    _ah: Option<AddressHandle>,
}

struct RecvSlot {
    seq: u64,
    wr_id: u64,
    chunks: [Option<Chunk>; MAX_SGE],
}

/// Outstanding requests of one QP, and scratch space to build chains in.
pub(crate) struct Pending {
    send: VecDeque<SendSlot>,
    recv: VecDeque<RecvSlot>,
    send_cap: usize,
    recv_cap: usize,
    next_send: u64,
    next_recv: u64,
    send_range: u64,
    recv_range: u64,
    send_wrs: Vec<sys::ibv_send_wr>,
    recv_wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
}

// SAFETY: the raw pointers inside the scratch vectors are only meaningful
// during one post call on the thread making it, and are rewritten before
// every use; everything else in `Pending` is `Send` already.
unsafe impl Send for Pending {}
// SAFETY: `Pending` is only reached through `&mut QueuePair`.
unsafe impl Sync for Pending {}

impl Pending {
    pub(crate) fn new(caps: &QpCaps) -> Self {
        let send_cap = caps.max_send_wr as usize;
        let recv_cap = caps.max_recv_wr as usize;
        let (send_range, recv_range) = (fresh_range(), fresh_range());
        Pending {
            send: VecDeque::with_capacity(send_cap),
            recv: VecDeque::with_capacity(recv_cap),
            send_cap,
            recv_cap,
            next_send: send_range,
            next_recv: recv_range,
            send_range,
            recv_range,
            send_wrs: Vec::new(),
            recv_wrs: Vec::new(),
            sges: Vec::new(),
        }
    }

    /// Drops every outstanding request's buffers (after RESET or destroy).
    pub(crate) fn clear(&mut self) {
        self.send.clear();
        self.recv.clear();
    }
}

fn fail(error: Error, posted: usize, returned: Vec<Chunk>) -> PostError {
    PostError {
        error,
        posted,
        returned,
    }
}

impl QueuePair {
    /// How many send requests are outstanding (posted, not yet reclaimed).
    pub fn outstanding_sends(&self) -> usize {
        self.pending().send.len()
    }

    /// How many receive requests are outstanding.
    pub fn outstanding_recvs(&self) -> usize {
        self.pending().recv.len()
    }

    fn check_send(&self, wr: &SendWr<'_>) -> Result<()> {
        const VERB: &str = "ibv_post_send";
        let t = self.qp_type();
        let op = &wr.op;
        let allowed = match t {
            QpType::Ud | QpType::RawPacket => matches!(op, SendOp::Send | SendOp::SendWithImm(_)),
            QpType::Uc => matches!(
                op,
                SendOp::Send
                    | SendOp::SendWithImm(_)
                    | SendOp::RdmaWrite(_)
                    | SendOp::RdmaWriteWithImm(..)
            ),
            _ => true,
        };
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
            if ah.pd().handle() != self.pd().handle() {
                return Err(Error::invalid(
                    VERB,
                    "the address handle belongs to another protection domain",
                ));
            }
        }
        if wr.sges.overflow.is_some() {
            return Err(Error::invalid(
                VERB,
                format!("more than {MAX_SGE} entries, or an entry longer than its chunk"),
            ));
        }
        if wr.sges.n > self.caps().max_send_sge as usize {
            return Err(Error::invalid(
                VERB,
                format!(
                    "{} entries but the QP's max_send_sge is {}",
                    wr.sges.n,
                    self.caps().max_send_sge
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
                    | SendOp::RdmaWrite(_)
                    | SendOp::RdmaWriteWithImm(..)
            ) {
                return Err(Error::invalid(
                    VERB,
                    format!("{} cannot carry inline data", op.name()),
                ));
            }
            if data.len() > self.caps().max_inline_data as usize {
                return Err(Error::invalid(
                    VERB,
                    format!(
                        "{} inline bytes but the QP's max_inline_data is {}",
                        data.len(),
                        self.caps().max_inline_data
                    ),
                ));
            }
        }
        for chunk in wr.sges.chunks.iter().flatten() {
            if chunk.pd_handle() != self.pd().handle() {
                return Err(Error::invalid(
                    VERB,
                    "a chunk belongs to another protection domain",
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

    /// Posts a chain of send requests with one `ibv_post_send` call.
    ///
    /// Each request's chunks move into the QP until [`reclaim`](Self::reclaim)
    /// hands them back. Checked before the call: operations the QP type
    /// cannot do, UD destinations, entry counts against `max_send_sge`,
    /// inline sizes against `max_inline_data`, atomics' 8-byte entry and
    /// alignment, chunks and address handles of another PD, and room in the
    /// send queue; such a refusal posts nothing. Allocates nothing in steady
    /// state.
    #[doc(alias = "ibv_post_send")]
    pub fn post_send<'a, I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = SendWr<'a>>,
    {
        const VERB: &str = "ibv_post_send";
        let mut reqs = Batch::new();
        let mut error = None;
        for wr in wrs {
            if error.is_none() {
                error = self.check_send(&wr).err();
            }
            reqs.push(wr);
        }
        let n = reqs.len();
        let (cap, outstanding) = (self.pending().send_cap, self.pending().send.len());
        if error.is_none() && outstanding + n > cap {
            error = Some(Error::invalid(
                VERB,
                format!(
                    "{n} request(s) with {outstanding} outstanding exceed the send queue's {cap}"
                ),
            ));
        }
        if let Some(e) = error {
            return Err(reqs.refuse(e));
        }
        let qp = self.as_ptr();
        let p = self.pending_mut();
        let first_seq = take_seqs(&mut p.next_send, &mut p.send_range, n);
        p.send_wrs.clear();
        p.sges.clear();
        for (i, wr) in reqs.iter().enumerate() {
            let sg_start = p.sges.len();
            if let Some(data) = wr.inline {
                p.sges.push(sys::ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: data.len() as u32,
                    lkey: 0,
                });
            } else {
                for (c, &len) in wr.sges.chunks.iter().flatten().zip(&wr.sges.lens) {
                    p.sges.push(sys::ibv_sge {
                        addr: c.addr(),
                        length: len,
                        lkey: c.lkey(),
                    });
                }
            }
            let num_sge = p.sges.len() - sg_start;
            let mut raw = sys::ibv_send_wr {
                wr_id: first_seq + i as u64,
                num_sge: num_sge as c_int,
                opcode: wr.op.opcode(),
                send_flags: wr.flags,
                ..Default::default()
            };
            // sg_list and next are set below, once the vectors stop growing.
            raw.sg_list = sg_start as *mut sys::ibv_sge;
            match wr.op {
                SendOp::Send => {}
                SendOp::SendWithImm(imm) => raw.__bindgen_anon_1.imm_data = imm.to_be(),
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
            p.send_wrs.push(raw);
        }
        link_chain(&mut p.send_wrs, &mut p.sges);
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // `send_wrs` is a NULL-terminated chain whose sg_lists point into
        // `sges`, both unchanged until the call returns; every entry names a
        // chunk this call owns (moved into the ring below before any
        // completion can be reclaimed) or inline data borrowed for the call;
        // UD entries name live address handles, kept in the ring.
        // SAFETY: a live QP and a valid chain over memory that outlives it (above).
        let rc = unsafe { sys::ibv_post_send(qp, p.send_wrs.as_mut_ptr(), &mut bad) };
        let posted = posted_count(rc, bad, &p.send_wrs, n);
        p.next_send = first_seq + posted as u64;
        let ring = &mut p.send;
        reqs.settle(rc, posted, VERB, |i, mut wr| {
            ring.push_back(SendSlot {
                seq: first_seq + i as u64,
                wr_id: wr.wr_id,
                chunks: wr.sges.take(),
                _ah: wr.ud.take().map(|u| u.0),
            })
        })
    }

    /// Posts a chain of receive requests with one `ibv_post_recv` call.
    ///
    /// Refused before the call: more entries than `max_recv_sge`, chunks of
    /// another PD, a QP that uses an SRQ, and no room in the receive queue.
    #[doc(alias = "ibv_post_recv")]
    pub fn post_recv<I>(&mut self, wrs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = RecvWr>,
    {
        const VERB: &str = "ibv_post_recv";
        let mut reqs = Batch::new();
        let mut error = self
            .uses_srq()
            .then(|| Error::invalid(VERB, "the QP receives through its SRQ: post to the SRQ"));
        let max_sge = self.caps().max_recv_sge as usize;
        let pd = self.pd().handle();
        for wr in wrs {
            if error.is_none() {
                error = check_recv(&wr, max_sge, pd, VERB).err();
            }
            reqs.push(wr);
        }
        let n = reqs.len();
        let (cap, outstanding) = (self.pending().recv_cap, self.pending().recv.len());
        if error.is_none() && outstanding + n > cap {
            error = Some(Error::invalid(
                VERB,
                format!("{n} request(s) with {outstanding} outstanding exceed the receive queue's {cap}"),
            ));
        }
        if let Some(e) = error {
            return Err(reqs.refuse(e));
        }
        let qp = self.as_ptr();
        let p = self.pending_mut();
        let first_seq = take_seqs(&mut p.next_recv, &mut p.recv_range, n);
        build_recv_chain(&mut p.recv_wrs, &mut p.sges, &reqs, |i| {
            (first_seq + i as u64) | RECV_BIT
        });
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as in `post_send`: a NULL-terminated chain into `recv_wrs`
        // and `sges`, naming chunks that move into the ring below.
        let rc = unsafe { sys::ibv_post_recv(qp, p.recv_wrs.as_mut_ptr(), &mut bad) };
        let posted = posted_count(rc, bad, &p.recv_wrs, n);
        p.next_recv = first_seq + posted as u64;
        let ring = &mut p.recv;
        reqs.settle(rc, posted, VERB, |i, mut wr| {
            ring.push_back(RecvSlot {
                seq: first_seq + i as u64,
                wr_id: wr.wr_id,
                chunks: wr.sges.take(),
            })
        })
    }

    /// Posts a raw chain of send requests, bypassing the buffer ownership of
    /// [`post_send`](Self::post_send): the expert path.
    ///
    /// Completions of these requests carry the caller's own `wr_id`s; the
    /// caller handles them itself and never passes them to
    /// [`reclaim`](Self::reclaim).
    ///
    /// # Safety
    /// `wr` is a valid NULL-terminated chain; every `sg_list` entry names
    /// memory registered in this QP's PD that stays allocated, and is not
    /// accessed by Rust code in a way that conflicts with the device (no
    /// references to memory the device writes), until the request's
    /// completion has been polled or the QP is destroyed or reset; UD
    /// requests name address handles that outlive them; and the completions
    /// of these requests are never passed to [`reclaim`](Self::reclaim)
    /// (their `wr_id`s are the caller's, and could name the safe path's).
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
    /// been polled or the QP is destroyed or reset, and those completions
    /// are never passed to [`reclaim`](Self::reclaim).
    #[doc(alias = "ibv_post_recv")]
    pub unsafe fn post_recv_raw(&mut self, wr: &mut sys::ibv_recv_wr) -> Result<()> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the caller vouches for the chain.
        let rc = unsafe { sys::ibv_post_recv(self.as_ptr(), wr, &mut bad) };
        crate::error::check_rc("ibv_post_recv", rc).map(|_| ())
    }

    /// Hands back the requests that completion `wc` ends, calling `f` for
    /// each; returns how many. For a QP that receives through an SRQ, its
    /// receive completions are handed back from the SRQ.
    ///
    /// A receive completion ends its receive. A send completion ends its
    /// send and every unsignalled send posted before it. Completions of
    /// other QPs (of any device), of QPs destroyed before, or already
    /// reclaimed, end nothing: every QP numbers its requests from ranges no
    /// other QP in the process ever uses, and only a `wr_id` this QP issued
    /// and still holds is accepted. Works for
    /// flushed completions too (after the QP went to ERR), whose opcode the
    /// device leaves undefined: the `wr_id` says which queue it is.
    /// Allocates nothing.
    pub fn reclaim(&mut self, wc: &WorkCompletion, mut f: impl FnMut(Completed)) -> usize {
        if wc.qp_num() != self.qp_num() {
            return 0;
        }
        let own = self.reclaim_own(wc, &mut f);
        match self.srq() {
            Some(srq) if own == 0 => srq.reclaim(wc, f),
            _ => own,
        }
    }

    fn reclaim_own(&mut self, wc: &WorkCompletion, f: &mut impl FnMut(Completed)) -> usize {
        let id = wc.wr_id();
        let p = self.pending_mut();
        if id & RECV_BIT != 0 {
            let seq = id & !RECV_BIT;
            // Receives complete in order; search anyway, so that a skipped
            // completion cannot strand the ones after it.
            let Ok(pos) = p.recv.binary_search_by_key(&seq, |s| s.seq) else {
                return 0;
            };
            let s = p.recv.remove(pos).expect("found");
            f(Completed {
                wr_id: s.wr_id,
                signaled: true,
                chunks: s.chunks,
            });
            1
        } else {
            // Only a wr_id this QP issued counts; it ends every send up to it.
            let Ok(pos) = p.send.binary_search_by_key(&id, |s| s.seq) else {
                return 0;
            };
            for s in p.send.drain(..=pos) {
                f(Completed {
                    wr_id: s.wr_id,
                    signaled: s.seq == id,
                    chunks: s.chunks,
                });
            }
            pos + 1
        }
    }
}

/// Requests of one call, kept in order without allocating for chains of up
/// to eight.
pub(crate) struct Batch<T> {
    inline: [Option<T>; 8],
    n: usize,
    more: Vec<T>,
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

impl<T: HasSges> Batch<T> {
    pub(crate) fn new() -> Self {
        Batch {
            inline: Default::default(),
            n: 0,
            more: Vec::new(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.n + self.more.len()
    }

    pub(crate) fn push(&mut self, wr: T) {
        if self.n < self.inline.len() {
            self.inline[self.n] = Some(wr);
            self.n += 1;
        } else {
            self.more.push(wr);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.inline.iter().flatten().chain(self.more.iter())
    }

    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.n = 0;
        self.inline
            .iter_mut()
            .filter_map(Option::take)
            .chain(self.more.drain(..))
    }

    /// After the post call: the first `posted` requests are the device's
    /// now and go to `keep`; the others' chunks go back in the error.
    pub(crate) fn settle(
        &mut self,
        rc: c_int,
        posted: usize,
        verb: &'static str,
        mut keep: impl FnMut(usize, T),
    ) -> Result<(), PostError> {
        let mut back = Vec::new();
        for (i, mut wr) in self.drain().enumerate() {
            if i < posted {
                keep(i, wr);
            } else {
                wr.sges_mut().drain_into(&mut back);
            }
        }
        if rc == 0 {
            Ok(())
        } else {
            let errno = if rc > 0 { rc } else { libc::EINVAL };
            Err(fail(Error::Verb { verb, errno }, posted, back))
        }
    }

    /// A refusal before any call: every request's chunks go back.
    pub(crate) fn refuse(&mut self, error: Error) -> PostError {
        let mut back = Vec::new();
        for mut wr in self.drain() {
            wr.sges_mut().drain_into(&mut back);
        }
        fail(error, 0, back)
    }
}

pub(crate) fn check_recv(
    wr: &RecvWr,
    max_sge: usize,
    pd_handle: u32,
    verb: &'static str,
) -> Result<()> {
    if wr.sges.overflow.is_some() {
        return Err(Error::invalid(verb, format!("more than {MAX_SGE} entries")));
    }
    if wr.sges.n > max_sge {
        return Err(Error::invalid(
            verb,
            format!("{} entries but max_recv_sge is {max_sge}", wr.sges.n),
        ));
    }
    if wr
        .sges
        .chunks
        .iter()
        .flatten()
        .any(|c| c.pd_handle() != pd_handle)
    {
        return Err(Error::invalid(
            verb,
            "a chunk belongs to another protection domain",
        ));
    }
    Ok(())
}

/// Fills `wrs`/`sges` with the raw chain for `reqs`, with wr_ids from `id`.
pub(crate) fn build_recv_chain(
    wrs: &mut Vec<sys::ibv_recv_wr>,
    sges: &mut Vec<sys::ibv_sge>,
    reqs: &Batch<RecvWr>,
    id: impl Fn(usize) -> u64,
) {
    wrs.clear();
    sges.clear();
    for (i, wr) in reqs.iter().enumerate() {
        let start = sges.len();
        for (c, &len) in wr.sges.chunks.iter().flatten().zip(&wr.sges.lens) {
            sges.push(sys::ibv_sge {
                addr: c.addr(),
                length: len,
                lkey: c.lkey(),
            });
        }
        wrs.push(sys::ibv_recv_wr {
            wr_id: id(i),
            next: std::ptr::null_mut(),
            sg_list: start as *mut sys::ibv_sge,
            num_sge: (sges.len() - start) as c_int,
        });
    }
    link_chain(wrs, sges);
}

/// The fields the two raw request types chain with.
trait ChainLink: Sized {
    /// While building, `sg_list` holds the request's first index into the
    /// entry vector, not a pointer.
    fn sg_start(&self) -> usize;
    fn has_sges(&self) -> bool;
    fn set_links(&mut self, sg_list: *mut sys::ibv_sge, next: *mut Self);
}

impl ChainLink for sys::ibv_send_wr {
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
}

impl ChainLink for sys::ibv_recv_wr {
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
}

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

/// How many requests of an `n`-request chain a post took.
pub(crate) fn posted_count<T>(rc: c_int, bad: *mut T, wrs: &[T], n: usize) -> usize {
    if rc == 0 {
        n
    } else if bad.is_null() {
        0
    } else {
        // SAFETY: `bad` points into `wrs` (the provider names the first
        // request it did not take).
        (unsafe { bad.offset_from(wrs.as_ptr()) }).clamp(0, n as isize) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_fresh_and_increasing() {
        let (a, b) = (fresh_range(), fresh_range());
        assert!(b >= a + RANGE, "{a:#x} {b:#x}");
        assert_eq!(a & RECV_BIT, 0);
    }

    #[test]
    fn a_full_range_moves_to_a_fresh_one() {
        let mut start = fresh_range();
        let mut next = start;
        assert_eq!(take_seqs(&mut next, &mut start, 4), next);
        let old = start;
        next = start + RANGE - 2;
        let first = take_seqs(&mut next, &mut start, 4);
        assert!(start > old && first == start, "moved to {start:#x}");
        let mut next2 = start + RANGE - 4;
        let mut start2 = start;
        assert_eq!(
            take_seqs(&mut next2, &mut start2, 4),
            start + RANGE - 4,
            "an exact fit stays"
        );
    }
}

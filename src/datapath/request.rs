//! The requests of the safe data path and what they lend: [`SendWr`],
//! [`RecvWr`], the finished [`Completed`](super::Completed) and a refused post's
//! [`PostError`](super::PostError).
//!
//! # Layout
//!
//! The common request has one entry, and carries it inline: a [`SendWr`]
//! is its caller's `wr_id`, its operation, its flags, one entry (an owned
//! [`Chunk`] or a clone of a [`SharedChunk`], with the length to use) and a
//! UD destination if it has one, about 120 bytes that the compiler moves in
//! registers. A request of two or more entries (or one whose entries were
//! refused when added) keeps them in one boxed `Entries`: it allocates
//! once, when its second entry is added, and that box then travels with
//! the request into the ledger and back out in its [`Completed`](super::Completed) (no
//! further allocation). What a request lends the device while it is
//! outstanding is a `Loan` of 32 bytes: nothing, one entry, the box of
//! entries, or a mark that its queue's side table holds it (UD
//! destinations and memory-window loans).

use std::fmt;

use super::entries::{Data, Lent};
use crate::ah::AddressHandle;
use crate::mr::{Chunk, SharedChunk};
use crate::sys;

use crate::qp::{QKey, QpNum};

/// The most scatter/gather entries one work request of the safe API takes.
pub const MAX_SGE: usize = 4;

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
    #[inline]
    pub(super) fn opcode(&self) -> sys::ibv_wr_opcode::Type {
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

    #[inline]
    pub(super) fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Whether the device writes the request's local entries (RDMA READ,
    /// atomics).
    #[inline]
    pub(super) fn writes_local(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead(_) | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }
}

/// A send work request (`struct ibv_send_wr`) that owns its buffers.
///
/// Signalled by default (`IBV_SEND_SIGNALED`): every request produces a
/// completion unless [`unsignaled`](Self::unsignaled) is asked for.
///
/// A request of one entry (or inline data, or none) allocates nothing;
/// the second entry added allocates the request's box of entries once,
/// which comes back with it in its [`Completed`](super::Completed).
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
    pub(super) flags: u32,
    pub(super) data: Data<'a>,
    pub(super) ud: Option<(AddressHandle, QpNum, QKey)>,
}

impl<'a> SendWr<'a> {
    /// A signalled request `op` with the caller's `wr_id` (handed back in
    /// [`Completed::wr_id`](super::Completed::wr_id)).
    #[inline(always)]
    pub fn new(wr_id: u64, op: SendOp) -> Self {
        SendWr {
            wr_id,
            op,
            flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            data: Data::None,
            ud: None,
        }
    }

    /// Adds a whole chunk as the next scatter/gather entry.
    #[inline(always)]
    pub fn sge(self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.sge_len(chunk, len)
    }

    /// Adds the first `len` bytes of a chunk as the next entry. A length
    /// past the chunk's end (or above `u32::MAX`) is refused when the
    /// request is posted, with the chunk handed back.
    #[inline(always)]
    pub fn sge_len(mut self, chunk: Chunk, len: usize) -> Self {
        self.data.push(Lent::Own(chunk), len);
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
    #[inline(always)]
    pub fn sge_shared(mut self, shared: &SharedChunk, len: usize) -> Self {
        self.data.push(Lent::Shared(shared.clone()), len);
        self
    }

    /// Sends `data` inline (`IBV_SEND_INLINE`): the provider copies it during
    /// the post, so it is only borrowed. For sends and RDMA writes, up to the
    /// QP's `max_inline_data`; not with chunks.
    #[inline(always)]
    pub fn inline(mut self, data: &'a [u8]) -> Self {
        self.data.set_inline(data);
        self.flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }

    /// No completion for this request on success (clears `IBV_SEND_SIGNALED`);
    /// its chunks come back with the next signalled completion.
    #[inline(always)]
    pub fn unsignaled(mut self) -> Self {
        self.flags &= !sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// `IBV_SEND_SOLICITED`: wake a peer waiting for solicited events.
    #[inline(always)]
    pub fn solicited(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// `IBV_SEND_FENCE`: wait for earlier RDMA reads and atomics first.
    #[inline(always)]
    pub fn fence(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// The UD destination: address handle, remote QP number and Q_Key.
    #[inline(always)]
    pub fn ud(mut self, ah: &AddressHandle, remote_qpn: QpNum, remote_qkey: QKey) -> Self {
        self.ud = Some((ah.clone(), remote_qpn, remote_qkey));
        self
    }

    #[inline]
    pub(super) fn signaled(&self) -> bool {
        self.flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }

    /// The inline bytes, if any.
    #[inline]
    pub(super) fn inline_data(&self) -> Option<&'a [u8]> {
        match self.data {
            Data::Inline(d) => Some(d),
            _ => None,
        }
    }
}

impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr_id)
            .field("op", &self.op)
            .field("sges", &self.data.chunk_count())
            .field("inline", &self.inline_data().map(<[u8]>::len))
            .field("signaled", &self.signaled())
            .finish()
    }
}

/// A receive work request (`struct ibv_recv_wr`) that owns its buffers.
///
/// A receive may have no buffer at all ([`RecvWr::new`] without
/// [`sge`](Self::sge)): it takes an RDMA WRITE with immediate, whose
/// completion carries the immediate data and the byte count while the
/// bytes went to the region the write named (or a zero-length send).
#[doc(alias = "ibv_recv_wr")]
pub struct RecvWr {
    pub(crate) wr_id: u64,
    pub(crate) data: Data<'static>,
}

impl RecvWr {
    /// A receive with the caller's `wr_id` (and no buffer until
    /// [`sge`](Self::sge) adds one).
    #[inline(always)]
    pub fn new(wr_id: u64) -> Self {
        RecvWr {
            wr_id,
            data: Data::None,
        }
    }

    /// Adds a whole chunk as the next scatter entry.
    #[inline(always)]
    pub fn sge(mut self, chunk: Chunk) -> Self {
        let len = chunk.len();
        self.data.push(Lent::Own(chunk), len);
        self
    }
}

impl fmt::Debug for RecvWr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvWr")
            .field("wr_id", &self.wr_id)
            .field("sges", &self.data.chunk_count())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::super::completed::Completed;
    use super::super::entries::Loan;
    use super::*;

    #[test]
    fn the_common_request_and_a_loan_are_small() {
        eprintln!(
            "sizes: SendWr {}, SendOp {}, Data {}, RecvWr {}, Completed {}",
            std::mem::size_of::<SendWr<'_>>(),
            std::mem::size_of::<SendOp>(),
            std::mem::size_of::<super::super::entries::Data<'_>>(),
            std::mem::size_of::<RecvWr>(),
            std::mem::size_of::<Completed>()
        );
        assert_eq!(std::mem::size_of::<Loan>(), 32);
        assert_eq!(std::mem::size_of::<Option<Loan>>(), 32);
        assert!(
            std::mem::size_of::<SendWr<'_>>() <= 128,
            "{}",
            std::mem::size_of::<SendWr<'_>>()
        );
        assert!(
            std::mem::size_of::<RecvWr>() <= 48,
            "{}",
            std::mem::size_of::<RecvWr>()
        );
        assert!(
            std::mem::size_of::<Completed>() <= 48,
            "{}",
            std::mem::size_of::<Completed>()
        );
    }
}

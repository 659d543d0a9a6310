//! The batch's requests that name no local memory: RDMA ATOMIC_WRITE
//! (`ibv_wr_atomic_write`) and RDMA FLUSH (`ibv_wr_flush`).
//!
//! Both are `ibv_wr_*` only: `struct ibv_send_wr` has no field for an
//! ATOMIC_WRITE's value or a FLUSH's placement, and no provider's
//! `ibv_post_send` takes their opcodes (rxe's `convert_send_wr` copies none
//! of their arguments), so [`QueuePair::post_send`](crate::QueuePair::post_send)
//! does not offer them. They lend nothing: the ledger records their
//! `wr_id` alone, by the door every send takes.

use super::WrBatch;
use crate::datapath::chain::refused_entry;
use crate::datapath::post::{fail, lend_send};
use crate::datapath::request::{RemoteAddr, SendOp, SendWr};
use crate::datapath::{PostError, SendOpsFlags};
use crate::error::{Error, Result};
use crate::remote::RemoteBuf;
use crate::sys;

/// The work request of an operation that names no local memory
/// ([`WrBatch::atomic_write`], [`WrBatch::flush`]): the caller's `wr_id`
/// and the send flags. Signalled unless [`unsignaled`](Self::unsignaled).
#[doc(alias = "ibv_qp_ex")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteWr {
    wr_id: u64,
    flags: u32,
}

impl RemoteWr {
    /// A signalled request with this `wr_id`.
    pub fn new(wr_id: u64) -> Self {
        RemoteWr {
            wr_id,
            flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        }
    }

    /// No completion unless the request fails (`IBV_SEND_SIGNALED` cleared).
    pub fn unsignaled(mut self) -> Self {
        self.flags &= !sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// Waits for earlier RDMA reads and atomics to complete (`IBV_SEND_FENCE`).
    pub fn fence(mut self) -> Self {
        self.flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }
}

/// Where an RDMA FLUSH makes the data it reaches durable (`enum
/// ibv_placement_type`); the peer's region needs the matching right.
#[doc(alias = "ibv_placement_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushPlacement {
    /// `IBV_FLUSH_GLOBAL`: visible to every reader of the peer's memory
    /// (the region needs [`AccessFlags::FLUSH_GLOBAL`](crate::AccessFlags::FLUSH_GLOBAL)).
    Global,
    /// `IBV_FLUSH_PERSISTENT`: persistent in the peer's persistent memory
    /// (the region needs [`AccessFlags::FLUSH_PERSISTENT`](crate::AccessFlags::FLUSH_PERSISTENT)).
    Persistent,
}

/// What an RDMA FLUSH covers (`enum ibv_selectivity_level`).
#[doc(alias = "ibv_selectivity_level")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushSelectivity {
    /// `IBV_FLUSH_RANGE`: the target's bytes.
    Range,
    /// `IBV_FLUSH_MR`: the whole region the target's rkey names (its
    /// address and length are not checked by the peer).
    Region,
}

impl WrBatch<'_> {
    /// Adds an RDMA ATOMIC_WRITE to the batch (`ibv_wr_atomic_write`):
    /// `value`'s 8 bytes land at `remote` whole, never torn, as they are
    /// given (the peer reads them in its own byte order: send
    /// `x.to_le_bytes()` and read `u64::from_le_bytes`, say).
    ///
    /// Refused before any call, the batch still open: a QP created without
    /// [`SendOpsFlags::ATOMIC_WRITE`] (which [`QpInitAttr::send_ops`](crate::QpInitAttr::send_ops)
    /// refuses with [`Error::Unsupported`] where the headers, the device or
    /// the provider lack it), a remote address that is not 8-byte aligned,
    /// and a full send queue. The peer's region needs
    /// [`AccessFlags::REMOTE_WRITE`](crate::AccessFlags::REMOTE_WRITE): without it, or
    /// outside the region, the request completes with
    /// [`WcStatus::RemAccessErr`](crate::WcStatus::RemAccessErr) and the QP
    /// goes to ERR, the peer's memory unchanged.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, peer: rdma_verbs::RemoteBuf) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_verbs::qp::RemoteWr;
    /// let mut batch = qp.start_batch()?;
    /// batch.atomic_write(RemoteWr::new(1), peer.at(0, 8)?, 42u64.to_le_bytes())?;
    /// batch.complete()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`PostError`], nothing recorded and the batch still open, for what
    /// is refused above.
    #[doc(alias = "ibv_wr_atomic_write")]
    #[doc(alias = "IBV_WR_ATOMIC_WRITE")]
    pub fn atomic_write(
        &mut self,
        wr: RemoteWr,
        remote: RemoteAddr,
        value: [u8; 8],
    ) -> Result<(), PostError> {
        const VERB: &str = "ibv_wr_atomic_write";
        let check = aligned(VERB, remote.addr);
        self.post_remote_only(VERB, SendOpsFlags::ATOMIC_WRITE, check, wr, |ex| {
            // SAFETY: `post_remote_only`'s promise (an open batch, ATOMIC_WRITE
            // in the QP's send_ops); `value` is read during the call only (the
            // provider copies the 8 bytes into the request).
            unsafe { raw_atomic_write(ex, remote, &value) }
        })
    }

    /// Adds an RDMA FLUSH to the batch (`ibv_wr_flush`): once it completes,
    /// the data earlier writes placed in `target` (or in the whole region,
    /// with [`FlushSelectivity::Region`]) is durable at `placement` in the
    /// peer's memory.
    ///
    /// Refused before any call, the batch still open: a QP created without
    /// [`SendOpsFlags::FLUSH`] (refused at creation with
    /// [`Error::Unsupported`] where the headers, before rdma-core 45, the
    /// device or the provider lack it) and a full send queue. The peer's
    /// region needs the right of `placement`
    /// ([`AccessFlags::FLUSH_GLOBAL`](crate::AccessFlags::FLUSH_GLOBAL) or
    /// [`FLUSH_PERSISTENT`](crate::AccessFlags::FLUSH_PERSISTENT)): without it, or with a
    /// range past the region's end, the request completes with
    /// [`WcStatus::RemAccessErr`](crate::WcStatus::RemAccessErr) and the QP
    /// goes to ERR.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, c: rdma_verbs::Chunk, peer: rdma_verbs::RemoteBuf) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_verbs::qp::{FlushPlacement, FlushSelectivity, RemoteWr, SendOp, SendWr};
    /// let mut batch = qp.start_batch()?;
    /// batch.post(SendWr::new(1, SendOp::RdmaWrite(peer.at(0, 64)?)).sge(c).unsignaled())?;
    /// batch.flush(RemoteWr::new(2), peer.slice(0, 64)?, FlushPlacement::Global, FlushSelectivity::Range)?;
    /// batch.complete()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`PostError`], nothing recorded and the batch still open, for what
    /// is refused above.
    #[doc(alias = "ibv_wr_flush")]
    #[doc(alias = "IBV_WR_FLUSH")]
    pub fn flush(
        &mut self,
        wr: RemoteWr,
        target: RemoteBuf,
        placement: FlushPlacement,
        selectivity: FlushSelectivity,
    ) -> Result<(), PostError> {
        const VERB: &str = "ibv_wr_flush";
        let check = fits(VERB, target.len);
        self.post_remote_only(VERB, SendOpsFlags::FLUSH, check, wr, |ex| {
            // SAFETY: `post_remote_only`'s promise (an open batch, FLUSH in the
            // QP's send_ops); the length fits in size_t (`check`).
            unsafe { raw_flush(ex, target, placement, selectivity) }
        })
    }

    /// The one way in of both operations: refuses the request (nothing
    /// recorded, the batch open) unless the QP was created for `flag`,
    /// `check` holds and the queue has room; otherwise records it, by the
    /// door every send takes ([`lend_send`], with no data), sets its tag
    /// and flags and calls `build` with the QP, which holds an open batch
    /// and `flag` among its send_ops, so the provider set that builder.
    fn post_remote_only(
        &mut self,
        verb: &'static str,
        flag: SendOpsFlags,
        check: Result<()>,
        wr: RemoteWr,
        build: impl FnOnce(*mut sys::ibv_qp_ex),
    ) -> Result<(), PostError> {
        self.check_op(verb, flag)
            .and(check)
            .and_then(|()| self.check_room(verb))
            .map_err(|e| fail(e, 0, Vec::new()))?;
        let p = &mut self.qp.pending_mut().send;
        let mut nothing = SendWr::new(wr.wr_id, SendOp::Send);
        nothing.flags = wr.flags;
        let tag = lend_send(&mut p.ledger, &mut p.side, nothing)
            .map_err(|loan| refused_entry(verb, &p.ledger, loan))?;
        let ex = self.ptr();
        // SAFETY: the batch is open on this live extended QP (`&mut`
        // held); these are plain fields the next builder call reads.
        unsafe {
            (*ex).wr_id = tag;
            (*ex).wr_flags = wr.flags;
        }
        build(ex);
        self.n += 1;
        Ok(())
    }
}

/// Refuses an atomic's remote address that is not 8-byte aligned (the
/// peer would answer with a misaligned-atomic NAK and the QP go to ERR).
fn aligned(verb: &'static str, addr: u64) -> Result<()> {
    if addr % 8 != 0 {
        return Err(Error::invalid(
            verb,
            format!("atomic remote address {addr:#x} is not 8-byte aligned"),
        ));
    }
    Ok(())
}

/// Refuses a FLUSH length that `size_t` cannot hold.
fn fits(verb: &'static str, len: u64) -> Result<()> {
    usize::try_from(len).map(|_| ()).map_err(|_| {
        Error::invalid(
            verb,
            format!("a FLUSH of {len} bytes is longer than size_t"),
        )
    })
}

/// `ibv_wr_atomic_write`, where the headers have it.
///
/// # Safety
/// An open batch on a live extended QP with ATOMIC_WRITE in its send_ops.
#[cfg(rdma_core_wr_atomic_write)]
unsafe fn raw_atomic_write(ex: *mut sys::ibv_qp_ex, remote: RemoteAddr, value: &[u8; 8]) {
    // SAFETY: the caller's promise; `value` is valid for 8 bytes.
    unsafe { sys::ibv_wr_atomic_write(ex, remote.rkey, remote.addr, value.as_ptr().cast()) }
}

/// Headers before rdma-core 44: no QP has ATOMIC_WRITE in its send_ops
/// (`QpInitAttr::send_ops` refuses it), so this is never reached.
///
/// # Safety
/// None needed: it does nothing.
#[cfg(not(rdma_core_wr_atomic_write))]
unsafe fn raw_atomic_write(_: *mut sys::ibv_qp_ex, _: RemoteAddr, _: &[u8; 8]) {}

/// `ibv_wr_flush`, where the headers have it.
///
/// # Safety
/// An open batch on a live extended QP with FLUSH in its send_ops.
#[cfg(rdma_core_wr_flush)]
unsafe fn raw_flush(
    ex: *mut sys::ibv_qp_ex,
    target: RemoteBuf,
    placement: FlushPlacement,
    selectivity: FlushSelectivity,
) {
    let kind = match placement {
        FlushPlacement::Global => sys::ibv_placement_type::IBV_FLUSH_GLOBAL,
        FlushPlacement::Persistent => sys::ibv_placement_type::IBV_FLUSH_PERSISTENT,
    };
    let level = match selectivity {
        FlushSelectivity::Range => sys::ibv_selectivity_level::IBV_FLUSH_RANGE,
        FlushSelectivity::Region => sys::ibv_selectivity_level::IBV_FLUSH_MR,
    };
    let len = target.len as usize;
    // SAFETY: the caller's promise; the length fits in size_t (checked).
    unsafe { sys::ibv_wr_flush(ex, target.rkey, target.addr, len, kind as u8, level as u8) }
}

/// Headers before rdma-core 45: no QP has FLUSH in its send_ops
/// (`QpInitAttr::send_ops` refuses it), so this is never reached.
///
/// # Safety
/// None needed: it does nothing.
#[cfg(not(rdma_core_wr_flush))]
unsafe fn raw_flush(_: *mut sys::ibv_qp_ex, _: RemoteBuf, _: FlushPlacement, _: FlushSelectivity) {}

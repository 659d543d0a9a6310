//! Invalidation: a local one ([`QueuePair::invalidate_mw`]), a peer's
//! SEND_WITH_INV seen in a reclaimed receive
//! ([`QueuePair::invalidated_rkey`], and the window it frees), and the
//! checks that keep an invalidation or a SEND_WITH_INV from naming a window
//! that is not bound (which crashes rxe on Linux 6.1).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{check_qp, not_in_leaked_batch, slot, MemoryWindow, MwInner, MwState, MwType};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::qp::{PostError, QpType, QueuePair};
use crate::sys;

impl QueuePair {
    /// Invalidates type 2 memory window `mw` with a local invalidation
    /// (`IBV_WR_LOCAL_INV` naming its rkey), revoking peers' access once
    /// the request has run.
    ///
    /// The region the window held stays registered until the request's
    /// completion is reclaimed (or the QP is reset or destroyed). Refused
    /// before any call: type 1 windows (which are unbound with
    /// [`unbind_mw`](Self::unbind_mw)), a QP not in RTS, another PD.
    ///
    /// # Errors
    /// A [`PostError`]: refused before any call as above or for a full
    /// send queue ([`Error::QueueFull`]), the
    /// window unchanged; or the provider failed (the request outstanding,
    /// in doubt).
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    pub fn invalidate_mw(&mut self, wr_id: u64, mw: &mut MemoryWindow) -> Result<(), PostError> {
        const VERB: &str = "ibv_post_send";
        not_in_leaked_batch(VERB, self)
            .and_then(|()| check_invalidate(VERB, self, mw))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        let qp = self.as_ptr();
        let rkey = mw.rkey();
        let loan = mw.lend_invalidate();
        self.post_one_loan(VERB, wr_id, loan, |tag| {
            let mut wr = sys::ibv_send_wr {
                wr_id: tag,
                opcode: sys::ibv_wr_opcode::IBV_WR_LOCAL_INV,
                send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
                ..Default::default()
            };
            wr.__bindgen_anon_1.invalidate_rkey = rkey;
            let mut bad = std::ptr::null_mut();
            // SAFETY: live QP; one request naming no memory.
            unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) }
        })
    }
}

impl QueuePair {
    /// The rkey that receive completion `wc` of this QP invalidated (a
    /// peer's [`SendOp::SendWithInv`](crate::qp::SendOp::SendWithInv)), or
    /// `None`.
    ///
    /// [`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey) reads `IBV_WC_WITH_INV`; rxe
    /// sets the kernel's `IB_WC_WITH_INVALIDATE` bit instead (`1 << 2`,
    /// which user space calls `IBV_WC_IP_CSUM_OK`, a flag that has no
    /// meaning on the RC and UC receives invalidation happens on). On an
    /// rxe RC or UC QP that bit on a successful receive counts too.
    ///
    /// Takes a [`WorkCompletion`](crate::WorkCompletion) or the
    /// [`PolledWc`](crate::PolledWc) of an extended CQ created with
    /// [`imm`](crate::CqExBuilder::imm) (without it: `None`).
    #[inline]
    pub fn invalidated_rkey<C: crate::qp::Completion + ?Sized>(&self, wc: &C) -> Option<u32> {
        let connected = matches!(self.qp_type(), QpType::Rc | QpType::Uc);
        peer_invalidated(self.pd().context(), wc, connected)
    }
}

impl crate::SharedReceiveQueue {
    /// The rkey that receive completion `wc` of this SRQ invalidated (a
    /// peer's [`SendOp::SendWithInv`](crate::qp::SendOp::SendWithInv)), or
    /// `None`: as [`QueuePair::invalidated_rkey`], for receives taken from
    /// the SRQ by any of its QPs. On rxe the kernel's
    /// `IB_WC_WITH_INVALIDATE` bit is the only one it puts at `1 << 2` in a
    /// user-space receive completion (rxe_resp.c sets `GRH`, `WITH_IMM` and
    /// `WITH_INVALIDATE` there), so it is read whatever the QP's type.
    #[inline]
    pub fn invalidated_rkey<C: crate::qp::Completion + ?Sized>(&self, wc: &C) -> Option<u32> {
        peer_invalidated(self.pd().context(), wc, true)
    }
}

/// The rkey a peer's SEND_WITH_INV invalidated, as receive completion `wc`
/// of a QP (`connected`: RC or UC) on `ctx` reports it: `IBV_WC_WITH_INV`,
/// or on rxe the kernel-numbered bit (see [`QueuePair::invalidated_rkey`]).
#[inline(always)]
pub(crate) fn peer_invalidated<C: crate::qp::Completion + ?Sized>(
    ctx: &Context,
    wc: &C,
    connected: bool,
) -> Option<u32> {
    // Inline, as every reclaimed receive asks: one read of the flags in
    // the common case (no invalidation); rxe's bit out of line.
    let flags = wc.inv_flags()?;
    if flags.contains(crate::WcFlags::WITH_INV) {
        return Some(wc.inv_word());
    }
    if !flags.contains(crate::WcFlags::IP_CSUM_OK) {
        return None;
    }
    rxe_invalidated(ctx, wc, connected)
}

/// [`peer_invalidated`] for a completion with `IBV_WC_IP_CSUM_OK` set:
/// on rxe, the kernel's `IB_WC_WITH_INVALIDATE` (see
/// [`QueuePair::invalidated_rkey`]).
#[inline(never)]
fn rxe_invalidated<C: crate::qp::Completion + ?Sized>(
    ctx: &Context,
    wc: &C,
    connected: bool,
) -> Option<u32> {
    let rxe_inv =
        connected && wc.succeeded() && wc.wc_opcode() == Ok(crate::WcOpcode::Recv) && ctx.is_rxe();
    rxe_inv.then(|| wc.inv_word())
}

/// A peer's SEND_WITH_INV invalidated `rkey` (seen in a receive reclaimed
/// on a QP or SRQ of `ctx`): the window with that rkey, if bound, is free,
/// and lets go of its region. Windows are looked up on the context, not a
/// PD: the window is in the receiving QP's PD, which an SRQ's may not be.
pub(crate) fn invalidated_by_peer(ctx: &Context, rkey: u32) {
    let windows: Vec<Arc<MwInner>> = ctx.windows().iter().filter_map(|w| w.upgrade()).collect();
    for mw in windows {
        if mw.keep().rkey.load(Ordering::Relaxed) == rkey {
            let mut s = slot(&mw);
            if s.state == MwState::Bound {
                s.state = MwState::Free;
                s.bound = None;
            }
        }
    }
}
/// The checks of a local invalidation.
pub(crate) fn check_invalidate(
    verb: &'static str,
    qp: &QueuePair,
    mw: &MemoryWindow,
) -> Result<()> {
    if mw.ty != MwType::Type2 {
        return Err(Error::invalid(
            verb,
            "only type 2 windows are invalidated (a type 1 window is rebound, or deallocated)",
        ));
    }
    check_qp(verb, qp, mw)?;
    match mw.state() {
        MwState::Bound => Ok(()),
        state => Err(Error::invalid(
            verb,
            format!(
                "the window is not known to be bound ({}): invalidating a free window crashes \
                 rxe's kernel (Linux 6.1), so only a window whose bind completion was \
                 reclaimed is invalidated",
                state.describe()
            ),
        )),
    }
}

/// The check of a SEND_WITH_INV (`ibv_post_send` or a batch's
/// `ibv_wr_send_inv`) from QP `qp` of context `ctx` naming `rkey`.
///
/// Invalidating a type 2 window that is not bound (never bound, already
/// invalidated) crashes the kernel of Linux 6.1's rxe (`rxe_invalidate_mw`
/// reaches the window's absent region). When `rkey` is exactly the key of a
/// window of this context that is free, being invalidated, or of unknown
/// state (a bind posted before, whose completion is not reclaimed yet, is
/// taken to have run, as rxe runs it within its post), and the QP's
/// destination is on this device (a GID of its table or its own LID, read
/// with `ibv_query_qp` only in that case), the request is refused. A window
/// of another context or process is not known here; neither is a
/// destination elsewhere, where `rkey` names some other device's window.
#[cold]
#[inline(never)]
pub(crate) fn check_send_inv(
    verb: &'static str,
    ctx: &Context,
    qp: *mut sys::ibv_qp,
    rkey: u32,
) -> Result<()> {
    // Upgraded under the list's lock, dropped after it (a window's drop
    // takes the lock to leave the list).
    let windows: Vec<Arc<MwInner>> = ctx.windows().iter().filter_map(|w| w.upgrade()).collect();
    let unbound = windows.iter().find_map(|mw| {
        let state = slot(mw).state;
        // Binding: the bind was posted first and is the program's intent
        // (announcing the key after posting the bind is the usual order);
        // rxe runs a posted bind before its post call returns.
        let unbound = !matches!(state, MwState::Bound | MwState::Binding);
        (mw.keep().rkey.load(Ordering::Relaxed) == rkey && unbound).then_some(state)
    });
    drop(windows);
    let Some(state) = unbound else {
        return Ok(());
    };
    if !destination_on_device(ctx, qp) {
        return Ok(());
    }
    Err(Error::invalid(
        verb,
        format!(
            "SEND_WITH_INV names rkey {rkey:#x}, a memory window of this device that is not \
             bound ({}): invalidating it would crash rxe on Linux 6.1",
            state.describe()
        ),
    ))
}

/// Whether the destination of connected QP `qp` is on `ctx`'s device (a
/// failure to tell counts as yes: refusing is the safe side).
fn destination_on_device(ctx: &Context, qp: *mut sys::ibv_qp) -> bool {
    let mut a = sys::ibv_qp_attr::default();
    let mut init = sys::ibv_qp_init_attr::default();
    let mask = (sys::ibv_qp_attr_mask::IBV_QP_AV.0 | sys::ibv_qp_attr_mask::IBV_QP_PORT.0) as i32;
    // SAFETY: `qp` is the caller's live QP; both out-structs are valid for writing.
    let rc = unsafe { sys::ibv_query_qp(qp, &mut a, mask, &mut init) };
    if rc != 0 {
        return true;
    }
    let av = &a.ah_attr;
    if av.is_global != 0 {
        // SAFETY: `raw` is the plain 16-byte view of the GID union.
        let dgid = crate::Gid(unsafe { av.grh.dgid.raw });
        return ctx
            .gid_table()
            .map_or(true, |t| t.iter().any(|e| e.gid == dgid));
    }
    let port = if av.port_num != 0 {
        av.port_num
    } else {
        a.port_num
    };
    ctx.query_port(port).map_or(true, |p| p.lid == av.dlid)
}

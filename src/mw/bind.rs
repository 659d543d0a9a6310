//! Binding: [`MwBind`] (a range of a region and its remote rights), the
//! checks a bind gets before any call, and [`QueuePair::bind_mw`] and
//! [`QueuePair::unbind_mw`] (type 1 through `ibv_bind_mw`, type 2 by a
//! posted `IBV_WR_BIND_MW`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{internal, slot, MemoryWindow, MwLoan, MwState, MwType};
use crate::device_attr::AtomicCap;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, MemoryRegion, MrInner, RegionCore};
use crate::qp::{PostError, QpState, QpType, QueuePair};
use crate::sys;

/// A bind of a memory window to a range of a region (`struct
/// ibv_mw_bind_info`, with the request's `wr_id` and flags of `struct
/// ibv_mw_bind`).
///
/// Signalled by default: the bind produces a completion
/// ([`WcOpcode::BindMw`](crate::WcOpcode::BindMw)) that
/// [`QueuePair::reclaim`] ends.
#[doc(alias = "ibv_mw_bind")]
#[doc(alias = "ibv_mw_bind_info")]
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    mr: &'a RegionCore,
    offset: usize,
    len: usize,
    access: AccessFlags,
    wr_id: u64,
    signaled: bool,
}

impl<'a> MwBind<'a> {
    /// Binds bytes `offset..offset + len` of `mr` with the remote rights
    /// `access` (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`).
    ///
    /// A bind's [`remote_addr`](Self::remote_addr) is always an address of
    /// the region. The other rules of the [module docs](crate::mw) are
    /// checked when the bind is posted.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range is empty or does not lie
    /// inside the region (`offset + len` past its end, or beyond
    /// `usize::MAX`).
    pub fn new<B>(
        mr: &'a MemoryRegion<B>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        check_range(mr.len(), offset, len)?;
        Ok(MwBind {
            mr: mr.core(),
            offset,
            len,
            access,
            wr_id: 0,
            signaled: true,
        })
    }

    /// The caller's `wr_id` for the bind request (0 by default).
    pub fn wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// No completion on success (clears `IBV_SEND_SIGNALED`).
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// The address peers use for the first byte of the window: the
    /// region's address plus `offset`.
    ///
    /// Exact: [`new`](Self::new) took only offsets inside the region, and
    /// the region's addresses are those of its live buffer, so the sum
    /// never reaches `u64::MAX` (saturating only so that no build can
    /// panic here).
    pub fn remote_addr(&self) -> u64 {
        self.mr.addr().saturating_add(self.offset as u64)
    }

    pub(crate) fn region(&self) -> &'a RegionCore {
        self.mr
    }

    pub(crate) fn wr_id_value(&self) -> u64 {
        self.wr_id
    }

    pub(crate) fn send_flags(&self) -> u32 {
        if self.signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        }
    }

    pub(crate) fn info(&self) -> sys::ibv_mw_bind_info {
        sys::ibv_mw_bind_info {
            mr: self.mr.as_ptr(),
            addr: self.remote_addr(),
            length: self.len as u64,
            mw_access_flags: self.access.bits(),
        }
    }
}

/// The range check of [`MwBind::new`]: `offset..offset + len` is
/// non-empty and inside a region of `region` bytes, its end computed
/// without overflow.
fn check_range(region: usize, offset: usize, len: usize) -> Result<()> {
    const VERB: &str = "MwBind::new";
    match offset.checked_add(len) {
        None => Err(Error::invalid(
            VERB,
            format!(
                "offset {offset} + length {len} overflows usize (the region has {region} bytes)"
            ),
        )),
        Some(_) if len == 0 => Err(Error::invalid(
            VERB,
            format!(
                "the window at offset {offset} is empty (length 0): a bind needs at least one \
                 byte (a type 1 window is unbound with QueuePair::unbind_mw)"
            ),
        )),
        Some(end) if end > region => Err(Error::invalid(
            VERB,
            format!("bytes {offset}..{end} are outside the {region}-byte region"),
        )),
        Some(_) => Ok(()),
    }
}

/// Outside a batch, a bind, unbind or invalidation is posted on its own,
/// which takes the provider's send-queue lock: refused while a leaked
/// [`WrBatch`](crate::qp::WrBatch) holds it. (A live batch borrows the QP,
/// so only a leaked one can leave the known state's lock set here.)
pub(super) fn not_in_leaked_batch(verb: &'static str, qp: &QueuePair) -> Result<()> {
    if qp.known().sends_locked() {
        return Err(crate::datapath::leaked_batch(verb));
    }
    Ok(())
}

/// The checks a bind gets before any call (`verb` names it in errors).
pub(crate) fn check_bind(
    verb: &'static str,
    qp: &QueuePair,
    mw: &MemoryWindow,
    b: &MwBind<'_>,
) -> Result<()> {
    check_qp(verb, qp, mw)?;
    if mw.state() == MwState::Unknown {
        // A bind names the window's current key (`mw_rkey`): after a RESET
        // cut a bind short, the device has the old key or the new one, and
        // a bind naming the wrong one fails with IBV_WC_MW_BIND_ERR (the QP
        // goes to ERR); after a cut-short invalidation a type 2 window may
        // still be bound.
        return Err(Error::invalid(
            verb,
            "the window's key and state on the device are unknown (a RESET or the QP's \
             destruction cut a bind or invalidation of it short): drop it and allocate \
             a new window",
        ));
    }
    if mw.ty == MwType::Type2 && mw.state() != MwState::Free {
        return Err(Error::invalid(
            verb,
            format!(
                "a type 2 window is bound only when free, and {}: invalidate it first",
                match mw.state() {
                    MwState::Bound => "it is bound",
                    other => other.describe(),
                }
            ),
        ));
    }
    let mr = b.mr;
    if !mr.access().contains(AccessFlags::MW_BIND) {
        return Err(Error::invalid(
            verb,
            "the region was registered without AccessFlags::MW_BIND (IBV_ACCESS_MW_BIND)",
        ));
    }
    if mr.pd().as_ptr() != mw.pd().as_ptr() {
        return Err(Error::invalid(
            verb,
            "the region and the window belong to different protection domains",
        ));
    }
    match b.offset.checked_add(b.len) {
        Some(end) if b.len > 0 && end <= mr.len() => {}
        _ => {
            return Err(Error::invalid(
                verb,
                format!(
                    "bytes {}..{} are empty or outside the {}-byte region",
                    b.offset,
                    b.offset.saturating_add(b.len),
                    mr.len()
                ),
            ))
        }
    }
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if !remote.contains(b.access) {
        return Err(Error::invalid(
            verb,
            format!(
                "a window takes only REMOTE_READ, REMOTE_WRITE and REMOTE_ATOMIC, not {:?}",
                b.access - remote
            ),
        ));
    }
    let writes = b.access & (AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    if !writes.is_empty() && !mr.access().contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::invalid(
            verb,
            format!("a window with {writes:?} needs a region with AccessFlags::LOCAL_WRITE"),
        ));
    }
    if b.access.contains(AccessFlags::REMOTE_ATOMIC)
        && qp.pd().context().attr().atomic_cap == AtomicCap::None
    {
        return Err(Error::invalid(
            verb,
            "REMOTE_ATOMIC on a device without atomics (atomic_cap NONE)",
        ));
    }
    Ok(())
}

/// The checks of any request on a window: same PD as the QP, the QP RC or
/// UC and in RTS.
pub(crate) fn check_qp(verb: &'static str, qp: &QueuePair, mw: &MemoryWindow) -> Result<()> {
    if !matches!(qp.qp_type(), QpType::Rc | QpType::Uc) {
        return Err(Error::invalid(
            verb,
            format!(
                "{} QPs cannot bind or invalidate memory windows (RC and UC can)",
                qp.qp_type().short_name()
            ),
        ));
    }
    if mw.pd().as_ptr() != qp.pd().as_ptr() {
        return Err(Error::invalid(
            verb,
            "the window and the QP belong to different protection domains",
        ));
    }
    if qp.state() != QpState::Rts {
        return Err(Error::QpState {
            verb,
            state: qp.state(),
            needs: "binding and invalidating memory windows need RTS",
        });
    }
    Ok(())
}

impl QueuePair {
    /// Binds memory window `mw` to a range of a region, returning the
    /// window's new rkey for peers.
    ///
    /// Type 1 windows go through `ibv_bind_mw`; type 2 windows are bound by
    /// posting `IBV_WR_BIND_MW` with `ibv_post_send` (on an extended QP,
    /// [`WrBatch::bind_mw`](crate::qp::WrBatch::bind_mw) does it in a
    /// batch). Either way the bind is a request on the send queue: it takes
    /// a slot, completes in order with the sends, and
    /// [`reclaim`](Self::reclaim) ends it, handing back a
    /// [`Completed`](crate::qp::Completed) with the bind's `wr_id` and no
    /// chunks. The rules of the [module docs](crate::mw) are checked first.
    /// If the provider fails, the request stays outstanding as a failed
    /// post's do ([`PostError`]), and the window keeps both regions.
    ///
    /// # Errors
    /// A [`PostError`]: refused before any call by the rules of the
    /// [module docs](crate::mw) or a full send queue
    /// ([`Error::QueueFull`]), the window
    /// unchanged; or the provider failed (the request outstanding, in
    /// doubt).
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_mw(&mut self, mw: &mut MemoryWindow, bind: &MwBind<'_>) -> Result<u32, PostError> {
        let verb = match mw.ty {
            MwType::Type1 => "ibv_bind_mw",
            MwType::Type2 => "ibv_post_send",
        };
        not_in_leaked_batch(verb, self)
            .and_then(|()| check_bind(verb, self, mw, bind))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        let qp = self.as_ptr();
        let raw_mw = mw.as_ptr();
        let info = bind.info();
        let flags = bind.send_flags();
        match mw.ty {
            MwType::Type1 => {
                let loan = mw.lend_bind(bind.mr, mw.rkey());
                self.post_type1_bind(mw, bind.wr_id, flags, info, loan)
            }
            MwType::Type2 => {
                let (_, current, rkey, loan) = internal::lend_type2_bind(mw, bind.mr);
                self.post_one_loan(verb, bind.wr_id, loan, |tag| {
                    // SAFETY: `raw_mw` is `mw`'s, borrowed mutably here.
                    unsafe { set_current_rkey(raw_mw, current) };
                    let mut wr = sys::ibv_send_wr {
                        wr_id: tag,
                        opcode: sys::ibv_wr_opcode::IBV_WR_BIND_MW,
                        send_flags: flags,
                        ..Default::default()
                    };
                    wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                        mw: raw_mw,
                        rkey,
                        bind_info: info,
                    };
                    let mut bad = std::ptr::null_mut();
                    // SAFETY: live QP; one request naming a live window and
                    // region of the QP's PD (checked), both held by the
                    // ledger entry until the device is done with them.
                    unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) }
                })?;
                Ok(rkey)
            }
        }
    }

    /// Unbinds type 1 memory window `mw`: `ibv_bind_mw` with a length of
    /// 0, revoking peers' access once the request has run. Returns the
    /// window's new rkey (a bind, even of nothing, moves it on).
    ///
    /// The request names the region the window is bound to (providers
    /// such as mlx4 read its lkey even for an unbind), so the window must
    /// be known to be bound: refused before any call otherwise, and for
    /// type 2 windows (see [`invalidate_mw`](Self::invalidate_mw)), a QP
    /// not in RTS, another PD. Like a bind, it takes a send-queue slot and
    /// [`reclaim`](Self::reclaim) ends it; the region stays registered
    /// until then (or until a RESET or the QP's destruction).
    ///
    /// # Errors
    /// A [`PostError`]: refused before any call as above, the window
    /// unchanged; or the provider failed (the request outstanding, in
    /// doubt).
    #[doc(alias = "ibv_bind_mw")]
    pub fn unbind_mw(&mut self, wr_id: u64, mw: &mut MemoryWindow) -> Result<u32, PostError> {
        const VERB: &str = "ibv_bind_mw";
        let region = not_in_leaked_batch(VERB, self)
            .and_then(|()| check_unbind(VERB, self, mw))
            .map_err(|e| crate::qp::post_error(e, 0, Vec::new()))?;
        // SAFETY: the region is live: the window holds it (`bound`), and
        // from here the loan does until the request has ended.
        let addr = unsafe { (*region.as_ptr()).addr } as u64;
        let info = sys::ibv_mw_bind_info {
            mr: region.as_ptr(),
            addr,
            length: 0,
            mw_access_flags: 0,
        };
        let loan = mw.lend_invalidate();
        let signaled = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self.post_type1_bind(mw, wr_id, signaled, info, loan)
    }

    /// Posts `ibv_bind_mw` of type 1 window `mw` (checked) with `info`,
    /// whose region `loan` holds until the request has ended; returns the
    /// rkey the provider gave the window (it writes it into the window
    /// during the call).
    fn post_type1_bind(
        &mut self,
        mw: &mut MemoryWindow,
        wr_id: u64,
        send_flags: u32,
        info: sys::ibv_mw_bind_info,
        loan: MwLoan,
    ) -> Result<u32, PostError> {
        let qp = self.as_ptr();
        let raw_mw = mw.as_ptr();
        self.post_one_loan("ibv_bind_mw", wr_id, loan, |tag| {
            let mut b = sys::ibv_mw_bind {
                wr_id: tag,
                send_flags,
                bind_info: info,
            };
            // Live QP and type 1 window of one PD (checked by the
            // caller); the region `info.mr` is live, held by the loan
            // from now on; `mw` is borrowed mutably, so nothing else
            // reads or writes the window's fields.
            // SAFETY: see above.
            unsafe { sys::ibv_bind_mw(qp, raw_mw, &mut b) }
        })?;
        // SAFETY: the window is live; `&mut mw` excludes other accesses to
        // its fields, and the call above has returned.
        let rkey = unsafe { (*raw_mw).rkey };
        mw.inner.keep().rkey.store(rkey, Ordering::Relaxed);
        Ok(rkey)
    }
}

/// The checks of a type 1 unbind; the region the window is bound to.
fn check_unbind(verb: &'static str, qp: &QueuePair, mw: &MemoryWindow) -> Result<Arc<MrInner>> {
    if mw.ty != MwType::Type1 {
        return Err(Error::invalid(
            verb,
            "only type 1 windows are unbound (a type 2 window is invalidated)",
        ));
    }
    check_qp(verb, qp, mw)?;
    let s = slot(&mw.inner);
    match (s.state, &s.bound) {
        (MwState::Bound, Some(region)) => Ok(Arc::clone(region)),
        (state, _) => Err(Error::invalid(
            verb,
            format!(
                "a window is unbound only when known to be bound, and {}",
                state.describe()
            ),
        )),
    }
}

/// Puts the window's current rkey where the provider reads it (`mw->rkey`)
/// before a type 2 bind: the provider names the window by it.
///
/// # Safety
/// `mw` is a live window that the caller borrows mutably (through its
/// `&mut MemoryWindow`), so that nothing else reads or writes its fields.
pub(crate) unsafe fn set_current_rkey(mw: *mut sys::ibv_mw, rkey: u32) {
    // SAFETY: live and exclusively borrowed (caller); providers read
    // `rkey` only inside calls this crate makes.
    unsafe { (*mw).rkey = rkey };
}

#[cfg(test)]
mod tests {
    use super::check_range;

    #[test]
    fn bind_ranges_are_checked_without_overflow() {
        let text = |offset, len| check_range(4096, offset, len).unwrap_err().to_string();
        let e = text(usize::MAX, 1);
        assert!(
            e.contains("offset 18446744073709551615 + length 1 overflows"),
            "{e}"
        );
        let e = text(1, usize::MAX);
        assert!(e.contains("overflows usize"), "{e}");
        let e = text(4095, 2);
        assert!(
            e.contains("bytes 4095..4097 are outside the 4096-byte region"),
            "{e}"
        );
        let e = text(4097, 1);
        assert!(e.contains("outside"), "{e}");
        let e = text(4096, 0);
        assert!(e.contains("empty (length 0)"), "{e}");
        let e = text(usize::MAX, 0);
        assert!(e.contains("empty"), "{e}");
        assert!(check_range(4096, 4095, 1).is_ok());
        assert!(check_range(4096, 0, 4096).is_ok());
    }
}

//! The checks every request gets before any call, from facts about its
//! queue found once, when the queue is created ([`SendFacts`],
//! [`RecvFacts`]).
//!
//! The common request (a send or RDMA write of one entry, inline data or
//! none; a receive of one chunk) passes [`SendFacts::fast`] /
//! [`RecvFacts::fast`]: an opcode bit, a destination presence, a PD compare
//! and a length or flag test. Anything else takes the full check, which
//! says exactly what is wrong; the refusal messages are built only there.

use super::entries::Data;
use super::ex::SendOpsFlags;
use super::request::{RecvWr, SendOp, SendWr, MAX_SGE};
use super::QpType;
use crate::error::{Error, Result};
use crate::sys;

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
            if data.len() > self.max_inline as usize {
                return invalid(format!(
                    "{} inline bytes but the QP's max_inline_data is {}",
                    data.len(),
                    self.max_inline
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

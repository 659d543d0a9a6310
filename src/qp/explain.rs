//! Explaining a failed completion: [`QueuePair::explain`].
//!
//! A status such as `IBV_WC_RETRY_EXC_ERR` says what the device gave up
//! on, not why. The QP knows most of why: the path it was given (the
//! peer's QP number, the DLID, the GRH and the type of the source GID),
//! the path MTU against the port's, the timeout and retry counts, the port's
//! state and link layer, the requests it holds, and the first failure
//! since it was last reset. [`QueuePair::explain`] reads those *when it is
//! called* (`ibv_query_qp`, `ibv_query_port`, `ibv_query_gid_ex`: nothing
//! is added to posting or polling) and names, per status, the causes those
//! facts make likely, most likely first.

mod causes;

use std::fmt;

use super::query::QpAttributes;
use super::{QpNum, QpState, QpType, QueuePair, RequestKind};
use crate::cq::WcStatus;
use crate::datapath::{Completed, Completion};
use crate::gid::{GidEntry, GidType};
use crate::port::{LinkLayer, PortAttr};

/// What a [`Cause`] is: one kind per cause the crate can name, so that a
/// program (or a test) can match on it; the cause's text has the specifics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CauseKind {
    /// The completion succeeded: nothing to explain.
    NotFailed,
    /// The completion is another QP's (its `qp_num` is not this QP's).
    OtherQp,
    /// The port is not `IBV_PORT_ACTIVE`.
    PortNotActive,
    /// The path has no GRH on a RoCE port, where peers are addressed by
    /// GID (or on a port flagged `IBV_QPF_GRH_REQUIRED`).
    NoGrhOnRoce,
    /// The path's DLID is 0 on an InfiniBand port (which routes by LID,
    /// with or without a GRH).
    Lid0OnInfiniBand,
    /// No QP answered at the peer: a wrong or destroyed peer QP number, or
    /// a peer QP not (or no longer) in RTR or RTS.
    PeerQp,
    /// The GRH's destination GID or source GID (index, type) does not
    /// reach the peer.
    GidPath,
    /// The path MTU is above the port's active MTU.
    PathMtuAboveActive,
    /// The ACK timeout and retry count gave up before the peer answered.
    AckTimeout,
    /// The peer had no receive posted (RNR) and `rnr_retry` ran out.
    NoReceiveAtPeer,
    /// The remote region (or the peer QP) lacks the access right the
    /// operation needs.
    RemoteRights,
    /// The remote address and length run outside the region the rkey names.
    RemoteRange,
    /// The rkey is stale: its region was deregistered, or its window
    /// invalidated or rebound.
    StaleRkey,
    /// The message was longer than the receive's buffers.
    ReceiveTooShort,
    /// The message is longer than the path or port allows.
    MessageTooLong,
    /// The peer's receive was shorter than this send.
    PeerReceiveTooShort,
    /// The peer QP does not take this operation.
    PeerRefusedOp,
    /// The peer failed the operation or answered out of turn.
    PeerResponse,
    /// A local buffer is outside its region, of another PD, lacks a right,
    /// or its region is gone.
    LocalBuffer,
    /// The request does not fit the QP (gather entries, inline size,
    /// opcode, message size).
    RequestInvalidForQp,
    /// An earlier failure (or a move to ERR) flushed this request.
    EarlierFailure,
    /// A memory-window bind was refused.
    WindowBind,
    /// The device reports a failure the crate cannot narrow down.
    Device,
}

/// One likely cause of a failed completion: its [`CauseKind`] and a
/// sentence with the facts that make it likely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    kind: CauseKind,
    text: String,
}

impl Cause {
    fn new(kind: CauseKind, text: String) -> Self {
        Cause { kind, text }
    }

    /// What the cause is.
    pub fn kind(&self) -> CauseKind {
        self.kind
    }

    /// The cause in words, with the facts it rests on.
    pub fn text(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What [`QueuePair::explain`] found out, each fact as it was when it was
/// called (`None` where a query failed or the fact does not apply).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExplainFacts {
    /// The QP's number.
    pub qp_num: QpNum,
    /// The QP's type.
    pub qp_type: QpType,
    /// The completion's `qp_num`; `None` from an extended CQ created
    /// without it (the completion is then taken as this QP's).
    pub completion_qp_num: Option<QpNum>,
    /// Which queue the completed request was posted to (safe-path requests).
    pub request: Option<RequestKind>,
    /// The state the crate knew (see [`QueuePair::state`]).
    pub known_state: QpState,
    /// The QP's attributes from `ibv_query_qp`: its device state, path
    /// (dest QPN, address vector), path MTU, timeout, retry counts.
    pub attrs: Option<QpAttributes>,
    /// The port the QP is bound to.
    pub port: Option<u8>,
    /// The port's attributes from `ibv_query_port`: state, link layer,
    /// LID, active MTU.
    pub port_attr: Option<PortAttr>,
    /// The source GID entry the path's GRH names, with its type.
    pub sgid: Option<GidEntry>,
    /// Send requests the QP holds (see [`QueuePair::outstanding_sends`]).
    pub outstanding_sends: usize,
    /// Receives the QP holds (see [`QueuePair::outstanding_recvs`]).
    pub outstanding_recvs: usize,
    /// Whether the QP receives through an SRQ.
    pub srq: bool,
    /// The first failed completion (not a flush) reclaimed on this QP
    /// since it was created or last reset: its status and request kind.
    pub first_failure: Option<(Result<WcStatus, u32>, RequestKind)>,
    /// The bytes the failed receive offered, when known (from
    /// [`Explanation::with_request`]).
    pub recv_bytes: Option<u64>,
    /// The completion's `vendor_err`.
    pub vendor_err: u32,
    /// What failed while gathering the facts (`ibv_query_qp`, ...).
    pub query_errors: Vec<String>,
}

/// Why a work completion failed, as far as its QP can tell:
/// [`QueuePair::explain`]'s answer.
///
/// Its `Display` is a few lines: the status, the likely causes (most
/// likely first), and the facts they rest on. [`causes`](Self::causes)
/// and [`facts`](Self::facts) give the same as values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    status: Result<WcStatus, u32>,
    causes: Vec<Cause>,
    facts: ExplainFacts,
}

impl Explanation {
    /// The completion's status; `Err(raw)` for one this crate does not know.
    pub fn status(&self) -> Result<WcStatus, u32> {
        self.status
    }

    /// The likely causes, most likely first.
    pub fn causes(&self) -> &[Cause] {
        &self.causes
    }

    /// Whether one of the causes is of `kind`.
    pub fn names(&self, kind: CauseKind) -> bool {
        self.causes.iter().any(|c| c.kind == kind)
    }

    /// The facts the causes rest on.
    pub fn facts(&self) -> &ExplainFacts {
        &self.facts
    }

    /// The same explanation with what the failed request lent: `done` is
    /// the request [`QueuePair::reclaim_one`] (or `reclaim`) handed back
    /// for this completion. For a receive, its buffers' length names how
    /// short it was (`IBV_WC_LOC_LEN_ERR`).
    #[cold]
    pub fn with_request(mut self, done: &Completed) -> Self {
        if matches!(done.kind, RequestKind::Recv | RequestKind::SrqRecv) {
            self.facts.recv_bytes = done.loan.recv_bytes();
            self.causes = causes::of(self.status, &self.facts);
        }
        self
    }
}

impl QueuePair {
    /// Explains a failed completion of this QP: the causes its facts make
    /// likely (the QP's path, GID type and index, path MTU against the
    /// port's, the peer's QP number, the receives posted, the retry
    /// counts), most likely first, with the facts.
    ///
    /// The facts are read now (`ibv_query_qp`, `ibv_query_port`,
    /// `ibv_query_gid_ex`), not when the request failed: call it soon after
    /// polling the completion, before the QP is reset or modified. The
    /// first failure behind a `IBV_WC_WR_FLUSH_ERR` is the first failed
    /// completion [reclaimed](Self::reclaim) on the QP since its last
    /// RESET: reclaim completions in the order they were polled.
    ///
    /// Takes a [`WorkCompletion`](crate::WorkCompletion) or an extended
    /// CQ's [`PolledWc`](crate::PolledWc). A successful completion, or one
    /// of another QP, is answered with a single cause saying so
    /// ([`CauseKind::NotFailed`], [`CauseKind::OtherQp`]); a query that
    /// fails leaves its facts out and says so in
    /// [`ExplainFacts::query_errors`]. Never fails.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, cq: &rdma_verbs::CompletionQueue) -> rdma_verbs::Result<()> {
    /// let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    /// for wc in cq.poll(&mut wcs)?.iter() {
    ///     if !wc.is_success() {
    ///         // e.g. "send-queue request on RC QP 0x12 failed: transport
    ///         // retry counter exceeded (IBV_WC_RETRY_EXC_ERR)", then the
    ///         // likely causes: "no QP answered as peer QP 0x13 at GID ..."
    ///         eprintln!("{}", qp.explain(wc));
    ///     }
    ///     qp.reclaim_one(wc);
    /// }
    /// # Ok(()) }
    /// ```
    #[cold]
    #[doc(alias = "ibv_wc_status_str")]
    #[doc(alias = "ibv_query_qp")]
    pub fn explain<C: Completion + ?Sized>(&self, wc: &C) -> Explanation {
        let facts = self.gather(wc);
        let raw = wc.status_code();
        let status = WcStatus::from_raw(raw).ok_or(raw);
        let causes = if let Some(other) = facts.other_qp() {
            vec![Cause::new(
                CauseKind::OtherQp,
                format!(
                    "the completion is QP {other:#x}'s, not this QP's ({:#x}): explain it with \
                     that QP",
                    facts.qp_num
                ),
            )]
        } else {
            causes::of(status, &facts)
        };
        Explanation {
            status,
            causes,
            facts,
        }
    }

    /// Reads the facts [`explain`](Self::explain) rests on.
    #[cold]
    fn gather<C: Completion + ?Sized>(&self, wc: &C) -> ExplainFacts {
        let mut errors = Vec::new();
        let attrs = match self.query() {
            Ok((a, _)) => Some(a),
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        };
        let port = attrs
            .as_ref()
            .map(|a| a.port_num)
            .filter(|&p| p != 0)
            .or_else(|| self.port());
        let ctx = self.pd().context();
        let port_attr = port.and_then(|p| {
            ctx.query_port(p)
                .map_err(|e| errors.push(e.to_string()))
                .ok()
        });
        let sgid = match (port, attrs.as_ref().and_then(|a| a.av.grh())) {
            (Some(p), Some(grh)) => ctx
                .query_gid_entry(p, grh.sgid_index().into())
                .map_err(|e| errors.push(e.to_string()))
                .ok(),
            _ => None,
        };
        let first_failure = self.known().first_failure().map(|(status, kind)| {
            let kind = match kind {
                0 => RequestKind::Send,
                1 => RequestKind::Recv,
                _ => RequestKind::SrqRecv,
            };
            (WcStatus::from_raw(status).ok_or(status), kind)
        });
        ExplainFacts {
            qp_num: self.qp_num(),
            qp_type: self.qp_type(),
            completion_qp_num: wc.local_qp_num().map(QpNum::truncate),
            request: RequestKind::of_tag(wc.tag()),
            known_state: self.state(),
            attrs,
            port,
            port_attr,
            sgid,
            outstanding_sends: self.outstanding_sends(),
            outstanding_recvs: self.outstanding_recvs(),
            srq: self.srq().is_some(),
            first_failure,
            recv_bytes: None,
            vendor_err: wc.vendor_code(),
            query_errors: errors,
        }
    }
}

/// What a request of `kind` is called in a message.
fn request_name(kind: Option<RequestKind>) -> &'static str {
    match kind {
        Some(RequestKind::Send) => "send-queue request",
        Some(RequestKind::Recv) => "receive",
        Some(RequestKind::SrqRecv) => "SRQ receive",
        None => "request",
    }
}

/// A GID type as people write it.
fn gid_type_name(t: Option<GidType>) -> &'static str {
    match t {
        Some(GidType::Ib) => "IB",
        Some(GidType::RoceV1) => "RoCE v1",
        Some(GidType::RoceV2) => "RoCE v2",
        None => "unknown type",
    }
}

/// A status as `message (C_NAME)`.
fn status_text(status: Result<WcStatus, u32>) -> String {
    match status {
        Ok(s) => format!("{} ({})", s.message(), s.c_name()),
        Err(raw) => format!("status {raw}, unknown to this crate"),
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = &self.facts;
        let what = request_name(x.request);
        let t = x.qp_type.short_name();
        match self.status {
            _ if x.other_qp().is_some() => write!(
                f,
                "completion of QP {:#x} ({}) offered to {t} QP {:#x}",
                x.completion_qp_num.unwrap_or_default(),
                status_text(self.status),
                x.qp_num
            )?,
            Ok(WcStatus::Success) => write!(f, "{what} on {t} QP {:#x} succeeded", x.qp_num)?,
            s => write!(
                f,
                "{what} on {t} QP {:#x} failed: {}",
                x.qp_num,
                status_text(s)
            )?,
        }
        match self.causes.as_slice() {
            [] => {}
            [one] => write!(f, "\nlikely cause: {one}")?,
            many => {
                f.write_str("\nlikely causes, most likely first:")?;
                for (i, c) in many.iter().enumerate() {
                    write!(f, "\n  {}. {c}", i + 1)?;
                }
            }
        }
        write!(f, "\nfacts: {x}")
    }
}

impl fmt::Display for ExplainFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state {}", self.known_state.short_name())?;
        if let Some(a) = &self.attrs {
            if a.state != self.known_state {
                write!(f, " (device: {})", a.state.short_name())?;
            }
        }
        if let Some(p) = self.port {
            write!(f, "; port {p}")?;
        }
        if let Some(p) = &self.port_attr {
            let link = match p.link_layer {
                LinkLayer::Ethernet => "Ethernet",
                _ => "InfiniBand",
            };
            let state = p.state.c_name().trim_start_matches("IBV_PORT_");
            write!(
                f,
                ": {state}, {link}, LID {}, active MTU {}",
                p.lid,
                p.active_mtu.bytes()
            )?;
        }
        if let Some(a) = &self.attrs {
            self.fmt_path(f, a)?;
        }
        write!(
            f,
            "; outstanding: {} send(s), {} receive(s)",
            self.outstanding_sends, self.outstanding_recvs
        )?;
        if self.srq {
            f.write_str(" (receives through an SRQ)")?;
        }
        if let Some((s, k)) = self.first_failure {
            let s = s.map_or_else(|raw| raw.to_string(), |s| s.c_name().to_owned());
            write!(
                f,
                "; first failure since RESET: {s} on a {}",
                request_name(Some(k))
            )?;
        }
        if self.vendor_err != 0 {
            write!(f, "; vendor_err {:#x}", self.vendor_err)?;
        }
        for e in &self.query_errors {
            write!(f, "; not known: {e}")?;
        }
        Ok(())
    }
}

impl ExplainFacts {
    /// The completion's QP number, if it is another QP's.
    fn other_qp(&self) -> Option<QpNum> {
        self.completion_qp_num.filter(|&n| n != self.qp_num)
    }

    /// The path and timers part of the facts' text.
    fn fmt_path(&self, f: &mut fmt::Formatter<'_>, a: &QpAttributes) -> fmt::Result {
        if matches!(self.qp_type, QpType::Rc | QpType::Uc) {
            write!(
                f,
                "; path: dest QPN {:#x}, DLID {}",
                a.dest_qp_num,
                a.av.dest_lid()
            )?;
            match a.av.grh() {
                Some(g) => {
                    write!(f, ", GRH to {} from GID index {}", g.dgid(), g.sgid_index())?;
                    if let Some(s) = &self.sgid {
                        write!(f, " ({} {})", gid_type_name(s.gid_type), s.gid)?;
                    }
                }
                None => f.write_str(", no GRH")?,
            }
            if let Some(m) = a.path_mtu {
                write!(f, ", path MTU {}", m.bytes())?;
            }
        }
        if self.qp_type == QpType::Rc {
            let ms = |d: Option<std::time::Duration>| {
                d.map_or("infinite".to_owned(), |d| {
                    format!("{:.1} ms", d.as_secs_f64() * 1e3)
                })
            };
            write!(
                f,
                "; timeout {} ({}), retry_cnt {}, rnr_retry {}{}, min_rnr_timer {} ({})",
                a.timeout.get(),
                ms(a.timeout.duration()),
                a.retry_cnt.get(),
                a.rnr_retry.get(),
                if a.rnr_retry.is_infinite() {
                    " (infinite)"
                } else {
                    ""
                },
                a.min_rnr_timer.get(),
                ms(Some(a.min_rnr_timer.duration())),
            )?;
        }
        Ok(())
    }
}

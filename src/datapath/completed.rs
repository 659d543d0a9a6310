//! What comes back: a [`Completion`] routed by its tag, the kind of queue
//! a request was posted to ([`RequestKind`]), the finished request
//! ([`Completed`]) and a refused post ([`PostError`]).

use std::fmt;

use super::entries::{Lent, Loan};
use super::ledger::Kind;
use crate::cq::WorkCompletion;
use crate::error::Error;
use crate::mr::Chunk;

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
    /// The raw status (`enum ibv_wc_status`).
    #[doc(hidden)]
    fn status_code(&self) -> u32;
    /// The `vendor_err` field.
    #[doc(hidden)]
    fn vendor_code(&self) -> u32;
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
        Some(self.raw().qp_num)
    }
    #[inline]
    fn succeeded(&self) -> bool {
        self.is_success()
    }
    #[inline]
    fn status_code(&self) -> u32 {
        self.raw().status
    }
    #[inline]
    fn vendor_code(&self) -> u32 {
        self.vendor_err()
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

/// Which queue a request was posted to, as its tag says: what a
/// [`Completed`] (and [`WorkCompletion::request_kind`]) reports, for failed
/// and flushed completions too, whose opcode the device leaves undefined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// A send queue's request (a send, RDMA or atomic operation, or a
    /// memory-window bind or invalidation).
    Send,
    /// A receive posted to the QP's own receive queue.
    Recv,
    /// A receive posted to a shared receive queue.
    SrqRecv,
}

impl RequestKind {
    /// The kind a `wr_id` of the safe path names; `None` for any other
    /// number (a raw request's own `wr_id`, zero).
    #[inline]
    pub fn of_tag(wr_id: u64) -> Option<RequestKind> {
        Kind::of(wr_id).map(RequestKind::from)
    }
}

impl From<Kind> for RequestKind {
    #[inline]
    fn from(k: Kind) -> Self {
        match k {
            Kind::Send => RequestKind::Send,
            Kind::Recv => RequestKind::Recv,
            Kind::Srq => RequestKind::SrqRecv,
        }
    }
}

/// A finished work request, with its buffers.
pub struct Completed {
    /// The caller's `wr_id` (the one given to [`SendWr::new`](super::SendWr::new) or
    /// [`RecvWr::new`](super::RecvWr::new)), never the crate's tag.
    pub wr_id: u64,
    /// Whether this request is the one the completion being reclaimed
    /// names. False for an earlier send that completion ends with it
    /// (unsignalled, or signalled but not reclaimed yet), and for requests
    /// handed back by a RESET or by destroying the queue, which may or may
    /// not have run.
    pub signaled: bool,
    /// Which queue the request was posted to.
    pub kind: RequestKind,
    pub(crate) loan: Loan,
}

impl Completed {
    #[inline]
    pub(crate) fn new(wr_id: u64, signaled: bool, kind: Kind, loan: Loan) -> Self {
        Completed {
            wr_id,
            signaled,
            kind: kind.into(),
            loan,
        }
    }

    /// The request's chunks, in scatter/gather order ([`SharedChunk`](crate::SharedChunk)
    /// entries are not among them: the request's clone is let go).
    #[inline]
    pub fn chunks(self) -> impl Iterator<Item = Chunk> {
        let (one, many) = match self.loan {
            Loan::One(l) => (l.owned(), None),
            Loan::Many(e) => (
                None,
                Some(e.lent.into_iter().flatten().filter_map(Lent::owned)),
            ),
            Loan::Empty | Loan::Side | Loan::Pooled => (None, None),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// The first chunk (for the common single-entry request).
    #[inline]
    pub fn into_chunk(self) -> Option<Chunk> {
        match self.loan {
            Loan::One(Lent::Own(c)) => Some(c),
            Loan::One(Lent::Shared(_)) | Loan::Empty | Loan::Side | Loan::Pooled => None,
            Loan::Many(_) => self.chunks().next(),
        }
    }
}

impl fmt::Debug for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completed")
            .field("wr_id", &self.wr_id)
            .field("signaled", &self.signaled)
            .field("kind", &self.kind)
            .field("chunks", &self.loan.owned_count())
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
    /// `?` on calls such as [`QueuePair::start_batch`](super::QueuePair::start_batch) in a function that
    /// returns `PostError`).
    fn from(error: Error) -> Self {
        super::post::fail(error, 0, Vec::new())
    }
}

impl From<PostError> for Error {
    /// Keeps the error; the returned chunks are dropped.
    fn from(e: PostError) -> Self {
        e.error
    }
}

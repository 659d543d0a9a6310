//! A QP's two queues as the data path keeps them: the send queue's
//! bookkeeping ([`SendQueue`]) and the receive queue's ([`RecvQueue`]),
//! each owned by one half of the QP when it is split (see
//! [`QueuePair::split`](super::QueuePair::split)), together in [`Pending`]
//! otherwise.
//!
//! The two share nothing: a send half changes only its `SendQueue`, a
//! receive half only its `RecvQueue`, so the two can be used from two
//! threads with no lock of the crate's between them.

use super::chain::Scratch;
use super::completed::{Completed, PostError};
use super::entries::{Loan, SendLoan};
use super::ledger::{Kind, Ledger, RecvLedger, SendLedger};
use super::pin::Pin;
use super::post::{RecvFacts, SendFacts};
use super::recv_buffers::PoolPin;
use super::{QpCaps, QpType};
use crate::sys;

/// Outstanding requests of one QP's send queue, what a RESET handed back,
/// the raw requests of long chains, and the facts the checks need.
pub(crate) struct SendQueue {
    pub(super) ledger: SendLedger<Loan>,
    /// Per send slot: what a UD send or a memory-window request lends
    /// beside its entries ([`Loan::Side`]). Empty until a QP first needs it
    /// (UD QPs: at creation), then one entry per send slot.
    pub(super) side: Vec<SendLoan>,
    /// Requests ended beside the one a completion named (and, after a
    /// RESET, every request of both queues), for `take_released`.
    pub(super) released: Vec<Completed>,
    pub(super) scratch: Scratch<sys::ibv_send_wr>,
    pub(super) facts: SendFacts,
    /// The QP's record of each [`SendTemplate`](super::SendTemplate) it
    /// posted from, which keeps the source alive while a request from it
    /// may be outstanding (see [`Pin`]), so that those requests' ledger
    /// records hold nothing ([`Loan::Empty`], inert).
    pub(super) pins: Vec<Pin>,
}

/// Outstanding requests of one QP's receive queue, the raw requests of
/// long chains, and the facts the checks need.
pub(crate) struct RecvQueue {
    pub(super) ledger: RecvLedger<Loan>,
    pub(super) scratch: Scratch<sys::ibv_recv_wr>,
    pub(super) facts: RecvFacts,
    /// The QP's record of each [`RecvBuffers`](super::RecvBuffers) pool
    /// posted to its receive queue, which keeps the pool's region, once the
    /// pool is dropped, while a buffer of it may be posted (see
    /// [`PoolPin`]), so that those requests' ledger records hold nothing
    /// ([`Loan::Pooled`], inert).
    pub(super) pools: Vec<PoolPin>,
}

/// Both queues of a QP that is not split.
pub(crate) struct Pending {
    pub(crate) send: SendQueue,
    pub(crate) recv: RecvQueue,
}

impl Pending {
    /// The bookkeeping of a QP with `caps` (as created) in `pd`. Posts
    /// build their raw requests on the stack (up to
    /// [`CHAIN_ROOM`](super::chain::CHAIN_ROOM)), so nothing is allocated
    /// for them here.
    pub(crate) fn new(caps: &QpCaps, qp_type: QpType, pd: *mut sys::ibv_pd, atomics: bool) -> Self {
        let ledger = Ledger::new(Kind::Send, caps.max_send_wr as usize);
        let mut side = Vec::new();
        if qp_type == QpType::Ud {
            side.resize_with(ledger.slot_count(), SendLoan::default);
        }
        let facts = SendFacts::new(
            qp_type,
            pd,
            caps.max_send_sge,
            caps.max_inline_data,
            atomics,
        );
        Pending {
            send: SendQueue {
                ledger,
                side,
                released: Vec::new(),
                scratch: Scratch::new(),
                facts,
                pins: Vec::new(),
            },
            recv: RecvQueue {
                ledger: Ledger::new(Kind::Recv, caps.max_recv_wr as usize),
                scratch: Scratch::new(),
                facts: RecvFacts {
                    pd,
                    max_sge: caps.max_recv_sge,
                    floor: 0,
                },
                pools: Vec::new(),
            },
        }
    }

    /// After a RESET: the device has forgotten every request, so they all
    /// go to `released`, oldest first, sends before receives.
    pub(crate) fn release_all(&mut self) {
        let SendQueue {
            ledger,
            side,
            released,
            ..
        } = &mut self.send;
        ledger.drain(|r| {
            // A window loan dropped here keeps what the window may reach.
            let (loan, _mw) = SendQueue::resolve(side, r.slot, r.payload);
            released.push(Completed::new(r.wr_id, false, Kind::Send, loan));
        });
        self.recv
            .ledger
            .drain(|r| released.push(Completed::new(r.wr_id, false, Kind::Recv, r.payload)));
        self.send.release_pins();
        // No buffer of any pool is posted any more.
        self.recv.pools.clear();
    }

    /// Everything still held, for a destroyed QP: `released` first.
    pub(crate) fn into_all(mut self) -> Vec<Completed> {
        self.release_all();
        std::mem::take(&mut self.send.released)
    }

    /// Bytes of bookkeeping per queue slot (ledger slots, side entries,
    /// scratch), for the benchmark's report.
    pub(crate) fn bytes(&self) -> usize {
        let (s, r) = (&self.send, &self.recv);
        s.ledger.bytes()
            + r.ledger.bytes()
            + s.side.capacity() * std::mem::size_of::<SendLoan>()
            + s.scratch.bytes()
            + r.scratch.bytes()
            + s.pins.capacity() * std::mem::size_of::<Pin>()
            + r.pools.capacity() * std::mem::size_of::<PoolPin>()
    }
}

impl SendQueue {
    /// An empty queue with the same facts, where a QP keeps its place while
    /// an owned half holds the real one (see `QueuePair::into_split`).
    pub(super) fn stand_in(&self) -> SendQueue {
        SendQueue {
            ledger: Ledger::new(Kind::Send, 0),
            side: Vec::new(),
            released: Vec::new(),
            scratch: Scratch::new(),
            facts: self.facts,
            pins: Vec::new(),
        }
    }

    /// The one way a memory-window request (a bind or an invalidation,
    /// posted alone or in a [`WrBatch`](super::WrBatch)) enters the
    /// ledger: `loan` in the side table at a fresh tag. No room or no tag
    /// left: refused, the window's bookkeeping undone, nothing recorded.
    pub(crate) fn lend_window(
        &mut self,
        verb: &'static str,
        wr_id: u64,
        loan: crate::mw::MwLoan,
    ) -> Result<u64, PostError> {
        let side = (Loan::Empty, None, Some(loan));
        let ledger = &mut self.ledger;
        super::post::lend_side(ledger, &mut self.side, wr_id, side).map_err(|back| {
            crate::mw::restore(back);
            super::post::fail(ledger.refusal(verb, 1), 0, Vec::new())
        })
    }

    /// What a released send lent: its side entry for [`Loan::Side`].
    #[inline]
    pub(super) fn resolve(
        side: &mut [SendLoan],
        slot: usize,
        loan: Loan,
    ) -> (Loan, Option<crate::mw::MwLoan>) {
        match loan {
            Loan::Side => {
                let (loan, _ah, mw) = std::mem::take(&mut side[slot]);
                (loan, mw)
            }
            loan => (loan, None),
        }
    }

    /// Keeps requests a completion ended beside the one it named, for
    /// `take_released`.
    #[cold]
    pub(super) fn keep_released(&mut self, earlier: &mut Vec<Completed>) {
        self.released.append(earlier);
    }

    /// What `take_released` hands back.
    pub(super) fn take_released(&mut self) -> Vec<Completed> {
        std::mem::take(&mut self.released)
    }

    /// Takes back the newest send (of an aborted batch); `None` when the
    /// send queue holds none.
    pub(super) fn undo_newest(&mut self) -> Option<(u64, Loan, Option<crate::mw::MwLoan>)> {
        let r = self.ledger.pop_newest()?;
        let (loan, mw) = Self::resolve(&mut self.side, r.slot, r.payload);
        Some((r.wr_id, loan, mw))
    }
}

impl RecvQueue {
    /// An empty queue with the same facts (see [`SendQueue::stand_in`]).
    pub(super) fn stand_in(&self) -> RecvQueue {
        RecvQueue {
            ledger: Ledger::new(Kind::Recv, 0),
            scratch: Scratch::new(),
            facts: self.facts,
            pools: Vec::new(),
        }
    }
}

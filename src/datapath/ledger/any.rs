//! For the tests: a ledger of either order, chosen by its kind at run
//! time (as the production code never needs), so that one test drives
//! send queues, receive queues and SRQs alike.

use super::{Error, Kind, Ledger, Payload, Released};

/// A [`Ledger`] of the order `kind` gives it.
pub(crate) enum AnyLedger<T> {
    Ring(Ledger<T, true>),
    Free(Ledger<T, false>),
}

/// Calls `$call` on the ledger, whichever order it has.
macro_rules! either {
    ($self:expr, $l:ident => $call:expr) => {
        match $self {
            AnyLedger::Ring($l) => $call,
            AnyLedger::Free($l) => $call,
        }
    };
}

impl<T: Payload> AnyLedger<T> {
    pub(crate) fn new(kind: Kind, cap: usize) -> Self {
        match kind {
            Kind::Send => AnyLedger::Ring(Ledger::new(kind, cap)),
            Kind::Recv | Kind::Srq => AnyLedger::Free(Ledger::new(kind, cap)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        either!(self, l => l.len())
    }

    pub(crate) fn room(&self) -> usize {
        either!(self, l => l.room())
    }

    pub(crate) fn cap(&self) -> usize {
        either!(self, l => l.cap())
    }

    pub(crate) fn insert(&mut self, wr_id: u64, payload: T) -> Result<u64, T> {
        either!(self, l => l.insert(wr_id, payload))
    }

    pub(crate) fn undo_last(&mut self, tag: u64) -> Option<T> {
        either!(self, l => l.undo_last(tag))
    }

    pub(crate) fn holds(&self, tag: u64) -> bool {
        either!(self, l => l.holds(tag))
    }

    pub(crate) fn outstanding(&self, tag: u64) -> bool {
        either!(self, l => l.outstanding(tag))
    }

    pub(crate) fn refusal(&self, verb: &'static str, n: usize) -> Error {
        either!(self, l => l.refusal(verb, n))
    }

    pub(crate) fn take_tag<R>(&mut self, tag: u64, f: impl FnOnce(u64, T) -> R) -> Option<R> {
        either!(self, l => l.take_tag(tag, f))
    }

    pub(crate) fn complete(&mut self, tag: u64, f: impl FnMut(Released<T>)) -> usize {
        either!(self, l => l.complete(tag, f))
    }

    pub(crate) fn complete_quiet(&mut self, tag: u64, f: impl FnMut(Released<T>)) -> usize {
        either!(self, l => l.complete_quiet(tag, f))
    }

    pub(crate) fn any_live(&self, f: impl FnMut(u64, &T) -> bool) -> bool {
        either!(self, l => l.any_live(f))
    }

    pub(crate) fn drain(&mut self, f: impl FnMut(Released<T>)) -> usize {
        either!(self, l => l.drain(f))
    }

    /// Moves the next stamp to `left` before the end of the queue's
    /// blocks (if it has any yet), so that a block crossing comes soon.
    pub(crate) fn near_block_end(&mut self, left: u64) {
        either!(self, l => {
            if l.end != 0 {
                l.next = l.next.max(l.end - left);
            }
        })
    }
}

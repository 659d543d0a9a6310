//! Building a chain of requests and handing it to the provider: the raw
//! requests a queue fills in place ([`Scratch`]), the guard that takes a
//! call's requests back out if it does not go through ([`Chain`]), and the
//! one post loop every safe post goes through ([`post_chain`]).

use std::ffi::c_int;

use super::completed::PostError;
use super::entries::{Loan, SendLoan};
use super::ledger::Ledger;
use super::post::{fail, Pending};
use super::request::MAX_SGE;
use crate::error::{Error, Result};
use crate::mr::Chunk;
use crate::sys;

/// Raw requests a queue fills in place for each post call, each beside
/// its room for [`MAX_SGE`] entries (one allocation for both): allocated
/// with the queue, grown (once) by a longer chain.
pub(crate) struct Scratch<R> {
    raws: Vec<Raw<R>>,
}

/// One raw request and its entries.
#[derive(Default)]
struct Raw<R> {
    wr: R,
    sges: [sys::ibv_sge; MAX_SGE],
}

// SAFETY: the raw pointers inside are only meaningful during one post call
// on the thread making it, and are rewritten before every use.
unsafe impl<R> Send for Scratch<R> {}
// SAFETY: only reached through `&mut` of its queue.
unsafe impl<R> Sync for Scratch<R> {}

impl<R: ChainLink> Scratch<R> {
    pub(crate) fn new(room: usize) -> Self {
        let room = room.max(1);
        let mut raws = Vec::with_capacity(room);
        // The optimiser turns "allocate, then fill with zeros" into one
        // `calloc`, which glibc serves without its per-thread cache: a QP
        // created and destroyed over and over then pays malloc's slow
        // paths both ways (measured: about 580 instructions per QP).
        // Hiding the fresh vector from it keeps the plain allocation.
        std::hint::black_box(&mut raws);
        raws.resize_with(room, Raw::default);
        Scratch { raws }
    }

    /// Room for one more request than `n` (a chain longer than the room).
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = self.raws.len() * 2;
        self.raws.resize_with(n, Raw::default);
    }

    /// How many requests there is room for.
    #[inline(always)]
    fn room(&self) -> usize {
        self.raws.len()
    }

    /// Request `i` and its entries.
    #[inline(always)]
    fn at(&mut self, i: usize) -> (&mut R, &mut [sys::ibv_sge]) {
        let raw = &mut self.raws[i];
        (&mut raw.wr, &mut raw.sges[..])
    }

    /// Links the first `n` requests into a NULL-terminated chain over
    /// their entries and returns its head. Every pointer is derived from
    /// the base pointer taken here, after which nothing touches the
    /// vector until the post call that receives the chain returns.
    #[inline(always)]
    fn link(&mut self, n: usize) -> *mut R {
        let base = self.raws.as_mut_ptr();
        for i in 0..n {
            // SAFETY: `i < n <= raws.len()`: an initialised element of
            // `raws`, which `&mut self` borrows; no other reference to it
            // exists, and the pointers made below are to its entries and to
            // the next element's request (disjoint from this one's).
            let (w, sges) = unsafe {
                let e = base.add(i);
                (
                    &mut (*e).wr,
                    std::ptr::addr_of_mut!((*e).sges).cast::<sys::ibv_sge>(),
                )
            };
            let next = if i + 1 < n {
                // SAFETY: `i + 1 < n <= raws.len()`: in bounds.
                unsafe { std::ptr::addr_of_mut!((*base.add(i + 1)).wr) }
            } else {
                std::ptr::null_mut()
            };
            w.set_links(sges, next);
        }
        // SAFETY: `raws` is not empty (`new` makes room for one at
        // least): its first element's request, from the same base pointer.
        unsafe { std::ptr::addr_of_mut!((*base).wr) }
    }

    /// Bytes allocated.
    pub(super) fn bytes(&self) -> usize {
        self.raws.capacity() * std::mem::size_of::<Raw<R>>()
    }

    #[inline]
    fn tag(&self, i: usize) -> u64 {
        self.raws[i].wr.wr_id()
    }
}

/// One post call's requests on their way in: the queue's ledger (and side
/// table), the raw requests being filled, and how many of the call's
/// requests the ledger holds. Dropped while `n > 0` (the caller's iterator
/// panicked), it takes them back out, newest first: none reached the
/// device, so no queue room is lost to requests never posted (their
/// chunks are dropped with the unwinding, back to their region).
pub(super) struct Chain<'q, R: ChainLink> {
    pub(super) ledger: &'q mut Ledger<Loan>,
    pub(super) side: &'q mut Vec<SendLoan>,
    pub(super) scratch: &'q mut Scratch<R>,
    pub(super) n: usize,
}

impl<R: ChainLink> Chain<'_, R> {
    /// Takes this call's requests back out of the ledger, newest first,
    /// and returns their owned chunks in request order.
    #[cold]
    fn undo(&mut self) -> Vec<Chunk> {
        let mut undone = Vec::with_capacity(self.n);
        while self.n > 0 {
            self.n -= 1;
            let tag = self.scratch.tag(self.n);
            let slot = self.ledger.slot_of(tag);
            if let Some(loan) = self.ledger.undo_last(tag) {
                let (loan, mw) = Pending::resolve(self.side, slot, loan);
                if let Some(mw) = mw {
                    mw.restore();
                }
                undone.push(loan);
            }
        }
        let mut out = Vec::new();
        for loan in undone.into_iter().rev() {
            loan.give_back(&mut out);
        }
        out
    }
}

impl<R: ChainLink> Drop for Chain<'_, R> {
    fn drop(&mut self) {
        if self.n > 0 {
            drop(self.undo());
        }
    }
}

/// The one place requests enter a ledger and reach a provider.
///
/// Each request of `reqs` passes the fast check `ok` or the full `check`,
/// has its raw form filled in place (`fill`) into the queue's scratch, and
/// its loan moved into the ledger (`lend`), whose tag becomes the raw
/// `wr_id`. If any request is refused (a failed check, no room:
/// `no_room(requests, room, outstanding)`, no tags left), the rest of the
/// iterator is consumed, the call's requests are taken back out of the
/// ledger, newest first, and every chunk of the call comes back in the
/// error, in request order; nothing reached the device. Otherwise the
/// chain is linked and handed to `call` (the provider's post); on success,
/// or on a provider failure, the ledger keeps every request (see
/// [`PostError`]). An empty `reqs` calls nothing.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn post_chain<W, R: ChainLink>(
    verb: &'static str,
    mut chain: Chain<'_, R>,
    mut reqs: impl Iterator<Item = W>,
    ok: impl Fn(&W) -> bool,
    check: impl Fn(&W) -> Result<()>,
    fill: impl Fn(&W, &mut R, &mut [sys::ibv_sge]),
    lend: impl Fn(&mut Ledger<Loan>, &mut Vec<SendLoan>, W) -> Result<u64, Loan>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
    no_room: impl FnOnce(usize, usize, usize) -> Error,
    call: impl FnOnce(*mut R, &mut *mut R) -> c_int,
) -> Result<(), PostError> {
    let room = chain.ledger.room();
    // One call site of the caller's `next`, so that it can be inlined.
    while let Some(wr) = reqs.next() {
        if !ok(&wr) {
            if let Err(e) = check(&wr) {
                return Err(refuse(chain, e, wr, reqs, give_back));
            }
        }
        let n = chain.n;
        if n == room {
            let held = chain.ledger.len() - n;
            return Err(refuse_full(chain, wr, reqs, give_back, |total| {
                no_room(total, room, held)
            }));
        }
        if n == chain.scratch.room() {
            chain.scratch.grow();
        }
        let (raw, sges) = chain.scratch.at(n);
        fill(&wr, raw, sges);
        match lend(chain.ledger, chain.side, wr) {
            Ok(tag) => raw.set_wr_id(tag),
            Err(loan) => return Err(exhausted(verb, chain, loan, reqs, give_back)),
        }
        chain.n = n + 1;
    }
    drop(reqs);
    if chain.n == 0 {
        return Ok(());
    }
    // The caller's iterator is used up and dropped: no caller code runs
    // from here on, and the requests stay in the ledger whatever happens.
    let n = std::mem::take(&mut chain.n);
    let head = chain.scratch.link(n);
    let mut bad: *mut R = std::ptr::null_mut();
    let rc = call(head, &mut bad);
    // Whatever `bad` says, a failed provider may have queued any request of
    // the chain: the ledger keeps them all.
    if rc != 0 {
        return Err(provider_failed(verb, rc, n));
    }
    Ok(())
}

#[cold]
#[inline(never)]
pub(super) fn provider_failed(verb: &'static str, rc: c_int, n: usize) -> PostError {
    let error = crate::error::check_rc(verb, rc)
        .err()
        .unwrap_or(Error::invalid(verb, "failed"));
    fail(error, n, Vec::new())
}

/// Takes a refused call apart: the rest of the iterator is consumed
/// (its chunks kept, after `back`'s), then this call's requests are taken
/// back out; every chunk of the call, in request order, and how many
/// requests the call had.
fn take_apart<W, R: ChainLink>(
    mut chain: Chain<'_, R>,
    mut back: Vec<Chunk>,
    rest: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
) -> (usize, Vec<Chunk>) {
    let mut total = chain.n + 1;
    for w in rest {
        total += 1;
        give_back(w, &mut back);
    }
    let mut all = chain.undo();
    all.append(&mut back);
    (total, all)
}

/// A request that failed its check: the call is refused whole.
#[cold]
#[inline(never)]
fn refuse<W, R: ChainLink>(
    chain: Chain<'_, R>,
    error: Error,
    wr: W,
    rest: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
) -> PostError {
    let mut back = Vec::new();
    give_back(wr, &mut back);
    let (_, all) = take_apart(chain, back, rest, give_back);
    fail(error, 0, all)
}

/// A call with more requests than room: refused whole, the message
/// counting every request of the call.
#[cold]
#[inline(never)]
fn refuse_full<W, R: ChainLink>(
    chain: Chain<'_, R>,
    wr: W,
    rest: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
    error: impl FnOnce(usize) -> Error,
) -> PostError {
    let mut back = Vec::new();
    give_back(wr, &mut back);
    let (total, all) = take_apart(chain, back, rest, give_back);
    fail(error(total), 0, all)
}

/// No tags left (after 2^62 stamps): refused whole.
#[cold]
#[inline(never)]
fn exhausted<W, R: ChainLink>(
    verb: &'static str,
    chain: Chain<'_, R>,
    loan: Loan,
    rest: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
) -> PostError {
    let mut back = Vec::new();
    loan.give_back(&mut back);
    let (_, all) = take_apart(chain, back, rest, give_back);
    fail(Error::TagsExhausted { verb }, 0, all)
}

/// A call refused before any request is looked at (the QP's state, a
/// leaked batch): every chunk comes back; an empty call is no error.
#[cold]
#[inline(never)]
pub(crate) fn refuse_all<W>(
    error: Option<Error>,
    reqs: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
) -> Result<(), PostError> {
    let mut back = Vec::new();
    let mut n = 0;
    for w in reqs {
        n += 1;
        give_back(w, &mut back);
    }
    match (n, error) {
        (0, _) | (_, None) => Ok(()),
        (_, Some(error)) => Err(fail(error, 0, back)),
    }
}

/// The fields the two raw request types chain with.
pub(crate) trait ChainLink: Default {
    fn set_links(&mut self, sg_list: *mut sys::ibv_sge, next: *mut Self);
    fn wr_id(&self) -> u64;
    fn set_wr_id(&mut self, id: u64);
}

macro_rules! chain_link {
    ($t:ty) => {
        impl ChainLink for $t {
            #[inline]
            fn set_links(&mut self, sg_list: *mut sys::ibv_sge, next: *mut Self) {
                self.sg_list = if self.num_sge > 0 {
                    sg_list
                } else {
                    std::ptr::null_mut()
                };
                self.next = next;
            }
            #[inline]
            fn wr_id(&self) -> u64 {
                self.wr_id
            }
            #[inline]
            fn set_wr_id(&mut self, id: u64) {
                self.wr_id = id;
            }
        }
    };
}
chain_link!(sys::ibv_send_wr);
chain_link!(sys::ibv_recv_wr);

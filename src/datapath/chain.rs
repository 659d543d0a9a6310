//! Building a chain of requests and handing it to the provider: the raw
//! requests a call fills in place (on its stack, [`Stack`], past
//! [`CHAIN_ROOM`] in its queue's [`Scratch`]), the guard that takes a
//! call's requests back out if it does not go through ([`Chain`]), and the
//! one post loop every safe post goes through ([`post_chain`]).

use std::ffi::c_int;
use std::mem::MaybeUninit;

use super::completed::PostError;
use super::entries::{Loan, SendLoan};
use super::ledger::Ledger;
use super::post::fail;
use super::queues::SendQueue;
use super::request::MAX_SGE;
use crate::error::{Error, Result};
use crate::mr::Chunk;
use crate::sys;

/// The longest chain whose raw requests are built on the caller's stack:
/// posts of up to this many requests never allocate, the first included,
/// and a queue allocates nothing for them at creation. A longer chain
/// builds the rest in its queue's [`Scratch`], grown once.
pub(crate) const CHAIN_ROOM: usize = 8;

/// One raw request and its entries.
#[derive(Default)]
pub(crate) struct Raw<R> {
    wr: R,
    sges: [sys::ibv_sge; MAX_SGE],
}

/// The raw requests of one post call, as a C program declares them: an
/// array on the stack, uninitialised until a request is filled into it.
pub(crate) struct Stack<R>([MaybeUninit<Raw<R>>; CHAIN_ROOM]);

impl<R> Stack<R> {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Stack([const { MaybeUninit::uninit() }; CHAIN_ROOM])
    }
}

/// The raw requests of a chain longer than [`CHAIN_ROOM`], past the
/// first `CHAIN_ROOM` (one per queue): empty, with nothing allocated,
/// until a queue's first such chain, then kept, so that steady state
/// allocates nothing.
pub(crate) struct Scratch<R> {
    spill: Vec<Raw<R>>,
}

// SAFETY: the raw pointers inside are only meaningful during one post call
// on the thread making it, and are rewritten before every use.
unsafe impl<R> Send for Scratch<R> {}
// SAFETY: only reached through `&mut` of its queue.
unsafe impl<R> Sync for Scratch<R> {}

impl<R> Scratch<R> {
    /// No room: nothing is allocated until a chain needs it.
    pub(crate) const fn new() -> Self {
        Scratch { spill: Vec::new() }
    }

    /// Bytes allocated.
    pub(super) fn bytes(&self) -> usize {
        self.spill.capacity() * std::mem::size_of::<Raw<R>>()
    }
}

/// Where one call's raw requests are filled, in order: the first
/// [`CHAIN_ROOM`] in the call's [`Stack`], the rest in the queue's
/// [`Scratch`]. Invariant: entries `0..filled` are initialised (the stack
/// ones written by [`next`](Self::next), the spilled ones by the vector).
pub(super) struct Room<'q, R> {
    stack: &'q mut Stack<R>,
    spill: &'q mut Scratch<R>,
    filled: usize,
}

impl<'q, R: ChainLink> Room<'q, R> {
    #[inline(always)]
    pub(super) fn new(stack: &'q mut Stack<R>, spill: &'q mut Scratch<R>) -> Self {
        Room {
            stack,
            spill,
            filled: 0,
        }
    }

    /// The next request, zeroed, and its entries.
    #[inline(always)]
    fn next(&mut self) -> (&mut R, &mut [sys::ibv_sge]) {
        let i = self.filled;
        self.filled = i + 1;
        let raw = if i < CHAIN_ROOM {
            self.stack.0[i].write(Raw::default())
        } else {
            self.spilled(i - CHAIN_ROOM)
        };
        (&mut raw.wr, &mut raw.sges[..])
    }

    /// Spilled request `j` (the `CHAIN_ROOM + j`th of the call), zeroed.
    #[cold]
    #[inline(never)]
    fn spilled(&mut self, j: usize) -> &mut Raw<R> {
        let spill = &mut self.spill.spill;
        if j < spill.len() {
            spill[j] = Raw::default();
        } else {
            spill.resize_with(j + 1, Raw::default);
        }
        &mut spill[j]
    }

    /// The request at `i` (a filled one); the requests taken back by an
    /// undo read their tags here.
    fn at(&self, i: usize) -> Option<&R> {
        if i >= self.filled {
            return None;
        }
        match self.stack.0.get(i) {
            // SAFETY: `i < filled`: written by `next` (the invariant).
            Some(e) => Some(unsafe { &e.assume_init_ref().wr }),
            None => self.spill.spill.get(i - CHAIN_ROOM).map(|r| &r.wr),
        }
    }

    /// Links the first `n` requests (at most those filled) into a
    /// NULL-terminated chain over their entries and returns its head.
    /// Every pointer is derived from the base pointers taken here, after
    /// which nothing touches the stack or the spill until the post call
    /// that receives the chain returns.
    #[inline(always)]
    fn link(&mut self, n: usize) -> *mut R {
        let n = n.min(self.filled);
        if n == 0 {
            return std::ptr::null_mut();
        }
        let stack = self.stack.0.as_mut_ptr().cast::<Raw<R>>();
        let spill = self.spill.spill.as_mut_ptr();
        // Request `i`, for `i < n <= filled`: an initialised element of the
        // stack (`i < CHAIN_ROOM`) or of the spill (which holds every
        // spilled request filled), both borrowed `&mut` by `self`; no
        // reference to them exists while the links are written, and each
        // request's links point at its own entries and at the next request
        // (disjoint from its own).
        let at = |i: usize| {
            if i < CHAIN_ROOM {
                // SAFETY: `i < CHAIN_ROOM`: inside the stack array.
                unsafe { stack.add(i) }
            } else {
                // SAFETY: `i < filled`: inside the spill (see above).
                unsafe { spill.add(i - CHAIN_ROOM) }
            }
        };
        for i in 0..n {
            let e = at(i);
            let next = if i + 1 < n {
                // SAFETY: `i + 1 < n`: a filled request (see `at`).
                unsafe { std::ptr::addr_of_mut!((*at(i + 1)).wr) }
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: `i < n`: a filled request (see `at`), written
            // through its pointer alone.
            unsafe {
                let sges = std::ptr::addr_of_mut!((*e).sges).cast::<sys::ibv_sge>();
                (*e).wr.set_links(sges, next);
            }
        }
        // SAFETY: `0 < n <= filled`: the first request (see `at`).
        unsafe { std::ptr::addr_of_mut!((*at(0)).wr) }
    }

    #[inline]
    fn tag(&self, i: usize) -> u64 {
        self.at(i).map_or(0, ChainLink::wr_id)
    }
}

/// One post call's requests on their way in: the queue's ledger (and side
/// table), the raw requests being filled, and how many of the call's
/// requests the ledger holds. Dropped while `n > 0` (the caller's iterator
/// panicked), it takes them back out, newest first: none reached the
/// device, so no queue room is lost to requests never posted (their
/// chunks are dropped with the unwinding, back to their region).
pub(super) struct Chain<'q, R: ChainLink, const RING: bool> {
    pub(super) ledger: &'q mut Ledger<Loan, RING>,
    pub(super) side: &'q mut Vec<SendLoan>,
    pub(super) scratch: Room<'q, R>,
    pub(super) n: usize,
}

impl<R: ChainLink, const RING: bool> Chain<'_, R, RING> {
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
                let (loan, mw) = SendQueue::resolve(self.side, slot, loan);
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

impl<R: ChainLink, const RING: bool> Drop for Chain<'_, R, RING> {
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
/// `wr_id`. If any request is refused (a failed check; no room for it or
/// no stamp left: the ledger's [`refusal`](Ledger::refusal)), the rest of
/// the iterator is consumed, the call's requests are taken back out of the
/// ledger, newest first, and every chunk of the call comes back in the
/// error, in request order; nothing reached the device. Otherwise the
/// chain is linked and handed to `call` (the provider's post); on success,
/// or on a provider failure, the ledger keeps every request (see
/// [`PostError`]). An empty `reqs` calls nothing.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn post_chain<W, R: ChainLink, const RING: bool>(
    verb: &'static str,
    mut chain: Chain<'_, R, RING>,
    mut reqs: impl Iterator<Item = W>,
    ok: impl Fn(&W) -> bool,
    check: impl Fn(&W) -> Result<()>,
    fill: impl Fn(&W, &mut R, &mut [sys::ibv_sge]),
    lend: impl Fn(&mut Ledger<Loan, RING>, &mut Vec<SendLoan>, W) -> Result<u64, Loan>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
    call: impl FnOnce(*mut R, &mut *mut R) -> c_int,
) -> Result<(), PostError> {
    let room = chain.ledger.room();
    // One call site of the caller's `next`, so that it can be inlined.
    while let Some(wr) = reqs.next() {
        if !ok(&wr) {
            if let Err(e) = check(&wr) {
                let back = chunks_of(wr, &give_back);
                return Err(refuse(verb, chain, Some(e), back, reqs, give_back));
            }
        }
        let n = chain.n;
        if n == room {
            let back = chunks_of(wr, &give_back);
            return Err(refuse(verb, chain, None, back, reqs, give_back));
        }
        let (raw, sges) = chain.scratch.next();
        fill(&wr, raw, sges);
        match lend(chain.ledger, chain.side, wr) {
            Ok(tag) => raw.set_wr_id(tag),
            Err(loan) => {
                let back = chunks_of(loan, Loan::give_back);
                return Err(refuse(verb, chain, None, back, reqs, give_back));
            }
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

/// A call refused whole at one of its requests (`back`: that request's
/// chunks): the rest of the iterator is consumed (its chunks kept, after
/// `back`'s), then the call's requests are taken back out; every chunk of
/// the call comes back, in request order. The error is `error` (a failed
/// check), or else the ledger's [`refusal`](Ledger::refusal) for every
/// request of the call (no room for them all, or no stamp left).
#[cold]
#[inline(never)]
fn refuse<W, R: ChainLink, const RING: bool>(
    verb: &'static str,
    mut chain: Chain<'_, R, RING>,
    error: Option<Error>,
    mut back: Vec<Chunk>,
    rest: impl Iterator<Item = W>,
    give_back: impl Fn(W, &mut Vec<Chunk>),
) -> PostError {
    let mut total = chain.n + 1;
    for w in rest {
        total += 1;
        give_back(w, &mut back);
    }
    let mut all = chain.undo();
    all.append(&mut back);
    let error = error.unwrap_or_else(|| chain.ledger.refusal(verb, total));
    fail(error, 0, all)
}

/// A request the ledger could not take (`ledger.insert` gave its `loan`
/// back): the ledger's [`refusal`](Ledger::refusal), its chunks back: the
/// refusal of the one-request posts, as [`refuse`] is the chains'.
#[cold]
#[inline(never)]
pub(super) fn refused_entry<const RING: bool>(
    verb: &'static str,
    ledger: &Ledger<Loan, RING>,
    loan: Loan,
) -> PostError {
    fail(ledger.refusal(verb, 1), 0, chunks_of(loan, Loan::give_back))
}

/// The owned chunks of a refused request (or loan), in their order.
#[cold]
fn chunks_of<W>(w: W, give_back: impl Fn(W, &mut Vec<Chunk>)) -> Vec<Chunk> {
    let mut back = Vec::new();
    give_back(w, &mut back);
    back
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

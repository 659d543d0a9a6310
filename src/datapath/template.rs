//! Send templates: a send or RDMA write checked once against its QP, then
//! posted any number of times with only a `wr_id` and the signalled flag
//! per request ([`QueuePair::post_template`]). For streams from one
//! read-only source ([`SharedChunk`]) or with no data, where the per-request
//! checks of [`QueuePair::post_send`] would only repeat themselves.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::Arc;

use super::chain::{post_chain, provider_failed, refuse_all, Chain, Room, Stack};
use super::completed::PostError;
use super::entries::Loan;
use super::pin::Keeper;
use super::request::{SendOp, SendWr};
use super::QueuePair;
use crate::error::{Error, Result};
use crate::mr::SharedChunk;
use crate::sys;

/// A send or RDMA write (with or without immediate data) from one
/// read-only [`SharedChunk`] (or with no data), checked once against the
/// QP it was made for ([`QueuePair::send_template`]).
///
/// The QP keeps the source alive while requests posted from it may be
/// outstanding (one record per QP and source, rather than a handle per
/// request as [`SendWr::sge_shared`] has), so a request costs the ledger
/// a record that holds nothing, and its completion need not visit it.
/// While the template lives, its own handle does that; dropped with
/// requests outstanding, it leaves the handle with the QP, which lets go
/// when they end. Between rounds of requests, when none is outstanding,
/// [`QueuePair::template_source_mut`] writes the source in place.
///
/// ```no_run
/// # fn f(qp: &mut rdma_verbs::QueuePair, src: &rdma_verbs::SharedChunk,
/// #      remote: rdma_verbs::qp::RemoteAddr) -> Result<(), Box<dyn std::error::Error>> {
/// use rdma_verbs::qp::SendOp;
/// let write = qp.send_template(SendOp::RdmaWrite(remote), Some((src, 64)))?;
/// // 16 writes, only the last signalled.
/// qp.post_template(&write, (0..16).map(|i| (i, i == 15)))?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SendTemplate {
    op: SendOp,
    src: Option<(SharedChunk, u32)>,
    /// The source's raw entry, found once (a chunk's address and key do
    /// not change).
    pub(super) sge: sys::ibv_sge,
    /// The raw request, filled once: opcode, entry count and the
    /// operation's fields; a post copies it and sets `wr_id`, the flags
    /// and the entry pointer.
    pub(super) raw: RawWr,
    /// The QP it was checked for ([`QueuePair::id`], never reused): the
    /// facts checked then (the operation against the transport, the
    /// source's PD and length, the QP's entry count) stay true of that QP.
    qp: u64,
    /// Shared with the QP's pin of the source (see `post::Pin`): tells
    /// the QP whether a template (this one or a clone) still lives, and
    /// takes the source's handle from the first of them dropped.
    pub(super) keeper: Arc<Keeper>,
}

/// A template's raw request: every pointer in it is NULL (`next`,
/// `sg_list`; a template is never UD, so no address handle either),
/// except the `sg_list` of the QP's copy in its [`Pin`](super::pin::Pin),
/// which a post points at the pin's own entry just before the call.
#[derive(Clone, Copy)]
pub(super) struct RawWr(pub(super) sys::ibv_send_wr);

// The template's request has only NULL pointers, never followed: posts
// copy it and point the copy at their own entry. A pin's copy has
// `sg_list` set only by a post (through `&mut QueuePair`), just before the
// provider follows it during that call; between posts it is never followed.
// SAFETY: nothing in it is tied to a thread (above).
unsafe impl Send for RawWr {}
// SAFETY: as for `Send`; shared use only reads (copies) it.
unsafe impl Sync for RawWr {}

impl std::fmt::Debug for RawWr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawWr")
            .field("opcode", &self.0.opcode)
            .field("num_sge", &self.0.num_sge)
            .finish_non_exhaustive()
    }
}

impl SendTemplate {
    /// The operation each request from this template carries.
    pub fn op(&self) -> SendOp {
        self.op
    }

    /// The raw request of this template, `wr_id` and `sg_list` aside
    /// (which the caller sets): a copy of the one filled at creation, with
    /// the signalled flag.
    #[inline(always)]
    fn raw(&self, signaled: bool) -> sys::ibv_send_wr {
        let mut raw = self.raw.0;
        raw.send_flags = if signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        raw
    }
}

impl Drop for SendTemplate {
    /// Leaves the source's handle with the QP while a request from the
    /// template may be outstanding there (see `post::Pin`).
    fn drop(&mut self) {
        if let Some((src, _)) = self.src.take() {
            self.keeper.leave(src);
        }
    }
}

impl QueuePair {
    /// Checks a send or RDMA write once (as [`post_send`](Self::post_send)
    /// would check it: the operation against the transport, the source's
    /// PD and length), for [`post_template`](Self::post_template). Refused:
    /// RDMA READ and atomics (their local entries are written: they need
    /// owned chunks), SEND_WITH_INV, UD QPs (each datagram names its
    /// destination), and what `post_send` refuses.
    ///
    /// # Errors
    /// The error `post_send` would refuse the request with, or
    /// [`Error::InvalidArgument`] for what only a template refuses.
    #[doc(alias = "ibv_send_wr")]
    pub fn send_template(
        &self,
        op: SendOp,
        src: Option<(&SharedChunk, usize)>,
    ) -> Result<SendTemplate> {
        const VERB: &str = "ibv_post_send";
        if !matches!(
            op,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::RdmaWrite(_)
                | SendOp::RdmaWriteWithImm(..)
        ) {
            return Err(Error::invalid(
                VERB,
                format!("a template is a send or an RDMA write, not {}", op.name()),
            ));
        }
        let facts = self.pending().send.facts;
        let mut wr = SendWr::new(0, op);
        if let Some((s, len)) = src {
            wr = wr.sge_shared(s, len);
        }
        if !facts.fast(&wr) {
            facts.check(&wr)?;
            // What the full check lets through beyond the fast one is a UD
            // send (which needs a destination per request).
            return Err(Error::invalid(VERB, "no templates on UD QPs"));
        }
        let sge = src.map_or_else(sys::ibv_sge::default, |(s, len)| sys::ibv_sge {
            addr: s.chunk().addr(),
            length: len as u32,
            lkey: s.chunk().lkey(),
        });
        let mut raw = sys::ibv_send_wr {
            num_sge: c_int::from(src.is_some()),
            opcode: op.opcode(),
            ..Default::default()
        };
        super::post::fill_op(&op, &mut raw);
        Ok(SendTemplate {
            raw: RawWr(raw),
            op,
            sge,
            src: src.map(|(s, len)| (s.clone(), len as u32)),
            qp: self.id(),
            keeper: Arc::new(Keeper::default()),
        })
    }

    /// Posts one request per `(wr_id, signaled)` of `reqs` from template
    /// `t`, in one `ibv_post_send` call: per request only the ledger's
    /// record and the raw request's fields. Refused as
    /// [`post_send`](Self::post_send) refuses a call (the QP's state, no
    /// room), and a template made for another QP. An empty iterator posts
    /// nothing and calls nothing.
    ///
    /// # Errors
    /// A [`PostError`], nothing recorded or posted, for what is refused
    /// above; or the provider failed (the requests stay in the ledger, in
    /// doubt).
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub fn post_template<I>(&mut self, t: &SendTemplate, reqs: I) -> Result<(), PostError>
    where
        I: IntoIterator<Item = (u64, bool)>,
    {
        const VERB: &str = "ibv_post_send";
        if let Some(e) = self.template_refusal(t, VERB) {
            return refuse_all(Some(e), reqs.into_iter(), |_, _| {});
        }
        let qp = self.as_ptr();
        let p = &mut self.pending_mut().send;
        // The QP keeps the source while the requests may be outstanding.
        let pin = t.src.as_ref().map(|_| p.pin(t));
        let newest = Cell::new(0u64);
        let mut stack = Stack::new();
        let chain = Chain {
            ledger: &mut p.ledger,
            side: &mut p.side,
            scratch: Room::new(&mut stack, &mut p.scratch),
            n: 0,
        };
        let res = post_chain(
            VERB,
            chain,
            reqs.into_iter(),
            |_| true,
            |_| Ok(()),
            |&(_, signaled), raw: &mut sys::ibv_send_wr, sges| {
                sges[0] = t.sge;
                *raw = t.raw(signaled);
            },
            |ledger, _, (wr_id, _)| {
                let tag = ledger
                    .insert_made(wr_id, || Loan::Empty)
                    .ok_or(Loan::Empty)?;
                newest.set(tag);
                Ok(tag)
            },
            |_, _| {},
            |chain, bad| {
                // A NULL-terminated chain of the call's raw requests; each one's entry
                // names the template's source, which the QP's pin keeps
                // (set below: nothing frees it before this call returns)
                // until the newest of these requests is no longer
                // outstanding, and so every one of them (in order).
                // SAFETY: a live QP and a valid chain over memory that outlives its use.
                unsafe { sys::ibv_post_send(qp, chain, bad) }
            },
        );
        // The common case straight on: every request went to the device
        // (and the ledger), so the newest is the pin's (none: an empty
        // call, whose pin, if made for it, goes again).
        match res {
            Ok(()) => {
                if let Some(i) = pin {
                    let p = &mut self.pending_mut().send;
                    match newest.get() {
                        0 => p.unpin_unused(i),
                        last => p.pin_posted(i, last),
                    }
                }
                Ok(())
            }
            Err(e) => Err(self.template_post_failed(pin, newest.get(), e)),
        }
    }

    /// Posts one request from template `t` (`wr_id`, signalled or not):
    /// [`post_template`](Self::post_template) with a single request, as
    /// latency loops post, without an iterator or a chain. The raw
    /// request is built in place on the stack, as a C program builds it.
    /// Refused, with nothing recorded or posted, as `post_template`
    /// refuses; a provider failure keeps the request in the ledger (in
    /// doubt, see [`PostError`]).
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, t: &rdma_verbs::qp::SendTemplate) -> Result<(), rdma_verbs::qp::PostError> {
    /// for i in 0..1000 {
    ///     qp.post_template_one(t, i, true)?;
    ///     // ... poll and reclaim its completion
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`post_template`](Self::post_template).
    #[doc(alias = "ibv_post_send")]
    #[inline(always)]
    pub fn post_template_one(
        &mut self,
        t: &SendTemplate,
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), PostError> {
        const VERB: &str = "ibv_post_send";
        // A template of this QP, a state that takes sends, and room: the
        // common case. Anything else takes `post_template`'s path, which
        // refuses it with the reason: the one refusal of template posts.
        let (sends, id) = (self.known().sends(), self.id());
        let qp = self.as_ptr();
        let p = &mut self.pending_mut().send;
        if t.qp != id || !sends || p.ledger.room() == 0 {
            return self.post_template_refused(t, wr_id, signaled);
        }
        let Some(tag) = p.ledger.insert_made(wr_id, || Loan::Empty) else {
            return self.post_template_refused(t, wr_id, signaled);
        };
        // The ledger keeps the request from here on, whatever the provider
        // says: the QP keeps the source until it is no longer outstanding
        // (set before this call returns, so before the template can go).
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        let rc = if t.src.is_some() {
            // The pin holds the template's raw request and entry, filled
            // once: only the `wr_id`, the flags and the entry pointer are
            // written, in place, as a C program reuses its request.
            let pin = p.pin_mut(t);
            pin.posted(tag);
            let wr = pin.raw_for(tag, signaled);
            // `wr` is the pin's one request (`next` NULL), whose one entry is
            // the pin's (`raw_for` points it there; the pin is not touched
            // until the call returns) and names the template's source, which
            // the pin keeps alive until the request is no longer outstanding
            // (`posted` above).
            // SAFETY: a live QP and a request valid for the call (above).
            unsafe { sys::ibv_post_send(qp, wr, &mut bad) }
        } else {
            let mut wr = t.raw(signaled);
            wr.wr_id = tag;
            // SAFETY: a live QP; `wr` is one request (`next` NULL) with no
            // entry (the template has no source), on this stack frame.
            unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) }
        };
        if rc != 0 {
            return Err(provider_failed(VERB, rc, 1));
        }
        Ok(())
    }

    /// [`post_template_one`](Self::post_template_one)'s request that the
    /// common case does not take: `post_template` refuses it with the
    /// reason, nothing recorded or posted.
    #[cold]
    #[inline(never)]
    fn post_template_refused(
        &mut self,
        t: &SendTemplate,
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), PostError> {
        self.post_template(t, std::iter::once((wr_id, signaled)))
    }

    /// Why template `t` cannot be posted here now, if it cannot (the
    /// checks of both template posts): a template of another QP, or what
    /// the QP's state or a leaked batch refuses.
    #[inline(always)]
    fn template_refusal(&self, t: &SendTemplate, verb: &'static str) -> Option<Error> {
        // The QP's number is never another QP's, and what `send_template`
        // checked of the template against it does not change.
        if t.qp != self.id() {
            return Some(Error::invalid(verb, "the template was made for another QP"));
        }
        self.send_refusal(verb)
    }

    /// The pin after a refused or failed template post: a provider
    /// failure leaves the requests in the ledger (in doubt), so they are
    /// the pin's newest; a call refused whole and undone keeps nothing.
    #[cold]
    #[inline(never)]
    fn template_post_failed(&mut self, pin: Option<usize>, newest: u64, e: PostError) -> PostError {
        if let Some(i) = pin {
            let p = &mut self.pending_mut().send;
            if e.posted > 0 && newest != 0 {
                p.pin_posted(i, newest);
            } else {
                p.unpin_unused(i);
            }
        }
        e
    }

    /// The template's source, to write in place between rounds of
    /// requests: refused while a request posted from it may still be
    /// outstanding on this QP, when another handle of the source exists
    /// (a clone, another template, a request of another QP or of
    /// [`post_send`](Self::post_send)), and for a template of another QP
    /// or with no source.
    ///
    /// ```no_run
    /// # fn f(qp: &mut rdma_verbs::QueuePair, src: rdma_verbs::SharedChunk,
    /// #      remote: rdma_verbs::qp::RemoteAddr) -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_verbs::qp::SendOp;
    /// let mut write = qp.send_template(SendOp::RdmaWrite(remote), Some((&src, 64)))?;
    /// drop(src); // the template's handle is now the only one
    /// qp.template_source_mut(&mut write)?[63] = 1;
    /// qp.post_template(&write, [(1, true)])?;
    /// // ... once its completion was reclaimed:
    /// qp.template_source_mut(&mut write)?[63] = 2;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for each
    /// refusal above.
    pub fn template_source_mut<'t>(&mut self, t: &'t mut SendTemplate) -> Result<&'t mut [u8]> {
        const VERB: &str = "ibv_post_send";
        if t.qp != self.id() {
            return Err(Error::invalid(VERB, "the template was made for another QP"));
        }
        let Some((src, _)) = t.src.as_mut() else {
            return Err(Error::invalid(VERB, "the template has no source"));
        };
        if self.pending().send.pinned(&t.keeper) {
            return Err(Error::invalid(
                VERB,
                "a request posted from the template may still be outstanding \
                 (reclaim its completion first)",
            ));
        }
        // Nothing outstanding: a handle a dropped clone left is needed no
        // more.
        drop(t.keeper.take_left());
        match src.get_mut() {
            Some(chunk) => Ok(chunk.as_mut_slice()),
            None => Err(Error::invalid(
                VERB,
                "the template's source has other handles (clones, requests or other QPs)",
            )),
        }
    }
}

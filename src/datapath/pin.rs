//! Template sources kept by the QP: each [`SendTemplate`]
//! the QP posted from has a [`Pin`] in its bookkeeping, which keeps the
//! source alive while a request from it may be outstanding, so that the
//! requests' ledger records hold nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::entries::Loan;
use super::ledger::SendLedger;
use super::queues::SendQueue;
use super::template::{RawWr, SendTemplate};
use crate::mr::SharedChunk;
use crate::sys;

/// What a [`SendTemplate`] (with its clones) shares
/// with the QP it posts on: whether a request from it may be outstanding
/// there (`active`, kept by the QP), and the source's handle, which a
/// template dropped while `active` is set leaves here. The handle goes
/// with the family, or sooner, when a template of the family asks for its
/// source ([`QueuePair::template_source_mut`](super::QueuePair::template_source_mut))
/// with nothing outstanding: the posts and completions never look at it.
#[derive(Debug, Default)]
pub(crate) struct Keeper {
    handle: Mutex<Option<SharedChunk>>,
    pub(super) active: AtomicBool,
}

impl Keeper {
    /// A template of the family is dropped: its handle stays here while a
    /// request from the family may be outstanding.
    pub(super) fn leave(&self, src: SharedChunk) {
        if self.active.load(Ordering::Acquire) {
            *self.lock() = Some(src);
        }
    }

    /// The handle a dropped template left, taken out (the caller has made
    /// sure no request needs it).
    pub(super) fn take_left(&self) -> Option<SharedChunk> {
        self.lock().take()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<SharedChunk>> {
        // Only whole `Option`s are stored under it.
        self.handle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The QP's record of a template (family: the clones share `keeper`):
/// `last` is the tag of the newest request posted from it (0: none yet).
/// Send queues complete in order, so once `last` is no longer outstanding
/// (completed, or handed back by a RESET) no request from it is: that
/// alone decides whether the source may go. `last` is set only for
/// requests the ledger keeps (never for an undone insert, whose stamp may
/// be issued again).
///
/// The source stays alive while a request is outstanding: the template
/// holds a handle of it, and `keeper.active` is set (before the post call
/// returns, so before the template can be dropped) until the QP sees
/// `last` end; a template dropped meanwhile leaves its handle in `keeper`,
/// which the pin holds. After that the QP clears `active` (a template
/// dropped then keeps nothing here), and lets go of the pin once no
/// template of the family is left. While a template lives, the QP adds no
/// handle, so its source stays writable between rounds.
pub(crate) struct Pin {
    pub(super) keeper: Arc<Keeper>,
    pub(super) last: u64,
    /// The QP's copy of `keeper.active` (only the QP writes it).
    pub(super) active: bool,
    /// The template's raw request and entry, copied once when the pin is
    /// made (a family's clones share them), which a one-request post
    /// fills in place ([`raw_for`](Self::raw_for)).
    raw: RawWr,
    sge: sys::ibv_sge,
}

impl Pin {
    /// Inactive, and no template of it is left: nothing needs it.
    #[inline]
    fn orphan(&self) -> bool {
        !self.active && Arc::strong_count(&self.keeper) == 1
    }

    /// After a send completion (`idle`: the send queue is empty): becomes
    /// inactive if none of its requests is outstanding in `send` any more
    /// (a template dropped from now on keeps nothing here); whether it is
    /// now an orphan.
    #[inline(always)]
    fn settle(&mut self, send: &SendLedger<Loan>, idle: bool) -> bool {
        if self.active && (idle || !send.outstanding(self.last)) {
            self.active = false;
            self.keeper.active.store(false, Ordering::Release);
        }
        self.orphan()
    }

    /// Marks the pin as holding requests up to tag `last` (kept by the
    /// ledger), before the post call returns.
    #[inline(always)]
    pub(super) fn posted(&mut self, last: u64) {
        self.last = last;
        if !self.active {
            self.active = true;
            self.keeper.active.store(true, Ordering::Release);
        }
    }

    /// The pin's raw request as one request `tag` (signalled or not),
    /// its entry pointer at the pin's own entry: valid for a post call
    /// made before the pin is touched again.
    #[inline(always)]
    pub(super) fn raw_for(&mut self, tag: u64, signaled: bool) -> *mut sys::ibv_send_wr {
        let wr = &mut self.raw.0;
        wr.wr_id = tag;
        wr.send_flags = if signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        wr.sg_list = &mut self.sge;
        wr
    }
}

impl SendQueue {
    /// The index of the QP's pin of template `t` (its family: the
    /// template's keeper), made if there is none.
    #[inline(always)]
    pub(super) fn pin(&mut self, t: &SendTemplate) -> usize {
        // The common case, the QP's one template, straight on.
        if let Some(p) = self.pins.first() {
            if Arc::ptr_eq(&p.keeper, &t.keeper) {
                return 0;
            }
        }
        self.pin_other(t)
    }

    /// The QP's pin of template `t`, made if there is none.
    #[inline(always)]
    pub(super) fn pin_mut(&mut self, t: &SendTemplate) -> &mut Pin {
        let i = self.pin(t);
        &mut self.pins[i]
    }

    /// [`pin`](Self::pin) for a template that is not the first pinned.
    #[inline(never)]
    fn pin_other(&mut self, t: &SendTemplate) -> usize {
        match self
            .pins
            .iter()
            .position(|p| Arc::ptr_eq(&p.keeper, &t.keeper))
        {
            Some(i) => i,
            None => self.new_pin(t),
        }
    }

    /// Marks pin `i` as holding requests up to tag `last` (kept by the
    /// ledger), before the post call returns.
    #[inline]
    pub(super) fn pin_posted(&mut self, i: usize, last: u64) {
        if let Some(p) = self.pins.get_mut(i) {
            p.posted(last);
        }
    }

    /// Lets go of pin `i` if nothing was ever posted through it (its
    /// first post call was refused whole).
    #[inline]
    pub(super) fn unpin_unused(&mut self, i: usize) {
        if self.pins.get(i).is_some_and(|p| p.last == 0) {
            self.pins.swap_remove(i);
        }
    }

    /// Whether a request posted from the template whose keeper is `keeper`
    /// may still be outstanding here.
    pub(super) fn pinned(&self, keeper: &Arc<Keeper>) -> bool {
        self.ledger.len() > 0
            && self
                .pins
                .iter()
                .any(|p| Arc::ptr_eq(&p.keeper, keeper) && self.ledger.outstanding(p.last))
    }

    /// After a send completion: the pins whose requests all ended become
    /// inactive (a template dropped from now on keeps nothing here), and
    /// those whose templates are all gone go (with the handle a template
    /// left), as a request's own handle would.
    #[inline(always)]
    pub(super) fn settle_pins(&mut self) {
        let send = &self.ledger;
        // An empty send queue (the common case of a round of requests
        // ended) holds none of any pin's.
        let idle = send.len() == 0;
        // The common case, one template, straight on (no loop, no call).
        if let [p] = &mut self.pins[..] {
            if p.settle(send, idle) {
                self.drop_orphan_pins();
            }
            return;
        }
        self.settle_many_pins(idle);
    }

    /// [`settle_pins`](Self::settle_pins) for two templates or more.
    #[inline(never)]
    fn settle_many_pins(&mut self, idle: bool) {
        let send = &self.ledger;
        let mut orphans = false;
        for p in self.pins.iter_mut() {
            orphans |= p.settle(send, idle);
        }
        if orphans {
            self.drop_orphan_pins();
        }
    }

    /// Lets go of the inactive pins no template is left of.
    #[cold]
    #[inline(never)]
    fn drop_orphan_pins(&mut self) {
        self.pins.retain(|p| !p.orphan());
    }

    /// A new pin (after letting go of orphans, so that there are never
    /// more pins than live templates and templates with outstanding
    /// requests).
    #[cold]
    #[inline(never)]
    fn new_pin(&mut self, t: &SendTemplate) -> usize {
        self.drop_orphan_pins();
        self.pins.push(Pin {
            keeper: t.keeper.clone(),
            last: 0,
            active: false,
            raw: t.raw,
            sge: t.sge,
        });
        self.pins.len() - 1
    }

    /// After a RESET: no request is outstanding, so no template source is
    /// needed.
    pub(super) fn release_pins(&mut self) {
        for p in self.pins.drain(..) {
            p.keeper.active.store(false, Ordering::Release);
        }
    }
}

//! The ledger's whole-queue walks, for cold paths only: after a RESET or
//! the queue's destruction ([`Ledger::drain`]), and the look-up of a
//! payload by predicate ([`Ledger::any_live`]).

use super::{Ledger, Payload, Released};

impl<T: Payload, const RING: bool> Ledger<T, RING> {
    /// On a receive queue or an SRQ (free list): whether an outstanding
    /// request satisfies `f(wr_id, payload)`. Visits every slot (for cold
    /// paths only); `false` on a send queue.
    pub(crate) fn any_live(&self, mut f: impl FnMut(u64, &T) -> bool) -> bool {
        if RING || self.live == 0 {
            return false;
        }
        (self.slots.iter()).any(|s| s.stamp != 0 && s.load.as_ref().is_some_and(|p| f(s.wr_id, p)))
    }

    /// Hands back every outstanding request, oldest first (after the queue
    /// was reset or destroyed).
    pub(crate) fn drain(&mut self, mut f: impl FnMut(Released<T>)) -> usize {
        if self.live == 0 {
            return 0;
        }
        let n = self.live;
        if RING {
            let tail = self.tail;
            for k in 0..n as u64 {
                let i = ((tail + k) & self.slots.mask()) as usize;
                if let Some(r) = self.take(i, false) {
                    f(r);
                }
            }
            self.tail += n as u64;
        } else {
            let mut live: Vec<(u64, usize)> = (self.slots.iter().enumerate())
                .filter(|(_, s)| s.stamp != 0)
                .map(|(i, s)| (s.stamp, i))
                .collect();
            live.sort_unstable();
            for (_, i) in live {
                if let Some(r) = self.take(i, false) {
                    f(r);
                }
            }
        }
        n
    }
}

//! A ledger's slot array (see the parent module's "Layout, and why it is
//! sound"): made in place, and reached by any number mod its length with
//! no bounds check. The ledger's two `unsafe` blocks are here.

use std::mem::ManuallyDrop;

/// One slot: free (`stamp` 0; on a receive queue `wr_id` then links the
/// free list) or an outstanding request. 48 bytes for the crate's loans:
/// stamp, the caller's `wr_id`, and a 32-byte payload.
pub(super) struct Slot<T> {
    pub(super) stamp: u64,
    pub(super) wr_id: u64,
    /// `Some` exactly when `stamp` is not 0. `ManuallyDrop`: dropping the
    /// slot array visits no slot; [`Ledger`]'s `Drop` takes what is left.
    pub(super) load: ManuallyDrop<Option<T>>,
}

/// A ledger's slot array: a power of two of them, reached by any number
/// mod their count ([`at`](Slots::at)), with no bounds check.
pub(super) struct Slots<T> {
    /// `mask + 1` slots, for the array's whole life.
    arr: Box<[Slot<T>]>,
    mask: u64,
}

impl<T> Slots<T> {
    /// `len` (a power of two) free slots, at least one; the free list
    /// links slot i to i + 1 (the ring ignores the links).
    pub(super) fn new(len: usize) -> Self {
        debug_assert!(len.max(1).is_power_of_two());
        // At least one slot, so that `mask` is `arr.len() - 1` whatever
        // the caller passed (and `x & mask` always a slot of the array).
        let mut arr = Box::<[Slot<T>]>::new_uninit_slice(len.max(1));
        for (i, s) in arr.iter_mut().enumerate() {
            s.write(Slot {
                stamp: 0,
                wr_id: i as u64 + 1,
                load: ManuallyDrop::new(None),
            });
        }
        // Written in place rather than collected from an iterator: about
        // 100 instructions fewer per 16-slot array.
        // SAFETY: the loop above wrote every element (it cannot stop
        // early: a write does not panic).
        let arr = unsafe { arr.assume_init() };
        Slots {
            mask: arr.len() as u64 - 1,
            arr,
        }
    }

    /// The slot count less one (a power of two less one).
    #[inline(always)]
    pub(super) fn mask(&self) -> u64 {
        self.mask
    }

    /// Every slot, in order (the cold walks).
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Slot<T>> {
        self.arr.iter()
    }

    /// Every slot, in order, mutable.
    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Slot<T>> {
        self.arr.iter_mut()
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.arr.len()
    }

    /// The slot `x` falls in (`x` mod the slot count).
    #[inline(always)]
    pub(super) fn at(&self, x: u64) -> &Slot<T> {
        let i = (x & self.mask) as usize;
        debug_assert!(i < self.arr.len());
        // `i <= mask`, and `arr.len() == mask + 1` (both set in `new`
        // from the same non-empty array, neither ever changed).
        // SAFETY: so `i` is in bounds.
        unsafe { self.arr.get_unchecked(i) }
    }

    /// [`at`](Self::at), mutable.
    #[inline(always)]
    pub(super) fn at_mut(&mut self, x: u64) -> &mut Slot<T> {
        let i = (x & self.mask) as usize;
        debug_assert!(i < self.arr.len());
        // SAFETY: as in `at`: `i <= mask == arr.len() - 1`.
        unsafe { self.arr.get_unchecked_mut(i) }
    }
}

//! Who still uses an object: per-kind counts of the children that keep a
//! parent alive, for [`Error::InUse`](crate::Error::InUse).
//!
//! A child keeps its parent alive with a clone of the parent's handle (an
//! `Arc`), which says nothing about who holds it. So each parent that can
//! name its users (context, PD, CQ, SRQ) has a [`UserCounts`], and each
//! child holds a [`Tally`] beside its clone: made when the child is
//! created, dropped with it. The counts are touched only then, never on
//! the data path. Whatever holds the parent without a tally is one of its
//! own handles (a clone the program made).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A kind of object that can keep another alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum UserKind {
    /// A protection domain (`ibv_pd`), of a context.
    ProtectionDomain,
    /// A completion queue (`ibv_cq`), of a context.
    CompletionQueue,
    /// A completion channel (`ibv_comp_channel`), of a context.
    CompletionChannel,
    /// A CM id (`rdma_cm_id`) on the context librdmacm opened.
    CmId,
    /// A queue pair (`ibv_qp`), of a context, PD, CQ or SRQ.
    QueuePair,
    /// A shared receive queue (`ibv_srq`), of a PD.
    SharedReceiveQueue,
    /// A memory region (`ibv_mr`), of a PD (however many chunks it was
    /// split into).
    MemoryRegion,
    /// A memory window (`ibv_mw`), of a PD.
    MemoryWindow,
    /// An address handle (`ibv_ah`), of a PD.
    AddressHandle,
}

impl UserKind {
    const ALL: [UserKind; 9] = [
        UserKind::ProtectionDomain,
        UserKind::CompletionQueue,
        UserKind::CompletionChannel,
        UserKind::CmId,
        UserKind::QueuePair,
        UserKind::SharedReceiveQueue,
        UserKind::MemoryRegion,
        UserKind::MemoryWindow,
        UserKind::AddressHandle,
    ];

    /// The kind's name for one object and for several.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            UserKind::ProtectionDomain => ("protection domain", "protection domains"),
            UserKind::CompletionQueue => ("completion queue", "completion queues"),
            UserKind::CompletionChannel => ("completion channel", "completion channels"),
            UserKind::CmId => ("CM id", "CM ids"),
            UserKind::QueuePair => ("queue pair", "queue pairs"),
            UserKind::SharedReceiveQueue => ("shared receive queue", "shared receive queues"),
            UserKind::MemoryRegion => ("memory region", "memory regions"),
            UserKind::MemoryWindow => ("memory window", "memory windows"),
            UserKind::AddressHandle => ("address handle", "address handles"),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What still used an object when [`close`](crate::ProtectionDomain::close)
/// was refused: how many objects of each kind, and how many other handles
/// (clones of the object itself).
///
/// Contexts, protection domains, completion queues and shared receive
/// queues name their users by kind; other objects (regions, windows,
/// address handles, channels, CM ids) only count them
/// ([`is_itemized`](Self::is_itemized) is false).
///
/// Its `Display` is the list [`Error::InUse`](crate::Error::InUse) prints:
/// `2 queue pairs, 1 memory region, 1 other handle (a clone)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InUseBy {
    kinds: Vec<(UserKind, usize)>,
    others: usize,
    itemized: bool,
    /// The users of a memory region, which are named as such.
    region: bool,
}

impl InUseBy {
    /// Users nobody named: `users` of them in all.
    pub(crate) fn uncounted(users: usize) -> Self {
        InUseBy {
            kinds: Vec::new(),
            others: users,
            itemized: false,
            region: false,
        }
    }

    /// A memory region's users, which it does not count by kind: the
    /// chunks and shared chunks cut from it (out, or in posted requests),
    /// the memory windows bound to it, and its other handles.
    pub(crate) fn region_users(users: usize) -> Self {
        InUseBy {
            region: true,
            ..InUseBy::uncounted(users)
        }
    }

    /// How many objects of `kind` use it.
    pub fn count(&self, kind: UserKind) -> usize {
        self.kinds
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |&(_, n)| n)
    }

    /// The kinds of object that use it, each with its count (none of 0).
    pub fn kinds(&self) -> &[(UserKind, usize)] {
        &self.kinds
    }

    /// The users that are no object of a named kind: for an itemized
    /// breakdown the object's other handles (its clones); otherwise every
    /// user.
    pub fn others(&self) -> usize {
        self.others
    }

    /// Whether the users are named by kind.
    pub fn is_itemized(&self) -> bool {
        self.itemized
    }
}

impl fmt::Display for InUseBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut item = |f: &mut fmt::Formatter<'_>, n: usize, name: &str| {
            let sep = if first { "" } else { ", " };
            first = false;
            write!(f, "{sep}{n} {name}")
        };
        for &(kind, n) in &self.kinds {
            let (one, many) = kind.names();
            item(f, n, if n == 1 { one } else { many })?;
        }
        match (self.itemized, self.others) {
            (true, 0) => Ok(()),
            (true, 1) => item(f, 1, "other handle (a clone)"),
            (true, n) => item(f, n, "other handles (clones)"),
            (false, 1) if self.region => {
                item(f, 1, "chunk, bound window or other handle naming it")
            }
            (false, n) if self.region => {
                item(f, n, "chunks, bound windows or other handles naming it")
            }
            (false, 1) => item(f, 1, "other handle or object"),
            (false, n) => item(f, n, "other handles or objects"),
        }
    }
}

/// The per-kind user counts of one parent object.
#[derive(Default)]
pub(crate) struct UserCounts {
    objects: [AtomicUsize; UserKind::ALL.len()],
    /// The parent's handle clones the tallied objects hold (a QP whose
    /// send and receive CQ are one CQ holds two of it).
    refs: AtomicUsize,
}

impl UserCounts {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(UserCounts::default())
    }

    /// The breakdown of `users` users (the parent's handles other than
    /// the one being closed).
    pub(crate) fn breakdown(&self, users: usize) -> InUseBy {
        let kinds: Vec<_> = UserKind::ALL
            .iter()
            .map(|&k| (k, self.objects[k.index()].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        // Children dropped or created by other threads meanwhile can make
        // the two reads disagree for a moment; never below zero.
        let others = users.saturating_sub(self.refs.load(Ordering::Relaxed));
        InUseBy {
            kinds,
            others,
            itemized: true,
            ..InUseBy::uncounted(0)
        }
    }
}

/// One object's entry in its parent's [`UserCounts`], for as long as the
/// object lives.
pub(crate) struct Tally {
    counts: Arc<UserCounts>,
    kind: UserKind,
    refs: usize,
}

impl Tally {
    /// Counts one object of `kind` that holds `refs` clones of the parent.
    pub(crate) fn new(counts: &Arc<UserCounts>, kind: UserKind, refs: usize) -> Self {
        counts.objects[kind.index()].fetch_add(1, Ordering::Relaxed);
        counts.refs.fetch_add(refs, Ordering::Relaxed);
        Tally {
            counts: Arc::clone(counts),
            kind,
            refs,
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.counts.objects[self.kind.index()].fetch_sub(1, Ordering::Relaxed);
        self.counts.refs.fetch_sub(self.refs, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kinds_and_clones() {
        let c = UserCounts::new();
        let q1 = Tally::new(&c, UserKind::QueuePair, 1);
        let _q2 = Tally::new(&c, UserKind::QueuePair, 2);
        let _m = Tally::new(&c, UserKind::MemoryRegion, 1);
        // 4 refs by tallied objects, one clone.
        let by = c.breakdown(5);
        assert_eq!(
            by.to_string(),
            "2 queue pairs, 1 memory region, 1 other handle (a clone)"
        );
        assert_eq!(by.count(UserKind::QueuePair), 2);
        assert_eq!(by.count(UserKind::AddressHandle), 0);
        assert_eq!(by.others(), 1);
        drop(q1);
        assert_eq!(c.breakdown(3).to_string(), "1 queue pair, 1 memory region");
        assert_eq!(
            c.breakdown(5).to_string(),
            "1 queue pair, 1 memory region, 2 other handles (clones)"
        );
        assert_eq!(
            InUseBy::uncounted(3).to_string(),
            "3 other handles or objects"
        );
        assert_eq!(
            InUseBy::uncounted(1).to_string(),
            "1 other handle or object"
        );
        // A momentary disagreement never underflows.
        assert_eq!(c.breakdown(1).others(), 0);
    }
}

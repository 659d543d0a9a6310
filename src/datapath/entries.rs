//! What requests lend the device: one entry inline ([`Lent`]), two or
//! more in one box ([`Entries`]), a request's [`Data`] as it is built, and
//! the 32-byte [`Loan`] a queue's ledger keeps while the request is
//! outstanding.

use crate::ah::AddressHandle;
use crate::mr::{Chunk, SharedChunk};
use crate::sys;

use super::request::MAX_SGE;

/// A chunk lent to the device: owned (handed back when the request ends)
/// or a clone of a [`SharedChunk`] (let go when it ends).
pub(crate) enum Lent {
    Own(Chunk),
    Shared(SharedChunk),
}

impl Lent {
    #[inline]
    pub(crate) fn chunk(&self) -> &Chunk {
        match self {
            Lent::Own(c) => c,
            Lent::Shared(s) => s.chunk(),
        }
    }
}

/// The entries of a request of two or more, or of one whose entries were
/// refused as they were added: boxed, so that the common request stays
/// small. The box travels with the request into the ledger and back.
pub(crate) struct Entries {
    pub(crate) lent: [Option<Lent>; MAX_SGE],
    pub(crate) lens: [u32; MAX_SGE],
    pub(crate) n: usize,
    /// Entries refused as they were added (past [`MAX_SGE`], or a length
    /// past their chunk's end or above `u32::MAX`), and why the first was:
    /// their owned chunks are kept, never dropped, so that the refusal at
    /// post time hands them back.
    refused: Vec<Chunk>,
    refused_n: usize,
    why: Option<String>,
}

impl Entries {
    fn new() -> Box<Self> {
        Box::new(Entries {
            lent: Default::default(),
            lens: [0; MAX_SGE],
            n: 0,
            refused: Vec::new(),
            refused_n: 0,
            why: None,
        })
    }

    pub(crate) fn push(&mut self, lent: Lent, len: usize) {
        let index = self.n + self.refused_n;
        match sge_refusal(index, self.n, len, lent.chunk().len()) {
            None if self.refused_n == 0 => {
                self.lent[self.n] = Some(lent);
                self.lens[self.n] = len as u32;
                self.n += 1;
            }
            why => self.refuse(lent, why.unwrap_or_default()),
        }
    }

    fn refuse(&mut self, lent: Lent, why: String) {
        self.refused_n += 1;
        self.why.get_or_insert(why);
        if let Lent::Own(c) = lent {
            self.refused.push(c);
        }
    }

    /// The accepted entries.
    #[inline]
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Chunk, u32)> + '_ {
        self.lent[..self.n]
            .iter()
            .zip(&self.lens)
            .filter_map(|(l, &len)| l.as_ref().map(|l| (l.chunk(), len)))
    }

    /// Moves every owned chunk, refused ones last, to `out`.
    fn give_back(self, out: &mut Vec<Chunk>) {
        let Entries { lent, refused, .. } = self;
        out.extend(lent.into_iter().flatten().filter_map(Lent::owned));
        out.extend(refused);
    }
}

impl Lent {
    #[inline]
    pub(crate) fn owned(self) -> Option<Chunk> {
        match self {
            Lent::Own(c) => Some(c),
            Lent::Shared(_) => None,
        }
    }
}

/// A request's data: nothing, one entry, inline bytes, or boxed entries.
pub(crate) enum Data<'a> {
    None,
    One(Lent, u32),
    Inline(&'a [u8]),
    Many(Box<Entries>),
}

impl<'a> Data<'a> {
    /// Adds `lent` (its first `len` bytes) as the next entry.
    #[inline(always)]
    pub(crate) fn push(&mut self, lent: Lent, len: usize) {
        if let Data::None = self {
            if len <= lent.chunk().len() && len <= u32::MAX as usize {
                *self = Data::One(lent, len as u32);
                return;
            }
        }
        self.push_more(lent, len);
    }

    /// The rare cases: a second entry, a refused one, chunks after inline
    /// data.
    #[cold]
    #[inline(never)]
    fn push_more(&mut self, lent: Lent, len: usize) {
        match std::mem::replace(self, Data::None) {
            Data::None => {
                let mut e = Entries::new();
                e.push(lent, len);
                *self = Data::Many(e);
            }
            Data::One(first, first_len) => {
                let mut e = Entries::new();
                e.push(first, first_len as usize);
                e.push(lent, len);
                *self = Data::Many(e);
            }
            Data::Inline(_) => {
                let mut e = Entries::new();
                e.refuse(lent, "inline data and chunks in one request".into());
                *self = Data::Many(e);
            }
            Data::Many(mut e) => {
                e.push(lent, len);
                *self = Data::Many(e);
            }
        }
    }

    /// Sets inline data: refused (at post time) with chunks.
    #[inline]
    pub(crate) fn set_inline(&mut self, data: &'a [u8]) {
        match self {
            Data::None | Data::Inline(_) => *self = Data::Inline(data),
            _ => self.refuse_inline(),
        }
    }

    #[cold]
    #[inline(never)]
    fn refuse_inline(&mut self) {
        let mut e = match std::mem::replace(self, Data::None) {
            Data::One(first, len) => {
                let mut e = Entries::new();
                e.push(first, len as usize);
                e
            }
            Data::Many(e) => e,
            Data::None | Data::Inline(_) => Entries::new(),
        };
        e.refused_n += 1;
        e.why
            .get_or_insert_with(|| "inline data and chunks in one request".into());
        *self = Data::Many(e);
    }

    /// Why entries were refused when they were added, with counts.
    pub(crate) fn refusal(&self) -> Option<String> {
        match self {
            Data::Many(e) if e.refused_n > 0 => Some(format!(
                "{} ({} entries given, {} refused)",
                e.why.as_deref().unwrap_or(""),
                e.n + e.refused_n,
                e.refused_n
            )),
            _ => None,
        }
    }

    /// How many chunk entries.
    #[inline]
    pub(crate) fn chunk_count(&self) -> usize {
        match self {
            Data::None | Data::Inline(_) => 0,
            Data::One(..) => 1,
            Data::Many(e) => e.n,
        }
    }

    /// The chunk entries with their lengths.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&Chunk, u32)> + '_ {
        let (one, many) = match self {
            Data::One(l, len) => (Some((l.chunk(), *len)), None),
            Data::Many(e) => (None, Some(e.entries())),
            Data::None | Data::Inline(_) => (None, None),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// The total length of the chunk entries.
    pub(crate) fn total(&self) -> u64 {
        self.entries().map(|(_, l)| u64::from(l)).sum()
    }

    /// Whether an entry is a [`SharedChunk`] (which the device may only read).
    pub(crate) fn has_shared(&self) -> bool {
        match self {
            Data::One(l, _) => matches!(l, Lent::Shared(_)),
            Data::Many(e) => e.lent[..e.n]
                .iter()
                .any(|l| matches!(l, Some(Lent::Shared(_)))),
            Data::None | Data::Inline(_) => false,
        }
    }

    /// Writes the raw entries to `out` (room for [`MAX_SGE`]); returns how
    /// many.
    #[inline(always)]
    pub(crate) fn fill(&self, out: &mut [sys::ibv_sge]) -> usize {
        match self {
            Data::None => 0,
            Data::One(l, len) => {
                let c = l.chunk();
                out[0] = sys::ibv_sge {
                    addr: c.addr(),
                    length: *len,
                    lkey: c.lkey(),
                };
                1
            }
            Data::Inline(d) => {
                out[0] = sys::ibv_sge {
                    addr: d.as_ptr() as u64,
                    length: d.len() as u32,
                    lkey: 0,
                };
                1
            }
            Data::Many(e) => {
                let mut n = 0;
                for ((c, len), s) in e.entries().zip(out.iter_mut()) {
                    *s = sys::ibv_sge {
                        addr: c.addr(),
                        length: len,
                        lkey: c.lkey(),
                    };
                    n += 1;
                }
                n
            }
        }
    }

    /// What the request lends the device while outstanding.
    #[inline(always)]
    pub(crate) fn into_loan(self) -> Loan {
        match self {
            Data::None | Data::Inline(_) => Loan::Empty,
            Data::One(l, _) => Loan::One(l),
            Data::Many(e) => Loan::Many(e),
        }
    }

    /// Moves every owned chunk (a refused request's) to `out`.
    pub(crate) fn give_back(self, out: &mut Vec<Chunk>) {
        match self {
            Data::None | Data::Inline(_) => {}
            Data::One(l, _) => out.extend(l.owned()),
            Data::Many(e) => e.give_back(out),
        }
    }
}

/// What an outstanding request lends the device, as its queue's ledger
/// keeps it (32 bytes).
#[derive(Default)]
pub(crate) enum Loan {
    /// No chunk (inline data, a zero-length send, a receive without a
    /// buffer, a memory-window request).
    #[default]
    Empty,
    /// One entry.
    One(Lent),
    /// Two or more entries.
    Many(Box<Entries>),
    /// In the send queue's side table, at the request's slot (a UD
    /// destination's address handle, a memory-window loan).
    Side,
    /// A buffer of a [`RecvBuffers`](super::RecvBuffers) pool posted to a
    /// QP: the request's `wr_id` names the pool and the buffer, the pool
    /// keeps the buffer's chunk, and the QP's pool pin keeps the region
    /// while any such record is outstanding (so the record holds nothing).
    Pooled,
}

impl super::ledger::Payload for Loan {
    /// Only [`Loan::Empty`] and [`Loan::Pooled`] drop nothing.
    #[inline(always)]
    fn inert(&self) -> bool {
        matches!(self, Loan::Empty | Loan::Pooled)
    }
}

impl Loan {
    /// Gives the owned chunks to `out`, in scatter/gather order; shared
    /// ones are let go.
    #[inline(always)]
    pub(crate) fn give_owned<E: Extend<Chunk>>(self, out: &mut E) {
        if let Loan::One(Lent::Own(c)) = self {
            out.extend(Some(c));
        } else if !matches!(self, Loan::Empty | Loan::Side | Loan::Pooled) {
            // The rare cases (a clone to drop, a box to take apart) out of
            // line, so that the common ones inline into the caller.
            self.give_rare(out);
        }
    }

    #[cold]
    #[inline(never)]
    fn give_rare<E: Extend<Chunk>>(self, out: &mut E) {
        match self {
            Loan::Many(e) => out.extend(e.lent.into_iter().flatten().filter_map(Lent::owned)),
            other => drop(other),
        }
    }

    /// All owned chunks, for a refusal.
    pub(crate) fn give_back(self, out: &mut Vec<Chunk>) {
        match self {
            Loan::Many(e) => e.give_back(out),
            other => other.give_owned(out),
        }
    }

    /// The bytes a receive's loan offered the device: its buffers are
    /// whole chunks (or a request's listed lengths); 0 for a receive
    /// without a buffer; `None` where the loan does not know them (a
    /// pool's buffer, a send's side entry). Only a receive's loan is
    /// exact: a send's single entry may have lent part of its chunk.
    pub(crate) fn recv_bytes(&self) -> Option<u64> {
        match self {
            Loan::Empty => Some(0),
            Loan::One(l) => Some(l.chunk().len() as u64),
            Loan::Many(e) => Some(e.lens[..e.n].iter().map(|&l| u64::from(l)).sum()),
            Loan::Side | Loan::Pooled => None,
        }
    }

    /// How many owned chunks.
    pub(crate) fn owned_count(&self) -> usize {
        match self {
            Loan::One(Lent::Own(_)) => 1,
            Loan::Many(e) => e.lent[..e.n]
                .iter()
                .filter(|l| matches!(l, Some(Lent::Own(_))))
                .count(),
            _ => 0,
        }
    }
}

/// What a send request keeps in its queue's side table: its entries, the
/// address handle a UD send names, and for a memory-window bind or
/// invalidation the window and the region it was bound to before.
pub(crate) type SendLoan = (Loan, Option<AddressHandle>, Option<crate::mw::MwLoan>);

/// Why entry `index` of `len` bytes of a `chunk_len`-byte chunk, coming
/// after `n` accepted entries, cannot be taken; `None` if it can. Lengths
/// are refused, never truncated to the sge's 32 bits.
fn sge_refusal(index: usize, n: usize, len: usize, chunk_len: usize) -> Option<String> {
    if n >= MAX_SGE {
        Some(format!("entry {index} is one more than {MAX_SGE} entries"))
    } else if len > chunk_len {
        Some(format!(
            "entry {index}: length {len} is more than its chunk's {chunk_len} bytes"
        ))
    } else if u32::try_from(len).is_err() {
        Some(format!(
            "entry {index}: length {len} does not fit an sge's 32-bit length (at most {})",
            u32::MAX
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_lengths_are_refused_not_truncated() {
        let big = u32::MAX as usize + 1;
        // A length above u32::MAX, even of a chunk that long.
        let why = sge_refusal(0, 0, big, usize::MAX).expect("refused");
        assert!(
            why.contains("length 4294967296") && why.contains("32-bit"),
            "{why}"
        );
        let why = sge_refusal(2, 2, usize::MAX, 64).expect("refused");
        assert!(
            why.contains("entry 2") && why.contains("length 18446744073709551615"),
            "{why}"
        );
        assert!(why.contains("chunk's 64 bytes"), "{why}");
        let why = sge_refusal(MAX_SGE, MAX_SGE, 1, 64).expect("refused");
        assert!(why.contains(&format!("than {MAX_SGE} entries")), "{why}");
        assert_eq!(sge_refusal(0, 0, u32::MAX as usize, usize::MAX), None);
        assert_eq!(sge_refusal(0, 0, 0, 0), None);
        assert_eq!(sge_refusal(MAX_SGE - 1, MAX_SGE - 1, 64, 64), None);
    }
}

//! Copies in and out of memory the device may touch at the same time:
//! volatile loads and stores only, so no Rust reference to it is ever made.

/// The word the volatile copies move at once where the region side is aligned.
const WORD: usize = std::mem::size_of::<u64>();

/// Copies `out.len()` bytes from `src` into `out`, loading from `src` only
/// with volatile reads: single bytes until `src` is 8-byte aligned, aligned
/// `u64` words, then single bytes for the rest. For memory that something
/// outside the program (the device, a peer through it) may write meanwhile:
/// volatile loads are each done once, as written, and no reference to the
/// source is ever made. Bytes written during the copy may come out torn
/// (each byte is one value that byte held; nothing more is promised).
///
/// # Safety
/// `src..src + out.len()` is valid for reads and does not overlap `out`.
pub(super) unsafe fn volatile_read(src: *const u8, out: &mut [u8]) {
    let len = out.len();
    // `align_offset` may answer "cannot" (usize::MAX); then every byte is
    // copied singly, which is slower but just as correct.
    let head = src.align_offset(WORD).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`, so `src + i` is in the readable range (caller).
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
    while len - i >= WORD {
        // `src + i .. src + i + 8` is in the readable range (`i + 8 <=
        // len`), and `src + i` is 8-byte aligned: `src + head` is (`head <
        // len` here, so it is the real `align_offset`), and `i` advances
        // from `head` in steps of 8.
        // SAFETY: in range and aligned (above).
        let word = unsafe { src.add(i).cast::<u64>().read_volatile() };
        out[i..i + WORD].copy_from_slice(&word.to_ne_bytes());
        i += WORD;
    }
    while i < len {
        // SAFETY: `i < len`, as in the first loop.
        out[i] = unsafe { src.add(i).read_volatile() };
        i += 1;
    }
}

/// Copies `data` to `dst`, storing to `dst` only with volatile writes, in
/// the same pieces as [`volatile_read`].
///
/// # Safety
/// `dst..dst + data.len()` is valid for writes and does not overlap `data`.
pub(super) unsafe fn volatile_write(dst: *mut u8, data: &[u8]) {
    let len = data.len();
    // As in `volatile_read`: usize::MAX only makes the copy bytewise.
    let head = dst.align_offset(WORD).min(len);
    let mut i = 0;
    while i < head {
        // SAFETY: `i < len`, so `dst + i` is in the writable range (caller).
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
    }
    while len - i >= WORD {
        let word = u64::from_ne_bytes(data[i..i + WORD].try_into().expect("8 bytes"));
        // SAFETY: `dst + i .. dst + i + 8` is in the writable range
        // (`i + 8 <= len`) and 8-byte aligned, as argued in `volatile_read`.
        unsafe { dst.add(i).cast::<u64>().write_volatile(word) };
        i += WORD;
    }
    while i < len {
        // SAFETY: `i < len`, as in the first loop.
        unsafe { dst.add(i).write_volatile(data[i]) };
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 40-byte, 8-byte-aligned buffer holding 1, 2, 3, ...
    fn numbered() -> [u64; 5] {
        let mut words = [0u64; 5];
        for (i, w) in words.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            for (j, x) in b.iter_mut().enumerate() {
                *x = (i * 8 + j + 1) as u8;
            }
            *w = u64::from_ne_bytes(b);
        }
        words
    }

    fn bytes(words: &[u64; 5]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn volatile_read_copies_every_offset_and_length() {
        let words = numbered();
        let plain = bytes(&words);
        let base = words.as_ptr().cast::<u8>();
        for offset in 0..=(8 + 7) {
            for len in 0..=17 {
                let mut out = vec![0xeeu8; len];
                // SAFETY: offset + len <= 15 + 17 = 32 <= 40 bytes of `words`,
                // which `out` (a separate allocation) does not overlap.
                unsafe { volatile_read(base.add(offset), &mut out) };
                assert_eq!(
                    out,
                    plain[offset..offset + len],
                    "offset {offset} len {len}"
                );
            }
        }
    }

    #[test]
    fn volatile_write_touches_exactly_its_range() {
        let data: Vec<u8> = (0..17u8).map(|b| 0xa0 | b).collect();
        for offset in 0..=(8 + 7) {
            for len in 0..=17 {
                let mut words = numbered();
                let before = bytes(&words);
                let base = words.as_mut_ptr().cast::<u8>();
                // SAFETY: offset + len <= 32 <= 40 bytes of `words`, which
                // `data` (a separate allocation) does not overlap.
                unsafe { volatile_write(base.add(offset), &data[..len]) };
                let after = bytes(&words);
                assert_eq!(
                    after[..offset],
                    before[..offset],
                    "offset {offset} len {len}"
                );
                assert_eq!(
                    after[offset..offset + len],
                    data[..len],
                    "offset {offset} len {len}"
                );
                assert_eq!(
                    after[offset + len..],
                    before[offset + len..],
                    "offset {offset} len {len}"
                );
            }
        }
    }
}

//! Reading in place what a peer wrote (`MemoryRegion::view`, `PeerView`):
//! the view shows the peer's bytes where they landed, agrees with the copy
//! `read` makes, and may be read while the peer is writing.

use std::sync::atomic::Ordering::Relaxed;

use libtest_mimic::Failed;
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::{AccessFlags, Error, QpCaps, QpType, RegisterBuffer};

use crate::common::{pair, poll_n, reclaim_on, remote_region, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    words_and_bytes_show_what_the_peer_wrote,
    read_in_place_while_the_peer_writes,
    ranges_and_alignment_are_refused_typed,
];

const SLOT: usize = 4096;

/// The word `i` of message `m`.
fn word(m: usize, i: usize) -> u64 {
    ((m as u64) << 32) | i as u64 | 0xa5 << 56
}

/// Writes `chunk` to the region's `slot` from QP `a` and waits for it.
fn write_slot(
    p: &mut Pair,
    remote: rdma_verbs::RemoteBuf,
    slot: usize,
    chunk: rdma_verbs::Chunk,
) -> Result<rdma_verbs::Chunk, Failed> {
    let at = remote.at((slot * SLOT) as u64, SLOT as u64)?;
    p.a.post_send([SendWr::new(slot as u64, SendOp::RdmaWrite(at)).sge(chunk)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.is_success(), "{wc:?}");
    let mut back = reclaim_on(&mut [&mut p.a], &wc);
    Ok(back.pop().ok_or("the chunk did not come back")?.1)
}

/// Four messages into four slots: after each completion the slot's words
/// and bytes in place are the message, and fold to what the copy folds to.
fn words_and_bytes_show_what_the_peer_wrote(env: &Env) -> Result<(), Failed> {
    let mut p = pair(
        env,
        QpType::Rc,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE,
    )?;
    let region = remote_region(&p.pd, 4 * SLOT)?;
    let remote = region.remote_buf()?;
    let mut chunk =
        p.pd.alloc_chunks(1, SLOT, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    for m in 0..4 {
        for (i, w) in chunk.as_mut_slice().chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(m, i).to_ne_bytes());
        }
        chunk = write_slot(&mut p, remote, m, chunk)?;
        let view = region.view(m * SLOT, SLOT)?;
        let words = view.words()?;
        ensure!(words.len() == SLOT / 8, "{} words", words.len());
        for (i, w) in words.iter().enumerate() {
            let got = w.load(Relaxed);
            ensure!(got == word(m, i), "message {m} word {i}: {got:#x}");
        }
        ensure!(
            view.bytes()[8].load(Relaxed) == word(m, 1).to_ne_bytes()[0],
            "byte 8 of message {m}"
        );
        let in_place = words
            .iter()
            .fold(0u64, |s, w| s.wrapping_add(w.load(Relaxed)));
        let mut copy = vec![0u8; SLOT];
        region.read(m * SLOT, &mut copy)?;
        let copied = copy.chunks_exact(8).fold(0u64, |s, w| {
            s.wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()))
        });
        ensure!(
            in_place == copied,
            "in place {in_place:#x}, copy {copied:#x}"
        );
    }
    // The slots the view was not asked for are untouched by it: a view of
    // the whole region sees all four messages in order.
    let all = region.view(0, 4 * SLOT)?.words()?;
    ensure!(
        all[3 * SLOT / 8 + 5].load(Relaxed) == word(3, 5),
        "whole view"
    );
    Ok(())
}

/// 64 writes into one slot, each filling it with its number, posted at
/// once; the view is read over and over while they land. Every byte ever
/// seen is a number written so far, and no byte is ever seen to go back to
/// an older number (reads of one place by one thread are coherent), and at
/// the end the slot holds the last. Under valgrind this is the in-place
/// read racing the device's writes.
fn read_in_place_while_the_peer_writes(env: &Env) -> Result<(), Failed> {
    const WRITES: usize = 64;
    let caps = QpCaps {
        max_send_wr: WRITES as u32,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::REMOTE_WRITE)?;
    let region = remote_region(&p.pd, SLOT)?;
    let at = region.remote_buf()?.at(0, SLOT as u64)?;
    let mut chunks = p.pd.alloc_chunks(WRITES, SLOT, AccessFlags::LOCAL_WRITE)?;
    for (k, c) in chunks.iter_mut().enumerate() {
        c.as_mut_slice().fill(k as u8 + 1);
    }
    let wrs = chunks
        .into_iter()
        .enumerate()
        .map(|(k, c)| SendWr::new(k as u64, SendOp::RdmaWrite(at)).sge(c));
    p.a.post_send(wrs)?;
    let view = region.view(0, SLOT)?;
    let mut last = vec![0u8; SLOT];
    let (mut done, mut reads, mut wcs) = (0, 0usize, [rdma_verbs::WorkCompletion::default(); 16]);
    let start = std::time::Instant::now();
    while done < WRITES {
        for (i, b) in view.bytes().iter().enumerate() {
            let now = b.load(Relaxed);
            ensure!(
                now >= last[i] && usize::from(now) <= WRITES,
                "byte {i} read {now} after {} (read {reads})",
                last[i]
            );
            last[i] = now;
        }
        reads += 1;
        let polled = p.cq.poll(&mut wcs)?;
        for wc in polled.iter() {
            ensure!(wc.is_success(), "{wc:?}");
            reclaim_on(&mut [&mut p.a], wc);
        }
        done += polled.len();
        ensure!(
            start.elapsed() < crate::common::deadline(),
            "{done} of {WRITES} writes completed"
        );
    }
    ensure!(
        view.bytes()
            .iter()
            .all(|b| usize::from(b.load(Relaxed)) == WRITES),
        "the slot does not hold the last write"
    );
    println!("peer_view: {reads} whole reads of the slot while {WRITES} writes landed");
    Ok(())
}

/// Out of range, overflowing, misaligned: typed refusals naming the bytes.
/// A program's own buffer registered at an odd address views fine as
/// bytes, and its words are refused with the address.
fn ranges_and_alignment_are_refused_typed(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let region = remote_region(&pd, SLOT)?;
    for (off, len) in [(SLOT, 1), (1, SLOT), (usize::MAX, 2)] {
        match region.view(off, len) {
            Err(e @ Error::InvalidArgument { .. }) => {
                ensure!(
                    e.to_string().contains("outside the 4096-byte region"),
                    "{e}"
                )
            }
            other => return Err(format!("view({off}, {len}): {other:?}").into()),
        }
    }
    ensure!(
        region.view(SLOT, 0)?.is_empty(),
        "the empty view at the end"
    );
    let (a, b) = (region.view(0, 16)?, region.view(8, 16)?);
    ensure!(
        a.words()?.len() == 2 && b.words()?.len() == 2,
        "two views at once"
    );
    match region.view(4, 16)?.words() {
        Err(e @ Error::InvalidArgument { .. }) => {
            ensure!(e.to_string().contains("8-byte boundary"), "{e}")
        }
        other => return Err(format!("words at 4: {other:?}").into()),
    }
    // A Vec registered from its second byte on: not word-aligned anywhere.
    let odd = Odd(vec![7u8; 65]);
    let mr = pd.register_owned(odd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let v = mr.view(0, 64)?;
    ensure!(v.bytes()[63].load(Relaxed) == 7, "the odd buffer's bytes");
    ensure!(v.words().is_err(), "words of an odd address accepted");
    Ok(())
}

/// A `Vec` whose registered bytes start at its second byte.
struct Odd(Vec<u8>);

// SAFETY: the bytes are the Vec's own heap allocation but its first byte:
// the Vec owns them exclusively, and they stay where they are while the Vec
// is not used (moving the `Odd` moves only the Vec's pointer and lengths).
unsafe impl RegisterBuffer for Odd {
    fn bytes_to_register(&mut self) -> &mut [u8] {
        &mut self.0[1..]
    }
}

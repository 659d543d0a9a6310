//! Regions over memory the program owns (`register_owned`): every kind of
//! buffer used for send, receive, RDMA write, read and atomics and handed
//! back intact; the hand-back refused while anything names the region.
//! The other ways of registering are in `registration.rs`.

use std::ops::Deref;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, Error, MemoryRegion, Pages, QpCaps, QpType, RegisterBuffer};

use crate::common::{pair, poll_n, reclaim_on as reclaim, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    vec_round_trip,
    boxed_slice_round_trip,
    static_slice_round_trip,
    pages_round_trip,
    huge_or_normal_pages_round_trip,
    anonymous_mmap_round_trip,
    file_mmap_round_trip,
    bytes_mut_round_trip,
    buffer_not_back_while_a_chunk_or_request_names_it,
];

pub(super) const LEN: usize = 8192;
pub(super) const CHUNK: usize = 1024;
pub(super) const ALL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Byte `i` of the pattern with `seed`.
pub(super) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

pub(super) fn rc_pair(env: &Env) -> Result<Pair, Failed> {
    pair(
        env,
        QpType::Rc,
        QpCaps::default(),
        ALL_REMOTE - AccessFlags::LOCAL_WRITE,
    )
}

pub(super) fn one(p: &mut Pair, wr: SendWr) -> Result<Chunk, Failed> {
    p.a.post_send([wr])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.is_success(), "{wc:?}");
    Ok(reclaim(&mut [&mut p.a], &wc)
        .pop()
        .ok_or("no chunk back")?
        .1)
}

/// Registers `local` (split into chunks) and `target` (peers may write
/// it), runs a send and receive, an RDMA write, an RDMA read, a
/// compare-and-swap and a fetch-and-add through them, closes both and
/// checks every byte of both buffers handed back.
fn round_trip<B>(env: &Env, kind: &str, make: impl Fn(&[u8]) -> B) -> Result<(), Failed>
where
    B: RegisterBuffer + Deref<Target = [u8]>,
{
    let mut p = rc_pair(env)?;
    let (lp, tp) = (pattern(1, LEN), pattern(2, LEN));
    let local = p.pd.register_owned(make(&lp), AccessFlags::LOCAL_WRITE)?;
    let target = p.pd.register_owned(make(&tp), ALL_REMOTE)?;
    ensure!(local.len() == LEN && target.len() == LEN, "{kind}: lengths");
    let (local, chunks) = local.split(CHUNK)?;
    ensure!(
        chunks.len() == LEN / CHUNK,
        "{kind}: {} chunks",
        chunks.len()
    );
    ensure!(
        local.chunks_out() == chunks.len(),
        "{kind}: chunks_out {}",
        local.chunks_out()
    );
    ensure!(
        chunks[2].as_slice() == &lp[2 * CHUNK..3 * CHUNK],
        "{kind}: chunk 2 is not the buffer's bytes"
    );
    let mut chunks: Vec<Option<Chunk>> = chunks.into_iter().map(Some).collect();
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    };
    let (word, old) = operations(&mut p, kind, &mut chunks, remote, &lp, &tp)?;

    // Not yet: chunks 6 and 7 are out.
    ensure!(
        local.chunks_out() == 2,
        "{kind}: chunks_out {} with 2 held",
        local.chunks_out()
    );
    let local = expect_in_use(local.into_inner(), kind)?;
    drop(chunks);
    let local_back = local.into_inner()?;
    let target_back = target.into_inner()?;

    let mut want = lp.clone();
    want[CHUNK..CHUNK + 100].copy_from_slice(&lp[..100]);
    want[3 * CHUNK..4 * CHUNK].copy_from_slice(&tp[3000..3000 + CHUNK]);
    want[4 * CHUNK..4 * CHUNK + 8].copy_from_slice(&old.to_ne_bytes());
    want[5 * CHUNK..5 * CHUNK + 8].copy_from_slice(&40u64.to_ne_bytes());
    check(kind, "local", &local_back, &want)?;
    let mut want = tp.clone();
    want[1000..1000 + CHUNK].copy_from_slice(&lp[2 * CHUNK..3 * CHUNK]);
    want[word..word + 8].copy_from_slice(&42u64.to_ne_bytes());
    check(kind, "target", &target_back, &want)?;
    eprintln!("owned: {kind}: send, receive, write, read, atomics; both buffers back intact");
    Ok(())
}

/// Through chunks 0-5 of the local buffer (with pattern `lp`) and the
/// target at `remote` (pattern `tp`): chunk 0's first 100 bytes sent into
/// chunk 1; chunk 2 written to target[1000..]; target[3000..] read into
/// chunk 3; compare-and-swap (old -> 40) into chunk 4 and fetch-and-add
/// (+2) into chunk 5 on an aligned target word. Returns the word's offset
/// and its first value. The chunks used are dropped when they come back.
fn operations(
    p: &mut Pair,
    kind: &str,
    chunks: &mut [Option<Chunk>],
    remote: RemoteAddr,
    lp: &[u8],
    tp: &[u8],
) -> Result<(usize, u64), Failed> {
    let mut take = |i: usize| chunks[i].take().ok_or("each chunk once");
    p.b.post_recv([RecvWr::new(1).sge(take(1)?)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(take(0)?, 100)])?;
    let mut back = Vec::new();
    for wc in &poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "{kind}: send/recv {wc:?}");
        back.extend(reclaim(&mut [&mut p.a, &mut p.b], wc));
    }
    let recv = back
        .iter()
        .find(|(id, _)| *id == 1)
        .ok_or("no receive chunk")?;
    ensure!(
        recv.1.as_slice()[..100] == lp[..100],
        "{kind}: the receive holds other bytes"
    );

    let at = |off: u64| RemoteAddr {
        addr: remote.addr + off,
        rkey: remote.rkey,
    };
    one(p, SendWr::new(3, SendOp::RdmaWrite(at(1000))).sge(take(2)?))?;
    let r = one(p, SendWr::new(4, SendOp::RdmaRead(at(3000))).sge(take(3)?))?;
    ensure!(
        r.as_slice() == &tp[3000..3000 + CHUNK],
        "{kind}: the read brought other bytes"
    );

    let word = (4096 + (8 - remote.addr % 8) % 8) as usize;
    let old = u64::from_ne_bytes(tp[word..word + 8].try_into()?);
    let cas = SendOp::CompareSwap {
        remote: at(word as u64),
        compare: old,
        swap: 40,
    };
    let a = one(p, SendWr::new(5, cas).sge_len(take(4)?, 8))?;
    ensure!(
        a.as_slice()[..8] == old.to_ne_bytes(),
        "{kind}: compare-and-swap returned other bytes"
    );
    let faa = SendOp::FetchAdd {
        remote: at(word as u64),
        add: 2,
    };
    let f = one(p, SendWr::new(6, faa).sge_len(take(5)?, 8))?;
    ensure!(
        f.as_slice()[..8] == 40u64.to_ne_bytes(),
        "{kind}: fetch-and-add returned other bytes"
    );
    Ok((word, old))
}

fn check(kind: &str, which: &str, got: &[u8], want: &[u8]) -> Result<(), Failed> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!(
            "{kind}: {which} has {} bytes, expected {}",
            got.len(),
            want.len()
        )
        .into()),
        Some(i) => Err(format!(
            "{kind}: {which} byte {i} is {:#04x}, expected {:#04x}",
            got[i], want[i]
        )
        .into()),
    }
}

fn vec_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "Vec<u8>", |b| b.to_vec())
}

fn boxed_slice_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "Box<[u8]>", |b| b.to_vec().into_boxed_slice())
}

fn static_slice_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "&'static mut [u8]", |b| {
        &mut *Box::leak(b.to_vec().into_boxed_slice())
    })
}

fn pages_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "Pages", |b| {
        let mut p = Pages::new(b.len()).expect("pages");
        p.copy_from_slice(b);
        p
    })
}

fn huge_or_normal_pages_round_trip(env: &Env) -> Result<(), Failed> {
    let huge = Pages::huge_or_normal(1)?.is_huge();
    round_trip(
        env,
        if huge {
            "Pages (huge)"
        } else {
            "Pages (huge_or_normal: normal)"
        },
        |b| {
            let mut p = Pages::huge_or_normal(b.len()).expect("pages");
            p.copy_from_slice(b);
            p
        },
    )
}

fn anonymous_mmap_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "memmap2::MmapMut (anonymous)", |b| {
        let mut m = memmap2::MmapMut::map_anon(b.len()).expect("map_anon");
        m.copy_from_slice(b);
        m
    })
}

/// A shared mapping of a tmpfs file (`/dev/shm`): the device's writes land
/// in the file itself.
fn file_mmap_round_trip(env: &Env) -> Result<(), Failed> {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_owned()
    } else {
        std::env::temp_dir()
    };
    let n = std::sync::atomic::AtomicUsize::new(0);
    let paths = std::sync::Mutex::new(Vec::new());
    let result = round_trip(env, "memmap2::MmapMut (file)", |b| {
        let path = dir.join(format!(
            "rdma-verbs-owned-{}-{}",
            std::process::id(),
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::write(&path, b).expect("write the file");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        paths.lock().unwrap().push(path);
        // SAFETY: the test's own file, which nothing else changes while mapped.
        unsafe { memmap2::MmapMut::map_mut(&file) }.expect("map_mut")
    });
    // The target's file holds what the device wrote (page cache, no msync needed to read it back).
    let paths = paths.into_inner().unwrap();
    if result.is_ok() {
        let target = std::fs::read(&paths[1])?;
        let lp = pattern(1, LEN);
        ensure!(
            target[1000..1000 + CHUNK] == lp[2 * CHUNK..3 * CHUNK],
            "the RDMA write is not in the target's file"
        );
    }
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
    result
}

fn bytes_mut_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "bytes::BytesMut", |b| bytes::BytesMut::from(b))
}

/// The buffer comes back only when no chunk, posted request or receive
/// names the region: refused with `InUse` before, the region unchanged.
fn buffer_not_back_while_a_chunk_or_request_names_it(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let mr =
        p.pd.register_owned(pattern(3, 4 * CHUNK), AccessFlags::LOCAL_WRITE)?;
    let (region, mut chunks) = mr.split(CHUNK)?;
    let posted = chunks.pop().unwrap();
    p.b.post_recv([RecvWr::new(9).sge(posted)])?;
    drop(chunks);
    ensure!(
        region.chunks_out() == 1,
        "chunks_out {}",
        region.chunks_out()
    );
    // Refused with the region back, twice (the same call again), and rejoin
    // too; the message counts the chunk and says the region came back.
    let refused = match region.into_inner() {
        Err(r) => r,
        Ok(_) => return Err("into_inner with a receive posted: accepted".into()),
    };
    let m = refused.error().to_string();
    ensure!(
        m.starts_with("cannot hand back the buffer of the memory region now")
            && m.contains("used by 1 chunk, bound window or other handle naming it")
            && m.contains("comes back with this error")
            && !m.contains("destroyed"),
        "{m}"
    );
    let region = expect_in_use(refused.into_value().into_inner(), "into_inner again")?;
    let refused = match region.rejoin() {
        Err(r) => r,
        Ok(_) => return Err("rejoin with a receive posted: accepted".into()),
    };
    let m = refused.error().to_string();
    ensure!(
        m.starts_with("cannot rejoin the memory region now") && m.contains("comes back"),
        "{m}"
    );
    let region = refused.into_value();
    // The receive is still live: a send lands in it.
    let send =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(send, 10)])?;
    let wcs = poll_n(&p.cq, 2)?;
    let mut got = None;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        for (id, c) in reclaim(&mut [&mut p.a, &mut p.b], wc) {
            if id == 9 {
                got = Some(c);
            }
        }
    }
    let got = got.ok_or("the receive did not complete")?;
    ensure!(
        region.chunks_out() == 1,
        "the reclaimed chunk is held: chunks_out {}",
        region.chunks_out()
    );
    drop(got);
    let mut mr: MemoryRegion<Vec<u8>> = region.rejoin()?;
    mr.write(0, b"rejoined")?;
    let buf = mr.into_inner()?;
    ensure!(
        &buf[..8] == b"rejoined",
        "the rejoined region's write is not in the buffer"
    );
    ensure!(
        buf[3 * CHUNK..3 * CHUNK + 10] == [0u8; 10],
        "the received bytes are not in the buffer"
    );
    ensure!(
        buf[CHUNK..2 * CHUNK] == pattern(3, 4 * CHUNK)[CHUNK..2 * CHUNK],
        "untouched bytes changed"
    );
    Ok(())
}

pub(super) fn expect_in_use<T, R>(
    r: Result<T, rdma_verbs::Refused<R>>,
    what: &str,
) -> Result<R, Failed> {
    match r {
        Ok(_) => Err(format!("{what}: accepted").into()),
        Err(refused) => {
            ensure!(
                matches!(refused.error(), Error::InUse { .. }),
                "{what}: {}",
                refused.error()
            );
            Ok(refused.into_value())
        }
    }
}

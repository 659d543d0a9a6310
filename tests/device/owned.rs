//! Regions over memory the program owns (`register_owned`): every kind of
//! buffer used for send, receive, RDMA write, read and atomics and handed
//! back intact; the hand-back refused while anything names the region;
//! zero-based and chosen IOVAs; huge pages; dma-bufs; re-registration.

use std::ops::Deref;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, ChunkedRegion, Error, MemoryRegion, Pages, QpCaps, QpType, RegisterBuffer,
};

use crate::common::{pair, poll_n, reclaim_on as reclaim, Env, Pair, TestFn};

pub const TESTS: &[(&str, TestFn)] = &[
    ("owned::vec_round_trip", vec_round_trip),
    ("owned::boxed_slice_round_trip", boxed_round_trip),
    ("owned::static_slice_round_trip", static_round_trip),
    ("owned::pages_round_trip", pages_round_trip),
    (
        "owned::huge_or_normal_pages_round_trip",
        huge_or_normal_round_trip,
    ),
    ("owned::anonymous_mmap_round_trip", anon_mmap_round_trip),
    ("owned::file_mmap_round_trip", file_mmap_round_trip),
    ("owned::bytes_mut_round_trip", bytes_mut_round_trip),
    (
        "owned::buffer_not_back_while_a_chunk_or_request_names_it",
        not_back_while_named,
    ),
    ("owned::zero_based_and_chosen_iova", chosen_iova),
    ("owned::huge_pages_registered_or_refused", huge_pages),
    ("owned::dmabuf_refused_with_unsupported_on_rxe", dmabuf),
    ("owned::rereg_refused_while_named_and_typed", rereg),
    (
        "owned::file_truncated_under_a_registered_mapping",
        truncated_file,
    ),
];

const LEN: usize = 8192;
const CHUNK: usize = 1024;
const ALL_REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// Byte `i` of the pattern with `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn rc_pair(env: &Env) -> Result<Pair, Failed> {
    pair(
        env,
        QpType::Rc,
        QpCaps::default(),
        ALL_REMOTE - AccessFlags::LOCAL_WRITE,
    )
}

fn one(p: &mut Pair, wr: SendWr) -> Result<Chunk, Failed> {
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
    let (local, mut chunks) = local.split(CHUNK)?;
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
    let mut c: Vec<Option<Chunk>> = chunks.drain(..).map(Some).collect();
    let mut take = |i: usize| c[i].take().expect("each chunk once");

    // Send chunk 0's first 100 bytes into chunk 1.
    p.b.post_recv([RecvWr::new(1).sge(take(1))])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(take(0), 100)])?;
    let wcs = poll_n(&p.cq, 2)?;
    let mut back = Vec::new();
    for wc in &wcs {
        ensure!(wc.is_success(), "{kind}: send/recv {wc:?}");
        back.extend(reclaim(&mut [&mut p.a, &mut p.b], wc));
    }
    ensure!(
        back.len() == 2,
        "{kind}: {} chunks back from send/recv",
        back.len()
    );
    let recv = back
        .iter()
        .find(|(id, _)| *id == 1)
        .ok_or("no receive chunk")?;
    ensure!(
        recv.1.as_slice()[..100] == lp[..100],
        "{kind}: the receive holds other bytes"
    );

    // RDMA write chunk 2 to target[1000..2024]; read target[3000..4024] into chunk 3.
    let at = |off: u64| RemoteAddr {
        addr: target.addr() + off,
        rkey: target.rkey(),
    };
    let w = one(
        &mut p,
        SendWr::new(3, SendOp::RdmaWrite(at(1000))).sge(take(2)),
    )?;
    let r = one(
        &mut p,
        SendWr::new(4, SendOp::RdmaRead(at(3000))).sge(take(3)),
    )?;
    ensure!(
        r.as_slice() == &tp[3000..3000 + CHUNK],
        "{kind}: the read brought other bytes"
    );

    // Atomics on an 8-byte-aligned word of the target.
    let word = (4096 + (8 - target.addr() % 8) % 8) as usize;
    let old = u64::from_ne_bytes(tp[word..word + 8].try_into()?);
    let a = one(
        &mut p,
        SendWr::new(
            5,
            SendOp::CompareSwap {
                remote: at(word as u64),
                compare: old,
                swap: 40,
            },
        )
        .sge_len(take(4), 8),
    )?;
    ensure!(
        a.as_slice()[..8] == old.to_ne_bytes(),
        "{kind}: compare-and-swap returned other bytes"
    );
    let f = one(
        &mut p,
        SendWr::new(
            6,
            SendOp::FetchAdd {
                remote: at(word as u64),
                add: 2,
            },
        )
        .sge_len(take(5), 8),
    )?;
    ensure!(
        f.as_slice()[..8] == 40u64.to_ne_bytes(),
        "{kind}: fetch-and-add returned other bytes"
    );

    // Not yet: chunks are out.
    drop((back, w, r, a, f));
    ensure!(
        local.chunks_out() == 2,
        "{kind}: chunks_out {} with chunks 6 and 7 held",
        local.chunks_out()
    );
    let local = match local.into_inner() {
        Err(refused) => {
            ensure!(
                matches!(refused.error(), Error::InUse { users: 2, .. }),
                "{kind}: {}",
                refused.error()
            );
            refused.into_value()
        }
        Ok(_) => return Err(format!("{kind}: the buffer came back with 2 chunks out").into()),
    };
    drop(c);
    let local_back = local.into_inner()?;
    let target_back = target.into_inner()?;

    let mut want = lp.clone();
    want[CHUNK..CHUNK + 100].copy_from_slice(&lp[..100]);
    want[3 * CHUNK..4 * CHUNK].copy_from_slice(&tp[3000..3000 + CHUNK]);
    want[4 * CHUNK..4 * CHUNK + 8].copy_from_slice(&old.to_ne_bytes());
    want[5 * CHUNK..5 * CHUNK + 8].copy_from_slice(&40u64.to_ne_bytes());
    ensure!(
        local_back.len() == LEN,
        "{kind}: local length {}",
        local_back.len()
    );
    check(kind, "local", &local_back, &want)?;
    let mut want = tp.clone();
    want[1000..1000 + CHUNK].copy_from_slice(&lp[2 * CHUNK..3 * CHUNK]);
    want[word..word + 8].copy_from_slice(&42u64.to_ne_bytes());
    check(kind, "target", &target_back, &want)?;
    eprintln!("owned: {kind}: send, receive, write, read, atomics; both buffers back intact");
    Ok(())
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

fn boxed_round_trip(env: &Env) -> Result<(), Failed> {
    round_trip(env, "Box<[u8]>", |b| b.to_vec().into_boxed_slice())
}

fn static_round_trip(env: &Env) -> Result<(), Failed> {
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

fn huge_or_normal_round_trip(env: &Env) -> Result<(), Failed> {
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

fn anon_mmap_round_trip(env: &Env) -> Result<(), Failed> {
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
fn not_back_while_named(env: &Env) -> Result<(), Failed> {
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
    // Refused with the region back, twice (the same call again), and rejoin too.
    let region = expect_in_use(region.into_inner(), "into_inner with a receive posted")?;
    let region = expect_in_use(region.into_inner(), "into_inner again")?;
    let region = expect_in_use(region.rejoin(), "rejoin with a receive posted")?;
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

fn expect_in_use<T, R>(r: Result<T, rdma_verbs::Refused<R>>, what: &str) -> Result<R, Failed> {
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

/// A zero-based region (`iova` 0) and one at an address of the test's
/// choosing: peers and local entries name bytes by that address.
fn chosen_iova(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    // Zero-based needs a page-aligned buffer (the kernel maps whole pages):
    // a Vec's heap bytes at an odd address are refused, the Vec handed back.
    let odd = vec![0u8; LEN].into_boxed_slice();
    if !(odd.as_ptr() as usize).is_multiple_of(rdma_verbs::page_size()) {
        match p.pd.register_owned_at(odd, ALL_REMOTE, 0) {
            Err(r) => ensure!(
                matches!(r.error(), Error::InvalidArgument { reason, .. } if reason.contains("into its page")),
                "{}",
                r.error()
            ),
            Ok(_) => return Err("iova 0 for bytes in the middle of a page accepted".into()),
        }
    }
    let target = p.pd.register_owned_at(Pages::new(LEN)?, ALL_REMOTE, 0)?;
    ensure!(
        target.addr() == 0,
        "zero-based region at {:#x}",
        target.addr()
    );
    ensure!(
        target.remote_buf()?.addr == 0,
        "its remote buffer is not at 0"
    );
    let local_buf = pattern(4, 2 * CHUNK);
    let in_page = local_buf.as_ptr() as u64 % rdma_verbs::page_size() as u64;
    let base = 0x7000_0000_0000u64 + in_page;
    let local =
        p.pd.register_owned_at(local_buf, AccessFlags::LOCAL_WRITE, base)?;
    let (local, mut chunks) = local.split(CHUNK)?;
    ensure!(
        chunks[1].addr() == base + CHUNK as u64,
        "chunk 1 at {:#x}",
        chunks[1].addr()
    );
    let src = chunks.pop().unwrap();
    let src = one(
        &mut p,
        SendWr::new(
            1,
            SendOp::RdmaWrite(RemoteAddr {
                addr: 100,
                rkey: target.rkey(),
            }),
        )
        .sge(src),
    )?;
    let dst = chunks.pop().unwrap();
    let dst = one(
        &mut p,
        SendWr::new(
            2,
            SendOp::RdmaRead(RemoteAddr {
                addr: 100,
                rkey: target.rkey(),
            }),
        )
        .sge(dst),
    )?;
    ensure!(
        dst.as_slice() == src.as_slice(),
        "the read at iova 100 brought other bytes"
    );
    drop((src, dst));
    let _ = local.into_inner()?;
    let buf = target.into_inner()?;
    ensure!(
        buf[100..100 + CHUNK] == pattern(4, 2 * CHUNK)[CHUNK..],
        "the write did not land at offset 100"
    );
    ensure!(
        buf[..100].iter().all(|&b| b == 0),
        "bytes before offset 100 changed"
    );
    // An iova whose range runs past 2^64 is refused, the buffer handed back.
    match p
        .pd
        .register_owned_at(vec![1u8; 4096], AccessFlags::LOCAL_WRITE, u64::MAX - 100)
    {
        Err(r) => {
            ensure!(
                matches!(r.error(), Error::InvalidArgument { .. }),
                "{}",
                r.error()
            );
            ensure!(
                r.into_value() == vec![1u8; 4096],
                "the buffer came back changed"
            );
        }
        Ok(_) => return Err("iova u64::MAX - 100 for 4096 bytes accepted".into()),
    }
    Ok(())
}

fn meminfo(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// With no huge page free, `Pages::huge` is refused with the typed error
/// (nothing mapped) and `huge_or_normal` falls back; in the VM (root, a
/// throw-away kernel) the test then reserves four and registers one.
fn huge_pages(env: &Env) -> Result<(), Failed> {
    let size = meminfo("Hugepagesize") as usize * 1024;
    let free = meminfo("HugePages_Free");
    if free == 0 {
        match Pages::huge(1) {
            Err(Error::HugePages {
                bytes: 1, free: 0, ..
            }) => {}
            other => return Err(format!("no huge page free, Pages::huge(1): {other:?}").into()),
        }
        ensure!(
            !Pages::huge_or_normal(1)?.is_huge(),
            "huge_or_normal claimed huge pages"
        );
        eprintln!(
            "owned: huge pages: none free, refused: {}",
            Pages::huge(1).unwrap_err()
        );
    }
    if std::env::var_os("RDMA_VERBS_VM").is_none() || size == 0 {
        eprintln!("owned: huge pages: not reserving any outside the VM");
        return Ok(());
    }
    let nr = "/proc/sys/vm/nr_hugepages";
    let before = std::fs::read_to_string(nr)?;
    let want = before.trim().parse::<u64>()? + 4;
    std::fs::write(nr, want.to_string())?;
    let result = (|| -> Result<(), Failed> {
        let pages = Pages::huge(2 * size + 1)?;
        ensure!(pages.is_huge() && pages.page_size() == size, "{pages:?}");
        let mut p = rc_pair(env)?;
        let target = p.pd.register_owned(pages, ALL_REMOTE)?;
        // Registration pinned (so faulted in) all three huge pages.
        let free = meminfo("HugePages_Free");
        ensure!(
            free + 3 <= want,
            "{free} of {want} huge pages free after registering 3"
        );
        let src =
            p.pd.alloc_chunks(1, 4096, AccessFlags::LOCAL_WRITE)?
                .remove(0);
        let mut src = src;
        src.as_mut_slice().fill(0xab);
        let remote = RemoteAddr {
            addr: target.addr() + size as u64 - 2048,
            rkey: target.rkey(),
        };
        one(&mut p, SendWr::new(1, SendOp::RdmaWrite(remote)).sge(src))?;
        let pages = target.into_inner()?;
        ensure!(
            pages[size - 2048..size + 2048].iter().all(|&b| b == 0xab),
            "the write across the huge page boundary did not land"
        );
        ensure!(
            pages[..size - 2048].iter().all(|&b| b == 0),
            "bytes before it changed"
        );
        eprintln!("owned: huge pages: {} bytes on {}-byte pages registered, written across a page boundary, back", pages.len(), size);
        Ok(())
    })();
    std::fs::write(nr, before.trim())?;
    result
}

/// A dma-buf: from `/dev/udmabuf` where the kernel has it, else a memfd
/// (not a dma-buf, which a device that does register dma-bufs refuses).
fn dmabuf_fd() -> Result<(std::os::fd::OwnedFd, &'static str), Failed> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let name = c"rdma-verbs-dmabuf";
    // SAFETY: memfd_create with a NUL-terminated name; the fd is ours.
    let memfd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING) };
    ensure!(
        memfd >= 0,
        "memfd_create: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh descriptor nobody else owns.
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    let len = 1 << 20;
    // SAFETY: plain calls on our own descriptor.
    unsafe {
        ensure!(libc::ftruncate(memfd.as_raw_fd(), len) == 0, "ftruncate");
        ensure!(
            libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0,
            "seal"
        );
    }
    #[repr(C)]
    struct UdmabufCreate {
        memfd: u32,
        flags: u32,
        offset: u64,
        size: u64,
    }
    // _IOW('u', 0x42, struct udmabuf_create): linux/udmabuf.h.
    const UDMABUF_CREATE: libc::c_ulong =
        (1 << 30) | (24 << 16) | ((b'u' as libc::c_ulong) << 8) | 0x42;
    let Ok(dev) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
    else {
        return Ok((memfd, "a memfd (no /dev/udmabuf)"));
    };
    let req = UdmabufCreate {
        memfd: memfd.as_raw_fd() as u32,
        flags: 1,
        offset: 0,
        size: len as u64,
    };
    // SAFETY: the ioctl reads `req`, a live struct of the layout it expects.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE, &req) };
    if fd < 0 {
        return Ok((memfd, "a memfd (UDMABUF_CREATE refused)"));
    }
    // SAFETY: the ioctl returned a new descriptor, ours.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, "a udmabuf dma-buf"))
}

fn dmabuf(env: &Env) -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let pd = env.ctx.alloc_pd()?;
    let (fd, what) = dmabuf_fd()?;
    let raw = fd.as_raw_fd();
    let rxe = env.ctx.name().starts_with("rxe");
    match pd.register_dmabuf(
        fd,
        0,
        1 << 20,
        0,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    ) {
        Err(r) => {
            let e = r.error().to_string();
            let unsupported = matches!(r.error(), Error::Unsupported { .. });
            ensure!(!rxe || unsupported, "rxe: {e}");
            ensure!(
                r.into_value().as_raw_fd() == raw,
                "the fd did not come back"
            );
            eprintln!("owned: dma-buf ({what}) refused: {e}");
        }
        Ok(mr) => {
            ensure!(!rxe, "rxe registered a dma-buf");
            ensure!(mr.addr() == 0 && mr.len() == 1 << 20, "{mr:?}");
            ensure!(
                mr.into_inner()?.into_fd().as_raw_fd() == raw,
                "the fd did not come back"
            );
        }
    }
    // Bad arguments are refused before any call, the fd handed back.
    let (fd, _) = dmabuf_fd()?;
    let r = pd
        .register_dmabuf(fd, 0, 0, 0, AccessFlags::LOCAL_WRITE)
        .err()
        .ok_or("0 bytes accepted")?;
    ensure!(
        matches!(r.error(), Error::InvalidArgument { .. }),
        "{}",
        r.error()
    );
    let r = pd
        .register_dmabuf(r.into_value(), 0, 4096, 0, AccessFlags::REMOTE_WRITE)
        .err()
        .ok_or("REMOTE_WRITE without LOCAL_WRITE accepted")?;
    ensure!(
        matches!(r.error(), Error::InvalidArgument { .. }),
        "{}",
        r.error()
    );
    Ok(())
}

/// `rereg_access` and `rereg_pd`: refused while a chunk names the region
/// (the region is then a `ChunkedRegion`, which has no rereg; rejoin is
/// refused) and for a PD of another context; on rxe `Unsupported`, the
/// region unchanged and still working.
fn rereg(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let mr =
        p.pd.register_owned(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
    let (region, chunks): (ChunkedRegion<Vec<u8>>, _) = mr.split(4096)?;
    let region = expect_in_use(region.rejoin(), "rejoin with a chunk out")?;
    drop(chunks);
    let mut mr = region.rejoin()?;
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let other = rdma_verbs::Context::open(env.ctx.name())?.alloc_pd()?;
    match mr.rereg_pd(&other) {
        Err(Error::InvalidArgument { reason, .. }) => {
            ensure!(reason.contains("another device context"), "{reason}")
        }
        other => return Err(format!("a PD of another context: {other:?}").into()),
    }
    let wanted = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    match mr.rereg_access(wanted) {
        Ok(()) => ensure!(mr.access() == wanted, "access {:?}", mr.access()),
        Err(e @ Error::Unsupported { .. }) => {
            ensure!(
                mr.access() == AccessFlags::LOCAL_WRITE,
                "access changed to {:?} on a refusal",
                mr.access()
            );
            ensure!(
                (mr.lkey(), mr.rkey()) == (lkey, rkey),
                "keys changed on a refusal"
            );
            eprintln!("owned: rereg_access: {e}");
        }
        Err(e) => return Err(format!("rereg_access: {e}").into()),
    }
    let pd2 = env.ctx.alloc_pd()?;
    let moved = mr.rereg_pd(&pd2);
    match moved {
        Ok(()) => ensure!(mr.pd().handle() == pd2.handle(), "the region did not move"),
        Err(ref e @ Error::Unsupported { .. }) => {
            ensure!(
                mr.pd().handle() == p.pd.handle(),
                "the region moved on a refusal"
            );
            eprintln!("owned: rereg_pd: {e}");
        }
        Err(e) => return Err(format!("rereg_pd: {e}").into()),
    }
    ensure!(
        matches!(
            mr.rereg_access(AccessFlags::REMOTE_WRITE),
            Err(Error::InvalidArgument { .. })
        ),
        "REMOTE_WRITE without LOCAL_WRITE accepted"
    );
    // Another buffer under the same keys: an empty one is refused, both
    // handed back; on rxe Unsupported, both handed back unchanged.
    let (e, (back, empty)) = match mr.rereg_buffer(Vec::<u8>::new()) {
        Err(r) => r.into_parts(),
        Ok(_) => return Err("rereg_buffer onto an empty buffer accepted".into()),
    };
    ensure!(
        matches!(e, Error::InvalidArgument { .. }) && empty == Some(Vec::new()),
        "{e}"
    );
    let mut mr = back;
    let new = vec![9u8; 8192];
    let new_ptr = new.as_ptr();
    mr = match mr.rereg_buffer(new) {
        Ok((moved, old)) => {
            ensure!(
                moved.len() == 8192 && moved.addr() == new_ptr as u64,
                "{moved:?}"
            );
            ensure!(old == vec![0u8; 4096], "the old buffer came back changed");
            eprintln!(
                "owned: rereg_buffer: moved, keys {:#x}/{:#x}",
                moved.lkey(),
                moved.rkey()
            );
            moved.into_inner()?;
            return Ok(());
        }
        Err(r) => {
            let (e, (back, new)) = r.into_parts();
            ensure!(matches!(e, Error::Unsupported { .. }), "rereg_buffer: {e}");
            let new = new.ok_or("the new buffer was kept on an Unsupported refusal")?;
            ensure!(
                new.as_ptr() == new_ptr && new == vec![9u8; 8192],
                "the new buffer came back changed"
            );
            ensure!(
                back.len() == 4096 && (back.lkey(), back.rkey()) == (lkey, rkey),
                "the region changed"
            );
            eprintln!("owned: rereg_buffer: {e}");
            back
        }
    };
    // Still a working region: split it again and send from it (if it is
    // still in the QPs' PD).
    let mut chunks = mr.into_chunks(4096)?;
    if moved.is_err() {
        let recv =
            p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
                .remove(0);
        p.b.post_recv([RecvWr::new(1).sge(recv)])?;
        p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(chunks.remove(0), 8)])?;
        for wc in poll_n(&p.cq, 2)? {
            ensure!(wc.is_success(), "after rereg: {wc:?}");
        }
    }
    Ok(())
}

/// A registered shared mapping whose file is truncated meanwhile (memmap2
/// makes creating the map `unsafe` for this; the test takes that on). What
/// the crate promises: the region stays registered over the pages it
/// pinned, the device's writes beyond the new end complete (into pages no
/// longer part of the file), nothing hangs, and `into_inner` hands the map
/// back. The file keeps what was written inside its new length.
fn truncated_file(env: &Env) -> Result<(), Failed> {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_owned()
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("rdma-verbs-truncated-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 4 * 4096])?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)?;
    // SAFETY: the test's own file; its truncation below is the point of
    // the test, and the truncated part of the map is never touched by
    // the CPU afterwards.
    let map = unsafe { memmap2::MmapMut::map_mut(&file) }?;
    let mut p = rc_pair(env)?;
    let mr = p.pd.register_owned(map, ALL_REMOTE)?;
    file.set_len(4096)?;
    let mut src =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    src.as_mut_slice().fill(0x5c);
    let mut results = Vec::new();
    for (i, off) in [(1u64, 100u64), (2, 3 * 4096 + 8)] {
        let at = RemoteAddr {
            addr: mr.addr() + off,
            rkey: mr.rkey(),
        };
        p.a.post_send([SendWr::new(i, SendOp::RdmaWrite(at)).sge(src)])?;
        let wc = poll_n(&p.cq, 1)?[0];
        results.push((off, wc.status()));
        src = reclaim(&mut [&mut p.a], &wc)
            .pop()
            .ok_or("the write's chunk did not come back")?
            .1;
    }
    for (off, status) in &results {
        ensure!(
            *status == Ok(rdma_verbs::WcStatus::Success),
            "the write at {off} after truncation: {status:?}"
        );
    }
    let map = mr.into_inner()?;
    ensure!(
        map.len() == 4 * 4096,
        "the map came back with {} bytes",
        map.len()
    );
    ensure!(
        map[100..164].iter().all(|&b| b == 0x5c),
        "the write inside the file is not in the map"
    );
    drop(map);
    let on_disk = std::fs::read(&path)?;
    ensure!(
        on_disk.len() == 4096,
        "the file has {} bytes",
        on_disk.len()
    );
    ensure!(
        on_disk[100..164].iter().all(|&b| b == 0x5c),
        "the write inside the file is not in the file"
    );
    let _ = std::fs::remove_file(&path);
    eprintln!("owned: truncated file: writes inside and past the new end completed; map back; file {} bytes", on_disk.len());
    Ok(())
}

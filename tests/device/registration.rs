//! The other ways of registering memory: zero-based and chosen IOVAs
//! (`register_owned_at`), huge pages, dma-bufs, re-registration, and a file
//! truncated under its registered mapping.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, ChunkedRegion, Error, Pages};

use super::owned::{expect_in_use, one, pattern, rc_pair, ALL_REMOTE, CHUNK, LEN};
use crate::common::{poll_n, reclaim_on as reclaim, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    zero_based_and_chosen_iova,
    huge_pages_registered_or_refused,
    dmabuf_refused_with_unsupported_on_rxe,
    rereg_in_place_refused_while_named_and_typed,
    rereg_onto_another_buffer,
    file_truncated_under_a_registered_mapping,
];

/// A zero-based region (`iova` 0) and one at an address of the test's
/// choosing: peers and local entries name bytes by that address.
fn zero_based_and_chosen_iova(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    iova_refusals(&p)?;
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
    let at_100 = RemoteAddr {
        addr: 100,
        rkey: target.rkey(),
    };
    let src = chunks.pop().ok_or("no chunk")?;
    let src = one(&mut p, SendWr::new(1, SendOp::RdmaWrite(at_100)).sge(src))?;
    let dst = chunks.pop().ok_or("no chunk")?;
    let dst = one(&mut p, SendWr::new(2, SendOp::RdmaRead(at_100)).sge(dst))?;
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
    Ok(())
}

/// The iovas the kernel would refuse are refused first, the buffer handed
/// back: one not as far into its page as the buffer (zero-based needs a
/// page-aligned buffer), and one whose range runs past 2^64.
fn iova_refusals(p: &Pair) -> Result<(), Failed> {
    let odd = vec![0u8; LEN].into_boxed_slice();
    if (odd.as_ptr() as usize) % rdma_verbs::page_size() != 0 {
        let r =
            p.pd.register_owned_at(odd, ALL_REMOTE, 0)
                .err()
                .ok_or("iova 0 mid-page accepted")?;
        ensure!(
            matches!(r.error(), Error::InvalidArgument { reason, .. } if reason.contains("into its page")),
            "{}",
            r.error()
        );
    }
    let r =
        p.pd.register_owned_at(vec![1u8; 4096], AccessFlags::LOCAL_WRITE, u64::MAX - 100)
            .err()
            .ok_or("iova u64::MAX - 100 for 4096 bytes accepted")?;
    ensure!(
        matches!(r.error(), Error::InvalidArgument { .. }),
        "{}",
        r.error()
    );
    ensure!(
        r.into_value() == vec![1u8; 4096],
        "the buffer came back changed"
    );
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
fn huge_pages_registered_or_refused(env: &Env) -> Result<(), Failed> {
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
        eprintln!("registration: huge pages: not reserving any outside the VM");
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
        eprintln!("registration: huge pages: {} bytes on {}-byte pages registered, written across a page boundary, back", pages.len(), size);
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

fn dmabuf_refused_with_unsupported_on_rxe(env: &Env) -> Result<(), Failed> {
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
            eprintln!("registration: dma-buf ({what}) refused: {e}");
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
fn rereg_in_place_refused_while_named_and_typed(env: &Env) -> Result<(), Failed> {
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
            eprintln!("registration: rereg_access: {e}");
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
            eprintln!("registration: rereg_pd: {e}");
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
    // Still a working region: split it again and send from it (if it is
    // still in the QPs' PD).
    if moved.is_err() {
        send_from(&mut p, mr.into_chunks(4096)?.remove(0), "after rereg")?;
    }
    Ok(())
}

/// `a` sends 8 bytes of `chunk` to `b`; both completions must succeed.
fn send_from(p: &mut Pair, chunk: rdma_verbs::Chunk, what: &str) -> Result<(), Failed> {
    let recv =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    p.b.post_recv([RecvWr::new(1).sge(recv)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(chunk, 8)])?;
    for wc in poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "{what}: {wc:?}");
    }
    Ok(())
}

/// `rereg_buffer`: an empty buffer refused, both handed back; on rxe
/// `Unsupported`, both handed back unchanged and the region still working;
/// where the device does it, the same keys over the new buffer and the
/// old one back.
fn rereg_onto_another_buffer(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let mr =
        p.pd.register_owned(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)?;
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let (e, (mr, empty)) = match mr.rereg_buffer(Vec::<u8>::new()) {
        Err(r) => r.into_parts(),
        Ok(_) => return Err("rereg_buffer onto an empty buffer accepted".into()),
    };
    ensure!(
        matches!(e, Error::InvalidArgument { .. }) && empty == Some(Vec::new()),
        "{e}"
    );
    let new = vec![9u8; 8192];
    let new_ptr = new.as_ptr();
    let mr = match mr.rereg_buffer(new) {
        Ok((moved, old)) => {
            ensure!(
                moved.len() == 8192 && moved.addr() == new_ptr as u64,
                "{moved:?}"
            );
            ensure!(old == vec![0u8; 4096], "the old buffer came back changed");
            eprintln!(
                "registration: rereg_buffer: moved, keys {:#x}/{:#x}",
                moved.lkey(),
                moved.rkey()
            );
            ensure!(
                moved.into_inner()? == vec![9u8; 8192],
                "the new buffer came back changed"
            );
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
            eprintln!("registration: rereg_buffer: {e}");
            back
        }
    };
    send_from(
        &mut p,
        mr.into_chunks(4096)?.remove(0),
        "after a refused rereg_buffer",
    )
}

/// A registered shared mapping whose file is truncated meanwhile (memmap2
/// makes creating the map `unsafe` for this; the test takes that on). What
/// the crate promises: the region stays registered over the pages it
/// pinned, the device's writes beyond the new end complete (into pages no
/// longer part of the file), nothing hangs, and `into_inner` hands the map
/// back. The file keeps what was written inside its new length.
fn file_truncated_under_a_registered_mapping(env: &Env) -> Result<(), Failed> {
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
    eprintln!("registration: truncated file: writes inside and past the new end completed; map back; file {} bytes", on_disk.len());
    Ok(())
}

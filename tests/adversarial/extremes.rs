//! Attacks on the arithmetic of public constructors and accessors: offsets, lengths, counts and durations at their extremes
//! (`usize::MAX`, `u32::MAX + 1`, `Duration::MAX`, one past the end, 0).
//! Each must get a typed error that says what was wrong, never a panic, a
//! wrapped address or a truncated length.

#[cfg(feature = "cm")]
use std::net::SocketAddr;
#[cfg(feature = "cm")]
use std::time::Duration;

use libtest_mimic::Failed;
#[cfg(feature = "cm")]
use rdma_verbs::cm::{CmEventKind, EventChannel, PortSpace};
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Error, MwBind, SharedChunk};

#[cfg(feature = "cm")]
use crate::common::cm_addr;
use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    mw_bind_offset_usize_max,
    mw_bind_range_past_the_region_or_empty,
    mr_read_write_at_extreme_offsets,
    alloc_chunks_count_times_len,
    sge_len_past_the_chunk_or_u32_is_refused,
    counts_at_u32_max_are_refused,
];

/// The connection manager's tests (feature `cm`).
#[cfg(feature = "cm")]
pub const CM_TESTS: &[Test] = tests![cm_wait_of_duration_max,];

/// `e` is an [`Error::InvalidArgument`] whose message contains each of
/// `needles`.
fn invalid(what: &str, e: &Error, needles: &[&str]) -> Result<(), Failed> {
    ensure!(
        matches!(e, Error::InvalidArgument { .. }),
        "{what}: not InvalidArgument: {e}"
    );
    let text = e.to_string();
    for n in needles {
        ensure!(text.contains(n), "{what}: {text:?} does not say {n:?}");
    }
    Ok(())
}

fn window_region(env: &Env, len: usize) -> Result<rdma_verbs::MemoryRegion, Failed> {
    let pd = env.ctx.alloc_pd()?;
    Ok(pd.register(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?)
}

/// An offset of `usize::MAX`: the window's address would be past the end
/// of the 64-bit address space. Refused when the bind is made, so no
/// `remote_addr()` of it exists to overflow.
fn mw_bind_offset_usize_max(env: &Env) -> Result<(), Failed> {
    let mr = window_region(env, 4096)?;
    let r = AccessFlags::REMOTE_READ;
    for (offset, len) in [(usize::MAX, 1), (usize::MAX, usize::MAX), (1, usize::MAX)] {
        let e = MwBind::new(&mr, offset, len, r)
            .err()
            .ok_or(format!("MwBind::new accepted {offset}..+{len}"))?;
        invalid(
            &format!("{offset}..+{len}"),
            &e,
            &[&format!("offset {offset} + length {len} overflows")],
        )?;
    }
    Ok(())
}

/// Ranges ending one past the region, starting past it, or empty; the
/// last byte itself is fine, and its address is the region's last.
fn mw_bind_range_past_the_region_or_empty(env: &Env) -> Result<(), Failed> {
    let mr = window_region(env, 4096)?;
    let len = mr.len();
    let r = AccessFlags::REMOTE_READ;
    for (offset, n, needle) in [
        (
            len - 1,
            2,
            "bytes 4095..4097 are outside the 4096-byte region",
        ),
        (len + 1, 1, "bytes 4097..4098 are outside"),
        (len, 1, "bytes 4096..4097 are outside"),
        (len, 0, "empty (length 0)"),
        (0, 0, "empty (length 0)"),
    ] {
        let e = MwBind::new(&mr, offset, n, r).err().ok_or(format!(
            "MwBind::new accepted {offset}..+{n} of a {len}-byte region"
        ))?;
        invalid(&format!("{offset}..+{n}"), &e, &[needle])?;
    }
    let last = MwBind::new(&mr, len - 1, 1, r)?;
    ensure!(
        last.remote_addr() == mr.addr() + (len as u64 - 1),
        "last byte at {:#x}, region at {:#x}",
        last.remote_addr(),
        mr.addr()
    );
    let whole = MwBind::new(&mr, 0, len, r)?;
    ensure!(whole.remote_addr() == mr.addr(), "whole region");
    Ok(())
}

/// `read` and `write` at offsets whose end overflows, or lies past the
/// region; an empty copy at the very end is fine.
fn mr_read_write_at_extreme_offsets(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let mut mr = pd.register(4096, AccessFlags::LOCAL_WRITE)?;
    let len = mr.len();
    let e = mr
        .write(usize::MAX, b"x")
        .err()
        .ok_or("write at usize::MAX")?;
    invalid("write at usize::MAX", &e, &["outside", "4096-byte region"])?;
    let e = mr
        .write(len - 1, b"xy")
        .err()
        .ok_or("write across the end")?;
    invalid("write across the end", &e, &["4095..4097", "outside"])?;
    let mut two = [0u8; 2];
    let e = mr
        .read(usize::MAX - 1, &mut two)
        .err()
        .ok_or("read near usize::MAX")?;
    invalid("read near usize::MAX", &e, &["outside"])?;
    let e = mr
        .read(len + 1, &mut [])
        .err()
        .ok_or("empty read past the end")?;
    invalid("empty read past the end", &e, &["outside"])?;
    mr.write(len, b"")?;
    mr.read(len - 1, &mut two[..1])?;
    Ok(())
}

/// `alloc_chunks` multiplies a count by a length; `into_chunks` divides
/// by its length; `register` takes any length.
fn alloc_chunks_count_times_len(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let w = AccessFlags::LOCAL_WRITE;
    for (count, len) in [(usize::MAX, 2), (2, usize::MAX), (usize::MAX, usize::MAX)] {
        let e = pd.alloc_chunks(count, len, w).err().ok_or("accepted")?;
        invalid(&format!("{count} x {len}"), &e, &["overflow"])?;
    }
    let e = pd.alloc_chunks(0, 64, w).err().ok_or("0 chunks accepted")?;
    invalid("0 chunks", &e, &["empty"])?;
    let e = pd
        .alloc_chunks(4, 0, w)
        .err()
        .ok_or("0-byte chunks accepted")?;
    invalid("0-byte chunks", &e, &["empty"])?;
    let e = pd.register(usize::MAX, w).err().ok_or("usize::MAX bytes")?;
    invalid("register usize::MAX", &e, &["18446744073709551615"])?;
    let mr = pd.register(4096, w)?;
    let e = mr.into_chunks(0).err().ok_or("chunk length 0")?;
    invalid("into_chunks(0)", &e, &["chunk length 0"])?;
    let chunks = pd.register(4096, w)?.into_chunks(usize::MAX)?;
    ensure!(
        chunks.len() == 1 && chunks[0].len() == 4096,
        "into_chunks(usize::MAX): {chunks:?}"
    );
    Ok(())
}

/// Entry lengths past their chunk, above an sge's 32-bit length, on an
/// owned and a shared chunk, posted alone and in a batch: refused, never
/// truncated, and the chunks come back.
fn sge_len_past_the_chunk_or_u32_is_refused(env: &Env) -> Result<(), Failed> {
    let crate::common::Pair {
        pd,
        cq: _cq,
        mut a,
        b: _b,
    } = crate::common::ex_rc_pair(env, AccessFlags::LOCAL_WRITE)?;
    let big = u32::MAX as usize + 1;
    for len in [usize::MAX, big, 65] {
        let chunk = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?.remove(0);
        let e = a
            .post_send([SendWr::new(1, SendOp::Send).sge_len(chunk, len)])
            .err()
            .ok_or(format!("sge_len({len}) accepted"))?;
        ensure!(e.posted == 0, "sge_len({len}): {e}");
        ensure!(e.returned.len() == 1, "sge_len({len}): chunk not returned");
        invalid(
            &format!("sge_len({len})"),
            &e.error,
            &[&format!("length {len}")],
        )?;
        let shared = SharedChunk::new(e.returned.into_iter().next().ok_or("chunk")?);
        let e = a
            .post_send([SendWr::new(2, SendOp::Send).sge_shared(&shared, len)])
            .err()
            .ok_or(format!("sge_shared({len}) accepted"))?;
        invalid(
            &format!("sge_shared({len})"),
            &e.error,
            &[&format!("length {len}")],
        )?;
        let chunk = shared
            .try_into_chunk()
            .map_err(|_| "shared chunk still held")?;
        let mut batch = a.start_batch()?;
        let e = batch
            .post(SendWr::new(3, SendOp::Send).sge_len(chunk, len))
            .err()
            .ok_or(format!("batch sge_len({len}) accepted"))?;
        invalid(
            &format!("batch sge_len({len})"),
            &e.error,
            &[&format!("length {len}")],
        )?;
        ensure!(batch.is_empty(), "the batch holds a request");
    }
    ensure!(a.outstanding_sends() == 0, "a request was posted");
    Ok(())
}

/// A wait of `Duration::MAX` for an event that comes: the deadline is
/// beyond what `Instant` holds, so the wait has no limit (and the event
/// ends it). A C timeout of `Duration::MAX` milliseconds is refused.
#[cfg(feature = "cm")]
fn cm_wait_of_duration_max(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    let e = id
        .resolve_addr(None, SocketAddr::new(ip, 0), Duration::MAX)
        .err()
        .ok_or("resolve_addr took Duration::MAX")?;
    ensure!(
        matches!(e, Error::OutOfRange { .. }) && e.to_string().contains("timeout"),
        "resolve_addr(Duration::MAX): {e}"
    );
    id.resolve_addr(None, SocketAddr::new(ip, 0), Duration::from_secs(2))?;
    let ev = ch.expect(CmEventKind::AddrResolved, Duration::MAX)?;
    ensure!(ev.is_for(&id), "an event for another id");
    drop(ev);
    let id2 = ch.create_id(PortSpace::Tcp)?;
    id2.resolve_addr(None, SocketAddr::new(ip, 0), Duration::from_secs(2))?;
    let ev = ch
        .get_event_timeout(Duration::MAX)?
        .ok_or("no event in Duration::MAX")?;
    ensure!(ev.kind() == CmEventKind::AddrResolved, "{ev:?}");
    Ok(())
}

/// Counts and indices of `u32::MAX` where the C field is an `int`: refused
/// before any call, never cast to a negative number.
fn counts_at_u32_max_are_refused(env: &Env) -> Result<(), Failed> {
    let ctx = &env.ctx;
    let e = ctx.create_cq(u32::MAX).err().ok_or("cqe u32::MAX")?;
    invalid("cqe u32::MAX", &e, &["cqe 4294967295"])?;
    let e = ctx
        .create_cq_ex(u32::MAX)
        .build()
        .err()
        .ok_or("extended cqe u32::MAX")?;
    invalid("extended cqe u32::MAX", &e, &["cqe 4294967295"])?;
    let e = ctx
        .query_gid(env.port, u32::MAX)
        .err()
        .ok_or("GID index u32::MAX")?;
    invalid("GID index u32::MAX", &e, &["4294967295"])?;
    let pd = ctx.alloc_pd()?;
    let e = pd
        .create_srq(u32::MAX, 1, 0)
        .err()
        .ok_or("SRQ max_wr u32::MAX")?;
    invalid("SRQ max_wr", &e, &["max_wr 4294967295"])?;
    let e = pd
        .create_srq(16, u32::MAX, 0)
        .err()
        .ok_or("SRQ max_sge u32::MAX")?;
    invalid("SRQ max_sge", &e, &["max_sge 4294967295"])?;
    let e = pd
        .create_srq(16, 1, u32::MAX)
        .err()
        .ok_or("SRQ limit u32::MAX")?;
    invalid("SRQ limit", &e, &["limit 4294967295"])?;
    Ok(())
}

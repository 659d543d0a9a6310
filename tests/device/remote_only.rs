//! RDMA ATOMIC_WRITE and FLUSH through the batch (`ibv_wr_atomic_write`,
//! `ibv_wr_flush`), and the region rights they need.
//!
//! Where the device, the kernel or the headers lack one, each test checks
//! the typed refusal instead; on rxe of Linux 6.2 and later with rdma-core
//! 44 (ATOMIC_WRITE) or 45 (FLUSH) and later, the verb must work
//! (`common::rxe_has`), so a newer stack never takes the refusal branch.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, DeviceCapFlags, Error, MemoryRegion, QpInitAttr, QpType, RemoteBuf, WcOpcode,
    WcStatus,
};

use crate::common::{poll_n, remote_region, rxe_has, Env, Test};
use crate::ex::{ex_pair, reclaim, ExPair};

pub const TESTS: &[Test] = tests![
    atomic_write_lands_whole,
    atomic_write_refusals_keep_the_batch_open,
    atomic_write_without_remote_write_is_refused_by_the_peer,
    atomic_write_past_the_region_is_refused_by_the_peer,
    flush_after_writes,
    flush_rights_need_the_device,
    flush_without_the_right_is_refused_by_the_peer,
    flush_past_the_region_is_refused_by_the_peer,
];

/// What a QP for `op` needs besides it.
fn ops_with(op: SendOpsFlags) -> SendOpsFlags {
    SendOpsFlags::SEND | SendOpsFlags::RDMA_WRITE | op
}

/// Whether `op` can be had here: a QP with it is created, or the refusal
/// is [`Error::Unsupported`] naming `needle` and the stack is not one that
/// must have it (`must`).
fn offered(env: &Env, op: SendOpsFlags, needle: &str, must: bool) -> Result<bool, Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(4)?;
    match pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(ops_with(op))) {
        Ok(_) => Ok(true),
        Err(e @ Error::Unsupported { .. }) if !must => {
            ensure!(
                e.to_string().contains(needle),
                "the refusal names {needle}: {e}"
            );
            eprintln!("refused as expected on this stack: {e}");
            Ok(false)
        }
        Err(e) => Err(format!("{op:?} on a stack that must have it: {e}").into()),
    }
}

/// A connected pair posting `op`, or `None` (the refusal checked) where the
/// stack lacks it.
fn pair(env: &Env, op: SendOpsFlags) -> Result<Option<ExPair>, Failed> {
    let (needle, must) = if op == SendOpsFlags::FLUSH {
        ("FLUSH", rxe_has(env, (6, 2), 45))
    } else {
        ("ATOMIC_WRITE", rxe_has(env, (6, 2), 44))
    };
    if !offered(env, op, needle, must)? {
        return Ok(None);
    }
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::FLUSH_GLOBAL;
    let access = if env
        .ctx
        .attr()
        .capabilities
        .contains(DeviceCapFlags::FLUSH_GLOBAL)
    {
        access
    } else {
        access - AccessFlags::FLUSH_GLOBAL
    };
    Ok(Some(ex_pair(
        env,
        QpType::Rc,
        ops_with(op),
        QpCaps::default(),
        access,
    )?))
}

fn at(mr: &MemoryRegion, off: u64) -> RemoteAddr {
    RemoteAddr {
        addr: mr.addr() + off,
        rkey: mr.rkey(),
    }
}

fn buf(mr: &MemoryRegion) -> RemoteBuf {
    RemoteBuf {
        addr: mr.addr(),
        rkey: mr.rkey(),
        len: mr.len() as u64,
    }
}

/// Completes one signalled request of `p.a` and checks its status, opcode
/// (when it succeeded) and caller's `wr_id`, and that it lent nothing.
fn one_completion(
    p: &mut ExPair,
    status: WcStatus,
    opcode: WcOpcode,
    wr_id: u64,
) -> Result<(), Failed> {
    let chunks = completion_lending(p, status, opcode, wr_id)?;
    ensure!(
        chunks == 0,
        "a request that lends no memory handed {chunks} chunks back"
    );
    Ok(())
}

/// As [`one_completion`]; how many chunks the requests it ended handed
/// back (unsignalled ones before it included).
fn completion_lending(
    p: &mut ExPair,
    status: WcStatus,
    opcode: WcOpcode,
    wr_id: u64,
) -> Result<usize, Failed> {
    let wcs = poll_n(&p.cq, 1)?;
    let wc = &wcs[0];
    ensure!(wc.status() == Ok(status), "{wc:?}: not {status:?}");
    if status == WcStatus::Success {
        ensure!(wc.opcode() == Ok(opcode), "{wc:?}: not {opcode:?}");
    }
    let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
    let ids: Vec<u64> = back.iter().map(|b| b.0).collect();
    ensure!(
        ids.last() == Some(&wr_id),
        "reclaimed {ids:?}, not ending in {wr_id}"
    );
    Ok(back.iter().map(|b| b.2.len()).sum())
}

fn read8(mr: &MemoryRegion, off: usize) -> Result<[u8; 8], Failed> {
    let mut b = [0u8; 8];
    mr.read(off, &mut b)?;
    Ok(b)
}

fn atomic_write_lands_whole(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::ATOMIC_WRITE)? else {
        return Ok(());
    };
    let mut region = remote_region(&p.pd, 4096)?;
    region.write(0, &[0xee; 64])?;
    let value = 0x1122_3344_5566_7788u64.to_le_bytes();
    let mut batch = p.a.start_batch()?;
    batch.atomic_write(RemoteWr::new(11), at(&region, 16), value)?;
    ensure!(batch.len() == 1, "batch holds {}", batch.len());
    batch.complete()?;
    one_completion(&mut p, WcStatus::Success, WcOpcode::AtomicWrite, 11)?;
    ensure!(read8(&region, 16)? == value, "{:x?}", read8(&region, 16)?);
    ensure!(read8(&region, 8)? == [0xee; 8], "the bytes before changed");
    ensure!(read8(&region, 24)? == [0xee; 8], "the bytes after changed");
    ensure!(
        p.a.outstanding_sends() == 0,
        "{} outstanding",
        p.a.outstanding_sends()
    );
    Ok(())
}

fn atomic_write_refusals_keep_the_batch_open(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::ATOMIC_WRITE)? else {
        return Ok(());
    };
    let mut region = remote_region(&p.pd, 4096)?;
    region.write(0, &[0; 16])?;
    // Outside a peer's announced buffer, refused by `RemoteBuf` itself.
    let small = RemoteBuf {
        len: 4,
        ..buf(&region)
    };
    ensure!(small.at(0, 8).is_err(), "8 bytes of a 4-byte buffer");
    let mut batch = p.a.start_batch()?;
    match batch.atomic_write(RemoteWr::new(1), at(&region, 4), [1; 8]) {
        Err(e) => ensure!(
            matches!(e.error, Error::InvalidArgument { .. })
                && e.to_string().contains("8-byte aligned")
                && e.posted == 0,
            "{e}"
        ),
        Ok(()) => return Err("a misaligned ATOMIC_WRITE was posted".into()),
    }
    ensure!(batch.is_empty(), "the refused request is in the batch");
    // The batch is still open: the next request goes through.
    batch.atomic_write(RemoteWr::new(2), at(&region, 8), [2; 8])?;
    batch.complete()?;
    one_completion(&mut p, WcStatus::Success, WcOpcode::AtomicWrite, 2)?;
    ensure!(read8(&region, 0)? == [0; 8], "the refused request landed");
    ensure!(read8(&region, 8)? == [2; 8], "{:?}", read8(&region, 8)?);

    // A QP made without ATOMIC_WRITE in its send_ops refuses it.
    let mut plain = ex_pair(
        env,
        QpType::Rc,
        SendOpsFlags::SEND,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE,
    )?;
    let mut batch = plain.a.start_batch()?;
    match batch.atomic_write(RemoteWr::new(3), at(&region, 8), [3; 8]) {
        Err(e) => ensure!(
            e.to_string().contains("without SendOpsFlags(ATOMIC_WRITE)"),
            "{e}"
        ),
        Ok(()) => return Err("ATOMIC_WRITE on a QP without it".into()),
    }
    batch.complete()?;
    ensure!(read8(&region, 8)? == [2; 8], "the refused request landed");
    Ok(())
}

fn atomic_write_without_remote_write_is_refused_by_the_peer(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::ATOMIC_WRITE)? else {
        return Ok(());
    };
    let mut region =
        p.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    region.write(0, &[0xee; 16])?;
    let mut batch = p.a.start_batch()?;
    batch.atomic_write(RemoteWr::new(5), at(&region, 8), [7; 8])?;
    batch.complete()?;
    one_completion(&mut p, WcStatus::RemAccessErr, WcOpcode::AtomicWrite, 5)?;
    ensure!(
        read8(&region, 8)? == [0xee; 8],
        "written without REMOTE_WRITE"
    );
    Ok(())
}

fn atomic_write_past_the_region_is_refused_by_the_peer(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::ATOMIC_WRITE)? else {
        return Ok(());
    };
    let region = remote_region(&p.pd, 4096)?;
    let mut batch = p.a.start_batch()?;
    batch.atomic_write(RemoteWr::new(6), at(&region, 4096), [7; 8])?;
    batch.complete()?;
    one_completion(&mut p, WcStatus::RemAccessErr, WcOpcode::AtomicWrite, 6)
}

/// A region the peer may write and flush to global visibility.
fn flushable(p: &ExPair) -> Result<MemoryRegion, Failed> {
    Ok(p.pd.register(
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::FLUSH_GLOBAL,
    )?)
}

fn flush_after_writes(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::FLUSH)? else {
        return Ok(());
    };
    let region = flushable(&p)?;
    let mut data = p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let mut c = data.pop().ok_or("no chunk")?;
    c.as_mut_slice()[..7].copy_from_slice(b"durable");
    let target = buf(&region);
    let mut batch = p.a.start_batch()?;
    batch.post(
        SendWr::new(1, SendOp::RdmaWrite(at(&region, 0)))
            .sge_len(c, 7)
            .unsignaled(),
    )?;
    batch.flush(
        RemoteWr::new(2),
        target.slice(0, 64)?,
        FlushPlacement::Global,
        FlushSelectivity::Range,
    )?;
    batch.flush(
        RemoteWr::new(3),
        target,
        FlushPlacement::Global,
        FlushSelectivity::Region,
    )?;
    ensure!(batch.len() == 3, "batch holds {}", batch.len());
    batch.complete()?;
    // The flush's completion ends the unsignalled write before it too.
    let back = completion_lending(&mut p, WcStatus::Success, WcOpcode::Flush, 2)?;
    ensure!(back == 1, "the write's chunk: {back} chunks back");
    one_completion(&mut p, WcStatus::Success, WcOpcode::Flush, 3)?;
    let mut back = [0u8; 7];
    region.read(0, &mut back)?;
    ensure!(&back == b"durable", "{back:?}");
    ensure!(
        p.a.outstanding_sends() == 0,
        "{} outstanding",
        p.a.outstanding_sends()
    );
    Ok(())
}

/// A region asks for a FLUSH right only where the device reports it.
fn flush_rights_need_the_device(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let caps = env.ctx.attr().capabilities;
    let must = rxe_has(env, (6, 2), 0);
    ensure!(
        !must || caps.contains(DeviceCapFlags::FLUSH_GLOBAL | DeviceCapFlags::ATOMIC_WRITE),
        "rxe of this kernel reports no FLUSH_GLOBAL/ATOMIC_WRITE: {caps:?}"
    );
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_GLOBAL;
    match pd.register(4096, access) {
        Ok(_) => ensure!(caps.contains(DeviceCapFlags::FLUSH_GLOBAL), "registered"),
        Err(e @ Error::Unsupported { .. }) => {
            ensure!(!caps.contains(DeviceCapFlags::FLUSH_GLOBAL), "{e}");
            ensure!(e.to_string().contains("IBV_ACCESS_FLUSH_GLOBAL"), "{e}");
        }
        Err(e) => return Err(format!("FLUSH_GLOBAL region: {e}").into()),
    }
    Ok(())
}

fn flush_without_the_right_is_refused_by_the_peer(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::FLUSH)? else {
        return Ok(());
    };
    let region = remote_region(&p.pd, 4096)?; // no FLUSH_GLOBAL
    let mut batch = p.a.start_batch()?;
    batch.flush(
        RemoteWr::new(8),
        buf(&region),
        FlushPlacement::Global,
        FlushSelectivity::Range,
    )?;
    batch.complete()?;
    one_completion(&mut p, WcStatus::RemAccessErr, WcOpcode::Flush, 8)
}

fn flush_past_the_region_is_refused_by_the_peer(env: &Env) -> Result<(), Failed> {
    let Some(mut p) = pair(env, SendOpsFlags::FLUSH)? else {
        return Ok(());
    };
    let region = flushable(&p)?;
    let whole = buf(&region);
    ensure!(whole.slice(0, 4097).is_err(), "a slice past the buffer");
    let past = RemoteBuf { len: 8192, ..whole };
    let mut batch = p.a.start_batch()?;
    batch.flush(
        RemoteWr::new(9),
        past,
        FlushPlacement::Global,
        FlushSelectivity::Range,
    )?;
    batch.complete()?;
    one_completion(&mut p, WcStatus::RemAccessErr, WcOpcode::Flush, 9)
}

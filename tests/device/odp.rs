//! On-demand paging: regions registered with `IBV_ACCESS_ON_DEMAND` over
//! the crate's pages and a program's own buffer, data through them, the
//! ownership rules while requests are posted, and prefetch advice
//! (`ibv_advise_mr`).
//!
//! Where the device has no ODP, each test checks the typed refusal
//! instead. rxe reports ODP from Linux 6.14 (`common::rxe_has`, checked)
//! and the crate refuses it there (its ODP copy ignores the offset within
//! a page; see `rdma_verbs::OdpCaps`): the tests check that refusal on rxe.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Error, MemoryRegion, MrAdvice, OdpGeneralCaps, ProtectionDomain, QpInitAttr,
    QpType, QueuePair, WcOpcode, WcStatus, WorkCompletion,
};

use crate::common::{connect, is_rxe, poll_n, rxe_has, Env, Test};

pub const TESTS: &[Test] = tests![
    regions_need_the_device,
    data_moves_through_odp_regions,
    prefetch_sync_and_async,
    prefetch_refusals,
    regions_dropped_and_handed_back_while_posted,
];

const ODP: AccessFlags = AccessFlags::ON_DEMAND
    .union(AccessFlags::LOCAL_WRITE)
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// ODP memory only this side writes: it can be split into chunks.
const ODP_LOCAL: AccessFlags = AccessFlags::ON_DEMAND.union(AccessFlags::LOCAL_WRITE);

/// Whether the crate offers ODP on this device: it reports it, and is not
/// rxe (on a kernel whose rxe has ODP, that it reports it is checked).
fn has_odp(env: &Env) -> Result<bool, Failed> {
    let general = env.ctx.attr().odp.general;
    let has = general.contains(OdpGeneralCaps::SUPPORT);
    ensure!(
        has || !rxe_has(env, (6, 14), 0),
        "rxe of this kernel reports no ODP: {:?}",
        env.ctx.attr().odp
    );
    Ok(has && !is_rxe(env))
}

/// An ODP region of `len` bytes, or `None` where the device has no ODP
/// (the refusal checked).
fn odp_region(
    env: &Env,
    pd: &ProtectionDomain,
    len: usize,
) -> Result<Option<MemoryRegion>, Failed> {
    let has = has_odp(env)?;
    match pd.register(len, ODP) {
        Ok(mr) if has => Ok(Some(mr)),
        Err(e @ Error::Unsupported { .. }) if !has => {
            let why = if is_rxe(env) && rxe_has(env, (6, 14), 0) {
                "the page's start"
            } else {
                "IBV_ODP_SUPPORT"
            };
            ensure!(e.to_string().contains(why), "{e}");
            Ok(None)
        }
        Ok(_) => Err("an ODP region on a device without ODP".into()),
        Err(e) => Err(format!("ODP region: {e}").into()),
    }
}

fn regions_need_the_device(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let Some(mr) = odp_region(env, &pd, 8192)? else {
        // The program's own buffer is refused the same way, and comes back.
        let refused = pd
            .register_owned(vec![7u8; 4096], ODP)
            .err()
            .ok_or("registered")?;
        ensure!(
            matches!(refused.error(), Error::Unsupported { .. }),
            "{}",
            refused.error()
        );
        ensure!(
            refused.into_value() == vec![7u8; 4096],
            "the buffer changed"
        );
        return Ok(());
    };
    ensure!(
        mr.access().contains(AccessFlags::ON_DEMAND),
        "{:?}",
        mr.access()
    );
    let own = pd
        .register_owned(vec![7u8; 4096], ODP)
        .map_err(|r| r.error().to_string())?;
    ensure!(own.len() == 4096, "{}", own.len());
    let back = own.into_inner().map_err(|r| r.error().to_string())?;
    ensure!(back == vec![7u8; 4096], "the buffer came back changed");
    mr.close()?;
    Ok(())
}

/// Checks that every completion of `wcs` succeeded, reclaims each on its
/// QP, and returns the bytes the receives among them got.
fn received(wcs: &[WorkCompletion], mut qps: [&mut QueuePair; 2]) -> Result<Vec<u8>, Failed> {
    let mut got = Vec::new();
    for wc in wcs {
        ensure!(wc.status() == Ok(WcStatus::Success), "{wc:?}");
        for qp in qps.iter_mut() {
            qp.reclaim(wc, |c| {
                if wc.opcode() == Ok(WcOpcode::Recv) {
                    for ch in c.chunks() {
                        got.extend_from_slice(&ch.as_slice()[..wc.byte_len() as usize]);
                    }
                }
            });
        }
    }
    Ok(got)
}

/// Two connected RC QPs with one CQ.
fn rc_pair(
    env: &Env,
    pd: &ProtectionDomain,
) -> Result<(rdma_verbs::CompletionQueue, QueuePair, QueuePair), Failed> {
    let cq = env.ctx.create_cq(64)?;
    let attr = QpInitAttr::new(QpType::Rc, &cq, &cq);
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr)?;
    connect(
        env,
        &mut a,
        &mut b,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    Ok((cq, a, b))
}

fn data_moves_through_odp_regions(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let Some(target) = odp_region(env, &pd, 1 << 20)? else {
        return Ok(());
    };
    let (cq, mut a, mut b) = rc_pair(env, &pd)?;
    // Sends from and receives into ODP chunks of a program's own buffer.
    let own = pd
        .register_owned(vec![0u8; 8192], ODP_LOCAL)
        .map_err(|r| r.error().to_string())?;
    let (own, mut chunks) = own.split(4096).map_err(|r| r.error().to_string())?;
    let (mut send, recv) = (chunks.remove(0), chunks.remove(0));
    send.as_mut_slice()[..9].copy_from_slice(b"on demand");
    b.post_recv([RecvWr::new(1).sge(recv)])?;
    // An RDMA write into the middle of the 1 MiB region, never touched by
    // the CPU: the device faults its page in.
    let far = RemoteAddr {
        addr: target.addr() + 700_000,
        rkey: target.rkey(),
    };
    let mut more = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let mut w = more.pop().ok_or("no chunk")?;
    w.as_mut_slice()[..5].copy_from_slice(b"fault");
    a.post_send([
        SendWr::new(2, SendOp::Send).sge_len(send, 9),
        SendWr::new(3, SendOp::RdmaWrite(far)).sge_len(w, 5),
    ])?;
    let wcs = poll_n(&cq, 3)?;
    let got = received(&wcs, [&mut a, &mut b])?;
    ensure!(got == b"on demand", "{got:?}");
    let mut back = [0u8; 5];
    target.read(700_000, &mut back)?;
    ensure!(&back == b"fault", "{back:?}");
    drop(own);
    Ok(())
}

fn prefetch_sync_and_async(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let Some(mr) = odp_region(env, &pd, 1 << 20)? else {
        return Ok(());
    };
    for advice in [
        MrAdvice::Prefetch,
        MrAdvice::PrefetchWrite,
        MrAdvice::PrefetchNoFault,
    ] {
        for sync in [true, false] {
            let r = if sync {
                mr.prefetch(advice, 4096..(1 << 19))
            } else {
                mr.prefetch_async(advice, 0..(1 << 20))
            };
            match r {
                Ok(()) => {}
                // A kernel whose rxe has ODP but no advice (before 6.16):
                // the typed refusal, with the errno it answered.
                Err(e @ Error::Unsupported { .. }) => {
                    ensure!(e.errno() == Some(libc::EOPNOTSUPP), "{e}");
                    eprintln!("{advice:?} (sync {sync}): {e}");
                }
                Err(e) => return Err(format!("{advice:?} (sync {sync}): {e}").into()),
            }
        }
    }
    // The region is still whole and usable.
    let mut r = mr;
    r.write(0, b"still here")?;
    let mut back = [0u8; 10];
    r.read(0, &mut back)?;
    ensure!(&back == b"still here", "{back:?}");
    Ok(())
}

fn prefetch_refusals(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    // A pinned region takes no advice, and a range outside a region is
    // refused first: both before the call, on every device.
    let pinned = pd.register(8192, AccessFlags::LOCAL_WRITE)?;
    invalid(pinned.prefetch(MrAdvice::Prefetch, 0..4096), "on-demand")?;
    invalid(
        pinned.prefetch_async(MrAdvice::PrefetchWrite, 0..4096),
        "on-demand",
    )?;
    range_refusals(&pinned)?;
    let Some(mr) = odp_region(env, &pd, 8192)? else {
        return Ok(());
    };
    range_refusals(&mr)?;
    let read_only = pd.register(4096, AccessFlags::ON_DEMAND | AccessFlags::REMOTE_READ)?;
    invalid(
        read_only.prefetch(MrAdvice::PrefetchWrite, 0..4096),
        "LOCAL_WRITE",
    )?;
    Ok(())
}

/// Ranges `ibv_advise_mr` must never see, for a region of 8192 bytes.
fn range_refusals(mr: &MemoryRegion) -> Result<(), Failed> {
    invalid(mr.prefetch(MrAdvice::Prefetch, 0..8193), "not inside")?;
    invalid(
        mr.prefetch_async(MrAdvice::Prefetch, 8192..8200),
        "not inside",
    )?;
    invalid(mr.prefetch(MrAdvice::Prefetch, 100..100), "empty")?;
    #[allow(clippy::reversed_empty_ranges)]
    invalid(mr.prefetch(MrAdvice::Prefetch, 200..100), "empty")?;
    invalid(
        mr.prefetch(MrAdvice::Prefetch, usize::MAX - 1..usize::MAX),
        "not inside",
    )?;
    Ok(())
}

/// Checks that `r` is an [`Error::InvalidArgument`] that says `needle`.
fn invalid(r: rdma_verbs::Result<()>, needle: &str) -> Result<(), Failed> {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            ensure!(e.to_string().contains(needle), "{e}");
            Ok(())
        }
        other => Err(format!("not refused ({needle}): {other:?}").into()),
    }
}

/// An ODP region's chunks keep it registered while a receive holds one:
/// the region's handle refuses to hand its buffer back, dropping the handle
/// deregisters nothing, and the posted receive still lands.
fn regions_dropped_and_handed_back_while_posted(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    if !has_odp(env)? {
        return Ok(()); // odp::regions_need_the_device checks the refusal
    }
    let (cq, mut a, mut b) = rc_pair(env, &pd)?;
    let own = pd
        .register_owned(vec![0u8; 8192], ODP_LOCAL)
        .map_err(|r| r.error().to_string())?;
    let (region, mut chunks) = own.split(4096).map_err(|r| r.error().to_string())?;
    let posted = chunks.remove(0);
    drop(chunks);
    b.post_recv([RecvWr::new(1).sge(posted)])?;
    // Handing the buffer back while the receive holds a chunk is refused,
    // and the region comes back intact.
    let refused = region
        .into_inner()
        .err()
        .ok_or("handed back while posted")?;
    ensure!(
        matches!(refused.error(), Error::InUse { .. }),
        "{}",
        refused.error()
    );
    let region = refused.into_value();
    ensure!(
        region.chunks_out() == 1,
        "{} chunks out",
        region.chunks_out()
    );
    // Dropping the handle leaves the region registered for the receive.
    drop(region);
    let mut more = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let mut s = more.pop().ok_or("no chunk")?;
    s.as_mut_slice()[..4].copy_from_slice(b"kept");
    a.post_send([SendWr::new(2, SendOp::Send).sge_len(s, 4)])?;
    let wcs = poll_n(&cq, 2)?;
    let got = received(&wcs, [&mut a, &mut b])?;
    ensure!(got == b"kept", "{got:?}");
    Ok(())
}

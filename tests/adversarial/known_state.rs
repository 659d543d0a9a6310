//! From safe code: the known state of a QP follows the device after an
//! error or flush completion, or a fatal async event, and what checks the
//! known state refuses accordingly.
//!
//! Before the fix each test shows the bad behaviour in its failure message:
//! the known state still RTS next to what the device reports.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, AsyncEvent, Error, QpCaps, QpType, QueuePair};

use crate::common::{pair, poll_n, remote_region, Env, Test};
use crate::sure_to_fail::{chunk, statuses};

pub const TESTS: &[Test] = tests![
    error_completion_moves_known_state_to_err,
    flush_completion_moves_known_state_to_err,
    responder_error_shows_after_its_event_or_resync,
];

/// After reclaiming an error completion, the QP is known in ERR, and what
/// checks the known state refuses accordingly.
fn check_known_err(qp: &mut QueuePair, what: &str) -> Result<(), Failed> {
    let device = qp.query_state()?;
    ensure!(
        qp.state() == QpState::Err,
        "after {what}, the known state is {:?}; the device says {device:?}",
        qp.state()
    );
    ensure!(device == QpState::Err, "the device says {device:?}");
    let c = chunk(qp.pd(), 64, AccessFlags::LOCAL_WRITE)?;
    match qp.post_recv([RecvWr::new(7).sge(c)]) {
        Err(PostError {
            error: Error::QpState { state, .. },
            posted: 0,
            returned,
        }) if state == QpState::Err && returned.len() == 1 => Ok(()),
        other => Err(format!("a receive after {what}: {other:?}").into()),
    }
}

/// Two connected RC QPs, the peer's region (kept alive) and an address in
/// it under an rkey the peer never gave: an RDMA WRITE there fails with a
/// remote access error, which moves both QPs to ERR on the device.
fn pair_with_a_bad_rkey(
    env: &Env,
) -> Result<(crate::common::Pair, rdma_verbs::MemoryRegion, RemoteAddr), Failed> {
    let p = pair(
        env,
        QpType::Rc,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE,
    )?;
    let mr = remote_region(&p.pd, 64)?;
    let bad = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey() ^ 0x00ff_ff00,
    };
    Ok((p, mr, bad))
}

/// An RDMA WRITE to an rkey the peer never gave: the sender's completion is
/// an error (the device moved the QP to ERR), and reclaiming it records ERR.
fn error_completion_moves_known_state_to_err(env: &Env) -> Result<(), Failed> {
    let (mut p, _mr, bad) = pair_with_a_bad_rkey(env)?;
    let src = chunk(&p.pd, 8, AccessFlags::LOCAL_WRITE)?;
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(bad)).sge(src)])?;
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(!wcs[0].is_success(), "the write to a bad rkey succeeded");
    let mut ended = 0;
    p.a.reclaim(&wcs[0], |_| ended += 1);
    ensure!(ended == 1, "the completion ended {ended} requests");
    check_known_err(
        &mut p.a,
        &format!("an error completion ({:?})", statuses(&wcs)),
    )
}

/// A failing write with a send behind it: reclaiming only the flushed
/// send's completion (which ends both) records ERR too.
fn flush_completion_moves_known_state_to_err(env: &Env) -> Result<(), Failed> {
    let (mut p, _mr, bad) = pair_with_a_bad_rkey(env)?;
    p.a.post_send([
        SendWr::new(1, SendOp::RdmaWrite(bad)).sge(chunk(&p.pd, 8, AccessFlags::LOCAL_WRITE)?),
        SendWr::new(2, SendOp::Send).sge(chunk(&p.pd, 8, AccessFlags::LOCAL_WRITE)?),
    ])?;
    let wcs = poll_n(&p.cq, 2)?;
    let flushed = wcs
        .iter()
        .find(|w| w.status() == Ok(rdma_verbs::WcStatus::WrFlushErr))
        .ok_or_else(|| format!("no flushed completion: {:?}", statuses(&wcs)))?;
    let mut back = Vec::new();
    let ended = p.a.reclaim_chunks(flushed, &mut back);
    ensure!(
        ended == 2 && back.len() == 2,
        "the flush ended {ended} ({} chunks)",
        back.len()
    );
    check_known_err(&mut p.a, "a flush completion")
}

/// The responder of a write to a bad rkey goes to ERR without any
/// completion of its own. If the device raises a fatal QP event for it,
/// reading the event records the device's state; rxe on Linux 6.1 raises
/// none (measured), and then the known state catches up at `resync`, as
/// `QueuePair::state` documents.
fn responder_error_shows_after_its_event_or_resync(env: &Env) -> Result<(), Failed> {
    let (mut p, _mr, bad) = pair_with_a_bad_rkey(env)?;
    let ctx = env.ctx.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // Blocks in ibv_get_async_event; left behind if no event comes.
    std::thread::spawn(move || {
        while let Ok(ev) = ctx.get_async_event() {
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    let src = chunk(&p.pd, 8, AccessFlags::LOCAL_WRITE)?;
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(bad)).sge(src)])?;
    let wcs = poll_n(&p.cq, 1)?;
    p.a.reclaim_chunks(&wcs[0], &mut Vec::new());
    let b_num = p.b.qp_num();
    let limit = crate::common::deadline() / 4;
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < limit {
        match rx.recv_timeout(limit.saturating_sub(start.elapsed())) {
            Ok(ev) => {
                seen.push(ev);
                let fatal = matches!(ev,
                    AsyncEvent::QpFatal { qp_num } | AsyncEvent::QpReqErr { qp_num }
                    | AsyncEvent::QpAccessErr { qp_num } if qp_num == b_num);
                if fatal {
                    let device = p.b.query_state()?;
                    ensure!(
                        p.b.state() == device,
                        "after {ev:?} the known state of b is {:?}; the device says {device:?}",
                        p.b.state()
                    );
                    return Ok(());
                }
            }
            Err(_) => break,
        }
    }
    let (known, device) = (p.b.state(), p.b.query_state()?);
    eprintln!(
        "no fatal QP event for the responder within {limit:?} (events: {seen:?}); \
         known state of b {known:?}, device {device:?}: the event path was not exercised"
    );
    let synced = p.b.resync()?;
    ensure!(
        synced == device && p.b.state() == device,
        "after resync the known state of b is {:?}; the device says {device:?}",
        p.b.state()
    );
    Ok(())
}

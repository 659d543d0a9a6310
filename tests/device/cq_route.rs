//! `CqRouter`: one CQ shared by two connected QPs, each QP's completions
//! handed to its own `QpInbox` by QP number, from one thread and from a
//! thread per QP; attacked with the same registration twice, a QP of
//! another CQ, an inbox dropped with completions queued, completions for
//! a QP nobody registered, and a wait that nothing answers.

use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::qp::{RecvWr, RequestKind, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, CqRouter, Error, QpCaps, QpInbox, QpType, QueuePair, WorkCompletion,
};

use rdma_verbs::ProtectionDomain;

use crate::common::{deadline, pair, under_valgrind, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    each_qp_gets_its_own_completions,
    misuse_refused_and_nothing_lost,
    a_thread_per_qp_on_one_cq,
];

fn rc_pair(env: &Env) -> Result<Pair, Failed> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    pair(env, QpType::Rc, caps, AccessFlags::empty())
}

/// Posts `n` receives of 64 bytes on `qp`.
fn post_recvs(pd: &ProtectionDomain, qp: &mut QueuePair, n: usize) -> Result<(), Failed> {
    let bufs = pd.alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE)?;
    qp.post_recv(bufs.into_iter().map(|c| RecvWr::new(1).sge(c)))?;
    Ok(())
}

/// Sends `n` 8-byte messages from `qp`.
fn post_sends(pd: &ProtectionDomain, qp: &mut QueuePair, n: usize) -> Result<(), Failed> {
    let bufs = pd.alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE)?;
    qp.post_send(
        bufs.into_iter()
            .map(|c| SendWr::new(2, SendOp::Send).sge_len(c, 8)),
    )?;
    Ok(())
}

/// Takes `n` completions from `inbox`, each reclaimed on `qp` (never
/// another QP's: `reclaim_one` would not know it), counting sends and
/// receives.
fn take(inbox: &mut QpInbox, qp: &mut QueuePair, n: usize) -> Result<(usize, usize), Failed> {
    let (mut sends, mut recvs) = (0, 0);
    let mut wcs = [WorkCompletion::default(); 8];
    while sends + recvs < n {
        for wc in inbox.wait(&mut wcs, deadline())?.iter() {
            ensure!(wc.is_success(), "{wc:?}");
            ensure!(
                wc.qp_num() == inbox.qp_num(),
                "{wc:?} in inbox {:#x}",
                inbox.qp_num()
            );
            let done = qp.reclaim_one(wc).ok_or(format!("not the QP's: {wc:?}"))?;
            match done.kind {
                RequestKind::Send => sends += 1,
                RequestKind::Recv => recvs += 1,
                k => return Err(format!("{k:?}").into()),
            }
        }
    }
    Ok((sends, recvs))
}

/// Messages both ways at once on two QPs of one CQ: each inbox holds
/// exactly its QP's sends and receives.
fn each_qp_gets_its_own_completions(env: &Env) -> Result<(), Failed> {
    let Pair {
        pd,
        cq,
        mut a,
        mut b,
    } = rc_pair(env)?;
    let router = CqRouter::new(&cq);
    let (mut ia, mut ib) = (router.register(&a)?, router.register(&b)?);
    post_recvs(&pd, &mut a, 5)?;
    post_recvs(&pd, &mut b, 7)?;
    post_sends(&pd, &mut a, 7)?;
    post_sends(&pd, &mut b, 5)?;
    // Take b's first: a's completions polled meanwhile wait in a's inbox.
    ensure!(take(&mut ib, &mut b, 12)? == (5, 7), "b's counts");
    ensure!(take(&mut ia, &mut a, 12)? == (7, 5), "a's counts");
    ensure!(router.unrouted() == 0, "{} unrouted", router.unrouted());
    ensure!(ia.queued() == 0 && ib.queued() == 0, "completions left");
    Ok(())
}

fn misuse_refused_and_nothing_lost(env: &Env) -> Result<(), Failed> {
    let Pair {
        pd,
        cq,
        mut a,
        mut b,
    } = rc_pair(env)?;
    let router = CqRouter::new(&cq);
    let ia = router.register(&a)?;
    // The same QP twice.
    match router.register(&a) {
        Err(Error::InvalidArgument { reason, .. }) if reason.contains("registered already") => {}
        other => return Err(format!("second registration: {other:?}").into()),
    }
    // A QP of another CQ.
    let other_cq = env.ctx.create_cq(4)?;
    let stranger = pd.create_qp(&rdma_verbs::QpInitAttr::new(
        QpType::Rc,
        &other_cq,
        &other_cq,
    ))?;
    match router.register(&stranger) {
        Err(Error::InvalidArgument { reason, .. }) if reason.contains("not on this CQ") => {}
        other => return Err(format!("QP of another CQ: {other:?}").into()),
    }
    // A wait nothing answers ends typed, at its deadline.
    let mut ia = ia;
    let mut wcs = [WorkCompletion::default(); 4];
    let (short, start) = (Duration::from_millis(50), Instant::now());
    match ia.wait(&mut wcs, short) {
        Err(Error::Timeout { what, waited }) => ensure!(
            what == "a completion of the QP" && waited == short,
            "{what} {waited:?}"
        ),
        other => return Err(format!("wait on nothing: {other:?}").into()),
    }
    ensure!(start.elapsed() >= short, "after {:?}", start.elapsed());
    ensure!(ia.wait(&mut [], deadline())?.is_empty(), "an empty buffer");
    // b is not registered: its receives' completions are counted, not
    // routed; its requests stay with it (RESET hands them back).
    post_recvs(&pd, &mut b, 2)?;
    post_sends(&pd, &mut a, 2)?;
    ensure!(take(&mut ia, &mut a, 2)? == (2, 0), "a's sends");
    let start = Instant::now();
    while router.unrouted() < 2 {
        router.route()?;
        ensure!(
            start.elapsed() < deadline(),
            "{} unrouted",
            router.unrouted()
        );
    }
    ensure!(router.unrouted() == 2, "{} unrouted", router.unrouted());
    // An inbox dropped with completions queued leaves them for the QP's
    // next registration, which gets them first: nothing lost.
    let ib = router.register(&b)?;
    post_recvs(&pd, &mut b, 3)?;
    post_sends(&pd, &mut a, 3)?;
    let start = Instant::now();
    while ib.queued() < 3 {
        router.route()?;
        ensure!(start.elapsed() < deadline(), "{} queued", ib.queued());
    }
    drop(ib);
    ensure!(
        router.unrouted() == 5,
        "{} unrouted after the drop",
        router.unrouted()
    );
    let mut ib = router.register(&b)?;
    ensure!(ib.queued() == 3, "{} handed back", ib.queued());
    ensure!(take(&mut ib, &mut b, 3)? == (0, 3), "b's receives");
    ensure!(take(&mut ia, &mut a, 3)? == (3, 0), "a's sends");
    ensure!(router.unrouted() == 2, "{} unrouted", router.unrouted());
    // The two unrouted receives come back at RESET.
    let back = b.reset()?;
    ensure!(back.len() == 2, "{} back at RESET", back.len());
    Ok(())
}

/// A thread per QP, each waiting in its own inbox for a ping-pong on one
/// CQ: every message arrives in order, in the right thread.
fn a_thread_per_qp_on_one_cq(env: &Env) -> Result<(), Failed> {
    let Pair { pd, cq, a, b } = rc_pair(env)?;
    let router = CqRouter::new(&cq);
    let rounds: u32 = if under_valgrind() { 50 } else { 500 };
    let ia = router.register(&a)?;
    let ib = router.register(&b)?;
    // Each side's receive is posted before either sends (no RNR wait).
    let prepare = |qp: &mut QueuePair| -> Result<Option<rdma_verbs::Chunk>, Failed> {
        let mut bufs = pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
        let send = bufs.pop();
        qp.post_recv(bufs.into_iter().map(|c| RecvWr::new(1).sge(c)))?;
        Ok(send)
    };
    let (mut a, mut b) = (a, b);
    let (send_a, send_b) = (prepare(&mut a)?, prepare(&mut b)?);
    // A sends message i once the echo of i - 1 is back; B echoes each
    // message with the chunk of its last echo, once that send is done
    // (message i + 1 may come before that completion, in the same batch).
    let side = |mut qp: QueuePair,
                mut inbox: QpInbox,
                mut send: Option<rdma_verbs::Chunk>,
                first: bool|
     -> Result<(), String> {
        let e = |x: Error| x.to_string();
        let mut wcs = [WorkCompletion::default(); 4];
        let (mut received, mut pending) = (0u32, std::collections::VecDeque::new());
        if first {
            pending.push_back(0u32);
        }
        while received < rounds || send.is_none() || !pending.is_empty() {
            // (Both looked at before `take`: a take that does not match
            // would drop the chunk.)
            if let (Some(&n), true) = (pending.front(), send.is_some()) {
                let mut c = send.take().ok_or("no send buffer")?;
                c.as_mut_slice()[..4].copy_from_slice(&n.to_le_bytes());
                qp.post_send([SendWr::new(2, SendOp::Send).sge_len(c, 4)])
                    .map_err(|x| x.to_string())?;
                pending.pop_front();
                continue;
            }
            let got = inbox.wait(&mut wcs, deadline()).map_err(|x| {
                format!(
                    "{} side: {} of {rounds} received, send chunk {}, pending {pending:?}, {} sends and {} receives outstanding, {} queued: {}",
                    if first { "sending" } else { "echo" },
                    received,
                    if send.is_some() { "here" } else { "out" },
                    qp.outstanding_sends(),
                    qp.outstanding_recvs(),
                    inbox.queued(),
                    e(x)
                )
            })?;
            for wc in got.iter() {
                if !wc.is_success() {
                    return Err(format!("{wc:?}"));
                }
                let done = qp.reclaim_one(wc).ok_or(format!("not ours: {wc:?}"))?;
                let kind = done.kind;
                let chunk = done.into_chunk().ok_or("no chunk")?;
                if kind == RequestKind::Send {
                    send = Some(chunk);
                    continue;
                }
                let n = u32::from_le_bytes(chunk.as_slice()[..4].try_into().unwrap_or([0; 4]));
                if n != received {
                    return Err(format!("message {n} where {received} was due"));
                }
                received += 1;
                qp.post_recv([RecvWr::new(1).sge(chunk)])
                    .map_err(|x| x.to_string())?;
                if !first {
                    pending.push_back(n);
                } else if received < rounds {
                    pending.push_back(received);
                }
            }
        }
        Ok(())
    };
    let (ra, rb) = std::thread::scope(|s| {
        let side = &side;
        let ta = s.spawn(move || side(a, ia, send_a, true));
        let tb = s.spawn(move || side(b, ib, send_b, false));
        (ta.join(), tb.join())
    });
    ra.map_err(|_| "thread a panicked")??;
    rb.map_err(|_| "thread b panicked")??;
    ensure!(router.unrouted() == 0, "{} unrouted", router.unrouted());
    Ok(())
}

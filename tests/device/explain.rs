//! `QueuePair::explain`: each cause it names, provoked on the device, and
//! the explanation naming it with the facts it rests on.

use libtest_mimic::Failed;
use rdma_verbs::qp::{
    AckTimeout, CauseKind, Explanation, Psn, RecvWr, RemoteAddr, RetryCount, RnrRetry, SendOp,
    SendWr,
};
use rdma_verbs::{AccessFlags, QpCaps, QpInitAttr, QpType, QueuePair, WcStatus, WorkCompletion};

use crate::common::{opts, pair, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    wrong_peer_qp_is_retry_exceeded_then_flushes,
    no_receive_with_rnr_retry_0_is_rnr_retry_exceeded,
    rdma_write_without_remote_write_is_remote_access,
    rdma_write_past_the_region_is_remote_access,
    send_longer_than_the_receive_on_both_sides,
    success_and_another_qps_completion,
    an_extended_cqs_completion,
];

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        ..QpCaps::default()
    }
}

/// `x` names a cause of `kind` whose text holds every one of `words`.
fn names(x: &Explanation, kind: CauseKind, words: &[&str]) -> Result<(), Failed> {
    let text = x.to_string();
    println!("{text}\n");
    let cause = x.causes().iter().find(|c| c.kind() == kind);
    let Some(cause) = cause else {
        return Err(format!("no {kind:?} cause in:\n{text}").into());
    };
    for w in words {
        ensure!(cause.text().contains(w), "{kind:?} lacks {w:?}:\n{text}");
    }
    Ok(())
}

/// The completion of `qp` among `wcs`, with status `status`.
fn of(qp: &QueuePair, wcs: &[WorkCompletion], status: WcStatus) -> Result<WorkCompletion, Failed> {
    of_any(qp, wcs, &[status])
}

/// The completion of `qp` among `wcs`, with one of `statuses`.
fn of_any(
    qp: &QueuePair,
    wcs: &[WorkCompletion],
    statuses: &[WcStatus],
) -> Result<WorkCompletion, Failed> {
    wcs.iter()
        .copied()
        .find(|w| w.qp_num() == qp.qp_num() && w.status().is_ok_and(|s| statuses.contains(&s)))
        .ok_or_else(|| format!("no {statuses:?} of QP {:#x} in {wcs:?}", qp.qp_num()).into())
}

/// How a receive shorter than the message ends, on the receiver and on
/// the sender: LOC_LEN_ERR and REM_INV_REQ_ERR as the verbs say, or
/// LOC_QP_OP_ERR and REM_OP_ERR as rxe on Linux 6.1 does (measured).
const SHORT_RECV: [WcStatus; 2] = [WcStatus::LocLenErr, WcStatus::LocQpOpErr];
const SHORT_RECV_SENDER: [WcStatus; 2] = [WcStatus::RemInvReqErr, WcStatus::RemOpErr];

/// An RC QP connected to a QP that no longer exists, with a short ACK
/// timeout and one retry: its send fails with RETRY_EXC_ERR, naming the
/// dead QP's number; the send behind it is flushed, and the flush names
/// the first failure once that was reclaimed.
fn wrong_peer_qp_is_retry_exceeded_then_flushes(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let attr = QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps());
    let mut a = pd.create_qp(&attr)?;
    let gone = pd.create_qp(&attr)?;
    let mut o = opts(env, AccessFlags::empty());
    o.timeout = AckTimeout::new(12)?; // 16.8 ms
    o.retry_cnt = RetryCount::new(1)?;
    let peer = gone.local_endpoint(&o, Psn::new(7)?)?;
    let dead = peer.qpn;
    gone.close()?;
    let mine = a.local_endpoint(&o, Psn::new(1)?)?;
    a.connect(&o, mine.psn, &peer)?;
    let mut bufs = pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    for id in [1, 2] {
        a.post_send([SendWr::new(id, SendOp::Send).sge_len(bufs.pop().ok_or("chunk")?, 8)])?;
    }
    let wcs = poll_n(&cq, 2)?;
    let failed = of(&a, &wcs, WcStatus::RetryExcErr)?;
    let flushed = of(&a, &wcs, WcStatus::WrFlushErr)?;
    let x = a.explain(&failed);
    let dead_hex = format!("{dead:#x}");
    names(&x, CauseKind::PeerQp, &[&dead_hex])?;
    names(
        &x,
        CauseKind::AckTimeout,
        &["timeout 12", "retry_cnt 1", "2 tries"],
    )?;
    names(&x, CauseKind::GidPath, &[&peer.gid.to_string()])?;
    let a_ = x.facts().attrs.as_ref().ok_or("no attributes")?;
    ensure!(a_.dest_qp_num == dead, "dest QPN {:#x}", a_.dest_qp_num);
    ensure!(
        x.facts().sgid.is_some_and(|s| s.gid == peer.gid),
        "source GID {:?}",
        x.facts().sgid
    );
    ensure!(
        !x.names(CauseKind::NoGrhOnRoce) && !x.names(CauseKind::Lid0OnInfiniBand),
        "a path fault named on a good path:\n{x}"
    );
    // The flush before anything was reclaimed: the QP cannot name the
    // first failure yet, and says where to look.
    names(
        &a.explain(&flushed),
        CauseKind::EarlierFailure,
        &["none reclaimed"],
    )?;
    ensure!(
        a.reclaim_one(&failed).is_some(),
        "the failed send ended nothing"
    );
    names(
        &a.explain(&flushed),
        CauseKind::EarlierFailure,
        &["IBV_WC_RETRY_EXC_ERR", "send-queue request"],
    )?;
    ensure!(
        a.reclaim_one(&flushed).is_some(),
        "the flushed send ended nothing"
    );
    // A RESET forgets the failure.
    a.reset()?;
    names(
        &a.explain(&flushed),
        CauseKind::EarlierFailure,
        &["none reclaimed"],
    )?;
    Ok(())
}

/// A send to a peer with no receive posted, from a QP with rnr_retry 0:
/// RNR_RETRY_EXC_ERR, naming the peer and the retry count.
fn no_receive_with_rnr_retry_0_is_rnr_retry_exceeded(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let attr = QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps());
    let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
    let mut oa = opts(env, AccessFlags::empty());
    oa.rnr_retry = RnrRetry::new(0)?;
    let ob = opts(env, AccessFlags::empty());
    let (ea, eb) = (
        a.local_endpoint(&oa, Psn::new(1)?)?,
        b.local_endpoint(&ob, Psn::new(2)?)?,
    );
    a.connect(&oa, ea.psn, &eb)?;
    b.connect(&ob, eb.psn, &ea)?;
    let chunk = pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("chunk")?;
    a.post_send([SendWr::new(1, SendOp::Send).sge_len(chunk, 8)])?;
    let wcs = poll_n(&cq, 1)?;
    let failed = of(&a, &wcs, WcStatus::RnrRetryExcErr)?;
    let x = a.explain(&failed);
    let b_hex = format!("{:#x}", b.qp_num());
    names(&x, CauseKind::NoReceiveAtPeer, &[&b_hex, "rnr_retry is 0"])?;
    ensure!(x.causes().len() == 1, "more than the one cause:\n{x}");
    ensure!(b.outstanding_recvs() == 0, "b holds receives");
    Ok(())
}

/// An RDMA WRITE of `len` bytes from `a` into a region of `b`'s with
/// `access`, at its start, or (`past_end`) 32 bytes before its end (the
/// region's length as registered: `Pages` may round it up): its one
/// completion, a REM_ACCESS_ERR, explained.
fn write_fails(
    env: &Env,
    access: AccessFlags,
    past_end: bool,
    len: usize,
) -> Result<Explanation, Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = p.pd.register(64, access)?;
    let offset = if past_end {
        target.len() as u64 - 32
    } else {
        0
    };
    let src =
        p.pd.alloc_chunks(1, 4096, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("chunk")?;
    let remote = RemoteAddr {
        addr: target.addr() + offset,
        rkey: target.rkey(),
    };
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(remote)).sge_len(src, len)])?;
    let wcs = poll_n(&p.cq, 1)?;
    let failed = of(&p.a, &wcs, WcStatus::RemAccessErr)?;
    let x = p.a.explain(&failed);
    ensure!(x.status() == Ok(WcStatus::RemAccessErr), "{x}");
    ensure!(
        x.to_string().contains(&format!("{:#x}", p.b.qp_num())),
        "the peer QP is not named:\n{x}"
    );
    Ok(x)
}

/// An RDMA WRITE to a region registered without REMOTE_WRITE.
fn rdma_write_without_remote_write_is_remote_access(env: &Env) -> Result<(), Failed> {
    let x = write_fails(
        env,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        false,
        16,
    )?;
    names(&x, CauseKind::RemoteRights, &["IBV_ACCESS_REMOTE_WRITE"])?;
    ensure!(x.causes()[0].kind() == CauseKind::RemoteRights, "{x}");
    Ok(())
}

/// An RDMA WRITE that runs 32 bytes past a writable region's end.
fn rdma_write_past_the_region_is_remote_access(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let x = write_fails(env, access, true, 64)?;
    names(&x, CauseKind::RemoteRange, &["RemoteAddr", "addr"])?;
    names(&x, CauseKind::StaleRkey, &["rkey"])
}

/// A 64-byte send into a 16-byte receive: LOC_LEN_ERR (rxe:
/// LOC_QP_OP_ERR) on the receiver, naming the receive's 16 bytes once the
/// request is given, and REM_INV_REQ_ERR (rxe: REM_OP_ERR) on the sender,
/// naming the peer's short receive first.
fn send_longer_than_the_receive_on_both_sides(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut bufs = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let small =
        p.pd.alloc_chunks(1, 16, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("chunk")?;
    p.b.post_recv([RecvWr::new(1).sge(small)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(bufs.pop().ok_or("chunk")?, 64)])?;
    let wcs = poll_n(&p.cq, 2)?;
    let recv = of_any(&p.b, &wcs, &SHORT_RECV)?;
    let send = of_any(&p.a, &wcs, &SHORT_RECV_SENDER)?;
    let x = p.b.explain(&recv);
    names(&x, CauseKind::ReceiveTooShort, &["receive"])?;
    ensure!(x.causes()[0].kind() == CauseKind::ReceiveTooShort, "{x}");
    let done = p.b.reclaim_one(&recv).ok_or("the receive ended nothing")?;
    let x = x.with_request(&done);
    names(&x, CauseKind::ReceiveTooShort, &["(16 bytes)"])?;
    ensure!(
        x.facts().recv_bytes == Some(16),
        "{:?}",
        x.facts().recv_bytes
    );
    let b_hex = format!("{:#x}", p.b.qp_num());
    let y = p.a.explain(&send);
    names(&y, CauseKind::PeerReceiveTooShort, &[&b_hex, "IBV_WC_LOC_"])?;
    ensure!(
        y.causes()[0].kind() == CauseKind::PeerReceiveTooShort,
        "{y}"
    );
    // The receiver's completion offered to the sender: a typed answer.
    let z = p.a.explain(&recv);
    ensure!(z.causes().len() == 1 && z.names(CauseKind::OtherQp), "{z}");
    names(&z, CauseKind::OtherQp, &[&b_hex])?;
    Ok(())
}

/// A successful completion has nothing to explain; another QP's is named
/// as such, whatever its status.
fn success_and_another_qps_completion(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut bufs = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    p.b.post_recv([RecvWr::new(1).sge(bufs.pop().ok_or("chunk")?)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(bufs.pop().ok_or("chunk")?, 8)])?;
    let wcs = poll_n(&p.cq, 2)?;
    let sent = of(&p.a, &wcs, WcStatus::Success)?;
    let got = of(&p.b, &wcs, WcStatus::Success)?;
    let x = p.a.explain(&sent);
    ensure!(
        x.causes().len() == 1 && x.names(CauseKind::NotFailed),
        "{x}"
    );
    ensure!(x.to_string().contains("succeeded"), "{x}");
    let y = p.a.explain(&got);
    names(&y, CauseKind::OtherQp, &[&format!("{:#x}", p.b.qp_num())])?;
    // A zeroed completion (QP 0, status success) is nobody's here.
    let z = p.b.explain(&WorkCompletion::default());
    ensure!(z.names(CauseKind::OtherQp), "{z}");
    Ok(())
}

/// A completion read from an extended CQ ([`rdma_verbs::PolledWc`]) is
/// explained as a basic one: a 64-byte send into a 16-byte receive.
fn an_extended_cqs_completion(env: &Env) -> Result<(), Failed> {
    let mut cq = env.ctx.create_cq_ex(16).standard().build()?;
    let pd = env.ctx.alloc_pd()?;
    let attr = QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq()).caps(caps());
    let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
    crate::common::connect(env, &mut a, &mut b, AccessFlags::empty())?;
    let small = pd
        .alloc_chunks(1, 16, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("chunk")?;
    let big = pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("chunk")?;
    b.post_recv([RecvWr::new(1).sge(small)])?;
    a.post_send([SendWr::new(2, SendOp::Send).sge_len(big, 64)])?;
    let (start, limit) = (std::time::Instant::now(), crate::common::deadline());
    let mut seen = Vec::new();
    while seen.len() < 2 {
        if let Some(mut batch) = cq.start_poll()? {
            while let Some(wc) = batch.next()? {
                let (own, other) = if wc.qp_num() == b.qp_num() {
                    (&b, &a)
                } else {
                    (&a, &b)
                };
                let x = own.explain(&wc);
                ensure!(x.status() == wc.status(), "{x}");
                ensure!(other.explain(&wc).names(CauseKind::OtherQp), "{x}");
                seen.push(x);
            }
        }
        ensure!(start.elapsed() < limit, "{} of 2 completions", seen.len());
    }
    let recv = seen
        .iter()
        .find(|x| x.status().is_ok_and(|s| SHORT_RECV.contains(&s)))
        .ok_or("no LOC_LEN_ERR or LOC_QP_OP_ERR")?;
    names(recv, CauseKind::ReceiveTooShort, &["receive"])?;
    let send = seen
        .iter()
        .find(|x| x.status().is_ok_and(|s| SHORT_RECV_SENDER.contains(&s)))
        .ok_or("no REM_INV_REQ_ERR or REM_OP_ERR")?;
    names(
        send,
        CauseKind::PeerReceiveTooShort,
        &[&format!("{:#x}", b.qp_num())],
    )
}

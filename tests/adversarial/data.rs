//! Attacks on the data path's promises, from safe code: a chunk the caller
//! holds is never written by the device, every lent chunk comes back
//! exactly once, and bad input is refused with a typed error that hands
//! the chunks back. One test per way it could break: empty posts, sends
//! below RTS, SRQ and QP completions crossing, chunks of another PD or too
//! many of them, and chunks lost to ERR, a CQ overrun, RESET or destroy.

use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Context, Error, MemoryRegion, ProtectionDomain,
    QpInitAttr, QpState, QpType, QueuePair, SharedReceiveQueue, WcStatus, WorkCompletion,
};

use crate::common::{connect, deadline, opts, poll_n, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    empty_posts_post_nothing,
    sends_below_rts_never_reach_the_provider,
    srq_and_qp_completions_never_cross,
    another_qps_completions_end_nothing_here,
    foreign_pd_and_too_many_sges_are_refused_whole,
    a_full_queue_refuses_the_call_whole_with_queue_full,
    nothing_lent_is_lost_by_err_overrun_reset_or_destroy,
];

/// How long to watch for something that must *not* happen.
const QUIET: Duration = Duration::from_millis(300);

fn qp(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    srq: Option<&SharedReceiveQueue>,
) -> Result<QueuePair, Failed> {
    let mut attr = QpInitAttr::new(QpType::Rc, cq, cq);
    if let Some(s) = srq {
        attr = attr.srq(s);
    }
    Ok(pd.create_qp(&attr)?)
}

fn pair(env: &Env, access: AccessFlags) -> Result<Pair, Failed> {
    crate::common::pair(env, QpType::Rc, QpCaps::default(), access)
}

fn chunk(pd: &ProtectionDomain, len: usize, fill: u8) -> Result<Chunk, Failed> {
    let mut c = pd
        .alloc_chunks(1, len, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("no chunk")?;
    c.as_mut_slice().fill(fill);
    Ok(c)
}

/// Polls for `QUIET` and returns whatever arrived (expected: nothing).
fn poll_quiet(cq: &CompletionQueue) -> Result<Vec<WorkCompletion>, Failed> {
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while start.elapsed() < QUIET {
        out.extend_from_slice(cq.poll(&mut wcs)?);
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(out)
}

fn chunks_of(qp: &mut QueuePair, wc: &WorkCompletion) -> Vec<(u64, Chunk)> {
    let mut back = Vec::new();
    qp.reclaim(wc, |d| {
        let id = d.wr_id;
        back.extend(d.chunks().map(|c| (id, c)));
    });
    back
}

/// Offers completion `wc`, which is not `qp`'s, to every way `qp` and
/// `pool` (posted to `qp`) take completions back: none may end anything,
/// or move `qp`'s known state.
fn ends_nothing(
    qp: &mut QueuePair,
    pool: &mut RecvBuffers,
    wc: &WorkCompletion,
) -> Result<(), Failed> {
    let (state, sends, recvs) = (qp.state(), qp.outstanding_sends(), qp.outstanding_recvs());
    let what = format!("{:?} of QP {:#x}", wc.status(), wc.qp_num());
    ensure!(qp.reclaim(wc, |_| {}) == 0, "reclaim ended {what}");
    ensure!(qp.reclaim_one(wc).is_none(), "reclaim_one ended {what}");
    ensure!(
        qp.reclaim_chunks(wc, &mut Vec::new()) == 0,
        "reclaim_chunks ended {what}"
    );
    match pool.take(qp, wc) {
        Taken::Nothing => {}
        other => return Err(format!("the pool took {what}: {other:?}").into()),
    }
    let (mut tx, mut rx) = qp.split();
    ensure!(tx.reclaim(wc, |_| {}) == 0, "the send half ended {what}");
    ensure!(rx.reclaim(wc, |_| {}) == 0, "the receive half ended {what}");
    ensure!(
        (qp.state(), qp.outstanding_sends(), qp.outstanding_recvs()) == (state, sends, recvs),
        "{what} changed the QP: {:?}, {} sends, {} receives",
        qp.state(),
        qp.outstanding_sends(),
        qp.outstanding_recvs()
    );
    Ok(())
}

/// Every completion of one QP (sends, receives into a pool and into
/// chunks, successful and flushed) offered to another QP of the same CQ,
/// through `reclaim`, `reclaim_one`, `reclaim_chunks`, its halves and its
/// pool's `take`, ends nothing there and leaves its state alone; the QP it
/// is of then takes it, once. The QPs' numbers are not compared on this
/// path: the tag's stamp, unique in the process, is what decides.
fn another_qps_completions_end_nothing_here(env: &Env) -> Result<(), Failed> {
    let Pair {
        pd,
        cq,
        mut a,
        mut b,
    } = pair(env, AccessFlags::empty())?;
    let (mut pool_a, mut pool_b) = (RecvBuffers::new(&pd, 2, 64)?, RecvBuffers::new(&pd, 2, 64)?);
    pool_a.post(&mut a)?;
    pool_b.post(&mut b)?;
    b.post_recv([RecvWr::new(5).sge(chunk(&pd, 64, 0)?)])?;
    a.post_send([SendWr::new(1, SendOp::Send).sge_len(chunk(&pd, 64, b'a')?, 8)])?;
    b.post_send([SendWr::new(2, SendOp::Send).sge_len(chunk(&pd, 64, b'b')?, 8)])?;
    let wcs = poll_n(&cq, 4)?;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let (mine, other, my_pool, other_pool) = if wc.qp_num() == a.qp_num() {
            (&mut a, &mut b, &mut pool_a, &mut pool_b)
        } else {
            (&mut b, &mut a, &mut pool_b, &mut pool_a)
        };
        ends_nothing(other, other_pool, wc)?;
        match my_pool.take(mine, wc) {
            Taken::Mine(m) => ensure!(m.len() == 8, "{} bytes", m.len()),
            Taken::Other(c) => ensure!(c.wr_id == 1 || c.wr_id == 2, "{c:?}"),
            Taken::Nothing => return Err(format!("its own QP took nothing of {wc:?}").into()),
        }
        ensure!(mine.reclaim(wc, |_| {}) == 0, "taken twice: {wc:?}");
    }
    // A flushed completion: b in ERR, a send posted there flushes (the
    // first completion may also be one of b's receives, on kernels whose
    // rxe flushes receives in ERR: offered the same).
    b.modify(&QpAttr::new().state(QpState::Err))?;
    b.post_send([SendWr::new(3, SendOp::Send).sge_len(chunk(&pd, 64, b'c')?, 8)])?;
    let flushed = poll_n(&cq, 1)?;
    for wc in &flushed {
        ensure!(!wc.is_success() && wc.qp_num() == b.qp_num(), "{wc:?}");
        ends_nothing(&mut a, &mut pool_a, wc)?;
        ensure!(
            a.state() == QpState::Rts,
            "b's flush moved a to {:?}",
            a.state()
        );
        ensure!(b.reclaim(wc, |_| {}) == 1, "b's own flush: {wc:?}");
    }
    Ok(())
}

fn refused(r: Result<(), PostError>, what: &str) -> Result<(Error, Vec<Chunk>), Failed> {
    match r {
        Err(PostError {
            error,
            posted: 0,
            returned,
        }) => Ok((error, returned)),
        Err(e) => Err(format!("{what}: the queue kept {} request(s): {e}", e.posted).into()),
        Ok(()) => Err(format!("{what}: accepted").into()),
    }
}

/// `post_send([])`, `post_recv([])` and an SRQ's `post_recv([])`
/// on a fresh QP, and after real posts were reclaimed: no crash, nothing
/// outstanding, and the device never writes a chunk the caller holds (the
/// old code re-posted the previous, reclaimed receive).
fn empty_posts_post_nothing(env: &Env) -> Result<(), Failed> {
    // Fresh objects, nothing ever posted (the old code crashed here).
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let mut fresh = qp(&pd, &cq, None)?;
    fresh.post_send([])?;
    fresh.post_recv([])?;
    let srq = pd.create_srq(4, 1, 0)?;
    srq.post_recv([])?;
    ensure!(
        fresh.outstanding_sends() + fresh.outstanding_recvs() + srq.outstanding() == 0,
        "an empty post left something outstanding"
    );
    drop(fresh);

    let mut p = pair(env, AccessFlags::empty())?;
    p.b.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 64, 0)?)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(chunk(&p.pd, 64, b'1')?, 8)])?;
    let (mut held, mut msg) = (None, None);
    for wc in poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "{wc:?}");
        held = held.or(chunks_of(&mut p.b, &wc).pop().map(|x| x.1));
        msg = msg.or(chunks_of(&mut p.a, &wc).pop().map(|x| x.1));
    }
    let mut held = held.ok_or("the receive chunk did not come back")?;
    ensure!(
        &held.as_slice()[..8] == b"11111111",
        "the first message did not land"
    );
    held.as_mut_slice().fill(0xaa);
    // Now empty posts, then a message to b, which has no receive: it must
    // wait (RNR), not land in the chunk the caller holds.
    p.b.post_recv([])?;
    p.a.post_send([])?;
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "empty posts left {} sends, {} receives outstanding",
        p.a.outstanding_sends(),
        p.b.outstanding_recvs()
    );
    let mut msg = msg.ok_or("the send chunk did not come back")?;
    msg.as_mut_slice().fill(b'2');
    p.a.post_send([SendWr::new(3, SendOp::Send).sge_len(msg, 8)])?;
    let stray = poll_quiet(&p.cq)?;
    ensure!(
        stray.is_empty(),
        "completions with no receive posted: {stray:?}"
    );
    ensure!(
        held.as_slice().iter().all(|&b| b == 0xaa),
        "the device wrote a chunk the caller holds: {:?}",
        &held.as_slice()[..8]
    );
    // A real receive takes the waiting message; everything comes back.
    p.b.post_recv([RecvWr::new(4).sge(held)])?;
    let mut back = 0;
    for wc in poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "{wc:?}");
        back += chunks_of(&mut p.a, &wc).len() + chunks_of(&mut p.b, &wc).len();
    }
    ensure!(back == 2, "{back} chunks back, expected 2");
    Ok(())
}

/// A send posted below RTS is refused before the provider is
/// asked (rxe would write it into its ring, fail the doorbell, and run it
/// once a later post rings the doorbell in RTS), its chunk comes back in
/// the error, and it never runs: after the QP reaches RTS (INIT -> RTR ->
/// RTS, no RESET in between to discard anything) and a later post rings
/// the doorbell, the chunk the refused RDMA READ named is never written and
/// no completion appears for it.
fn sends_below_rts_never_reach_the_provider(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let mut a = qp(&pd, &cq, None)?;
    let mut b = qp(&pd, &cq, None)?;
    let mut region: MemoryRegion = pd.register(
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    region.write(0, &[0x5a; 64])?;
    let remote = RemoteAddr {
        addr: region.addr(),
        rkey: region.rkey(),
    };
    let o = opts(env, access);
    let (ea, eb) = (
        a.local_endpoint(&o, Psn::new(1)?)?,
        b.local_endpoint(&o, Psn::new(2)?)?,
    );
    b.connect(&o, eb.psn, &ea)?;
    let gid_index = env
        .ctx
        .gid_table()?
        .into_iter()
        .find(|e| e.gid == ea.gid && e.port == u32::from(env.port))
        .map_or(0, |e| e.index as u8);
    let mut av = AddressVector::new(env.port).dlid(eb.lid);
    if !eb.gid.is_zero() {
        av = av.global(GlobalRoute::new(eb.gid, gid_index).hop_limit(1));
    }
    let steps = [
        QpAttr::new()
            .state(QpState::Init)
            .pkey_index(0)
            .port(env.port)
            .access_flags(access),
        QpAttr::new()
            .state(QpState::Rtr)
            .av(av)
            .path_mtu(env.ctx.query_port(env.port)?.active_mtu)
            .dest_qpn(eb.qpn)
            .rq_psn(eb.psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(MinRnrTimer::new(12)?),
        QpAttr::new()
            .state(QpState::Rts)
            .timeout(AckTimeout::new(14)?)
            .retry_cnt(RetryCount::new(7)?)
            .rnr_retry(RnrRetry::INFINITE)
            .sq_psn(ea.psn)
            .max_rd_atomic(1),
    ];
    let mut dst = chunk(&pd, 64, 0)?;
    // RESET, INIT and RTR: each refused with the state named, chunk back.
    for step in &steps {
        let (e, mut back) = refused(
            a.post_send([SendWr::new(7, SendOp::RdmaRead(remote)).sge(dst)]),
            "an RDMA READ below RTS",
        )?;
        ensure!(
            matches!(e, Error::QpState { state, .. } if state == a.state()),
            "in {:?}: {e}",
            a.state()
        );
        ensure!(
            e.to_string().contains("sends need RTS"),
            "the message does not say what sends need: {e}"
        );
        ensure!(back.len() == 1, "{} chunks back, expected 1", back.len());
        dst = back.pop().unwrap();
        ensure!(a.outstanding_sends() == 0, "a refused post left a request");
        a.modify(step)?;
    }
    ensure!(a.state() == QpState::Rts, "a is in {:?}", a.state());
    // Ring the doorbell with a real post (a SEND into a receive of b): a
    // request the provider had queued would run now.
    b.post_recv([RecvWr::new(3).sge(chunk(&pd, 64, 0)?)])?;
    a.post_send([SendWr::new(4, SendOp::Send).sge_len(chunk(&pd, 64, b's')?, 8)])?;
    let wcs = poll_n(&cq, 2)?;
    ensure!(wcs.iter().all(|w| w.is_success()), "{wcs:?}");
    let stray = poll_quiet(&cq)?;
    ensure!(
        stray.is_empty(),
        "a refused post produced completions: {stray:?}"
    );
    ensure!(
        dst.as_slice().iter().all(|&x| x == 0),
        "the device wrote the chunk the caller got back from a refused RDMA READ"
    );
    for wc in &wcs {
        ensure!(
            chunks_of(&mut a, wc).len() + chunks_of(&mut b, wc).len() == 1,
            "{wc:?} did not hand back exactly its chunk"
        );
    }
    // A real READ now works, completes once, and hands the chunk back once.
    a.post_send([SendWr::new(8, SendOp::RdmaRead(remote)).sge(dst)])?;
    let wcs = poll_n(&cq, 1)?;
    let stray = poll_quiet(&cq)?;
    ensure!(stray.is_empty(), "a second completion: {stray:?}");
    let back = chunks_of(&mut a, &wcs[0]);
    ensure!(back.len() == 1 && back[0].0 == 8, "handed back {back:?}");
    ensure!(
        back[0].1.as_slice().iter().all(|&x| x == 0x5a),
        "the READ did not land"
    );
    ensure!(chunks_of(&mut a, &wcs[0]).is_empty(), "reclaimed twice");
    Ok(())
}

/// An SRQ's completions and a QP's own never cross, whatever was
/// posted before (the old ids met after 4096 SRQ post calls): reclaiming a
/// receive completion through the QP or the SRQ hands back that receive
/// alone, once; a send completion reclaimed twice, or a flushed one after
/// RESET, hands back nothing.
fn srq_and_qp_completions_never_cross(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(256)?;
    // Churn: 4,095 successful SRQ post calls, so that the SRQ post below
    // is the 4,096th of the process when this test runs alone: the old
    // per-call generation numbers then met the first QP's send ids
    // exactly (generation 4096, slot 0 == range 1, request 0).
    const CHURN: u32 = 4095;
    let max = env.ctx.attr().max_srq_wr.clamp(1, CHURN);
    let mut calls = 0;
    while calls < CHURN {
        let n = max.min(CHURN - calls);
        let churn = pd.create_srq(n, 1, 0)?;
        for c in pd.alloc_chunks(n as usize, 16, AccessFlags::LOCAL_WRITE)? {
            churn.post_recv([RecvWr::new(0).sge(c)])?;
            calls += 1;
        }
        let n = churn.outstanding();
        let back = churn.close_and_reclaim()?;
        ensure!(
            back.len() == n,
            "close_and_reclaim handed back {} of {n}",
            back.len()
        );
    }

    let srq = pd.create_srq(16, 1, 0)?;
    let mut x = qp(&pd, &cq, Some(&srq))?; // receives through the SRQ
    let mut y = qp(&pd, &cq, None)?;
    connect(env, &mut x, &mut y, AccessFlags::empty())?;
    // x: a SEND that cannot complete yet (y has no receive: RNR retries).
    x.post_send([SendWr::new(11, SendOp::Send).sge_len(chunk(&pd, 64, b'x')?, 8)])?;
    // The SRQ: two receives; y sends one message into it.
    srq.post_recv([
        RecvWr::new(21).sge(chunk(&pd, 64, 0)?),
        RecvWr::new(22).sge(chunk(&pd, 64, 0)?),
    ])?;
    y.post_send([SendWr::new(31, SendOp::Send).sge_len(chunk(&pd, 64, b'y')?, 8)])?;
    let wcs = poll_n(&cq, 2)?; // y's send, x's SRQ receive
    let recv = *wcs
        .iter()
        .find(|w| w.qp_num() == x.qp_num())
        .ok_or("no receive on x")?;
    let ysend = *wcs
        .iter()
        .find(|w| w.qp_num() == y.qp_num())
        .ok_or("no send completion on y")?;
    // The receive completion, on the wrong QP, then through x, then again
    // through x and the SRQ: exactly one receive chunk, once.
    ensure!(chunks_of(&mut y, &recv).is_empty(), "y took x's receive");
    let got = chunks_of(&mut x, &recv);
    ensure!(
        got.len() == 1 && got[0].0 == 21 || got.len() == 1 && got[0].0 == 22,
        "x's receive completion handed back {got:?}"
    );
    ensure!(
        &got[0].1.as_slice()[..8] == b"yyyyyyyy",
        "the receive chunk does not hold y's message"
    );
    ensure!(
        chunks_of(&mut x, &recv).is_empty(),
        "the receive came back twice"
    );
    ensure!(
        srq.reclaim(&recv, |_| ()) == 0,
        "the SRQ handed it back again"
    );
    ensure!(
        x.outstanding_sends() == 1 && srq.outstanding() == 1,
        "x has {} sends, the SRQ {} receives outstanding",
        x.outstanding_sends(),
        srq.outstanding()
    );
    // The send completion: on x (wrong QP), on the SRQ, then twice on y.
    ensure!(chunks_of(&mut x, &ysend).is_empty(), "x took y's send");
    ensure!(srq.reclaim(&ysend, |_| ()) == 0, "the SRQ took a send");
    ensure!(
        chunks_of(&mut y, &ysend).len() == 1,
        "y's send not handed back"
    );
    ensure!(
        chunks_of(&mut y, &ysend).is_empty(),
        "y's send came back twice"
    );

    // x to ERR: its SEND is flushed. RESET first, then reclaim the flushed
    // completion: the RESET already handed the send back; the late
    // completion ends nothing, and the SRQ receive stays posted.
    x.modify(&QpAttr::new().state(QpState::Err))?;
    let flushed = poll_n(&cq, 1)?[0];
    ensure!(
        flushed.status() == Ok(WcStatus::WrFlushErr) || flushed.status() == Ok(WcStatus::Success),
        "{flushed:?}"
    );
    let reset_back = x.reset()?;
    ensure!(
        reset_back.len() == 1 && reset_back[0].wr_id == 11,
        "RESET handed back {reset_back:?}"
    );
    ensure!(
        chunks_of(&mut x, &flushed).is_empty(),
        "a late completion after RESET ended something"
    );
    ensure!(
        srq.reclaim(&flushed, |_| ()) == 0,
        "the SRQ took a flushed send"
    );
    ensure!(srq.outstanding() == 1, "the SRQ receive was handed back");
    drop(x);
    let back = srq.close_and_reclaim();
    ensure!(
        matches!(back, Ok(ref v) if v.len() == 1 && v[0].wr_id != 0),
        "close_and_reclaim: {back:?}"
    );
    Ok(())
}

/// A chunk of a PD of *another context* (whose kernel PD handle
/// equals ours: handles restart at 0 in every context) is refused, and a
/// request with more chunks than `MAX_SGE` is refused with every chunk
/// handed back (the old code dropped some).
fn foreign_pd_and_too_many_sges_are_refused_whole(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, AccessFlags::empty())?;
    let other = Context::open(env.ctx.name())?;
    let other_pd = other.alloc_pd()?;
    eprintln!(
        "adversarial: PD handles {} (ours) and {} (other context)",
        p.pd.handle(),
        other_pd.handle()
    );
    let foreign = chunk(&other_pd, 64, 0)?;
    let (e, back) = refused(
        p.a.post_send([SendWr::new(1, SendOp::Send).sge(foreign)]),
        "a send of another context's chunk",
    )?;
    ensure!(e.to_string().contains("protection domain"), "{e}");
    ensure!(back.len() == 1, "{} chunks back", back.len());
    let foreign = back.into_iter().next().unwrap();
    let (e, back) = refused(
        p.b.post_recv([RecvWr::new(1).sge(foreign)]),
        "a receive into another context's chunk",
    )?;
    ensure!(e.to_string().contains("protection domain"), "{e}");
    ensure!(back.len() == 1, "{} chunks back", back.len());
    let srq = other_pd.create_srq(4, 1, 0)?;
    let (e, _) = refused(
        srq.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 64, 0)?)]),
        "an SRQ receive into a chunk of another context",
    )?;
    ensure!(e.to_string().contains("protection domain"), "{e}");

    for n in [MAX_SGE + 1, MAX_SGE + 3] {
        let many = p.pd.alloc_chunks(n, 32, AccessFlags::LOCAL_WRITE)?;
        let mut wr = SendWr::new(1, SendOp::Send);
        let mut rwr = RecvWr::new(1);
        let more = p.pd.alloc_chunks(n, 32, AccessFlags::LOCAL_WRITE)?;
        for c in many {
            wr = wr.sge(c);
        }
        for c in more {
            rwr = rwr.sge(c);
        }
        let (e, back) = refused(p.a.post_send([wr]), "too many send entries")?;
        ensure!(
            back.len() == n,
            "{n} send entries: {} chunks back ({e})",
            back.len()
        );
        ensure!(e.to_string().contains(&format!("{n} entries")), "{e}");
        let (e, back) = refused(p.b.post_recv([rwr]), "too many receive entries")?;
        ensure!(
            back.len() == n,
            "{n} receive entries: {} chunks back ({e})",
            back.len()
        );
    }
    // A length past the chunk's end is refused too, the chunk handed back.
    let (e, back) = refused(
        p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(chunk(&p.pd, 16, 0)?, 17)]),
        "an entry longer than its chunk",
    )?;
    ensure!(back.len() == 1, "{} chunks back ({e})", back.len());
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "a refused post left requests outstanding"
    );
    Ok(())
}

/// One request more than each queue holds, through every plural way in
/// (a QP's send and receive queues, a half of each, an SRQ), and one more
/// through the one-request ways once a queue is full: refused whole,
/// before the call, as [`Error::QueueFull`] naming the queue and the
/// counts; every chunk back in request order; nothing left outstanding
/// by the refused call; the same call again refused the same way.
fn a_full_queue_refuses_the_call_whole_with_queue_full(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, AccessFlags::empty())?;
    let full = |e: &Error, queue: &str, requests: usize, room: usize, held: usize| {
        matches!(e, Error::QueueFull { queue: q, requests: n, room: r, outstanding: o, .. }
            if *q == queue && *n == requests && *r == room && *o == held)
    };
    let marked = |n: usize| -> Result<Vec<Chunk>, Failed> {
        (0..n).map(|i| chunk(&p.pd, 16, i as u8)).collect()
    };
    let in_order = |back: &[Chunk], n: usize| {
        back.len() == n
            && back
                .iter()
                .enumerate()
                .all(|(i, c)| c.as_slice()[0] == i as u8)
    };
    let (sends, recvs) = (
        p.a.caps().max_send_wr as usize,
        p.b.caps().max_recv_wr as usize,
    );
    // A call of `n` refused whole by a queue with `room`: typed, every
    // chunk back in request order.
    let refused_whole = |r, queue: &str, n: usize, room: usize| -> Result<(), Failed> {
        let (e, back) = refused(r, queue)?;
        ensure!(full(&e, queue, n, room, 0), "{queue}: {e:?}");
        ensure!(in_order(&back, n), "{queue}: chunks back out of order");
        Ok(())
    };
    // Twice: a refused call leaves nothing behind to change the second.
    for _ in 0..2 {
        let wrs = marked(sends + 1)?;
        let wrs = wrs.into_iter().map(|c| SendWr::new(1, SendOp::Send).sge(c));
        refused_whole(p.a.post_send(wrs), "send queue", sends + 1, sends)?;
        let wrs = marked(recvs + 1)?
            .into_iter()
            .map(|c| RecvWr::new(1).sge(c));
        let (_, mut rx) = p.b.split();
        refused_whole(rx.post_recv(wrs), "receive queue", recvs + 1, recvs)?;
    }
    // Filled to the brim, then one more through the one-request ways.
    let fill = marked(recvs)?.into_iter().map(|c| RecvWr::new(1).sge(c));
    p.b.post_recv(fill)?;
    let e = p.b.post_recv_one(RecvWr::new(2).sge(chunk(&p.pd, 16, 7)?));
    let (e, back) = refused(e, "a receive past the room")?;
    ensure!(full(&e, "receive queue", 1, 0, recvs), "{e:?}");
    ensure!(
        back.len() == 1 && back[0].as_slice()[0] == 7,
        "the chunk came back"
    );
    ensure!(
        p.b.outstanding_recvs() == recvs,
        "{}",
        p.b.outstanding_recvs()
    );
    // An SRQ of 4: the device may report more (rxe: 7), the crate holds
    // at least 4; a call of one more than the device reports is refused,
    // and the room it names is exactly what fits.
    let srq = p.pd.create_srq(4, 1, 0)?;
    let (cap, _, _) = srq.query()?;
    let over = cap as usize + 1;
    let wrs = marked(over)?.into_iter().map(|c| RecvWr::new(1).sge(c));
    let (e, back) = refused(srq.post_recv(wrs), "one receive more than the SRQ holds")?;
    let Error::QueueFull { room, .. } = e else {
        return Err(format!("{e:?}").into());
    };
    ensure!(
        full(&e, "shared receive queue", over, room, 0) && room >= 4,
        "{e:?}"
    );
    ensure!(in_order(&back, over), "SRQ receives back out of order");
    srq.post_recv(back.into_iter().take(room).map(|c| RecvWr::new(1).sge(c)))?;
    let (e, back) = refused(
        srq.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 16, 9)?)]),
        "a receive past the SRQ's room",
    )?;
    ensure!(full(&e, "shared receive queue", 1, 0, room), "{e:?}");
    ensure!(
        back.len() == 1 && srq.outstanding() == room,
        "{}",
        srq.outstanding()
    );
    ensure!(
        p.a.outstanding_sends() == 0,
        "a refused call left sends outstanding"
    );
    ensure!(e.to_string().contains("room for 0"), "{e}");
    Ok(())
}

/// Nothing lent is lost. A receive posted in ERR is refused (rxe
/// would never complete it); after a CQ overrun a RESET hands back every
/// outstanding chunk; destroying a QP hands back what it held.
fn nothing_lent_is_lost_by_err_overrun_reset_or_destroy(env: &Env) -> Result<(), Failed> {
    // ERR: receives refused with the chunk back; sends are flushed.
    let mut p = pair(env, AccessFlags::empty())?;
    p.b.modify(&QpAttr::new().state(QpState::Err))?;
    let (e, back) = refused(
        p.b.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 64, 0)?)]),
        "a receive in ERR",
    )?;
    ensure!(
        matches!(
            e,
            Error::QpState {
                state: QpState::Err,
                ..
            }
        ),
        "{e}"
    );
    ensure!(back.len() == 1, "{} chunks back", back.len());
    p.b.post_send([SendWr::new(5, SendOp::Send).sge(back.into_iter().next().unwrap())])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.status() == Ok(WcStatus::WrFlushErr), "{wc:?}");
    ensure!(
        chunks_of(&mut p.b, &wc).len() == 1,
        "the flushed send did not come back"
    );

    // CQ overrun: a tiny CQ, more completions than it holds.
    let pd = env.ctx.alloc_pd()?;
    let small = env.ctx.create_cq(1)?;
    let big = env.ctx.create_cq(64)?;
    let cap = small.capacity() as usize;
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCaps::default()
    };
    let mut tx = pd.create_qp(&QpInitAttr::new(QpType::Rc, &big, &big).caps(caps))?;
    let mut rx = pd.create_qp(&QpInitAttr::new(QpType::Rc, &big, &small).caps(caps))?;
    connect(env, &mut tx, &mut rx, AccessFlags::empty())?;
    let n = (cap + 8).min(64);
    let recvs: Vec<RecvWr> = pd
        .alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE)?
        .into_iter()
        .enumerate()
        .map(|(i, c)| RecvWr::new(i as u64).sge(c))
        .collect();
    rx.post_recv(recvs)?;
    let sends: Vec<SendWr> = pd
        .alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE)?
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let w = SendWr::new(i as u64, SendOp::Send).sge_len(c, 4);
            if i + 1 == n {
                w
            } else {
                w.unsignaled()
            }
        })
        .collect();
    tx.post_send(sends)?;
    // Give the traffic time to overrun the receiver's CQ (rxe then stops
    // the receiving QP), then flush the sender: every send comes back.
    std::thread::sleep(QUIET * 3);
    tx.modify(&QpAttr::new().state(QpState::Err))?;
    let start = Instant::now();
    let mut wcs = [WorkCompletion::default(); 16];
    let mut sent_back = 0;
    while tx.outstanding_sends() > 0 {
        for wc in big.poll(&mut wcs)? {
            sent_back += tx.reclaim(wc, |_| ());
        }
        ensure!(
            start.elapsed() < deadline(),
            "{} sends never completed or flushed",
            tx.outstanding_sends()
        );
    }
    ensure!(sent_back == n, "{sent_back} of {n} sends came back");
    // The receive CQ held `cap`; the rest overran it. Reclaim what it has.
    let mut got = 0;
    let mut wcs = [WorkCompletion::default(); 64];
    if let Ok(done) = small.poll(&mut wcs) {
        for wc in done.iter() {
            got += rx.reclaim(wc, |_| ());
        }
    }
    ensure!(
        got < n,
        "no overrun: all {n} receive completions fitted a CQ of {cap}"
    );
    let outstanding = rx.outstanding_recvs();
    ensure!(
        outstanding == n - got,
        "{outstanding} outstanding, expected {}",
        n - got
    );
    let back = rx.reset()?;
    let (requests, chunks) = (
        back.len(),
        back.into_iter().map(|d| d.chunks().count()).sum::<usize>(),
    );
    ensure!(
        requests == outstanding && chunks == outstanding,
        "RESET handed back {requests} requests with {chunks} chunks of {outstanding}"
    );
    eprintln!(
        "adversarial: CQ of {cap} overrun by {n} receives; {got} reclaimed, {outstanding} back from RESET"
    );

    // Destroy with requests outstanding: all handed back.
    let mut p = pair(env, AccessFlags::empty())?;
    p.b.post_recv(
        p.pd.alloc_chunks(3, 64, AccessFlags::LOCAL_WRITE)?
            .into_iter()
            .map(|c| RecvWr::new(9).sge(c))
            .collect::<Vec<_>>(),
    )?;
    p.a.modify(&QpAttr::new().state(QpState::Err))?;
    let back = p.b.close_and_reclaim()?;
    ensure!(
        back.len() == 3,
        "close_and_reclaim handed back {}",
        back.len()
    );
    ensure!(p.a.take_released().is_empty(), "nothing was reset on a");
    Ok(())
}

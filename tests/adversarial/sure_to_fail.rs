//! From safe code: requests the device is sure to fail, which the crate
//! can see, are refused before the provider call with every chunk handed
//! back (a receive into a region without local write, a UD receive without
//! room for the GRH).
//!
//! Before the fix each test shows the bad behaviour in its failure message:
//! the request is posted and what the device then does with it.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, QpCaps, QpInitAttr, QpType, QueuePair, WorkCompletion};

use crate::common::{connect, pair, poll_n, remote_region, ud_dest, Env, Test};

pub const TESTS: &[Test] = tests![
    recv_into_region_without_local_write_is_refused,
    srq_recv_into_region_without_local_write_is_refused,
    read_and_atomic_into_region_without_local_write_are_refused,
    batch_read_into_region_without_local_write_is_refused,
    ud_recv_without_room_for_the_grh_is_refused,
];

/// One chunk of `len` bytes of a region registered with `access` only.
pub(crate) fn chunk(
    pd: &rdma_verbs::ProtectionDomain,
    len: usize,
    access: AccessFlags,
) -> Result<Chunk, Failed> {
    Ok(pd.alloc_chunks(1, len, access)?.remove(0))
}

/// The refusal a test expects: nothing posted, `chunks` chunks back, and a
/// message naming `why`.
fn expect_refusal(
    r: Result<(), PostError>,
    chunks: usize,
    why: &str,
    otherwise: impl FnOnce() -> Result<String, Failed>,
) -> Result<(), Failed> {
    match r {
        Err(e) => {
            ensure!(e.posted == 0, "{e}: {} posted", e.posted);
            ensure!(
                e.returned.len() == chunks,
                "{e}: {} of {chunks} chunk(s) back",
                e.returned.len()
            );
            ensure!(
                e.error.to_string().contains(why),
                "refused, but the message does not say {why:?}: {e}"
            );
            Ok(())
        }
        Ok(()) => Err(otherwise()?.into()),
    }
}

/// The statuses of completions, for messages.
pub(crate) fn statuses(wcs: &[WorkCompletion]) -> Vec<String> {
    wcs.iter()
        .map(|w| match w.status() {
            Ok(s) => format!("{s:?}"),
            Err(raw) => format!("status {raw}"),
        })
        .collect()
}

/// What the device did with a receive that should have been refused, once
/// `a` sends 8 bytes to `b`.
fn show_recv_fate(
    pd: &rdma_verbs::ProtectionDomain,
    cq: &rdma_verbs::CompletionQueue,
    a: &mut QueuePair,
    b: &mut QueuePair,
    outstanding: usize,
) -> Result<String, Failed> {
    let src = chunk(pd, 8, AccessFlags::LOCAL_WRITE)?;
    a.post_send([SendWr::new(2, SendOp::Send).sge(src)])?;
    let wcs = poll_n(cq, 2)?;
    let (mut ended_a, mut ended_b) = (0, 0);
    for wc in &wcs {
        ended_a += a.reclaim_chunks(wc, &mut Vec::new());
        ended_b += b.reclaim_chunks(wc, &mut Vec::new());
        ended_b += b.srq().map_or(0, |s| s.reclaim(wc, drop));
    }
    Ok(format!(
        "the receive was posted ({outstanding} outstanding); a send to it then completed \
         {:?} (ended {ended_a} of a's, {ended_b} of b's); known states a {:?} b {:?}, \
         device a {:?} b {:?}",
        statuses(&wcs),
        a.state(),
        b.state(),
        a.query_state(),
        b.query_state()
    ))
}

/// A receive into a chunk of a region without LOCAL_WRITE: before the fix
/// it is posted, and the send that lands in it kills both QPs.
fn recv_into_region_without_local_write_is_refused(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, QpCaps::default(), AccessFlags::empty())?;
    let before = p.b.outstanding_recvs();
    let r =
        p.b.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 64, AccessFlags::empty())?)]);
    let now = p.b.outstanding_recvs();
    expect_refusal(r, 1, "LOCAL_WRITE", || {
        show_recv_fate(&p.pd, &p.cq, &mut p.a, &mut p.b, now)
    })?;
    ensure!(now == before, "{now} receives outstanding, {before} before");
    ensure!(
        p.b.state() == QpState::Rts,
        "b is known in {:?}",
        p.b.state()
    );
    Ok(())
}

/// The same through an SRQ, which must check it too.
fn srq_recv_into_region_without_local_write_is_refused(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let srq = pd.create_srq(16, 1, 0)?;
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).srq(&srq))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    let before = srq.outstanding();
    let r = srq.post_recv([RecvWr::new(1).sge(chunk(&pd, 64, AccessFlags::empty())?)]);
    let now = srq.outstanding();
    expect_refusal(r, 1, "LOCAL_WRITE", || {
        show_recv_fate(&pd, &cq, &mut a, &mut b, now)
    })?;
    ensure!(now == before, "{now} receives outstanding, {before} before");
    Ok(())
}

/// What the device did with a send that should have been refused.
fn show_send_fate(
    cq: &rdma_verbs::CompletionQueue,
    qp: &mut QueuePair,
    outstanding: usize,
) -> Result<String, Failed> {
    let wcs = poll_n(cq, 1)?;
    let ended = qp.reclaim_chunks(&wcs[0], &mut Vec::new());
    Ok(format!(
        "the request was posted ({outstanding} outstanding); it completed {:?} \
         (ended {ended}); known state {:?}, device {:?}",
        statuses(&wcs),
        qp.state(),
        qp.query_state()
    ))
}

/// Makes an operation on a remote address.
type MakeOp = fn(RemoteAddr) -> SendOp;

/// RDMA READ and atomics write their local entry: into a chunk without
/// LOCAL_WRITE they are refused (one QP pair each, as a posted one kills it).
fn read_and_atomic_into_region_without_local_write_are_refused(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_WRITE;
    let ops: [(&str, MakeOp); 2] = [
        ("RDMA_READ", SendOp::RdmaRead),
        ("ATOMIC_FETCH_AND_ADD", |remote| SendOp::FetchAdd {
            remote,
            add: 1,
        }),
    ];
    let mut found = Vec::new();
    for (name, op) in ops {
        let mut p = pair(env, QpType::Rc, QpCaps::default(), access)?;
        let mr = remote_region(&p.pd, 64)?;
        let remote = RemoteAddr {
            addr: mr.addr(),
            rkey: mr.rkey(),
        };
        let before = p.a.outstanding_sends();
        let r =
            p.a.post_send([SendWr::new(1, op(remote)).sge(chunk(&p.pd, 8, AccessFlags::empty())?)]);
        let now = p.a.outstanding_sends();
        if let Err(e) = expect_refusal(r, 1, "LOCAL_WRITE", || show_send_fate(&p.cq, &mut p.a, now))
        {
            found.push(format!("{name}: {}", e.message().unwrap_or("?")));
            continue;
        }
        ensure!(
            now == before,
            "{name}: {now} sends outstanding, {before} before"
        );
        ensure!(
            p.a.state() == QpState::Rts,
            "{name}: a is known in {:?}",
            p.a.state()
        );
    }
    ensure!(found.is_empty(), "{}", found.join("; "));
    Ok(())
}

/// The same check on the extended batch path.
fn batch_read_into_region_without_local_write_is_refused(env: &Env) -> Result<(), Failed> {
    let crate::common::Pair {
        pd,
        cq,
        mut a,
        b: _b,
    } = crate::common::ex_rc_pair(env, AccessFlags::REMOTE_READ)?;
    let mr = remote_region(&pd, 64)?;
    let remote = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    let before = a.outstanding_sends();
    let mut batch = a.start_batch()?;
    let r = batch.post(SendWr::new(1, SendOp::RdmaRead(remote)).sge(chunk(
        &pd,
        8,
        AccessFlags::empty(),
    )?));
    let in_batch = batch.len();
    batch.complete()?;
    let now = a.outstanding_sends();
    expect_refusal(r, 1, "LOCAL_WRITE", || {
        Ok(format!(
            "batch of {in_batch}; {}",
            show_send_fate(&cq, &mut a, now)?
        ))
    })?;
    ensure!(in_batch == 0, "the batch holds {in_batch} request(s)");
    ensure!(now == before, "{now} sends outstanding, {before} before");
    Ok(())
}

/// A UD receive of 16 bytes on RoCE, where every datagram carries a 40-byte
/// GRH the device writes first: before the fix it is posted and the next
/// datagram fails it with a local QP operation error.
fn ud_recv_without_room_for_the_grh_is_refused(env: &Env) -> Result<(), Failed> {
    if !env.ctx.query_port(env.port)?.grh_required() {
        eprintln!("port {} needs no GRH: nothing to refuse", env.port);
        return Ok(());
    }
    let mut p = pair(env, QpType::Ud, QpCaps::default(), AccessFlags::empty())?;
    let before = p.b.outstanding_recvs();
    let r =
        p.b.post_recv([RecvWr::new(1).sge(chunk(&p.pd, 16, AccessFlags::LOCAL_WRITE)?)]);
    let now = p.b.outstanding_recvs();
    expect_refusal(r, 1, "GRH", || {
        let (ah, eb) = ud_dest(env, &p.pd, &p.b)?;
        let mut src = chunk(&p.pd, 8, AccessFlags::LOCAL_WRITE)?;
        src.as_mut_slice().copy_from_slice(b"datagram");
        p.a.post_send([SendWr::new(2, SendOp::Send)
            .sge(src)
            .ud(&ah, eb.qpn, QKey::PINGPONG)])?;
        let wcs = poll_n(&p.cq, 2)?;
        for wc in &wcs {
            p.a.reclaim_chunks(wc, &mut Vec::new());
            p.b.reclaim_chunks(wc, &mut Vec::new());
        }
        Ok(format!(
            "the 16-byte receive was posted ({now} outstanding); a datagram to it then \
             completed {:?}; known state of b {:?}, device {:?}",
            statuses(&wcs),
            p.b.state(),
            p.b.query_state()
        ))
    })?;
    ensure!(now == before, "{now} receives outstanding, {before} before");
    // 40 bytes (GRH) plus payload is accepted.
    p.b.post_recv([RecvWr::new(3).sge(chunk(&p.pd, 48, AccessFlags::LOCAL_WRITE)?)])?;
    ensure!(
        p.b.outstanding_recvs() == before + 1,
        "the 48-byte receive was not posted"
    );
    Ok(())
}

//! Getting requests back by value: `QueuePair::reclaim_one`, the request
//! kind a completion and a `Completed` report (failed ones too), one
//! receive per call (`post_recv_one`), and the bookkeeping's size (send
//! templates are `templates.rs`'s, the queue-owned receive buffers
//! `recv_buffers.rs`'s).

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, QpType};

use crate::common::{pair, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    reclaim_one_hands_back_the_request_to_repost,
    a_flushed_receive_shows_its_kind_and_the_callers_id,
    post_recv_one_reposts_and_refuses_misuse,
    bookkeeping_is_48_bytes_a_queue_slot,
];

/// The QPs of these tests (and of `templates`, `template_pins` and
/// `recv_buffers`): 16 requests each way.
pub(crate) fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    }
}

/// Ten round trips where every receive's chunk is posted again straight
/// from `reclaim_one` (no callback, no collection), and a send completion
/// that also ends earlier unsignalled sends leaves them in
/// `take_released`.
fn reclaim_one_hands_back_the_request_to_repost(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    for c in p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)? {
        p.b.post_recv([RecvWr::new(100).sge(c)])?;
    }
    let mut sent =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    for round in 0..10u8 {
        sent.as_mut_slice()[0] = round;
        p.a.post_send([SendWr::new(u64::from(round), SendOp::Send).sge(sent)])?;
        let wcs = poll_n(&p.cq, 2)?;
        let mut got_send = None;
        for wc in &wcs {
            ensure!(wc.is_success(), "{wc:?}");
            if wc.qp_num() == p.a.qp_num() {
                ensure!(wc.request_kind() == Some(RequestKind::Send), "{wc:?}");
                let done = p.a.reclaim_one(wc).ok_or("the send ended nothing")?;
                ensure!(
                    done.wr_id == u64::from(round)
                        && done.kind == RequestKind::Send
                        && done.signaled,
                    "{done:?}"
                );
                got_send = done.into_chunk();
                ensure!(p.a.reclaim_one(wc).is_none(), "reclaimed twice");
            } else {
                ensure!(wc.request_kind() == Some(RequestKind::Recv), "{wc:?}");
                let done = p.b.reclaim_one(wc).ok_or("the receive ended nothing")?;
                ensure!(
                    done.wr_id == 100 && done.kind == RequestKind::Recv,
                    "{done:?}"
                );
                let chunk = done.into_chunk().ok_or("no chunk")?;
                ensure!(
                    chunk.as_slice()[0] == round,
                    "received {}",
                    chunk.as_slice()[0]
                );
                // Reposted at once: the QP is not borrowed.
                p.b.post_recv([RecvWr::new(100).sge(chunk)])?;
            }
        }
        sent = got_send.ok_or("no send chunk back")?;
    }
    // Three unsignalled sends, then a signalled one: reclaim_one hands back
    // the signalled one, the earlier three wait in take_released.
    // Receives for all five (two are posted already).
    for c in p.pd.alloc_chunks(3, 64, AccessFlags::LOCAL_WRITE)? {
        p.b.post_recv([RecvWr::new(100).sge(c)])?;
    }
    let mut more = p.pd.alloc_chunks(4, 64, AccessFlags::LOCAL_WRITE)?;
    more.push(sent);
    let last = more.pop().ok_or("no chunk")?;
    p.a.post_send(
        more.into_iter()
            .enumerate()
            .map(|(i, c)| SendWr::new(50 + i as u64, SendOp::Send).sge(c).unsignaled())
            .chain([SendWr::new(99, SendOp::Send).sge(last)]),
    )?;
    let wcs = poll_n(&p.cq, 6)?;
    let mut earlier = Vec::new();
    for wc in &wcs {
        if wc.qp_num() == p.a.qp_num() {
            let done = p.a.reclaim_one(wc).ok_or("nothing")?;
            ensure!(done.wr_id == 99 && done.signaled, "{done:?}");
            earlier = p.a.take_released();
        } else {
            p.b.reclaim_one(wc).ok_or("receive ended nothing")?;
        }
    }
    let ids: Vec<(u64, bool)> = earlier.iter().map(|c| (c.wr_id, c.signaled)).collect();
    ensure!(
        ids == [(50, false), (51, false), (52, false), (53, false)],
        "earlier sends: {ids:?}"
    );
    ensure!(
        p.a.outstanding_sends() == 0,
        "{} sends outstanding",
        p.a.outstanding_sends()
    );
    Ok(())
}

/// A receive flushed by ERR: its opcode is undefined (the crate says
/// so), but its kind and the caller's id come back.
fn a_flushed_receive_shows_its_kind_and_the_callers_id(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let c =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    p.b.post_recv([RecvWr::new(4242).sge(c)])?;
    p.b.modify(&QpAttr::new().state(rdma_verbs::QpState::Err))?;
    let wcs = poll_n(&p.cq, 1)?;
    let wc = &wcs[0];
    ensure!(!wc.is_success(), "{wc:?}");
    ensure!(
        wc.opcode().is_err(),
        "a flushed completion's opcode: {:?}",
        wc.opcode()
    );
    ensure!(wc.request_kind() == Some(RequestKind::Recv), "{wc:?}");
    let shown = format!("{wc:?}");
    ensure!(
        shown.contains("request: Recv") && !shown.contains("opcode"),
        "{shown}"
    );
    let done = p.b.reclaim_one(wc).ok_or("the flush ended nothing")?;
    ensure!(
        done.wr_id == 4242 && done.kind == RequestKind::Recv && done.into_chunk().is_some(),
        "flushed receive came back wrong"
    );
    Ok(())
}

/// One receive per call, reposted straight from its completion; what
/// `post_recv` refuses is refused the same way, with the chunk handed
/// back and nothing recorded: a chunk of another PD, one the device may
/// not write, no room, RESET, a UD receive under the GRH's 40 bytes.
fn post_recv_one_reposts_and_refuses_misuse(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut rx =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    let mut tx =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    for round in 0..5u8 {
        p.b.post_recv_one(RecvWr::new(10 + u64::from(round)).sge(rx))?;
        ensure!(p.b.outstanding_recvs() == 1, "{}", p.b.outstanding_recvs());
        tx.as_mut_slice()[0] = round;
        p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(tx, 1)])?;
        let (mut got_rx, mut got_tx) = (None, None);
        for wc in poll_n(&p.cq, 2)? {
            ensure!(wc.is_success(), "{wc:?}");
            if wc.qp_num() == p.b.qp_num() {
                let done = p.b.reclaim_one(&wc).ok_or("the receive ended nothing")?;
                ensure!(
                    done.wr_id == 10 + u64::from(round) && done.kind == RequestKind::Recv,
                    "{done:?}"
                );
                ensure!(p.b.reclaim_one(&wc).is_none(), "reclaimed twice");
                got_rx = done.into_chunk();
            } else {
                got_tx = p.a.reclaim_one(&wc).and_then(Completed::into_chunk);
            }
        }
        rx = got_rx.ok_or("no receive chunk back")?;
        tx = got_tx.ok_or("no send chunk back")?;
        ensure!(rx.as_slice()[0] == round, "received {}", rx.as_slice()[0]);
    }
    // Refused, the chunk back, nothing recorded.
    let refused = |qp: &mut rdma_verbs::QueuePair,
                   c: rdma_verbs::Chunk,
                   why: &str|
     -> Result<rdma_verbs::Chunk, Failed> {
        let before = qp.outstanding_recvs();
        let mut e = qp.post_recv_one(RecvWr::new(99).sge(c)).expect_err(why);
        ensure!(e.posted == 0 && e.returned.len() == 1, "{why}: {e}");
        ensure!(
            qp.outstanding_recvs() == before,
            "{why}: a receive was recorded"
        );
        Ok(e.returned.pop().ok_or("no chunk")?)
    };
    let other = env.ctx.alloc_pd()?;
    let theirs = other
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("no chunk")?;
    refused(&mut p.b, theirs, "a chunk of another PD")?;
    let read_only =
        p.pd.alloc_chunks(1, 64, AccessFlags::REMOTE_READ)?
            .pop()
            .ok_or("no chunk")?;
    refused(&mut p.b, read_only, "a chunk without LOCAL_WRITE")?;
    // A receive without a buffer is allowed (RDMA WRITE with immediate).
    p.b.post_recv_one(RecvWr::new(5))?;
    let room = p.b.caps().max_recv_wr as usize;
    let mut fill = p.pd.alloc_chunks(room, 64, AccessFlags::LOCAL_WRITE)?;
    while p.b.outstanding_recvs() < room {
        p.b.post_recv_one(RecvWr::new(6).sge(fill.pop().ok_or("no chunk")?))?;
    }
    rx = refused(&mut p.b, rx, "a full receive queue")?;
    ensure!(p.b.reset()?.len() == room, "RESET handed back the receives");
    refused(&mut p.b, rx, "RESET")?;
    // UD on a port that needs a GRH: 16 bytes are refused, 64 taken.
    let mut u = pair(env, QpType::Ud, caps(), AccessFlags::empty())?;
    let small =
        u.pd.alloc_chunks(1, 16, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    if env.ctx.query_port(env.port)?.is_roce() {
        refused(&mut u.b, small, "a 16-byte UD receive on RoCE")?;
    }
    let big =
        u.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    u.b.post_recv_one(RecvWr::new(7).sge(big))?;
    ensure!(u.b.outstanding_recvs() == 1, "{}", u.b.outstanding_recvs());
    Ok(())
}

/// A 256/256 QP's data-path bookkeeping: 48 bytes per queue slot in the
/// ledgers, and nothing else (posts build their raw requests on the
/// stack; a queue has scratch only after a chain longer than eight).
fn bookkeeping_is_48_bytes_a_queue_slot(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        ..QpCaps::default()
    };
    let p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let got = p.a.caps();
    let slots = (got.max_send_wr as usize).next_power_of_two()
        + (got.max_recv_wr as usize).next_power_of_two();
    let bytes = p.a.bookkeeping_bytes();
    eprintln!(
        "bookkeeping: {bytes} bytes for a {}/{} QP ({slots} slots): {:.1} bytes a slot",
        got.max_send_wr,
        got.max_recv_wr,
        bytes as f64 / slots as f64,
    );
    ensure!(bytes <= 48 * slots, "{bytes} bytes for {slots} slots");
    Ok(())
}

//! Getting requests back by value: `QueuePair::reclaim_one`, the request
//! kind a completion and a `Completed` report (failed ones too), one
//! receive per call, the bookkeeping's size, and send templates (the
//! queue-owned receive buffers are `recv_buffers.rs`'s).

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, QpType};

use crate::common::{pair, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    reclaim_one_hands_back_the_request_to_repost,
    a_flushed_receive_shows_its_kind_and_the_callers_id,
    post_recv_one_reposts_and_refuses_misuse,
    bookkeeping_is_48_bytes_a_queue_slot,
    send_templates_post_streams_and_refuse_misuse,
    a_template_source_stays_with_the_qp_until_its_requests_end,
    post_template_one_posts_one_request_and_refuses_misuse,
];

/// The QPs of these tests (and of `template_pins`): 16 requests each way.
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

/// A template of an RDMA write posted 12 times (one signalled): the
/// bytes land, the source's clones come back; misuse is refused before
/// any call.
fn send_templates_post_streams_and_refuse_misuse(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::SharedChunk;
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = crate::common::remote_region(&p.pd, 64)?;
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    };
    let mut c =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    c.as_mut_slice().fill(0x5a);
    let src = SharedChunk::new(c);
    // Refused: reads and atomics write their local entries.
    ensure!(
        p.a.send_template(SendOp::RdmaRead(remote), Some((&src, 64)))
            .is_err(),
        "an RDMA read template"
    );
    // Refused: a source length past the chunk.
    ensure!(
        p.a.send_template(SendOp::RdmaWrite(remote), Some((&src, 65)))
            .is_err(),
        "65 bytes of a 64-byte source"
    );
    let t =
        p.a.send_template(SendOp::RdmaWrite(remote), Some((&src, 64)))?;
    // Refused: another QP.
    let e =
        p.b.post_template(&t, [(1, true)])
            .expect_err("another QP's template");
    ensure!(e.posted == 0 && p.b.outstanding_sends() == 0, "{e}");
    // Refused: more than the send queue holds.
    let room = p.a.caps().max_send_wr as u64;
    let e =
        p.a.post_template(&t, (0..room + 1).map(|i| (i, true)))
            .expect_err("past the room");
    ensure!(e.posted == 0 && p.a.outstanding_sends() == 0, "{e}");
    ensure!(
        src.holders() == 2,
        "{} holders after refusals",
        src.holders()
    );
    p.a.post_template(&t, std::iter::empty())?;
    p.a.post_template(&t, (0..12).map(|i| (i, i == 11)))?;
    ensure!(p.a.outstanding_sends() == 12, "{}", p.a.outstanding_sends());
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    let mut ids = Vec::new();
    ensure!(
        p.a.reclaim(&wcs[0], |c| ids.push(c.wr_id)) == 12,
        "ended {ids:?}"
    );
    ensure!(ids == (0..12).collect::<Vec<_>>(), "{ids:?}");
    drop(t);
    ensure!(src.holders() == 1, "{} holders left", src.holders());
    let mut got = [0u8; 64];
    target.read(0, &mut got)?;
    ensure!(got.iter().all(|&b| b == 0x5a), "the write did not land");
    // Refused: below RTS.
    let t = p.a.send_template(SendOp::Send, None)?;
    p.a.reset()?;
    ensure!(
        p.a.post_template(&t, [(1, true)]).is_err(),
        "a template posted in RESET"
    );
    Ok(())
}

/// The QP keeps a template's source while requests from it are
/// outstanding and the template was dropped, lets go of it when the
/// completion that ends them is reclaimed (the quiet path of
/// `reclaim_chunks`, which visits no slot), and after a RESET;
/// `template_source_mut` writes the source only when nothing else can
/// reach it; owned chunks posted among template requests still come back.
fn a_template_source_stays_with_the_qp_until_its_requests_end(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::SharedChunk;
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = crate::common::remote_region(&p.pd, 64)?;
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    };
    let mut chunks = p.pd.alloc_chunks(3, 64, AccessFlags::LOCAL_WRITE)?;
    let mut c = chunks.pop().ok_or("no chunk")?;
    c.as_mut_slice().fill(0x11);
    let src = SharedChunk::new(c);
    let write = SendOp::RdmaWrite(remote);
    let t = p.a.send_template(write, Some((&src, 64)))?;
    p.a.post_template(&t, (0..4).map(|i| (i, i == 3)))?;
    // While the template lives, the QP adds no handle.
    ensure!(
        src.holders() == 2,
        "{} holders (src, template)",
        src.holders()
    );
    drop(t);
    // Dropped with requests outstanding: the QP keeps its handle.
    ensure!(
        src.holders() == 2,
        "{} holders after the template went",
        src.holders()
    );
    let mut t2 = p.a.send_template(write, Some((&src, 64)))?;
    let e =
        p.a.template_source_mut(&mut t2)
            .expect_err("the QP holds the source");
    ensure!(e.to_string().contains("other handles"), "{e}");
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    let mut back: Vec<rdma_verbs::Chunk> = Vec::new();
    ensure!(p.a.reclaim_chunks(&wcs[0], &mut back) == 4, "4 writes end");
    ensure!(back.is_empty(), "a template request handed back a chunk");
    ensure!(
        p.a.reclaim_chunks(&wcs[0], &mut back) == 0,
        "the same completion twice"
    );
    ensure!(
        src.holders() == 2,
        "{} holders after the completion (src, t2)",
        src.holders()
    );
    let e = p.a.template_source_mut(&mut t2).expect_err("src is alive");
    ensure!(e.to_string().contains("other handles"), "{e}");
    let e = p.b.template_source_mut(&mut t2).expect_err("another QP");
    ensure!(e.to_string().contains("another QP"), "{e}");
    drop(src);
    p.a.template_source_mut(&mut t2)?.fill(0x77);
    // An owned chunk among template requests (the slow walk): it comes back.
    let own = chunks.pop().ok_or("no chunk")?;
    p.a.post_template(&t2, [(10, false)])?;
    p.a.post_send([SendWr::new(11, write).sge(own).unsignaled()])?;
    p.a.post_template(&t2, [(12, true)])?;
    let e =
        p.a.template_source_mut(&mut t2)
            .expect_err("outstanding again");
    ensure!(e.to_string().contains("outstanding"), "{e}");
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    ensure!(p.a.reclaim_chunks(&wcs[0], &mut back) == 3, "3 writes end");
    ensure!(back.len() == 1, "{} owned chunks back, not 1", back.len());
    let mut got = [0u8; 64];
    target.read(0, &mut got)?;
    ensure!(
        got.iter().all(|&b| b == 0x77),
        "the rewritten source did not land"
    );
    p.a.template_source_mut(&mut t2)?[0] = 0x78;
    // Outstanding template requests and a RESET: the QP lets go.
    let keep = SharedChunk::new(chunks.pop().ok_or("no chunk")?);
    let t3 = p.a.send_template(write, Some((&keep, 64)))?;
    p.a.post_template(&t3, [(20, false), (21, false)])?;
    drop(t3);
    ensure!(
        keep.holders() == 2,
        "{} holders (keep, the QP)",
        keep.holders()
    );
    let released = p.a.reset()?;
    ensure!(
        released.len() == 2,
        "{} requests back from RESET",
        released.len()
    );
    ensure!(
        keep.holders() == 1,
        "{} holders after RESET",
        keep.holders()
    );
    Ok(())
}

/// `post_template_one`, one request per call as a latency loop posts:
/// each write lands and its completion ends exactly it, under the
/// caller's id; the source is not writable while it is outstanding;
/// another QP's template (one that outlived its QP too), a full send
/// queue and RESET are refused with nothing recorded; the QP keeps a
/// dropped template's source until its request ends.
fn post_template_one_posts_one_request_and_refuses_misuse(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::SharedChunk;
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = crate::common::remote_region(&p.pd, 64)?;
    let write = SendOp::RdmaWrite(RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    });
    let mut chunks = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let src = SharedChunk::new(chunks.pop().ok_or("no chunk")?);
    let mut t = p.a.send_template(write, Some((&src, 64)))?;
    drop(src);
    let mut got = [0u8; 64];
    for round in 1..=5u8 {
        p.a.template_source_mut(&mut t)?.fill(round);
        p.a.post_template_one(&t, 100 + u64::from(round), true)?;
        ensure!(p.a.outstanding_sends() == 1, "{}", p.a.outstanding_sends());
        let e = p.a.template_source_mut(&mut t).expect_err("outstanding");
        ensure!(e.to_string().contains("outstanding"), "{e}");
        let wcs = poll_n(&p.cq, 1)?;
        ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
        let mut ids = Vec::new();
        ensure!(p.a.reclaim(&wcs[0], |c| ids.push(c.wr_id)) == 1, "{ids:?}");
        ensure!(ids == [100 + u64::from(round)], "{ids:?}");
        ensure!(
            p.a.reclaim(&wcs[0], |_| {}) == 0,
            "the same completion twice"
        );
        target.read(0, &mut got)?;
        ensure!(got.iter().all(|&b| b == round), "round {round}: {got:?}");
    }
    // Refused, nothing recorded: another QP.
    let e =
        p.b.post_template_one(&t, 1, true)
            .expect_err("another QP's template");
    ensure!(e.posted == 0 && p.b.outstanding_sends() == 0, "{e}");
    ensure!(e.to_string().contains("another QP"), "{e}");
    // A template that outlived its QP is refused on a later QP of the same
    // PD, even one at the same address (a template names its QP by a
    // number never reused, not by its address).
    let init = rdma_verbs::QpInitAttr::new(QpType::Rc, &p.cq, &p.cq).caps(caps());
    let gone = p.pd.create_qp(&init)?;
    let old = gone.as_raw() as usize;
    let orphan = gone.send_template(write, None)?;
    drop(gone);
    let mut later = Vec::new();
    while later.len() < 8 {
        let q = p.pd.create_qp(&init)?;
        let same = q.as_raw() as usize == old;
        later.push(q);
        if same {
            break;
        }
    }
    let q = later.last_mut().ok_or("no QP")?;
    eprintln!(
        "post_template_one_posts_one_request_and_refuses_misuse: the later QP is at the gone one's address: {}",
        q.as_raw() as usize == old
    );
    let e = q
        .post_template_one(&orphan, 1, true)
        .expect_err("a gone QP's template");
    ensure!(e.posted == 0 && q.outstanding_sends() == 0, "{e}");
    ensure!(e.to_string().contains("another QP"), "{e}");
    drop(later);
    // Refused, nothing recorded: a full send queue.
    let room = p.a.caps().max_send_wr as u64;
    for i in 0..room {
        p.a.post_template_one(&t, i, i + 1 == room)?;
    }
    let e =
        p.a.post_template_one(&t, room, true)
            .expect_err("past the room");
    ensure!(e.posted == 0 && e.returned.is_empty(), "{e}");
    ensure!(e.to_string().contains("room"), "{e}");
    ensure!(
        matches!(e.error, rdma_verbs::Error::QueueFull { requests: 1, room: 0, outstanding, .. }
            if outstanding == room as usize),
        "{e:?}"
    );
    ensure!(
        p.a.outstanding_sends() == room as usize,
        "{} outstanding, not {room}",
        p.a.outstanding_sends()
    );
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    let mut back: Vec<rdma_verbs::Chunk> = Vec::new();
    ensure!(
        p.a.reclaim_chunks(&wcs[0], &mut back) == room as usize,
        "{room} writes end"
    );
    ensure!(back.is_empty(), "a template request handed back a chunk");
    // A template dropped with its request outstanding: the QP keeps the
    // source until the completion is reclaimed.
    let keep = SharedChunk::new(chunks.pop().ok_or("no chunk")?);
    let t2 = p.a.send_template(write, Some((&keep, 64)))?;
    p.a.post_template_one(&t2, 7, true)?;
    drop(t2);
    ensure!(
        keep.holders() == 2,
        "{} holders (keep, the QP)",
        keep.holders()
    );
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    ensure!(
        p.a.reclaim_chunks(&wcs[0], &mut back) == 1,
        "the write ends"
    );
    ensure!(
        keep.holders() == 1,
        "{} holders after it ended",
        keep.holders()
    );
    // Refused, nothing recorded: RESET.
    p.a.reset()?;
    let e = p.a.post_template_one(&t, 1, true).expect_err("RESET");
    ensure!(e.posted == 0 && p.a.outstanding_sends() == 0, "{e}");
    Ok(())
}

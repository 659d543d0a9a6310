//! Queue-owned receive buffers (`RecvBuffers`): the bytes lent and the
//! buffers posted again, RESET, the direct post and its refusals, a
//! receive forged with a pool's `wr_id`, and the region's life when the
//! pool is dropped while buffers are posted (the QP's pins).

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, QpType, WcOpcode};

use crate::common::{pair, poll_n, Env, Test};
use crate::reclaim_one::caps;

pub const TESTS: &[Test] = tests![
    lend_the_bytes_and_post_again,
    come_back_from_a_reset,
    refuse_a_receive_posted_with_their_wr_id,
    post_direct_and_refuse_with_nothing_recorded,
    outlive_their_pool_while_posted,
    a_qp_holds_a_pools_region_exactly_while_a_buffer_is_posted,
    a_dropped_pools_region_goes_when_each_qp_it_was_posted_to_looks,
    of_0_bytes_take_writes_with_immediate_on_a_qp_and_an_srq,
];

/// A pool of four buffers kept posted on the receiving QP through twelve
/// messages: each completion lends the bytes, dropping the loan frees the
/// buffer, and one post call reposts all that are free.
fn lend_the_bytes_and_post_again(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    ensure!(
        RecvBuffers::new(&p.pd, 0, 64).is_err(),
        "a pool of 0 buffers"
    );
    let mut bufs = RecvBuffers::new(&p.pd, 4, 256)?;
    ensure!(bufs.post_up_to(&mut p.b, 0)? == 0, "posted 0 of at most 0");
    ensure!(bufs.post_up_to(&mut p.b, 1)? == 1, "posted 1 of at most 1");
    ensure!(
        bufs.free() == 3 && bufs.posted() == 1,
        "{} free",
        bufs.free()
    );
    ensure!(bufs.post(&mut p.b)? == 3, "posted the other 3");
    ensure!(bufs.post(&mut p.b)? == 0, "nothing free: nothing posted");
    ensure!(
        bufs.posted() == 4 && p.b.outstanding_recvs() == 4,
        "posted {}",
        bufs.posted()
    );
    let mut src =
        p.pd.alloc_chunks(1, 256, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    let mut free = 0;
    for i in 0..12u8 {
        let len = 10 + usize::from(i);
        src.as_mut_slice()[..len].fill(i);
        p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(src, len)])?;
        let wcs = poll_n(&p.cq, 2)?;
        let mut back = None;
        for wc in &wcs {
            if wc.qp_num() == p.a.qp_num() {
                back = p.a.reclaim_one(wc).and_then(Completed::into_chunk);
                continue;
            }
            ensure!(wc.opcode() == Ok(WcOpcode::Recv), "{wc:?}");
            match bufs.take(&mut p.b, wc) {
                Taken::Mine(msg) => {
                    ensure!(msg.is_success() && msg.len() == len, "{} bytes", msg.len());
                    ensure!(msg.iter().all(|&b| b == i), "bytes {:?}", &msg[..]);
                }
                other => return Err(format!("not the pool's: {other:?}").into()),
            }
            free += 1;
            ensure!(
                bufs.free() == free,
                "{} free after the loan ended, not {free}",
                bufs.free()
            );
            // The same completion again ends nothing.
            ensure!(
                matches!(bufs.take(&mut p.b, wc), Taken::Nothing),
                "taken twice"
            );
        }
        src = back.ok_or("no send chunk back")?;
        if i % 3 == 2 {
            ensure!(bufs.post(&mut p.b)? == free, "reposted");
            free = 0;
        }
    }
    ensure!(
        bufs.free() + bufs.posted() == 4,
        "{} free, {} posted",
        bufs.free(),
        bufs.posted()
    );
    // A completion of the other QP is not the pool's, and is handed back whole.
    p.a.post_send([SendWr::new(7, SendOp::Send).sge_len(src, 8)])?;
    let wcs = poll_n(&p.cq, 2)?;
    for wc in &wcs {
        if wc.qp_num() == p.a.qp_num() {
            match bufs.take(&mut p.a, wc) {
                Taken::Other(c) => {
                    ensure!(c.wr_id == 7 && c.into_chunk().is_some(), "wrong request")
                }
                other => return Err(format!("a send taken as {other:?}").into()),
            }
        } else if let Taken::Mine(msg) = bufs.take(&mut p.b, wc) {
            ensure!(msg.len() == 8, "{}", msg.len());
        }
    }
    Ok(())
}

/// Buffers posted when the QP is reset come back through `give_back`.
fn come_back_from_a_reset(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut bufs = RecvBuffers::new(&p.pd, 3, 64)?;
    bufs.post(&mut p.b)?;
    let mut mine = RecvWr::new(5);
    mine = mine.sge(
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?,
    );
    p.b.post_recv([mine])?;
    let back = p.b.reset()?;
    ensure!(back.len() == 4, "{} back", back.len());
    let mut others = 0;
    for c in back {
        if let Err(c) = bufs.give_back(c) {
            ensure!(c.wr_id == 5, "{c:?}");
            others += 1;
        }
    }
    ensure!(
        others == 1 && bufs.free() == 3 && bufs.posted() == 0,
        "{} free",
        bufs.free()
    );
    Ok(())
}

/// The pool's direct post checks once per call what every buffer shares,
/// and a refusal records nothing and leaves every buffer free: no room
/// for them all, a pool of another PD, a QP in RESET, buffers too small
/// for a UD QP's GRH. One pool feeds two QPs.
fn post_direct_and_refuse_with_nothing_recorded(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let room = p.b.caps().max_recv_wr as usize;
    // No room for all: refused whole, then posted up to the room.
    let mut bufs = RecvBuffers::new(&p.pd, room + 2, 64)?;
    let e = bufs.post(&mut p.b).expect_err("more buffers than room");
    ensure!(
        e.posted == 0 && e.to_string().contains("has room for"),
        "{e}"
    );
    ensure!(
        matches!(e.error, rdma_verbs::Error::QueueFull {
            queue: "receive queue", requests, room: r, outstanding: 0, ..
        } if requests == room + 2 && r == room),
        "{e:?}"
    );
    ensure!(
        bufs.free() == room + 2 && bufs.posted() == 0 && p.b.outstanding_recvs() == 0,
        "a refusal recorded {} receives",
        p.b.outstanding_recvs()
    );
    ensure!(
        bufs.post_up_to(&mut p.b, room)? == room,
        "posted up to the room"
    );
    let e = bufs.post(&mut p.b).expect_err("a full receive queue");
    ensure!(e.posted == 0 && bufs.free() == 2, "{e}");
    ensure!(
        p.b.outstanding_recvs() == room,
        "{}",
        p.b.outstanding_recvs()
    );
    // A pool of another PD.
    let other = env.ctx.alloc_pd()?;
    let mut theirs = RecvBuffers::new(&other, 2, 64)?;
    let e = theirs.post(&mut p.a).expect_err("another PD");
    ensure!(
        e.to_string().contains("another protection domain") && theirs.free() == 2,
        "{e}"
    );
    ensure!(p.a.outstanding_recvs() == 0, "{}", p.a.outstanding_recvs());
    // The same pool feeds the other QP too; each completion is the pool's.
    ensure!(bufs.post(&mut p.a)? == 2, "posted to the second QP");
    let mut srcs = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let (s1, s0) = (srcs.pop().ok_or("no chunk")?, srcs.pop().ok_or("no chunk")?);
    p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(s0, 5)])?;
    p.b.post_send([SendWr::new(2, SendOp::Send).sge_len(s1, 6)])?;
    let mut lens = Vec::new();
    for wc in poll_n(&p.cq, 4)? {
        let qp = if wc.qp_num() == p.a.qp_num() {
            &mut p.a
        } else {
            &mut p.b
        };
        match bufs.take(qp, &wc) {
            Taken::Mine(msg) => lens.push(msg.len()),
            Taken::Other(c) => ensure!(c.kind == RequestKind::Send, "{c:?}"),
            Taken::Nothing => return Err(format!("{wc:?} ended nothing").into()),
        }
    }
    lens.sort_unstable();
    ensure!(lens == [5, 6], "received {lens:?}");
    // RESET: refused, nothing recorded; the buffers come back.
    for c in p.a.reset()? {
        bufs.give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    let free = bufs.free();
    let e = bufs.post(&mut p.a).expect_err("RESET");
    ensure!(e.posted == 0 && bufs.free() == free, "{e}");
    ensure!(p.a.outstanding_recvs() == 0, "{}", p.a.outstanding_recvs());
    // UD on a port that needs a GRH (RoCE): buffers under 40 bytes.
    let mut u = pair(env, QpType::Ud, caps(), AccessFlags::empty())?;
    let mut small = RecvBuffers::new(&u.pd, 2, 16)?;
    match small.post(&mut u.b) {
        Err(e) => ensure!(e.to_string().contains("GRH") && small.free() == 2, "{e}"),
        // An InfiniBand port without IBV_QPF_GRH_REQUIRED takes them.
        Ok(n) => ensure!(
            !env.ctx.query_port(env.port)?.is_roce() && n == 2,
            "16-byte UD buffers posted on RoCE"
        ),
    }
    ensure!(
        RecvBuffers::new(&u.pd, 2, 64)?.post(&mut u.b)? == 2,
        "64-byte UD buffers"
    );
    Ok(())
}

/// A pool dropped while its buffers are posted: the QP keeps the pool's
/// region registered until the last of them ends, so the device still
/// writes messages into them (the receives succeed, which they would not
/// with the region gone: rxe fails a receive into an unregistered key);
/// their completions hand back the requests, naming the pool, with no
/// chunk (the bytes went with the pool). A second pool posted behind them
/// meanwhile takes the next message as usual, and its other buffer comes
/// back from the QP's RESET, which it takes back.
fn outlive_their_pool_while_posted(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut gone = RecvBuffers::new(&p.pd, 2, 64)?;
    ensure!(gone.post(&mut p.b)? == 2, "posted");
    drop(gone);
    let mut bufs = RecvBuffers::new(&p.pd, 2, 64)?;
    ensure!(bufs.post(&mut p.b)? == 2, "second pool posted");
    let mut srcs = p.pd.alloc_chunks(3, 64, AccessFlags::LOCAL_WRITE)?;
    for (c, msg) in srcs.iter_mut().zip([b"lat1", b"lat2", b"anew"]) {
        c.as_mut_slice()[..4].copy_from_slice(msg);
    }
    p.a.post_send(
        srcs.drain(..)
            .map(|c| SendWr::new(1, SendOp::Send).sge_len(c, 4)),
    )?;
    let (mut dropped, mut bytes) = (Vec::new(), None);
    for wc in poll_n(&p.cq, 6)? {
        ensure!(wc.is_success(), "{wc:?}");
        if wc.qp_num() != p.b.qp_num() {
            p.a.reclaim_chunks(&wc, &mut srcs);
            continue;
        }
        match bufs.take(&mut p.b, &wc) {
            Taken::Mine(msg) => bytes = Some(msg.to_vec()),
            Taken::Other(c) => dropped.push(c),
            Taken::Nothing => return Err("a receive ended nothing".into()),
        }
    }
    ensure!(srcs.len() == 3, "{} send chunks back", srcs.len());
    ensure!(bytes.as_deref() == Some(&b"anew"[..]), "{bytes:?}");
    ensure!(dropped.len() == 2, "{dropped:?}");
    for c in dropped {
        ensure!(c.kind == RequestKind::Recv && c.wr_id >> 32 != 0, "{c:?}");
        ensure!(c.into_chunk().is_none(), "a chunk of the dropped pool");
    }
    ensure!(p.b.outstanding_recvs() == 1, "{}", p.b.outstanding_recvs());
    // The second pool's other buffer goes with the QP's RESET.
    let back = p.b.reset()?;
    ensure!(back.len() == 1, "{back:?}");
    for c in back {
        bufs.give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    ensure!(
        bufs.free() == 2 && bufs.posted() == 0,
        "{} free, {} posted",
        bufs.free(),
        bufs.posted()
    );
    Ok(())
}

/// How many memory regions hold `pd` (its clone's refused close names
/// them).
fn regions_of(pd: &rdma_verbs::ProtectionDomain) -> Result<usize, Failed> {
    match pd.clone().close() {
        Err(rdma_verbs::Error::InUse { by, .. }) => {
            Ok(by.count(rdma_verbs::UserKind::MemoryRegion))
        }
        other => Err(format!("the clone's close: {other:?}").into()),
    }
}

/// One 8-byte send from `from` (a chunk of `srcs`) into whatever `to`
/// has posted, both completions reclaimed through the QPs: the send's
/// chunk back into `srcs`, the receive by `reclaim_one` (which must end
/// it). Both completions go to `cq`.
fn send_reclaimed(
    from: &mut rdma_verbs::QueuePair,
    to: &mut rdma_verbs::QueuePair,
    cq: &rdma_verbs::CompletionQueue,
    srcs: &mut Vec<rdma_verbs::Chunk>,
    id: u64,
) -> Result<(), Failed> {
    let src = srcs.pop().ok_or("no chunk")?;
    from.post_send([SendWr::new(id, SendOp::Send).sge_len(src, 8)])?;
    for wc in poll_n(cq, 2)? {
        ensure!(wc.is_success(), "{wc:?}");
        if wc.qp_num() == from.qp_num() {
            from.reclaim_chunks(&wc, srcs);
        } else {
            ensure!(to.reclaim_one(&wc).is_some(), "the receive ended nothing");
        }
    }
    Ok(())
}

/// The QP's pin of a pool's region: taken by the first post, let go when
/// the pool's last posted buffer ends (its completion, or a RESET), so
/// that a dropped pool's region is deregistered then, not when the QP
/// goes; a pool that lives on keeps its own handle meanwhile.
fn a_qp_holds_a_pools_region_exactly_while_a_buffer_is_posted(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut srcs = p.pd.alloc_chunks(4, 64, AccessFlags::LOCAL_WRITE)?;
    let base = regions_of(&p.pd)?;
    let mut bufs = RecvBuffers::new(&p.pd, 2, 64)?;
    ensure!(regions_of(&p.pd)? == base + 1, "the pool's region");
    ensure!(bufs.post(&mut p.b)? == 2, "posted");
    drop(bufs);
    ensure!(
        regions_of(&p.pd)? == base + 1,
        "the QP keeps the dropped pool's region while its buffers are posted"
    );
    // Two sends: the first ends one buffer (one left: still held), the
    // second the last one (let go).
    for round in 0..2 {
        send_reclaimed(&mut p.a, &mut p.b, &p.cq, &mut srcs, round)?;
        let want = if round == 0 { base + 1 } else { base };
        ensure!(
            regions_of(&p.pd)? == want,
            "round {round}: {} regions, want {want}",
            regions_of(&p.pd)?
        );
    }
    // A pool that lives on: after a RESET hands its buffers back, only
    // the pool holds its region.
    let mut bufs = RecvBuffers::new(&p.pd, 2, 64)?;
    ensure!(bufs.post(&mut p.b)? == 2, "posted");
    for c in p.b.reset()? {
        bufs.give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    ensure!(bufs.free() == 2, "{} free", bufs.free());
    ensure!(regions_of(&p.pd)? == base + 1, "the pool's own handle only");
    drop(bufs);
    ensure!(
        regions_of(&p.pd)? == base,
        "a pool dropped with nothing posted goes at once"
    );
    Ok(())
}

/// A pool posted to two QPs and dropped while buffers are posted to one
/// of them: that QP lets go of the region when the last of them ends;
/// the other, which holds none, keeps it until it next looks (here:
/// another pool's first post there), and then lets go.
fn a_dropped_pools_region_goes_when_each_qp_it_was_posted_to_looks(
    env: &Env,
) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::empty())?;
    let mut srcs = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let base = regions_of(&p.pd)?;
    let mut bufs = RecvBuffers::new(&p.pd, 2, 64)?;
    // One message into a buffer posted to b, taken by the pool.
    ensure!(bufs.post_up_to(&mut p.b, 1)? == 1, "posted to b");
    let src = srcs.pop().ok_or("no chunk")?;
    p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(src, 8)])?;
    for wc in poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "{wc:?}");
        if wc.qp_num() == p.a.qp_num() {
            p.a.reclaim_chunks(&wc, &mut srcs);
        } else {
            ensure!(
                matches!(bufs.take(&mut p.b, &wc), Taken::Mine(_)),
                "not the pool's"
            );
        }
    }
    // Both buffers to a, then the pool goes.
    ensure!(bufs.post(&mut p.a)? == 2, "posted to a");
    drop(bufs);
    ensure!(regions_of(&p.pd)? == base + 1, "kept for a's buffers");
    for round in 0..2 {
        send_reclaimed(&mut p.b, &mut p.a, &p.cq, &mut srcs, round)?;
    }
    // a let go; b, which held none, still has its pin.
    ensure!(regions_of(&p.pd)? == base + 1, "b's pin keeps the region");
    let mut other = RecvBuffers::new(&p.pd, 1, 64)?;
    ensure!(other.post(&mut p.b)? == 1, "another pool posted to b");
    ensure!(
        regions_of(&p.pd)? == base + 1,
        "b let go of the dropped pool's region (the new pool's own is left)"
    );
    let back = p.b.reset()?;
    ensure!(back.len() == 1, "{back:?}");
    for c in back {
        other
            .give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    Ok(())
}

/// A receive the caller posts with the `wr_id` of one of a pool's posted
/// buffers (and two chunks of its own) is not the pool's: taken before
/// the pool's own completion it comes back whole as `Taken::Other`, no
/// panic, and the pool's buffer is still recognised afterwards.
fn refuse_a_receive_posted_with_their_wr_id(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_recv_sge: 2,
        ..caps()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let mut bufs = RecvBuffers::new(&p.pd, 1, 64)?;
    let mut srcs = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    // Learn the pool's wr_id: reclaim its first receive by hand.
    ensure!(bufs.post(&mut p.b)? == 1, "posted");
    let src = srcs.pop().ok_or("no chunk")?;
    p.a.post_send([SendWr::new(1, SendOp::Send).sge_len(src, 8)])?;
    let mut pool_id = None;
    for wc in &poll_n(&p.cq, 2)? {
        if wc.qp_num() == p.a.qp_num() {
            srcs.extend(p.a.reclaim_one(wc).and_then(Completed::into_chunk));
        } else {
            let c =
                p.b.reclaim_one(wc)
                    .ok_or("the pool's receive ended nothing")?;
            pool_id = Some(c.wr_id);
            bufs.give_back(c)
                .map_err(|c| format!("not the pool's: {c:?}"))?;
        }
    }
    let pool_id = pool_id.ok_or("no receive completion")?;
    ensure!(srcs.len() == 2, "{} send chunks", srcs.len());
    // The pool's buffer posted again, then a forged receive behind it.
    ensure!(bufs.post(&mut p.b)? == 1, "reposted");
    let mut mine = p.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let (m1, m0) = (mine.pop().ok_or("no chunk")?, mine.pop().ok_or("no chunk")?);
    p.b.post_recv([RecvWr::new(pool_id).sge(m0).sge(m1)])?;
    p.a.post_send(
        srcs.drain(..)
            .map(|c| SendWr::new(2, SendOp::Send).sge_len(c, 8)),
    )?;
    let mut recvs = Vec::new();
    for wc in poll_n(&p.cq, 4)? {
        if wc.qp_num() == p.a.qp_num() {
            p.a.reclaim_chunks(&wc, &mut srcs);
        } else {
            recvs.push(wc);
        }
    }
    ensure!(srcs.len() == 2, "{} send chunks back", srcs.len());
    ensure!(recvs.len() == 2, "{} receive completions", recvs.len());
    // The forged one first, while the pool's buffer is still posted.
    match bufs.take(&mut p.b, &recvs[1]) {
        Taken::Other(c) => ensure!(
            c.wr_id == pool_id && c.chunks().count() == 2,
            "the forged receive came back changed"
        ),
        other => return Err(format!("a forged receive taken as {other:?}").into()),
    }
    match bufs.take(&mut p.b, &recvs[0]) {
        Taken::Mine(msg) => ensure!(msg.is_success() && msg.len() == 8, "{} bytes", msg.len()),
        other => return Err(format!("the pool's receive taken as {other:?}").into()),
    }
    ensure!(
        bufs.free() == 1 && bufs.posted() == 0,
        "{} free",
        bufs.free()
    );
    Ok(())
}

/// Buffers of 0 bytes (receives without an entry) take RDMA WRITEs with
/// immediate, on a QP and through an SRQ: each completion is the pool's,
/// holds no bytes and carries the immediate, the data is in the target,
/// and the buffer is posted again; no region is registered for them; a
/// write's completion offered twice
/// ends nothing the second time; what the pool refuses (RESET) leaves
/// every buffer free.
fn of_0_bytes_take_writes_with_immediate_on_a_qp_and_an_srq(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::QpInitAttr;
    ensure!(
        RecvBuffers::new(&env.ctx.alloc_pd()?, 0, 0).is_err(),
        "a pool of 0 buffers"
    );
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let regions = regions_of(&p.pd)?;
    let mut imms = RecvBuffers::new(&p.pd, 4, 0)?;
    ensure!(regions_of(&p.pd)? == regions, "a region for 0-byte buffers");
    ensure!(imms.buffer_size() == 0 && imms.len() == 4, "{imms:?}");
    let target = crate::common::remote_region(&p.pd, 64)?;
    let mut src =
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    // Over twice the pool, so that every buffer is posted again.
    let write = |p: &mut crate::common::Pair, src, imms: &mut RecvBuffers, round: u32| {
        let op = SendOp::RdmaWriteWithImm(
            RemoteAddr {
                addr: target.addr(),
                rkey: target.rkey(),
            },
            round,
        );
        p.a.post_send([SendWr::new(u64::from(round), op).sge_len(src, 8)])?;
        let (mut got, mut back) = (None, None);
        for wc in poll_n(&p.cq, 2)? {
            ensure!(wc.is_success(), "round {round}: {wc:?}");
            if wc.opcode() == Ok(WcOpcode::RecvRdmaWithImm) {
                match imms.take(&mut p.b, &wc) {
                    Taken::Mine(msg) => {
                        ensure!(msg.is_empty() && msg.is_success(), "{msg:?}");
                        got = wc.imm_data();
                    }
                    other => return Err(format!("round {round}: {other:?}").into()),
                }
                ensure!(
                    matches!(imms.take(&mut p.b, &wc), Taken::Nothing),
                    "the same completion twice"
                );
            } else {
                back = p.a.reclaim_one(&wc).and_then(Completed::into_chunk);
            }
        }
        ensure!(got == Some(round), "round {round}: immediate {got:?}");
        imms.post(&mut p.b)?;
        Ok::<_, Failed>(back.ok_or("no send chunk back")?)
    };
    ensure!(imms.post(&mut p.b)? == 4, "posted 4");
    for round in 1..=9u32 {
        src.as_mut_slice()[..8].fill(round as u8);
        src = write(&mut p, src, &mut imms, round)?;
        let mut got = [0u8; 8];
        target.read(0, &mut got)?;
        ensure!(got == [round as u8; 8], "round {round}: {got:?}");
    }
    ensure!(
        imms.posted() == 4 && p.b.outstanding_recvs() == 4,
        "4 posted"
    );
    // RESET hands the records back; the pool takes them, and a post below
    // INIT is refused with every buffer still free.
    for c in p.b.reset()? {
        imms.give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    ensure!(imms.free() == 4, "{} free after RESET", imms.free());
    let e = imms.post(&mut p.b).expect_err("RESET");
    ensure!(e.posted == 0 && imms.free() == 4, "{e}");

    // Through an SRQ: the same writes, taken through the QP on the SRQ.
    let cq = env.ctx.create_cq(64)?;
    let srq = p.pd.create_srq(8, 1, 0)?;
    let mut sender =
        p.pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps()))?;
    let mut receiver =
        p.pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps()).srq(&srq))?;
    crate::common::connect(env, &mut sender, &mut receiver, AccessFlags::REMOTE_WRITE)?;
    let mut imms = RecvBuffers::new(&p.pd, 2, 0)?;
    ensure!(
        imms.post_srq(&srq)? == 2 && srq.outstanding() == 2,
        "2 on the SRQ"
    );
    for round in 1..=5u32 {
        let op = SendOp::RdmaWriteWithImm(
            RemoteAddr {
                addr: target.addr(),
                rkey: target.rkey(),
            },
            round,
        );
        sender.post_send([SendWr::new(0, op).sge_len(src, 8)])?;
        let mut back = None;
        for wc in poll_n(&cq, 2)? {
            ensure!(wc.is_success(), "SRQ round {round}: {wc:?}");
            if wc.qp_num() == receiver.qp_num() {
                match imms.take(&mut receiver, &wc) {
                    Taken::Mine(msg) => ensure!(msg.is_empty(), "{msg:?}"),
                    other => return Err(format!("SRQ round {round}: {other:?}").into()),
                }
                ensure!(wc.imm_data() == Some(round), "{wc:?}");
            } else {
                back = sender.reclaim_one(&wc).and_then(Completed::into_chunk);
            }
        }
        src = back.ok_or("no send chunk back")?;
        ensure!(imms.post_srq(&srq)? == 1, "reposted 1 to the SRQ");
    }
    ensure!(srq.outstanding() == 2 && imms.posted() == 2, "2 on the SRQ");
    Ok(())
}

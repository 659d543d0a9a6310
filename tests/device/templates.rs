//! Send templates: `QueuePair::send_template`, `post_template` and
//! `post_template_one`, a template's source kept by the QP while its
//! requests may be outstanding (what the QP pins is `template_pins.rs`'s).

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, QpType};

use super::reclaim_one::caps;
use crate::common::{pair, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    send_templates_post_streams_and_refuse_misuse,
    a_template_source_stays_with_the_qp_until_its_requests_end,
    post_template_one_posts_one_request_and_refuses_misuse,
];

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
        "template_one: the later QP is at the gone one's address: {}",
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

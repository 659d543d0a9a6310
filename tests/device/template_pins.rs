//! Templates on one QP: the QP's pin of each template family holds that
//! family's raw request and entry, which `post_template_one` fills in place.
//! These tests try to make one template post another's request: several
//! templates, clones, sources of other lengths, rewritten sources, a
//! template without a source, and a template made again after its family
//! was let go.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, QpType, SharedChunk};

use crate::common::{pair, poll_n, Env, Test};
use crate::reclaim_one::caps;

pub const TESTS: &[Test] = tests![
    each_template_posts_its_own_request_on_a_shared_qp,
    clone_dropped_while_outstanding_leaves_the_source_writable,
];

/// A clone of a template dropped while a request from it is outstanding
/// leaves its handle with the QP; once the request ends (and after a
/// RESET), the handle goes and the template's source is writable again.
/// (Before, the handle stayed as long as any template of the family, so
/// `template_source_mut` refused for good with nothing outstanding.)
fn clone_dropped_while_outstanding_leaves_the_source_writable(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = crate::common::remote_region(&p.pd, 64)?;
    let op = SendOp::RdmaWrite(RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    });
    let c = p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let src = SharedChunk::new(c.into_iter().next().ok_or("no chunk")?);
    let mut t = p.a.send_template(op, Some((&src, 64)))?;
    drop(src);
    for round in 0..2 {
        let clone = t.clone();
        p.a.post_template_one(&clone, 1, true)?;
        drop(clone);
        let e = p.a.template_source_mut(&mut t).expect_err("outstanding");
        ensure!(e.to_string().contains("outstanding"), "{e}");
        if round == 0 {
            let wcs = poll_n(&p.cq, 1)?;
            ensure!(p.a.reclaim_one(&wcs[0]).is_some(), "{:?}", wcs[0]);
        } else {
            // A RESET ends the request too (its completion may come or not).
            let back = p.a.reset()?;
            ensure!(back.len() <= 1, "{} back at RESET", back.len());
        }
        p.a.template_source_mut(&mut t)
            .map_err(|e| format!("round {round}: nothing outstanding, yet: {e}"))?
            .fill(round);
    }
    Ok(())
}

/// Posts `t` once (signalled) as request `id` and checks that its one
/// completion ends exactly that request.
fn post_and_end(p: &mut crate::common::Pair, t: &SendTemplate, id: u64) -> Result<(), Failed> {
    p.a.post_template_one(t, id, true)?;
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "request {id}: {:?}", wcs[0]);
    let mut ids = Vec::new();
    ensure!(
        p.a.reclaim(&wcs[0], |c| ids.push(c.wr_id)) == 1,
        "request {id}: {ids:?}"
    );
    ensure!(ids == [id], "request {id} ended {ids:?}");
    Ok(())
}

fn each_template_posts_its_own_request_on_a_shared_qp(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, caps(), AccessFlags::REMOTE_WRITE)?;
    let target = crate::common::remote_region(&p.pd, 128)?;
    let at = |off: u64| {
        SendOp::RdmaWrite(RemoteAddr {
            addr: target.addr() + off,
            rkey: target.rkey(),
        })
    };
    let mut chunks = p.pd.alloc_chunks(3, 64, AccessFlags::LOCAL_WRITE)?;
    let mut c1 = chunks.pop().ok_or("no chunk")?;
    c1.as_mut_slice().fill(0xa1);
    let mut c2 = chunks.pop().ok_or("no chunk")?;
    c2.as_mut_slice().fill(0xb2);
    let (s1, s2) = (SharedChunk::new(c1), SharedChunk::new(c2));
    // Two families on one QP: 64 bytes to offset 0, and 32 bytes (another
    // length, another source) to offset 64; a clone of the first; a
    // zero-length write with no source (no pin: built on the stack).
    let mut t1 = p.a.send_template(at(0), Some((&s1, 64)))?;
    let mut t2 = p.a.send_template(at(64), Some((&s2, 32)))?;
    let t1c = t1.clone();
    let t0 = p.a.send_template(at(0), None)?;
    drop((s1, s2));
    let mut got = [0u8; 128];
    for (round, id) in (1..=3u8).zip((0..).step_by(10)) {
        if round > 1 {
            // Sources rewritten in place between rounds: the pins name the
            // sources' memory, not a copy of it.
            let e =
                p.a.template_source_mut(&mut t1)
                    .expect_err("a clone holds it");
            ensure!(e.to_string().contains("other handles"), "{e}");
            p.a.template_source_mut(&mut t2)?.fill(0xb0 + round);
        }
        post_and_end(&mut p, &t1, id)?;
        post_and_end(&mut p, &t2, id + 1)?;
        post_and_end(&mut p, &t0, id + 2)?;
        post_and_end(&mut p, &t1c, id + 3)?;
        post_and_end(&mut p, &t2, id + 4)?;
        target.read(0, &mut got)?;
        ensure!(
            got[..64].iter().all(|&b| b == 0xa1),
            "round {round}: {got:?}"
        );
        let b = if round == 1 { 0xb2 } else { 0xb0 + round };
        ensure!(
            got[64..96].iter().all(|&x| x == b),
            "round {round}: {got:?}"
        );
        ensure!(
            got[96..].iter().all(|&x| x == 0),
            "round {round}: t2 wrote past its 32 bytes: {got:?}"
        );
    }
    // The first family let go (template and clone), then made again from
    // another source to another place: its new pin has its own request.
    drop((t1, t1c));
    let mut c3 = chunks.pop().ok_or("no chunk")?;
    c3.as_mut_slice().fill(0xc3);
    let s3 = SharedChunk::new(c3);
    let t3 = p.a.send_template(at(96), Some((&s3, 16)))?;
    post_and_end(&mut p, &t3, 100)?;
    post_and_end(&mut p, &t2, 101)?;
    target.read(0, &mut got)?;
    ensure!(got[96..112].iter().all(|&x| x == 0xc3), "{got:?}");
    ensure!(got[112..].iter().all(|&x| x == 0), "{got:?}");
    ensure!(got[..64].iter().all(|&x| x == 0xa1), "{got:?}");
    // A chain of templates after the single posts: the same pins.
    p.a.post_template(&t3, [(200, false), (201, true)])?;
    let wcs = poll_n(&p.cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    ensure!(p.a.reclaim(&wcs[0], |_| {}) == 2, "two writes end");
    ensure!(p.a.outstanding_sends() == 0, "{}", p.a.outstanding_sends());
    Ok(())
}

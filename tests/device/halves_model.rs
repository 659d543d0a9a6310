//! A QP driven through its halves by a seeded random sequence of sends,
//! receives, the peer's sends, drains and changes of shape (whole, split
//! for one step, given away as owned halves, reunited) against a plain
//! model: after every step the QP's outstanding sends and receives equal
//! the model's, every completion is first offered to the half it is not
//! for (and ends nothing there), and at the end every chunk is back.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, QpCaps, QpType, QueuePair, WorkCompletion};

use crate::common::{pair, Env, Rng, Test};

pub const TESTS: &[Test] = tests![halves_follow_the_model_through_random_steps,];

const DEPTH: usize = 16;
const STEPS: usize = 300;

/// The QP under test, whole or given away as two owned halves.
enum Shape {
    Whole(QueuePair),
    Owned(OwnedSendHalf, OwnedRecvHalf),
}

/// What the QP must hold: its outstanding sends and receives, and the
/// peer's messages to it not yet received.
#[derive(Default)]
struct Model {
    sends: usize,
    recvs: usize,
    to_a: usize,
    to_b: usize,
}

impl Shape {
    fn outstanding(&mut self) -> (usize, usize) {
        match self {
            Shape::Whole(qp) => (qp.outstanding_sends(), qp.outstanding_recvs()),
            Shape::Owned(tx, rx) => (tx.half().outstanding(), rx.half().outstanding()),
        }
    }

    /// Posts `wrs` through the send half (`split`: a borrowed one, for a
    /// whole QP).
    fn send(&mut self, wrs: Vec<SendWr<'static>>, split: bool) -> Result<(), PostError> {
        match self {
            Shape::Whole(qp) if split => qp.split().0.post_send(wrs),
            Shape::Whole(qp) => qp.post_send(wrs),
            Shape::Owned(tx, _) => tx.half().post_send(wrs),
        }
    }

    fn recv(&mut self, wrs: Vec<RecvWr>, split: bool) -> Result<(), PostError> {
        match self {
            Shape::Whole(qp) if split => qp.split().1.post_recv(wrs),
            Shape::Whole(qp) => qp.post_recv(wrs),
            Shape::Owned(_, rx) => rx.half().post_recv(wrs),
        }
    }

    /// Offers `wc` to the half it is not for (which must end nothing),
    /// then takes it: the chunks of the requests it ends, and whether it
    /// was a send's.
    fn take(&mut self, wc: &WorkCompletion, split: bool) -> Result<(Vec<Chunk>, bool), Failed> {
        let send = RequestKind::of_tag(wc.wr_id()) == Some(RequestKind::Send);
        let mut back = Vec::new();
        let (wrong, right) = match self {
            Shape::Whole(qp) if !split => (0, qp.reclaim_chunks(wc, &mut back)),
            Shape::Whole(qp) => {
                let (mut tx, mut rx) = qp.split();
                if send {
                    (
                        rx.reclaim_chunks(wc, &mut back),
                        tx.reclaim_chunks(wc, &mut back),
                    )
                } else {
                    (
                        tx.reclaim_chunks(wc, &mut back),
                        rx.reclaim_chunks(wc, &mut back),
                    )
                }
            }
            Shape::Owned(tx, rx) if send => (
                rx.half().reclaim_chunks(wc, &mut back),
                tx.half().reclaim_chunks(wc, &mut back),
            ),
            Shape::Owned(tx, rx) => (
                tx.half().reclaim_chunks(wc, &mut back),
                rx.half().reclaim_chunks(wc, &mut back),
            ),
        };
        ensure!(
            wrong == 0,
            "the wrong half ended {wrong} request(s) of {wc:?}"
        );
        ensure!(right == 1, "{right} request(s) ended by {wc:?}");
        Ok((back, send))
    }

    fn reshape(self) -> Result<Shape, Failed> {
        Ok(match self {
            Shape::Whole(qp) => {
                let (tx, rx) = qp.into_split();
                Shape::Owned(tx, rx)
            }
            Shape::Owned(tx, rx) => Shape::Whole(tx.reunite(rx)?),
        })
    }
}

fn halves_follow_the_model_through_random_steps(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_wr: DEPTH as u32,
        max_recv_wr: DEPTH as u32,
        ..QpCaps::default()
    };
    let p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let (pd, cq, mut b) = (p.pd, p.cq, p.b);
    let mut a = Shape::Whole(p.a);
    let mut chunks = pd.alloc_chunks(4 * DEPTH, 64, AccessFlags::LOCAL_WRITE)?;
    let mut take = || chunks.split_off(chunks.len() - DEPTH);
    let (mut a_send, mut a_recv, mut b_send) = (take(), take(), take());
    // The peer keeps every receive posted; a's sends wait for none.
    b.post_recv(take().into_iter().map(|c| RecvWr::new(0).sge(c)))?;
    let mut m = Model::default();
    let mut rng = Rng(0x000b_a1f5_eed5);
    let mut counts = [0usize; 5];
    for step in 0..STEPS {
        let split = rng.below(2) == 0;
        let what = rng.below(5) as usize;
        counts[what] += 1;
        match what {
            0 => {
                let k = (rng.below(4) as usize)
                    .min(DEPTH - m.sends)
                    .min(DEPTH - m.to_b)
                    .min(a_send.len());
                let wrs = a_send
                    .drain(..k)
                    .map(|c| SendWr::new(1, SendOp::Send).sge_len(c, 8));
                a.send(wrs.collect(), split)?;
                m.sends += k;
                m.to_b += k;
            }
            1 => {
                let k = (rng.below(4) as usize).min(a_recv.len());
                a.recv(
                    a_recv.drain(..k).map(|c| RecvWr::new(2).sge(c)).collect(),
                    split,
                )?;
                m.recvs += k;
            }
            2 => {
                let k = (rng.below(4) as usize)
                    .min(m.recvs - m.to_a)
                    .min(b_send.len());
                let wrs: Vec<_> = b_send
                    .drain(..k)
                    .map(|c| SendWr::new(3, SendOp::Send).sge_len(c, 8))
                    .collect();
                b.post_send(wrs)?;
                m.to_a += k;
            }
            3 => drain(
                &cq,
                &mut a,
                &mut b,
                &mut m,
                split,
                [&mut a_send, &mut a_recv, &mut b_send],
                step,
            )?,
            _ => a = a.reshape()?,
        }
        let (s, r) = a.outstanding();
        ensure!(
            (s, r) == (m.sends, m.recvs),
            "step {step}: the QP holds {s} sends and {r} receives, the model {} and {}",
            m.sends,
            m.recvs
        );
    }
    drain(
        &cq,
        &mut a,
        &mut b,
        &mut m,
        false,
        [&mut a_send, &mut a_recv, &mut b_send],
        STEPS,
    )?;
    let mut qp = match a {
        Shape::Whole(qp) => qp,
        Shape::Owned(tx, rx) => tx.reunite(rx)?,
    };
    let back = qp.reset()?;
    ensure!(
        back.len() == m.recvs,
        "{} back at RESET, {} receives posted",
        back.len(),
        m.recvs
    );
    a_recv.extend(back.into_iter().flat_map(Completed::chunks));
    ensure!(
        a_send.len() == DEPTH && a_recv.len() == DEPTH && b_send.len() == DEPTH,
        "chunks back: {} + {} + {} of {}",
        a_send.len(),
        a_recv.len(),
        b_send.len(),
        3 * DEPTH
    );
    eprintln!("halves_model: {STEPS} steps (seeded): sends, receives, peer sends, drains, reshapes: {counts:?}");
    Ok(())
}

/// Polls until every send of both QPs ended and every message to `a` was
/// received; the chunks go back to their pools, the peer's receives are
/// posted again.
fn drain(
    cq: &rdma_verbs::CompletionQueue,
    a: &mut Shape,
    b: &mut QueuePair,
    m: &mut Model,
    split: bool,
    [a_send, a_recv, b_send]: [&mut Vec<Chunk>; 3],
    step: usize,
) -> Result<(), Failed> {
    let mut wcs = [WorkCompletion::default(); 16];
    let (start, limit) = (std::time::Instant::now(), crate::common::deadline());
    let a_num = match a {
        Shape::Whole(qp) => qp.qp_num(),
        Shape::Owned(tx, _) => tx.half().qp_num(),
    };
    while m.sends > 0 || m.to_a > 0 || m.to_b > 0 || b_send.len() < DEPTH {
        for wc in cq.poll(&mut wcs)?.iter() {
            ensure!(wc.is_success(), "step {step}: {wc:?}");
            if wc.qp_num() == a_num {
                let (chunks, send) = a.take(wc, split)?;
                if send {
                    m.sends -= 1;
                    a_send.extend(chunks);
                } else {
                    m.recvs -= 1;
                    m.to_a -= 1;
                    a_recv.extend(chunks);
                }
            } else {
                let done = b
                    .reclaim_one(wc)
                    .ok_or("the peer's completion ended nothing")?;
                if done.kind == RequestKind::Send {
                    b_send.extend(done.chunks());
                } else {
                    m.to_b -= 1;
                    let c = done.into_chunk().ok_or("a receive without its chunk")?;
                    b.post_recv_one(RecvWr::new(0).sge(c))?;
                }
            }
        }
        ensure!(
            start.elapsed() < limit,
            "step {step}: completions did not arrive"
        );
    }
    Ok(())
}

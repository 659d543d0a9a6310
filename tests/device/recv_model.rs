//! Queue-owned receive buffers (`RecvBuffers`) driven by a seeded random
//! sequence of posts, sends, drains and a final RESET against a plain
//! model of the pool: after every step the pool's free and posted counts
//! and the QP's outstanding receives equal the model's, and every message
//! comes back, in order, with its bytes.

use std::collections::VecDeque;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, QpCaps, QpType};

use crate::common::{pair, Env, Rng, Test};

pub const TESTS: &[Test] = tests![recv_buffers_follow_the_model_through_random_steps,];

/// The model: how many buffers are free and posted, and the messages sent
/// and not yet taken (their first byte and length), in order.
#[derive(Default)]
struct Model {
    free: usize,
    posted: usize,
    inflight: VecDeque<(u8, usize)>,
}

const BUFS: usize = 6;
const STEPS: usize = 400;

fn recv_buffers_follow_the_model_through_random_steps(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let mut bufs = RecvBuffers::new(&p.pd, BUFS, 64)?;
    let mut srcs: Vec<Chunk> = p.pd.alloc_chunks(BUFS, 64, AccessFlags::LOCAL_WRITE)?;
    let mut m = Model {
        free: BUFS,
        ..Model::default()
    };
    let mut rng = Rng(0x005e_ed0f_b0f5);
    let (mut posts, mut posted_bufs, mut sends, mut drains, mut taken) = (0, 0, 0, 0, 0);
    for step in 0..STEPS {
        match rng.below(3) {
            0 => {
                let k = rng.below(4) as usize;
                let n = bufs.post_up_to(&mut p.b, k)?;
                ensure!(
                    n == m.free.min(k),
                    "step {step}: posted {n} of at most {k} with {} free",
                    m.free
                );
                m.free -= n;
                m.posted += n;
                posts += 1;
                posted_bufs += n;
            }
            // A send only where a posted buffer waits for it (RC would
            // otherwise retry on RNR).
            1 if m.posted > m.inflight.len() && !srcs.is_empty() => {
                let len = 1 + rng.below(64) as usize;
                let byte = step as u8;
                let mut c = srcs.pop().ok_or("no send chunk")?;
                c.as_mut_slice()[..len].fill(byte);
                p.a.post_send([SendWr::new(step as u64, SendOp::Send).sge_len(c, len)])?;
                m.inflight.push_back((byte, len));
                sends += 1;
            }
            _ => {
                taken += drain(&mut p, &mut bufs, &mut srcs, &mut m, step)?;
                drains += 1;
            }
        }
        ensure!(
            bufs.free() == m.free
                && bufs.posted() == m.posted
                && p.b.outstanding_recvs() == m.posted,
            "step {step}: pool {} free {} posted, QP {} receives; model {} free {} posted",
            bufs.free(),
            bufs.posted(),
            p.b.outstanding_recvs(),
            m.free,
            m.posted
        );
    }
    taken += drain(&mut p, &mut bufs, &mut srcs, &mut m, STEPS)?;
    // What is still posted comes back from a RESET, every buffer of it.
    for c in p.b.reset()? {
        bufs.give_back(c)
            .map_err(|c| format!("not the pool's: {c:?}"))?;
    }
    ensure!(
        bufs.free() == BUFS && bufs.posted() == 0 && m.inflight.is_empty(),
        "after RESET: {} free, {} posted",
        bufs.free(),
        bufs.posted()
    );
    eprintln!(
        "recv_model: {STEPS} steps (seeded): {posts} post calls ({posted_bufs} buffers), {sends} sends, \
         {drains} drains, {taken} messages taken in order; {} buffers back from the final RESET",
        m.posted
    );
    ensure!(taken == sends, "{taken} taken of {sends} sent");
    Ok(())
}

/// Polls until every message in flight was taken (and its send's chunk
/// came back), checking each one's bytes against the model; how many.
fn drain(
    p: &mut crate::common::Pair,
    bufs: &mut RecvBuffers,
    srcs: &mut Vec<Chunk>,
    m: &mut Model,
    step: usize,
) -> Result<usize, Failed> {
    let mut wcs = [rdma_verbs::WorkCompletion::default(); 16];
    let (start, limit) = (std::time::Instant::now(), crate::common::deadline());
    let mut taken = 0;
    while !m.inflight.is_empty() || srcs.len() < BUFS {
        for wc in p.cq.poll(&mut wcs)?.iter() {
            ensure!(wc.is_success(), "step {step}: {wc:?}");
            if wc.qp_num() == p.a.qp_num() {
                p.a.reclaim_chunks(wc, srcs);
                continue;
            }
            let (byte, len) = m
                .inflight
                .pop_front()
                .ok_or("a receive with no message in flight")?;
            match bufs.take(&mut p.b, wc) {
                Taken::Mine(msg) => ensure!(
                    msg.len() == len && msg.iter().all(|&b| b == byte),
                    "step {step}: received {} bytes {:?}, sent {len} of {byte}",
                    msg.len(),
                    &msg[..msg.len().min(4)]
                ),
                other => return Err(format!("step {step}: {other:?}").into()),
            }
            m.posted -= 1;
            m.free += 1;
            taken += 1;
        }
        ensure!(
            start.elapsed() < limit,
            "step {step}: completions did not arrive"
        );
    }
    Ok(taken)
}

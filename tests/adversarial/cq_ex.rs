//! Attacks on the extended CQ's poll batch, from safe code: a batch asked
//! for more after its end, ended both ways, round and round the ring; and
//! a batch dropped before its first `next`, whose completion is consumed
//! unseen (as documented), without losing the request's buffer for good.

use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::cq_ex::WithQpNum;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, CompletionQueueEx, ProtectionDomain, QpInitAttr, QpType,
    QueuePair,
};

use crate::common::{connect, deadline, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    cq_poll_past_its_end_calls_nothing_round_the_ring,
    cq_poll_dropped_before_next_loses_no_buffer,
];

fn chunks(pd: &ProtectionDomain, n: usize) -> Result<Vec<Chunk>, Failed> {
    Ok(pd.alloc_chunks(n, 32, AccessFlags::LOCAL_WRITE)?)
}

/// `a` on a small extended CQ (with qp_num), `b` on a basic one,
/// connected.
struct Rig<F: WithQpNum> {
    pd: ProtectionDomain,
    cq: CompletionQueueEx<F>,
    basic: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn rig(env: &Env, cqe: u32) -> Result<Rig<impl WithQpNum>, Failed> {
    let cq = env.ctx.create_cq_ex(cqe).qp_num().build()?;
    let basic = env.ctx.create_cq(64)?;
    let pd = env.ctx.alloc_pd()?;
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq()))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &basic, &basic))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    Ok(Rig {
        pd,
        cq,
        basic,
        a,
        b,
    })
}

impl<F: WithQpNum> Rig<F> {
    /// `a` sends `ids` (one 8-byte send each) to `b`, whose receives are
    /// reclaimed on the basic CQ.
    fn sends(&mut self, ids: std::ops::Range<u64>) -> Result<(), Failed> {
        let n = ids.end.saturating_sub(ids.start) as usize;
        let mut c = chunks(&self.pd, 2 * n)?;
        self.b.post_recv(
            c.drain(n..)
                .map(|c| RecvWr::new(0).sge(c))
                .collect::<Vec<_>>(),
        )?;
        self.a.post_send(
            ids.zip(c)
                .map(|(id, c)| SendWr::new(id, SendOp::Send).sge_len(c, 8))
                .collect::<Vec<_>>(),
        )?;
        for wc in poll_n(&self.basic, n)? {
            ensure!(self.b.reclaim(&wc, drop) == 1, "receive {wc:?}");
        }
        Ok(())
    }
}

/// One send at a time, three times round the CQ's ring: each batch yields
/// its completion, then is asked for more three times (`None`, the last
/// two calling nothing: on rxe the first `None` already ended the batch),
/// and is ended by `end` or by dropping it. Every completion comes back
/// once, in order; none is stale and none is left.
fn cq_poll_past_its_end_calls_nothing_round_the_ring(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env, 4)?;
    let rounds = u64::from(r.cq.capacity()).clamp(4, 64) * 3;
    let limit = deadline();
    for round in 0..rounds {
        r.sends(round..round + 1)?;
        let start = Instant::now();
        let mut batch = loop {
            if let Some(b) = r.cq.start_poll()? {
                break b;
            }
            ensure!(start.elapsed() < limit, "round {round}: no completion");
        };
        let wc = batch.next()?.ok_or("a batch without its completion")?;
        ensure!(
            wc.is_success() && wc.qp_num() == r.a.qp_num(),
            "round {round}: {wc:?}"
        );
        let mut ids = Vec::new();
        r.a.reclaim(&wc, |d| ids.push(d.wr_id));
        ensure!(ids == [round], "round {round}: reclaimed {ids:?}");
        for more in 0..3 {
            if let Some(wc) = batch.next()? {
                return Err(format!("round {round}, call {more} past the end: {wc:?}").into());
            }
        }
        if round % 2 == 0 {
            batch.end();
        } else {
            drop(batch);
        }
    }
    ensure!(r.cq.start_poll()?.is_none(), "a completion left over");
    ensure!(r.a.outstanding_sends() == 0, "sends outstanding");
    Ok(())
}

/// A batch dropped before its first `next`: `ibv_end_poll` consumes the
/// completion `ibv_start_poll` found, unseen (documented). Its request is
/// not lost: the next completion of the send queue ends it too (as an
/// earlier request, not the one signalled), and when no later one comes it
/// stays in the ledger (nothing says the device is done with its buffer)
/// until a RESET hands its chunk back.
fn cq_poll_dropped_before_next_loses_no_buffer(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env, 16)?;
    let limit = deadline();
    let start = Instant::now();
    let drop_first = |r: &mut Rig<_>| loop {
        if let Some(batch) = r.cq.start_poll()? {
            drop(batch);
            return Ok::<(), Failed>(());
        }
        ensure!(start.elapsed() < limit, "no completion");
    };
    // Three sends; the first one's completion is consumed unseen.
    r.sends(0..3)?;
    drop_first(&mut r)?;
    let mut ended = Vec::new();
    while ended.len() < 3 {
        if let Some(mut batch) = r.cq.start_poll()? {
            while let Some(wc) = batch.next()? {
                let before = ended.len();
                r.a.reclaim(&wc, |d| ended.push((d.wr_id, d.signaled)));
                ensure!(ended.len() > before, "{wc:?} ended nothing: {ended:?}");
            }
        }
        ensure!(start.elapsed() < limit, "only {ended:?}");
    }
    ensure!(
        ended == [(0, false), (1, true), (2, true)],
        "after the unseen one: {ended:?}"
    );
    ensure!(r.a.outstanding_sends() == 0, "sends outstanding");
    // The last send's completion consumed unseen: nothing later ends it.
    r.sends(3..4)?;
    drop_first(&mut r)?;
    ensure!(r.cq.start_poll()?.is_none(), "a completion left over");
    ensure!(
        r.a.outstanding_sends() == 1,
        "{} sends outstanding, not the unseen one",
        r.a.outstanding_sends()
    );
    let mut back = r.a.reset()?;
    ensure!(
        back.len() == 1 && back[0].wr_id == 3,
        "RESET handed back {back:?}"
    );
    let n = back.remove(0).chunks().count();
    ensure!(n == 1, "the unseen send's chunk: {n}");
    ensure!(
        r.a.outstanding_sends() == 0,
        "still outstanding after RESET"
    );
    Ok(())
}

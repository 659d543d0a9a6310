//! Futures dropped at their await points, then the completion or event
//! they were waiting for delivered to the next call: `AsyncCq::poll`
//! (timed out again and again, and dropped after its wakeup without being
//! polled), `AsyncCq::ready` and the stream's buffer, `QpCompletions::poll`,
//! and `AsyncEvents::next`.

use std::future::Future;
use std::pin::pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
use rdma_verbs::tokio::{AsyncCq, AsyncEvents, SharedCq};
use rdma_verbs::{AccessFlags, AsyncEvent, QpCaps, QpInitAttr, QpType, QueuePair, WorkCompletion};

use crate::common::{connect, Env, Test};

pub const TESTS: &[Test] = tests![
    async_cq_poll_timed_out_then_delivered,
    async_cq_poll_dropped_after_its_wakeup,
    async_cq_ready_and_stream_keep_what_they_polled,
    qp_completions_poll_timed_out_then_delivered,
    async_events_next_timed_out_then_delivered,
];

/// Two connected RC QPs on `cq`, with `n` receives posted on `b`.
fn pair_on(
    env: &Env,
    cq: &rdma_verbs::CompletionQueue,
) -> Result<(rdma_verbs::ProtectionDomain, QueuePair, QueuePair), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let attr = QpInitAttr::new(QpType::Rc, cq, cq).caps(QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    });
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr)?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    Ok((pd, a, b))
}

/// Posts `n` receives on `b` and `n` sends from `a` (wr_ids 1..=n).
fn send_n(
    pd: &rdma_verbs::ProtectionDomain,
    a: &mut QueuePair,
    b: &mut QueuePair,
    n: usize,
) -> Result<(), Failed> {
    let bufs = pd.alloc_chunks(2 * n, 64, AccessFlags::LOCAL_WRITE)?;
    let mut it = bufs.into_iter();
    let recvs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr::new(100 + i as u64).sge(it.next().unwrap()))
        .collect();
    b.post_recv(recvs)?;
    let sends: Vec<SendWr> = (0..n)
        .map(|i| SendWr::new(1 + i as u64, SendOp::Send).sge_len(it.next().unwrap(), 8))
        .collect();
    a.post_send(sends)?;
    Ok(())
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let waker = crate::noop_waker();
    let mut cx = TaskContext::from_waker(&waker);
    fut.poll(&mut cx)
}

/// Reclaims every completion of `wcs` on `a` or `b`, checking success;
/// returns the wr_ids.
fn reclaim(
    a: &mut QueuePair,
    b: &mut QueuePair,
    wcs: &[WorkCompletion],
) -> Result<Vec<u64>, Failed> {
    let mut ids = Vec::new();
    for wc in wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let done = if wc.qp_num() == a.qp_num() {
            a.reclaim_one(wc)
        } else {
            b.reclaim_one(wc)
        };
        ids.push(done.ok_or_else(|| format!("nothing for {wc:?}"))?.wr_id);
    }
    Ok(ids)
}

/// Collects completions from `cq` until `n` came (each call a fresh poll).
async fn collect(
    cq: &mut AsyncCq,
    a: &mut QueuePair,
    b: &mut QueuePair,
    n: usize,
) -> Result<Vec<u64>, Failed> {
    let mut ids = Vec::new();
    let mut wcs = [WorkCompletion::default(); 4];
    while ids.len() < n {
        let got = cq.poll(&mut wcs).await?;
        ids.extend(reclaim(a, b, got)?);
    }
    ensure!(
        ids.len() == n,
        "{} completions, not {n}: {ids:?}",
        ids.len()
    );
    ids.sort();
    Ok(ids)
}

fn async_cq_poll_timed_out_then_delivered(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let mut cq = AsyncCq::new(&env.ctx, 64)?;
        let (pd, mut a, mut b) = pair_on(env, cq.cq())?;
        for round in 0..3 {
            // Dropped at its await point, many times, with the CQ armed.
            for _ in 0..20 {
                let mut wcs = [WorkCompletion::default(); 4];
                let r = tokio::time::timeout(Duration::from_millis(2), cq.poll(&mut wcs)).await;
                ensure!(
                    r.is_err(),
                    "round {round}: a completion before anything was posted: {r:?}"
                );
            }
            send_n(&pd, &mut a, &mut b, 2)?;
            let ids = collect(&mut cq, &mut a, &mut b, 4).await?;
            ensure!(ids == [1, 2, 100, 101], "round {round}: {ids:?}");
        }
        Ok(())
    })
}

fn async_cq_poll_dropped_after_its_wakeup(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let mut cq = AsyncCq::new(&env.ctx, 64)?;
        let (pd, mut a, mut b) = pair_on(env, cq.cq())?;
        for round in 0..3 {
            {
                let mut wcs = [WorkCompletion::default(); 4];
                let mut fut = pin!(cq.poll(&mut wcs));
                ensure!(
                    poll_once(fut.as_mut()).is_pending(),
                    "round {round}: ready with nothing posted"
                );
                // The completions arrive and the channel becomes readable
                // (the reactor wakes the no-op waker); the future is then
                // dropped without being polled again.
                send_n(&pd, &mut a, &mut b, 1)?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let ids = collect(&mut cq, &mut a, &mut b, 2).await?;
            ensure!(ids == [1, 100], "round {round}: {ids:?}");
        }
        // The event left unread by the dropped futures does not confuse a
        // later wait: it still sleeps until the next completion.
        let mut wcs = [WorkCompletion::default(); 4];
        let r = tokio::time::timeout(Duration::from_millis(50), cq.poll(&mut wcs)).await;
        ensure!(r.is_err(), "a completion with nothing posted: {r:?}");
        send_n(&pd, &mut a, &mut b, 1)?;
        let ids = collect(&mut cq, &mut a, &mut b, 2).await?;
        ensure!(ids == [1, 100], "after the rounds: {ids:?}");
        Ok(())
    })
}

fn async_cq_ready_and_stream_keep_what_they_polled(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let mut cq = AsyncCq::new(&env.ctx, 64)?;
        let (pd, mut a, mut b) = pair_on(env, cq.cq())?;
        send_n(&pd, &mut a, &mut b, 4)?;
        // Wait until all 8 are in the CQ.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // `ready` polls into the AsyncCq's buffer; the future is done, then
        // one item comes from the stream, the rest from `poll` and `try_poll`.
        cq.ready().await?;
        let first = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut cq), cx)
        })
        .await
        .ok_or("the stream ended")??;
        let mut ids = reclaim(&mut a, &mut b, &[first])?;
        let mut wcs = [WorkCompletion::default(); 3];
        let got = cq.poll(&mut wcs).await?;
        ids.extend(reclaim(&mut a, &mut b, got)?);
        while ids.len() < 8 {
            let mut wcs = [WorkCompletion::default(); 16];
            let got = cq.try_poll(&mut wcs)?;
            if got.is_empty() {
                let r = tokio::time::timeout(crate::limit(), cq.ready()).await;
                ensure!(r.is_ok(), "{} of 8 completions", ids.len());
                continue;
            }
            ids.extend(reclaim(&mut a, &mut b, got)?);
        }
        ids.sort();
        ensure!(ids == [1, 2, 3, 4, 100, 101, 102, 103], "{ids:?}");
        // A `ready` dropped while waiting keeps nothing and loses nothing.
        {
            let mut fut = pin!(cq.ready());
            ensure!(
                poll_once(fut.as_mut()).is_pending(),
                "ready with nothing posted"
            );
        }
        send_n(&pd, &mut a, &mut b, 1)?;
        let ids = collect(&mut cq, &mut a, &mut b, 2).await?;
        ensure!(ids == [1, 100], "{ids:?}");
        Ok(())
    })
}

fn qp_completions_poll_timed_out_then_delivered(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let shared = SharedCq::new(&env.ctx, 64)?;
        let (pd, mut a, mut b) = pair_on(env, shared.cq())?;
        let (mut qa, mut qb) = (shared.register(&a)?, shared.register(&b)?);
        for round in 0..3 {
            for _ in 0..20 {
                let mut wcs = [WorkCompletion::default(); 4];
                let r = tokio::time::timeout(Duration::from_millis(2), qb.poll(&mut wcs)).await;
                ensure!(
                    r.is_err(),
                    "round {round}: a completion before anything was posted"
                );
            }
            {
                let mut wcs = [WorkCompletion::default(); 4];
                let mut fut = pin!(qa.poll(&mut wcs));
                ensure!(
                    poll_once(fut.as_mut()).is_pending(),
                    "round {round}: ready with nothing posted"
                );
                send_n(&pd, &mut a, &mut b, 2)?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let mut ids = Vec::new();
            let mut wcs = [WorkCompletion::default(); 4];
            while ids.len() < 2 {
                let got = qa.poll(&mut wcs).await?;
                ensure!(
                    got.iter().all(|wc| wc.qp_num() == a.qp_num()),
                    "another QP's completion routed to a"
                );
                ids.extend(reclaim(&mut a, &mut b, got)?);
            }
            while ids.len() < 4 {
                let got = qb.poll(&mut wcs).await?;
                ensure!(
                    got.iter().all(|wc| wc.qp_num() == b.qp_num()),
                    "another QP's completion routed to b"
                );
                ids.extend(reclaim(&mut a, &mut b, got)?);
            }
            ids.sort();
            ensure!(ids == [1, 2, 100, 101], "round {round}: {ids:?}");
        }
        ensure!(shared.unrouted() == 0, "unrouted completions");
        Ok(())
    })
}

fn async_events_next_timed_out_then_delivered(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let mut events = AsyncEvents::new(&env.ctx)?;
        for _ in 0..20 {
            let r = tokio::time::timeout(Duration::from_millis(2), events.next()).await;
            ensure!(r.is_err(), "an async event before any was caused: {r:?}");
        }
        // The SRQ lives until its event is read: ibv_destroy_srq waits for
        // the acknowledgement of every event reported for it.
        let held;
        {
            let mut fut = pin!(events.next());
            ensure!(
                poll_once(fut.as_mut()).is_pending(),
                "an event with none caused"
            );
            held = srq_limit_event(env)?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let r = match tokio::time::timeout(crate::limit(), events.next()).await {
            Ok(Ok(AsyncEvent::SrqLimitReached { srq_handle })) if srq_handle == held.0.handle() => {
                Ok(())
            }
            other => Err(format!("expected SrqLimitReached, got {other:?}").into()),
        };
        drop(held);
        r
    })
}

/// Causes an SRQ_LIMIT_REACHED event: an SRQ of 4 receives armed at 3,
/// two of them consumed by sends. Returns the SRQ and its QPs.
fn srq_limit_event(
    env: &Env,
) -> Result<(rdma_verbs::SharedReceiveQueue, QueuePair, QueuePair), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let srq = pd.create_srq(8, 1, 0)?;
    let mut sender = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mut receiver = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).srq(&srq))?;
    connect(env, &mut sender, &mut receiver, AccessFlags::empty())?;
    let mut bufs = pd.alloc_chunks(6, 64, AccessFlags::LOCAL_WRITE)?;
    let sends: Vec<_> = bufs.drain(4..).collect();
    srq.post_recv(
        bufs.into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )?;
    srq.arm_limit(3)?;
    sender.post_send(
        sends
            .into_iter()
            .map(|c| SendWr::new(0, SendOp::Send).sge_len(c, 8))
            .collect::<Vec<_>>(),
    )?;
    crate::common::poll_n(&cq, 4)?;
    Ok((srq, sender, receiver))
}

//! Typed refusals: constructors outside a runtime, a QP registered on the
//! wrong CQ or twice, a second `AsyncEvents` on one context, an empty
//! buffer; completions of a QP nobody registered are counted, not routed.

use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::tokio::{AsyncCq, AsyncEvents, SharedCq};
use rdma_verbs::{AccessFlags, Error, QpInitAttr, QpType, WorkCompletion};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    outside_a_runtime_is_a_typed_error,
    register_refuses_another_cqs_qp_and_a_second_time,
    a_second_async_events_is_a_typed_error,
    empty_buffers_and_unregistered_qps,
    waits_after_their_runtime_shut_down_fail_typed,
    dropped_qp_completions_leave_theirs_for_the_next,
];

fn outside_a_runtime_is_a_typed_error(env: &Env) -> Result<(), Failed> {
    // The other tests of this binary run in parallel and open and close
    // descriptors meanwhile, so the refusals run 50 times: were each to
    // leave a descriptor (a completion channel, the CM channel), the count
    // would rise by 50 or more.
    let fds = || std::fs::read_dir("/proc/self/fd").map(|d| d.count());
    let before = fds()?;
    for _ in 0..50 {
        let e = AsyncCq::new(&env.ctx, 16).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument { .. }),
            "AsyncCq::new: {e:?}"
        );
        let e = SharedCq::new(&env.ctx, 16).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument { .. }),
            "SharedCq::new: {e:?}"
        );
        let e = AsyncEvents::new(&env.ctx).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument { .. }),
            "AsyncEvents::new: {e:?}"
        );
        #[cfg(feature = "cm")]
        {
            let e = rdma_verbs::tokio::AsyncCmChannel::new().unwrap_err();
            ensure!(
                matches!(e, Error::InvalidArgument { .. }),
                "AsyncCmChannel::new: {e:?}"
            );
        }
    }
    let after = fds()?;
    ensure!(
        after < before + 25,
        "{before} descriptors before, {after} after 50 rounds of refusals"
    );
    Ok(())
}

fn register_refuses_another_cqs_qp_and_a_second_time(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let pd = env.ctx.alloc_pd()?;
        let shared = SharedCq::new(&env.ctx, 64)?;
        let other = env.ctx.create_cq(16)?;
        let foreign = pd.create_qp(&QpInitAttr::new(QpType::Rc, &other, &other))?;
        let e = shared.register(&foreign).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument { .. }),
            "another CQ's QP: {e:?}"
        );
        // Only the receive CQ shared: accepted.
        let half = pd.create_qp(&QpInitAttr::new(QpType::Rc, &other, shared.cq()))?;
        let h = shared.register(&half)?;
        let e = shared.register(&half).unwrap_err();
        ensure!(
            matches!(e, Error::InvalidArgument { .. }),
            "registered twice: {e:?}"
        );
        drop(h);
        let _again = shared.register(&half)?;
        Ok(())
    })
}

fn a_second_async_events_is_a_typed_error(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let first = AsyncEvents::new(&env.ctx)?;
        let e = AsyncEvents::new(&env.ctx).unwrap_err();
        ensure!(e.errno() == Some(libc::EEXIST), "second AsyncEvents: {e:?}");
        drop(first);
        let _again = AsyncEvents::new(&env.ctx)?;
        Ok(())
    })
}

fn empty_buffers_and_unregistered_qps(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let mut cq = AsyncCq::new(&env.ctx, 16)?;
        ensure!(
            cq.poll(&mut []).await?.is_empty(),
            "an empty buffer got completions"
        );
        let e = cq.set_busy_poll(Duration::from_secs(1)).unwrap_err();
        ensure!(matches!(e, Error::OutOfRange { .. }), "a 1 s spin: {e:?}");
        cq.set_busy_poll(Duration::from_millis(10))?;
        cq.set_busy_poll(Duration::ZERO)?;
        let shared = SharedCq::new(&env.ctx, 64)?;
        let pd = env.ctx.alloc_pd()?;
        let attr = QpInitAttr::new(QpType::Rc, shared.cq(), shared.cq());
        let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
        crate::common::connect(env, &mut a, &mut b, AccessFlags::empty())?;
        let mut qa = shared.register(&a)?;
        ensure!(
            qa.poll(&mut []).await?.is_empty(),
            "an empty buffer got completions"
        );
        // b is not registered: its receive completion is counted, a's send
        // completion is routed.
        let bufs = pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
        let mut it = bufs.into_iter();
        b.post_recv([rdma_verbs::qp::RecvWr::new(7).sge(it.next().unwrap())])?;
        a.post_send(
            [rdma_verbs::qp::SendWr::new(8, rdma_verbs::qp::SendOp::Send)
                .sge_len(it.next().unwrap(), 8)],
        )?;
        let mut wcs = [WorkCompletion::default(); 4];
        let got = qa.poll(&mut wcs).await?;
        ensure!(got.len() == 1 && got[0].qp_num() == a.qp_num(), "{got:?}");
        let start = std::time::Instant::now();
        while shared.unrouted() < 1 {
            ensure!(
                start.elapsed() < crate::limit(),
                "b's completion never counted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ensure!(shared.unrouted() == 1, "{} unrouted", shared.unrouted());
        Ok(())
    })
}

/// A `QpCompletions` dropped with completions queued (a task cancelled
/// mid-stream) loses none: they are counted in `unrouted()` until the QP
/// is registered again, whose first poll gets them, and the QP reclaims
/// every request. (Before, they were dropped with the route, uncounted,
/// and the requests stayed outstanding until RESET.)
fn dropped_qp_completions_leave_theirs_for_the_next(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit(), async {
        let shared = SharedCq::new(&env.ctx, 64)?;
        let pd = env.ctx.alloc_pd()?;
        let attr = QpInitAttr::new(QpType::Rc, shared.cq(), shared.cq());
        let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
        crate::common::connect(env, &mut a, &mut b, AccessFlags::empty())?;
        let first = shared.register(&a)?;
        // b's completions go to a registration of their own (kept).
        let _b_completions = shared.register(&b)?;
        let mut bufs = pd.alloc_chunks(6, 64, AccessFlags::LOCAL_WRITE)?;
        let recvs = bufs
            .drain(..3)
            .map(|c| rdma_verbs::qp::RecvWr::new(7).sge(c));
        b.post_recv(recvs.collect::<Vec<_>>())?;
        let sends = bufs.into_iter().enumerate().map(|(i, c)| {
            rdma_verbs::qp::SendWr::new(i as u64, rdma_verbs::qp::SendOp::Send).sge_len(c, 8)
        });
        a.post_send(sends.collect::<Vec<_>>())?;
        let start = std::time::Instant::now();
        while first.queued() < 3 {
            ensure!(
                start.elapsed() < crate::limit(),
                "{} routed",
                first.queued()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        ensure!(
            shared.unrouted() == 3,
            "{} unrouted after the drop",
            shared.unrouted()
        );
        let mut again = shared.register(&a)?;
        ensure!(
            shared.unrouted() == 0,
            "{} unrouted after registering again",
            shared.unrouted()
        );
        let mut wcs = [WorkCompletion::default(); 8];
        let got = again.poll(&mut wcs).await?;
        ensure!(
            got.len() == 3,
            "{} completions for the new registration",
            got.len()
        );
        for wc in got.iter() {
            ensure!(a.reclaim_one(wc).is_some(), "{wc:?} ended nothing");
        }
        ensure!(
            a.outstanding_sends() == 0,
            "{} sends outstanding",
            a.outstanding_sends()
        );
        Ok(())
    })
}

fn waits_after_their_runtime_shut_down_fail_typed(env: &Env) -> Result<(), Failed> {
    // Made on one runtime, which is then shut down: its reactor and the
    // SharedCq's routing task are gone.
    let first = crate::runtime()?;
    let (mut cq, shared, mut routed, _qp) = first.block_on(async {
        let cq = AsyncCq::new(&env.ctx, 16)?;
        let shared = SharedCq::new(&env.ctx, 16)?;
        let pd = env.ctx.alloc_pd()?;
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, shared.cq(), shared.cq()))?;
        let routed = shared.register(&qp)?;
        Ok::<_, Failed>((cq, shared, routed, qp))
    })?;
    drop(first);
    crate::run_for(crate::limit(), async {
        let mut wcs = [WorkCompletion::default(); 4];
        let e = routed.poll(&mut wcs).await.unwrap_err();
        ensure!(e.errno() == Some(libc::ECANCELED), "routed wait: {e:?}");
        let e = cq.poll(&mut wcs).await.unwrap_err();
        ensure!(matches!(e, Error::Verb { .. }), "AsyncCq wait: {e:?}");
        drop(shared);
        Ok(())
    })
}

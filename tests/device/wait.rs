//! `wait::Poller` over the crate's real descriptors: a completion channel
//! and (with `cm`) a CM event channel, waited on together in one thread;
//! each reported ready exactly when it has something to read.

use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
use rdma_verbs::wait::Poller;
use rdma_verbs::{AccessFlags, CompletionChannel, QpInitAttr, QpType};

use crate::common::{connect, deadline, Env, Test};

pub const TESTS: &[Test] = tests![poller_names_the_source_that_is_ready,];

fn poller_names_the_source_that_is_ready(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let comp = CompletionChannel::new(&env.ctx)?;
    comp.set_nonblocking(true)?;
    let cq = env.ctx.create_cq_with_channel(16, &comp, 0)?;
    let plain = env.ctx.create_cq(16)?;
    let attr = QpInitAttr::new(QpType::Rc, &cq, &plain);
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &plain, &plain))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    #[cfg(feature = "cm")]
    let cm = rdma_verbs::cm::EventChannel::new()?;
    let mut poller = Poller::new();
    let on_cq = poller.add(&comp);
    #[cfg(feature = "cm")]
    let on_cm = poller.add(&cm);
    // Nothing pending: the wait times out, empty.
    let ready: Vec<usize> = poller.wait(Some(Duration::from_millis(20)))?.collect();
    ensure!(ready.is_empty(), "ready with nothing pending: {ready:?}");
    // A send completes on the armed CQ: only its channel is ready.
    cq.req_notify(false)?;
    let mut bufs = pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    b.post_recv([RecvWr::new(1).sge(bufs.pop().unwrap())])?;
    a.post_send([SendWr::new(2, SendOp::Send).sge_len(bufs.pop().unwrap(), 8)])?;
    let ready: Vec<usize> = poller.wait(Some(deadline()))?.collect();
    ensure!(ready == [on_cq], "after a completion: {ready:?}");
    let ev = comp.get_event()?;
    ensure!(ev.is_for(&cq), "event for another CQ");
    let ready: Vec<usize> = poller.wait(Some(Duration::from_millis(20)))?.collect();
    ensure!(
        ready.is_empty(),
        "still ready after the event was read: {ready:?}"
    );
    #[cfg(feature = "cm")]
    {
        // A CM step: only the CM channel is ready.
        let id = cm.create_id(rdma_verbs::cm::PortSpace::Tcp)?;
        id.resolve_addr(None, "127.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
        let ready: Vec<usize> = poller.wait(Some(deadline()))?.collect();
        ensure!(ready == [on_cm], "after resolve_addr: {ready:?}");
        let ev = cm
            .try_get_event()?
            .ok_or("the CM channel was ready with no event")?;
        ensure!(ev.is_for(&id), "event for another id");
    }
    let mut wcs = [rdma_verbs::WorkCompletion::default(); 4];
    let got = cq.poll(&mut wcs)?;
    ensure!(got.len() == 1 && got[0].is_success(), "{got:?}");
    a.reclaim_one(&got[0]);
    Ok(())
}

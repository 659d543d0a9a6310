//! Completion events acknowledged in batches (`channel/acks.rs`): a CQ
//! dropped with events read and not yet acknowledged, and a CQ dropped
//! while another thread reads its event, must not hang `ibv_destroy_cq`
//! (which waits until every event it reported was acknowledged).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, CqEvent, QpInitAttr, QpType, QueuePair,
};

use crate::common::{connect, deadline, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    a_cq_dropped_with_events_unacknowledged_does_not_hang,
    a_cq_dropped_while_a_thread_reads_its_event_does_not_hang,
];

/// Two RC QPs connected to each other on one CQ of `channel`.
fn qps_on(
    env: &Env,
    channel: &CompletionChannel,
) -> Result<(CompletionQueue, QueuePair, QueuePair), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq_with_channel(16, channel, 0)?;
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    Ok((cq, a, b))
}

/// One zero-length send from `a` to `b` (into a receive without a
/// buffer), the CQ armed first.
fn ping(cq: &CompletionQueue, a: &mut QueuePair, b: &mut QueuePair, id: u64) -> Result<(), Failed> {
    b.post_recv_one(RecvWr::new(id))?;
    cq.req_notify(false)?;
    a.post_send([SendWr::new(id, SendOp::Send).inline(b"")])?;
    Ok(())
}

/// The next event of a non-blocking `channel`, waiting up to the deadline.
fn next_event(channel: &CompletionChannel) -> Result<CqEvent, Failed> {
    let end = Instant::now() + deadline();
    loop {
        match channel.get_event() {
            Ok(ev) => return Ok(ev),
            Err(e) if e.errno() == Some(libc::EAGAIN) && Instant::now() < end => {
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(format!("no completion event: {e}").into()),
        }
    }
}

/// Drops `parts` on a thread of its own; a drop still running at the
/// deadline is a hang.
fn drop_within_deadline<T: Send + 'static>(parts: T, what: &str) -> Result<(), Failed> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(parts);
        let _ = tx.send(());
    });
    rx.recv_timeout(deadline())
        .map_err(|_| format!("{what}: dropping the CQ hung (an event left unacknowledged)").into())
}

/// 150 events read (two batches of 64 acknowledged, 22 counted), then
/// the CQ is dropped: its destruction acknowledges the 22 first.
fn a_cq_dropped_with_events_unacknowledged_does_not_hang(env: &Env) -> Result<(), Failed> {
    let channel = CompletionChannel::new(&env.ctx)?;
    channel.set_nonblocking(true)?;
    let (cq, mut a, mut b) = qps_on(env, &channel)?;
    for round in 1..=150u64 {
        ping(&cq, &mut a, &mut b, round)?;
        let ev = next_event(&channel)?;
        ensure!(ev.is_for(&cq), "round {round}: an event of another CQ");
        for wc in poll_n(&cq, 2)? {
            ensure!(wc.is_success(), "round {round}: {wc:?}");
            ensure!(
                a.reclaim(&wc, |_| {}) + b.reclaim(&wc, |_| {}) == 1,
                "round {round}: {wc:?} ended nothing"
            );
        }
    }
    drop_within_deadline((a, b, cq), "after 150 events")
}

/// Twenty rounds in which one thread polls the channel for the event of a
/// send while another drops the QPs and the CQ, a little later each round:
/// whichever comes first, the drop ends.
fn a_cq_dropped_while_a_thread_reads_its_event_does_not_hang(env: &Env) -> Result<(), Failed> {
    let channel = CompletionChannel::new(&env.ctx)?;
    channel.set_nonblocking(true)?;
    let mut read = 0;
    for round in 0..20u64 {
        let (cq, mut a, mut b) = qps_on(env, &channel)?;
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (channel, stop) = (channel.clone(), Arc::clone(&stop));
            std::thread::spawn(move || loop {
                match channel.get_event() {
                    Ok(_) => return true,
                    Err(e) if e.errno() == Some(libc::EAGAIN) => {
                        if stop.load(Ordering::SeqCst) {
                            return false;
                        }
                        std::thread::yield_now();
                    }
                    Err(_) => return false,
                }
            })
        };
        ping(&cq, &mut a, &mut b, round + 1)?;
        std::thread::sleep(Duration::from_micros(round * 40));
        drop_within_deadline((a, b, cq), &format!("round {round}"))?;
        stop.store(true, Ordering::SeqCst);
        read += u32::from(reader.join().map_err(|_| "the reader panicked")?);
    }
    eprintln!("acks: the reader had the event before the drop in {read} of 20 rounds");
    Ok(())
}

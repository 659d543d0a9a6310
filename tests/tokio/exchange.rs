//! 64 QP pairs, one task per QP, each pair exchanging 1,000 messages
//! (ping and echo, checked for sequence): on one CQ shared by all 128 QPs
//! (`SharedCq`, completions routed to each QP's task), and on a CQ per QP
//! (`AsyncCq`). Nothing may be lost or delivered twice: every message
//! carries its QP's index and sequence number, and each end checks that
//! they come exactly in order; each end ends with all its chunks back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use libtest_mimic::Failed;
use rdma_verbs::qp::{RecvWr, SendOp, SendWr};
use rdma_verbs::tokio::{AsyncCq, QpCompletions, SharedCq};
use rdma_verbs::{AccessFlags, Chunk, QpCaps, QpInitAttr, QpType, QueuePair, WorkCompletion};

use crate::common::{connect, Env, Test};

pub const TESTS: &[Test] = tests![
    qps_64_on_one_shared_cq_1000_messages_each,
    qps_64_on_64_cqs_1000_messages_each,
    busy_poll_4_pairs_200_messages_each,
];

const PAIRS: usize = 64;
const MESSAGES: u32 = 1000;
/// Receives the echoing end keeps posted.
const SERVER_RECVS: usize = 4;

/// Where a QP's task waits for its completions.
pub enum Waits {
    Own(AsyncCq),
    Routed(QpCompletions),
}

impl Waits {
    pub async fn poll<'a>(
        &mut self,
        wcs: &'a mut [WorkCompletion],
    ) -> rdma_verbs::Result<&'a mut [WorkCompletion]> {
        match self {
            Waits::Own(cq) => cq.poll(wcs).await,
            Waits::Routed(q) => q.poll(wcs).await,
        }
    }
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 4,
        max_recv_wr: 8,
        ..QpCaps::default()
    }
}

fn qps_64_on_one_shared_cq_1000_messages_each(env: &Env) -> Result<(), Failed> {
    let done = Arc::new(AtomicU64::new(0));
    crate::run_progressing(crate::limit(), &done, async {
        let pd = env.ctx.alloc_pd()?;
        let shared = SharedCq::new(&env.ctx, 4096)?;
        let mut tasks = Vec::new();
        for k in 0..PAIRS {
            let attr = QpInitAttr::new(QpType::Rc, shared.cq(), shared.cq()).caps(caps());
            let mut a = pd.create_qp(&attr)?;
            let mut b = pd.create_qp(&attr)?;
            let (wa, wb) = (shared.register(&a)?, shared.register(&b)?);
            connect(env, &mut a, &mut b, AccessFlags::empty())?;
            let (ca, cb) = (chunks(&pd, 3)?, chunks(&pd, SERVER_RECVS)?);
            tasks.push(tokio::spawn(ping(
                k as u32,
                a,
                Waits::Routed(wa),
                ca,
                done.clone(),
            )));
            tasks.push(tokio::spawn(echo(k as u32, b, Waits::Routed(wb), cb)));
        }
        join(tasks).await?;
        ensure!(
            shared.unrouted() == 0,
            "{} completions for QPs nobody registered",
            shared.unrouted()
        );
        Ok(())
    })
}

fn qps_64_on_64_cqs_1000_messages_each(env: &Env) -> Result<(), Failed> {
    let done = Arc::new(AtomicU64::new(0));
    crate::run_progressing(crate::limit(), &done, async {
        let pd = env.ctx.alloc_pd()?;
        let mut tasks = Vec::new();
        for k in 0..PAIRS {
            let (qa, qb) = (AsyncCq::new(&env.ctx, 16)?, AsyncCq::new(&env.ctx, 16)?);
            let mut a =
                pd.create_qp(&QpInitAttr::new(QpType::Rc, qa.cq(), qa.cq()).caps(caps()))?;
            let mut b =
                pd.create_qp(&QpInitAttr::new(QpType::Rc, qb.cq(), qb.cq()).caps(caps()))?;
            connect(env, &mut a, &mut b, AccessFlags::empty())?;
            let (ca, cb) = (chunks(&pd, 3)?, chunks(&pd, SERVER_RECVS)?);
            tasks.push(tokio::spawn(ping(
                k as u32,
                a,
                Waits::Own(qa),
                ca,
                done.clone(),
            )));
            tasks.push(tokio::spawn(echo(k as u32, b, Waits::Own(qb), cb)));
        }
        join(tasks).await
    })
}

/// The adaptive busy-poll mode (spin up to 50 us before arming) on both
/// ends of 4 pairs: the same checks as the arming waits.
fn busy_poll_4_pairs_200_messages_each(env: &Env) -> Result<(), Failed> {
    crate::run_for(crate::limit() * 2, async {
        let pd = env.ctx.alloc_pd()?;
        let mut tasks = Vec::new();
        for k in 0..4 {
            let (mut qa, mut qb) = (AsyncCq::new(&env.ctx, 16)?, AsyncCq::new(&env.ctx, 16)?);
            qa.set_busy_poll(std::time::Duration::from_micros(50))?;
            qb.set_busy_poll(std::time::Duration::from_micros(50))?;
            let mut a =
                pd.create_qp(&QpInitAttr::new(QpType::Rc, qa.cq(), qa.cq()).caps(caps()))?;
            let mut b =
                pd.create_qp(&QpInitAttr::new(QpType::Rc, qb.cq(), qb.cq()).caps(caps()))?;
            connect(env, &mut a, &mut b, AccessFlags::empty())?;
            let (ca, cb) = (chunks(&pd, 3)?, chunks(&pd, SERVER_RECVS)?);
            let done = Arc::new(AtomicU64::new(0));
            tasks.push(tokio::spawn(ping_n(k, a, Waits::Own(qa), ca, 200, done)));
            tasks.push(tokio::spawn(echo_n(k, b, Waits::Own(qb), cb, 200)));
        }
        join(tasks).await
    })
}

fn chunks(pd: &rdma_verbs::ProtectionDomain, n: usize) -> Result<Vec<Chunk>, Failed> {
    Ok(pd.alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE)?)
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Result<String, String>>>) -> Result<(), Failed> {
    let mut failures = Vec::new();
    let n = tasks.len();
    for t in tasks {
        match t.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(format!("task panicked: {e}")),
        }
    }
    ensure!(
        failures.is_empty(),
        "{} of {n} tasks failed; first: {}",
        failures.len(),
        failures[0]
    );
    eprintln!("tokio: {n} tasks, each QP's messages in order, every chunk back");
    Ok(())
}

fn message(k: u32, i: u32) -> [u8; 8] {
    let mut m = [0u8; 8];
    m[..4].copy_from_slice(&k.to_le_bytes());
    m[4..].copy_from_slice(&i.to_le_bytes());
    m
}

/// The pinging end: sends message `i`, waits for its echo (and its send's
/// completion), checks it, counts it in `done`, repeats.
async fn ping(
    k: u32,
    qp: QueuePair,
    waits: Waits,
    bufs: Vec<Chunk>,
    done: Arc<AtomicU64>,
) -> Result<String, String> {
    ping_n(k, qp, waits, bufs, MESSAGES, done).await
}

async fn ping_n(
    k: u32,
    mut qp: QueuePair,
    mut waits: Waits,
    mut bufs: Vec<Chunk>,
    messages: u32,
    done: Arc<AtomicU64>,
) -> Result<String, String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("QP {k} (ping): {what}: {err}");
    let mut send = bufs.pop().ok_or("no send buffer")?;
    let held = bufs.len();
    qp.post_recv(
        bufs.into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )
    .map_err(|x| e("post_recv", &x))?;
    let mut wcs = [WorkCompletion::default(); 8];
    for i in 0..messages {
        send.as_mut_slice()[..8].copy_from_slice(&message(k, i));
        qp.post_send([SendWr::new(u64::from(i), SendOp::Send).sge_len(send, 8)])
            .map_err(|x| e("post_send", &x))?;
        let (mut sent, mut echoed) = (None, false);
        while sent.is_none() || !echoed {
            for wc in waits
                .poll(&mut wcs)
                .await
                .map_err(|x| e("poll", &x))?
                .iter()
            {
                if !wc.is_success() {
                    return Err(format!("QP {k} (ping): message {i}: {wc:?}"));
                }
                let done = qp.reclaim_one(wc).ok_or_else(|| {
                    format!("QP {k}: a completion nothing was waiting for: {wc:?}")
                })?;
                let kind = done.kind;
                let chunk = done
                    .into_chunk()
                    .ok_or("a request came back without its chunk")?;
                match kind {
                    rdma_verbs::qp::RequestKind::Send => sent = Some(chunk),
                    rdma_verbs::qp::RequestKind::Recv => {
                        let got = &chunk.as_slice()[..8];
                        if echoed || got != message(k, i) || wc.byte_len() != 8 {
                            return Err(format!(
                                "QP {k} (ping): message {i}: echo {got:?} (length {}), a second echo: {echoed}",
                                wc.byte_len()
                            ));
                        }
                        echoed = true;
                        qp.post_recv([RecvWr::new(0).sge(chunk)])
                            .map_err(|x| e("post_recv", &x))?;
                    }
                    other => return Err(format!("QP {k} (ping): a {other:?} completion")),
                }
            }
        }
        send = sent.ok_or("no send")?;
        done.fetch_add(1, Ordering::Relaxed);
    }
    if qp.outstanding_sends() != 0 || qp.outstanding_recvs() != held {
        return Err(format!(
            "QP {k} (ping): {} sends and {} receives outstanding at the end",
            qp.outstanding_sends(),
            qp.outstanding_recvs()
        ));
    }
    Ok(format!("QP {k}: {messages} echoes"))
}

/// The echoing end: each message received is checked for sequence and
/// sent back from the same chunk, which is posted as a receive again once
/// the send completes.
async fn echo(k: u32, qp: QueuePair, waits: Waits, bufs: Vec<Chunk>) -> Result<String, String> {
    echo_n(k, qp, waits, bufs, MESSAGES).await
}

async fn echo_n(
    k: u32,
    mut qp: QueuePair,
    mut waits: Waits,
    bufs: Vec<Chunk>,
    messages: u32,
) -> Result<String, String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("QP {k} (echo): {what}: {err}");
    let held = bufs.len();
    qp.post_recv(
        bufs.into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )
    .map_err(|x| e("post_recv", &x))?;
    let mut wcs = [WorkCompletion::default(); 8];
    let mut next = 0u32;
    while next < messages || qp.outstanding_sends() > 0 {
        for wc in waits
            .poll(&mut wcs)
            .await
            .map_err(|x| e("poll", &x))?
            .iter()
        {
            if !wc.is_success() {
                return Err(format!("QP {k} (echo): after {next} messages: {wc:?}"));
            }
            let done = qp
                .reclaim_one(wc)
                .ok_or_else(|| format!("QP {k}: a completion nothing was waiting for: {wc:?}"))?;
            let kind = done.kind;
            let chunk = done
                .into_chunk()
                .ok_or("a request came back without its chunk")?;
            match kind {
                rdma_verbs::qp::RequestKind::Recv => {
                    let got = &chunk.as_slice()[..8];
                    if got != message(k, next) {
                        return Err(format!(
                            "QP {k} (echo): expected message {next}, got {got:?}"
                        ));
                    }
                    next += 1;
                    qp.post_send([SendWr::new(0, SendOp::Send).sge_len(chunk, 8)])
                        .map_err(|x| e("post_send", &x))?;
                }
                rdma_verbs::qp::RequestKind::Send => {
                    qp.post_recv([RecvWr::new(0).sge(chunk)])
                        .map_err(|x| e("post_recv", &x))?;
                }
                other => return Err(format!("QP {k} (echo): a {other:?} completion")),
            }
        }
    }
    if qp.outstanding_recvs() != held {
        return Err(format!(
            "QP {k} (echo): {} receives outstanding at the end, not {held}",
            qp.outstanding_recvs()
        ));
    }
    Ok(format!("QP {k}: {messages} messages"))
}

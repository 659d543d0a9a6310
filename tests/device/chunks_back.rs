//! Every chunk lent to the device comes back: unsignalled sends with the
//! next signalled completion, every buffer flushed after ERR, what RESET
//! ends, a refused post whole, a run of requests in one call (the
//! operations themselves are `data.rs`s).

use super::data::chunks;
use crate::common::{pair, poll_n, Env, Test};
use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, Error, QpState, QpType, WcStatus, WorkCompletion};
use std::time::{Duration, Instant};

pub const TESTS: &[Test] = tests![
    unsignaled_sends_come_back_with_the_next_signaled,
    flush_after_err_hands_every_buffer_back,
    reset_hands_back_outstanding_requests,
    bad_posts_are_refused_with_buffers_returned,
    reclaim_chunks_hands_back_a_run_in_one_call,
];

fn unsignaled_sends_come_back_with_the_next_signaled(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, QpCaps::default(), AccessFlags::empty())?;
    let mut bufs = chunks(&p, 16, 64)?;
    let recvs: Vec<RecvWr> = bufs
        .drain(8..)
        .enumerate()
        .map(|(i, c)| RecvWr::new(100 + i as u64).sge(c))
        .collect();
    p.b.post_recv(recvs)?;
    let sends: Vec<SendWr> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let wr = SendWr::new(i as u64, SendOp::Send).sge(c);
            if i == 7 {
                wr
            } else {
                wr.unsignaled()
            }
        })
        .collect();
    p.a.post_send(sends)?; // eight requests, one call
    let wcs = poll_n(&p.cq, 9)?; // one send completion, eight receives
    std::thread::sleep(Duration::from_millis(50));
    let mut extra = [WorkCompletion::default(); 4];
    ensure!(
        p.cq.poll(&mut extra)?.is_empty(),
        "unsignalled sends produced completions"
    );
    let send_wc = wcs
        .iter()
        .find(|w| w.qp_num() == p.a.qp_num())
        .ok_or("no send completion")?;
    let mut ids = Vec::new();
    let n = p.a.reclaim(send_wc, |d| ids.push((d.wr_id, d.signaled)));
    ensure!(n == 8, "one signalled completion handed back {n} sends");
    ensure!(
        ids == (0..8).map(|i| (i, i == 7)).collect::<Vec<_>>(),
        "{ids:?}"
    );
    ensure!(p.a.outstanding_sends() == 0, "sends left outstanding");
    Ok(())
}

fn flush_after_err_hands_every_buffer_back(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, QpCaps::default(), AccessFlags::empty())?;
    // a: four sends the peer cannot take (no receives, RNR retry forever)
    // and ten receives; all stay outstanding until a goes to ERR.
    let mut bufs = chunks(&p, 14, 128)?;
    let recvs: Vec<RecvWr> = bufs
        .drain(4..)
        .enumerate()
        .map(|(i, c)| RecvWr::new(50 + i as u64).sge(c))
        .collect();
    p.a.post_recv(recvs)?;
    let sends: Vec<SendWr> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let wr = SendWr::new(i as u64, SendOp::Send).sge(c);
            if i % 2 == 0 {
                wr.unsignaled()
            } else {
                wr
            }
        })
        .collect();
    p.a.post_send(sends)?;
    std::thread::sleep(Duration::from_millis(100));
    let mut wcs = [WorkCompletion::default(); 4];
    ensure!(p.cq.poll(&mut wcs)?.is_empty(), "completions before ERR");
    p.a.modify(&QpAttr::new().state(QpState::Err))?;
    let mut back = 0;
    let mut flushed = 0;
    let start = Instant::now();
    let mut wcs = [WorkCompletion::default(); 16];
    while p.a.outstanding_sends() + p.a.outstanding_recvs() > 0 {
        for wc in p.cq.poll(&mut wcs)? {
            ensure!(
                wc.status() == Ok(WcStatus::WrFlushErr),
                "status {:?}",
                wc.status()
            );
            flushed += 1;
            back += p.a.reclaim(wc, |d| drop(d.into_chunk()));
        }
        ensure!(
            start.elapsed() < crate::common::deadline(),
            "{} requests never flushed",
            p.a.outstanding_sends() + p.a.outstanding_recvs()
        );
    }
    ensure!(back == 14, "{back} buffers handed back, expected 14");
    eprintln!("data: ERR flushed {flushed} completions, handing back all {back} buffers");
    Ok(())
}

fn reset_hands_back_outstanding_requests(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Rc, QpCaps::default(), AccessFlags::empty())?;
    let bufs = chunks(&p, 4, 64)?;
    p.b.post_recv(
        bufs.into_iter()
            .map(|c| RecvWr::new(1).sge(c))
            .collect::<Vec<_>>(),
    )?;
    ensure!(p.b.outstanding_recvs() == 4, "4 outstanding");
    p.b.modify(&QpAttr::new().state(QpState::Reset))?;
    ensure!(
        p.b.outstanding_recvs() == 0,
        "RESET kept {} receives",
        p.b.outstanding_recvs()
    );
    let back = p.b.take_released();
    ensure!(
        back.len() == 4 && back.iter().all(|d| !d.signaled),
        "RESET handed back {back:?}"
    );
    ensure!(p.b.take_released().is_empty(), "handed back twice");
    Ok(())
}

fn bad_posts_are_refused_with_buffers_returned(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_wr: 4,
        max_inline_data: 16,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let expect = |r: Result<(), PostError>,
                  returned: usize,
                  what: &str,
                  needle: &str|
     -> Result<(), Failed> {
        match r {
            Err(PostError {
                error: Error::InvalidArgument { reason, .. },
                posted: 0,
                returned: back,
            }) => {
                ensure!(
                    back.len() == returned,
                    "{what}: {} chunks returned, expected {returned}",
                    back.len()
                );
                ensure!(
                    reason.contains(needle),
                    "{what}: reason {reason:?} lacks {needle:?}"
                );
                Ok(())
            }
            other => Err(format!("{what}: {other:?}").into()),
        }
    };
    let pd = p.pd.clone();
    let c = |n| pd.alloc_chunks(n, 64, AccessFlags::LOCAL_WRITE);
    let caps = p.a.caps();
    let mut two = c(2)?;
    expect(
        p.a.post_send([SendWr::new(1, SendOp::Send)
            .sge(two.pop().unwrap())
            .sge(two.pop().unwrap())]),
        2,
        "two SGEs with max_send_sge 1",
        "max_send_sge",
    )?;
    let big = vec![0u8; caps.max_inline_data as usize + 1];
    expect(
        p.a.post_send([SendWr::new(1, SendOp::Send).inline(&big)]),
        0,
        "inline too large",
        "max_inline_data",
    )?;
    expect(
        p.a.post_send([SendWr::new(
            1,
            SendOp::FetchAdd {
                remote: RemoteAddr { addr: 0, rkey: 0 },
                add: 1,
            },
        )
        .sge(c(1)?.pop().unwrap())]),
        1,
        "atomic with a 64-byte entry",
        "8-byte",
    )?;
    let full: Vec<SendWr> = c(caps.max_send_wr as usize + 1)?
        .into_iter()
        .map(|x| SendWr::new(1, SendOp::Send).sge(x))
        .collect();
    // No room for them all: the typed refusal, with the counts.
    let n = caps.max_send_wr as usize + 1;
    match p.a.post_send(full) {
        Err(PostError {
            error:
                Error::QueueFull {
                    queue: "send queue",
                    requests,
                    room,
                    outstanding: 0,
                    ..
                },
            posted: 0,
            returned,
        }) if requests == n && room == n - 1 && returned.len() == n => {}
        other => return Err(format!("more than the send queue holds: {other:?}").into()),
    }
    let other_pd = env.ctx.alloc_pd()?;
    let foreign = other_pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .unwrap();
    expect(
        p.a.post_send([SendWr::new(1, SendOp::Send).sge(foreign)]),
        1,
        "chunk of another PD",
        "protection domain",
    )?;
    ensure!(p.a.outstanding_sends() == 0, "a refused post left requests");
    // UC cannot read.
    let mut uc = pair(env, QpType::Uc, QpCaps::default(), AccessFlags::empty())?;
    expect(
        uc.a.post_send([
            SendWr::new(1, SendOp::RdmaRead(RemoteAddr { addr: 0, rkey: 0 }))
                .sge(chunks(&uc, 1, 8)?.pop().unwrap()),
        ]),
        1,
        "RDMA read on UC",
        "UC",
    )?;
    let ud = pair(env, QpType::Ud, QpCaps::default(), AccessFlags::empty())?;
    let mut ud_a = ud.a;
    expect(
        ud_a.post_send([SendWr::new(1, SendOp::Send).inline(b"x")]),
        0,
        "UD send without a destination",
        "UD",
    )?;
    Ok(())
}

/// One signalled completion ends a run of unsignalled sends: reclaim_chunks
/// hands back all their chunks in order in one call, once.
fn reclaim_chunks_hands_back_a_run_in_one_call(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let mut bufs = chunks(&p, 10, 64)?;
    for (i, c) in bufs.iter_mut().enumerate() {
        c.as_mut_slice()[0] = i as u8;
    }
    let recvs: Vec<Chunk> = bufs.drain(5..).collect();
    p.b.post_recv(recvs.into_iter().map(|c| RecvWr::new(9).sge(c)))?;
    p.a.post_send(bufs.into_iter().enumerate().map(|(i, c)| {
        let wr = SendWr::new(i as u64, SendOp::Send).sge(c);
        if i == 4 {
            wr
        } else {
            wr.unsignaled()
        }
    }))?;
    let wcs = poll_n(&p.cq, 6)?;
    let send = wcs
        .iter()
        .find(|w| w.qp_num() == p.a.qp_num())
        .ok_or("no send completion")?;
    let mut back = Vec::new();
    let n = p.a.reclaim_chunks(send, &mut back);
    let order: Vec<u8> = back.iter().map(|c| c.as_slice()[0]).collect();
    ensure!(
        n == 5 && order == [0, 1, 2, 3, 4],
        "{n} ended, chunks {order:?}"
    );
    ensure!(p.a.reclaim_chunks(send, &mut back) == 0, "ended twice");
    ensure!(
        p.b.reclaim_chunks(send, &mut back) == 0,
        "another QP took a send completion"
    );
    let mut recvd = Vec::new();
    let bq = p.b.qp_num();
    for wc in wcs.iter().filter(|w| w.qp_num() == bq) {
        ensure!(p.b.reclaim_chunks(wc, &mut recvd) == 1, "{wc:?}");
    }
    let got: Vec<u8> = recvd.iter().map(|c| c.as_slice()[0]).collect();
    ensure!(got == [0, 1, 2, 3, 4], "received {got:?}");
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "left outstanding"
    );
    Ok(())
}

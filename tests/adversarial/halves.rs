//! Attacks on the send and receive halves of a split QP, from safe code:
//! two threads at full queue depth with every completion first offered to
//! the wrong half, halves leaked, dropped with requests posted, put back
//! together with requests outstanding, and iterators that panic in either
//! half's post. Nothing may be lost, taken twice or freed under the device.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, QpInitAttr, QpType, QueuePair, WcStatus, WorkCompletion,
};

use crate::common::{connect, deadline, poll_n, Env};

pub const TESTS: &[Test] = tests![
    two_threads_at_full_depth_borrowed,
    two_threads_at_full_depth_owned,
    leaked_owned_half_keeps_the_qp_alive,
    dropped_halves_free_chunks_only_after_the_qp,
    reunite_keeps_what_is_outstanding,
    panicking_iterators_leave_each_half_as_it_was,
];

use crate::common::Test;

/// Queue depth of the exchange QPs.
const DEPTH: u32 = 16;

/// Messages each way per QP: 600, wrapping the queue 37 times; 100 under
/// valgrind, where the threads take turns anyway and memcheck checks every
/// access however often it happens (600 took 3 minutes a test there).
fn messages() -> u64 {
    if crate::common::under_valgrind() {
        100
    } else {
        600
    }
}

/// Two RC QPs of depth [`DEPTH`] on one CQ, connected to each other.
fn rc_pair(
    env: &Env,
) -> Result<
    (
        rdma_verbs::ProtectionDomain,
        CompletionQueue,
        QueuePair,
        QueuePair,
    ),
    Failed,
> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(4 * DEPTH)?;
    let caps = QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        ..QpCaps::default()
    };
    let attr = QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps);
    let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    Ok((pd, cq, a, b))
}

/// The sending side of the exchange: each QP's send half sends
/// [`messages()`] numbered messages, keeping its queue full.
struct Sender<'a, 'q> {
    halves: Vec<&'a mut SendHalf<'q>>,
    free: Vec<Vec<Chunk>>,
    sent: Vec<u64>,
    done: u64,
}

/// The receiving side: each QP's receive half keeps [`DEPTH`] receives
/// posted and checks that every message number arrives exactly once (the
/// order they are taken in is not theirs: a completion the other side
/// polled comes later, through the channel).
struct Receiver<'a, 'q> {
    halves: Vec<&'a mut RecvHalf<'q>>,
    seen: Vec<Vec<bool>>,
    got: Vec<u64>,
}

/// Offers `wc` to each of `reclaim`'s halves in turn; whether one took it.
fn taken(n: usize, reclaim: impl FnMut(usize) -> bool) -> bool {
    (0..n).any(reclaim)
}

impl Sender<'_, '_> {
    fn post(&mut self) -> Result<(), Failed> {
        for i in 0..self.halves.len() {
            while self.sent[i] < messages() && (self.halves[i].outstanding() as u32) < DEPTH {
                let Some(mut c) = self.free[i].pop() else {
                    break;
                };
                c.as_mut_slice()[..8].copy_from_slice(&self.sent[i].to_le_bytes());
                let wr = SendWr::new(self.sent[i], SendOp::Send).sge_len(c, 8);
                self.halves[i].post_send([wr])?;
                self.sent[i] += 1;
            }
        }
        Ok(())
    }

    /// Takes `wc` if it is one of this side's: its chunk, and those of the
    /// earlier sends it ends (`take_released`), go back to the free list.
    /// A send completion that ends nothing was ended already by a later
    /// one the other side forwarded first (send queues complete in order):
    /// taken too, as nothing of it is left.
    fn take(&mut self, wc: &WorkCompletion) -> Result<bool, Failed> {
        let (halves, free) = (&mut self.halves, &mut self.free);
        let mut back = Vec::new();
        let took = taken(halves.len(), |i| match halves[i].reclaim_one(wc) {
            Some(c) => {
                back.push((i, c));
                back.extend(halves[i].take_released().into_iter().map(|e| (i, e)));
                true
            }
            None => false,
        });
        ensure!(wc.status() == Ok(WcStatus::Success), "send: {wc:?}");
        for (i, c) in back {
            free[i].extend(c.chunks());
            self.done += 1;
        }
        Ok(took || RequestKind::of_tag(wc.wr_id()) == Some(RequestKind::Send))
    }
}

impl Receiver<'_, '_> {
    fn take(&mut self, wc: &WorkCompletion) -> Result<bool, Failed> {
        for i in 0..self.halves.len() {
            if let Some(c) = self.halves[i].reclaim_one(wc) {
                ensure!(wc.status() == Ok(WcStatus::Success), "receive: {wc:?}");
                let chunk = c.into_chunk().ok_or("a receive without its chunk")?;
                let n = u64::from_le_bytes(chunk.as_slice()[..8].try_into()?);
                let seen = self.seen[i]
                    .get_mut(n as usize)
                    .ok_or("a number never sent")?;
                ensure!(!*seen, "QP {i}: message {n} arrived twice");
                *seen = true;
                self.got[i] += 1;
                self.halves[i].post_recv_one(RecvWr::new(n).sge(chunk))?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn finished(&self) -> bool {
        self.got.iter().all(|&n| n == messages())
    }
}

/// One side's loop: polls the shared CQ, offers each completion to its own
/// halves first (the other side's completions are refused there: the
/// wrong half), and forwards what they refuse to the other side, which
/// must take it. Ends when `finished`; returns how many it forwarded.
fn side(
    cq: &CompletionQueue,
    to_other: mpsc::Sender<WorkCompletion>,
    from_other: mpsc::Receiver<WorkCompletion>,
    mut step: impl FnMut() -> Result<(), Failed>,
    mut take: impl FnMut(&WorkCompletion) -> Result<bool, Failed>,
    progress: impl Fn() -> Option<String>,
    name: &str,
) -> Result<usize, Failed> {
    let (start, limit) = (Instant::now(), deadline() * 3);
    let mut forwarded = 0;
    let mut wcs = [WorkCompletion::default(); 8];
    while let Some(state) = progress() {
        step()?;
        let polled = cq.poll(&mut wcs)?;
        if polled.is_empty() {
            // Lets the other thread run (under valgrind, which runs one
            // thread at a time, a spinning one would keep it waiting).
            std::thread::yield_now();
        }
        for wc in polled.iter() {
            if !take(wc)? {
                forwarded += 1;
                // The other side may be done with nothing left to take.
                let _ = to_other.send(*wc);
            }
        }
        while let Ok(wc) = from_other.try_recv() {
            ensure!(take(&wc)?, "{name}: a completion neither half took: {wc:?}");
        }
        ensure!(
            start.elapsed() < limit,
            "{name}: not done after {limit:?}: {state}, {forwarded} forwarded"
        );
    }
    Ok(forwarded)
}

/// The exchange on two QPs `a` and `b` (each sends to the other), whose
/// halves are `tx` (sends of a, then b) and `rx` (receives of a, then b),
/// from two threads. Every message arrives once, in order; every send's
/// chunk comes back; completions of the other half are refused.
fn exchange(
    cq: &CompletionQueue,
    tx: [&mut SendHalf<'_>; 2],
    rx: [&mut RecvHalf<'_>; 2],
    chunks: [Vec<Chunk>; 4],
) -> Result<(), Failed> {
    let [sa, sb, ra, rb] = chunks;
    let (to_rx, from_tx) = mpsc::channel();
    let (to_tx, from_rx) = mpsc::channel();
    let [ta, tb] = tx;
    let [xa, xb] = rx;
    for (h, cs) in [(&mut *xa, ra), (&mut *xb, rb)] {
        let wrs: Vec<RecvWr> = cs.into_iter().map(|c| RecvWr::new(0).sge(c)).collect();
        h.post_recv(wrs)?;
        ensure!(
            h.outstanding() == DEPTH as usize,
            "{} receives posted",
            h.outstanding()
        );
    }
    std::thread::scope(|s| -> Result<(), Failed> {
        let sender = s.spawn(move || -> Result<(usize, u64), Failed> {
            let mut me = Sender {
                halves: vec![ta, tb],
                free: vec![sa, sb],
                sent: vec![0, 0],
                done: 0,
            };
            let me = std::cell::RefCell::new(&mut me);
            let forwarded = side(
                cq,
                to_rx,
                from_rx,
                || me.borrow_mut().post(),
                |wc| me.borrow_mut().take(wc),
                || {
                    let m = me.borrow();
                    let out: Vec<usize> = m.halves.iter().map(|h| h.outstanding()).collect();
                    let free: Vec<usize> = m.free.iter().map(Vec::len).collect();
                    (m.done < 2 * messages()).then(|| {
                        format!(
                            "{} done, sent {:?}, outstanding {out:?}, free {free:?}",
                            m.done, m.sent
                        )
                    })
                },
                "send side",
            )?;
            let m = me.borrow();
            ensure!(
                m.free.iter().all(|f| f.len() == DEPTH as usize),
                "send chunks lost"
            );
            ensure!(
                m.halves.iter().all(|h| h.outstanding() == 0),
                "sends outstanding"
            );
            Ok((forwarded, m.done))
        });
        let receiver = s.spawn(move || -> Result<usize, Failed> {
            let mut me = Receiver {
                halves: vec![xa, xb],
                seen: vec![vec![false; messages() as usize]; 2],
                got: vec![0, 0],
            };
            let me = std::cell::RefCell::new(&mut me);
            side(
                cq,
                to_tx,
                from_tx,
                || Ok(()),
                |wc| me.borrow_mut().take(wc),
                || {
                    let m = me.borrow();
                    (!m.finished()).then(|| format!("got {:?}", m.got))
                },
                "receive side",
            )
        });
        let sent = sender.join().map_err(|_| "the send thread panicked")?;
        let received = receiver.join().map_err(|_| "the receive thread panicked")?;
        let ((fwd_tx, done), fwd_rx) = match (sent, received) {
            (Ok(s), Ok(r)) => (s, r),
            (s, r) => {
                let (s, r) = (s.err(), r.err());
                return Err(format!("send side: {s:?}; receive side: {r:?}").into());
            }
        };
        println!(
            "halves: {done} sends and {} receives on 2 QPs from 2 threads; \
             {fwd_tx} + {fwd_rx} completions refused by the wrong half, then taken by the right one",
            2 * messages()
        );
        Ok(())
    })
}

fn chunks(pd: &rdma_verbs::ProtectionDomain) -> Result<[Vec<Chunk>; 4], Failed> {
    let mut all = pd.alloc_chunks(4 * DEPTH as usize, 64, AccessFlags::LOCAL_WRITE)?;
    let mut take = || all.split_off(all.len() - DEPTH as usize);
    Ok([take(), take(), take(), take()])
}

/// Both QPs split with `split` (scoped threads); after the exchange the
/// QPs are whole, with exactly their receives outstanding, and a RESET
/// hands every one back.
fn two_threads_at_full_depth_borrowed(env: &Env) -> Result<(), Failed> {
    let (pd, cq, mut a, mut b) = rc_pair(env)?;
    let cs = chunks(&pd)?;
    {
        let (mut ta, mut xa) = a.split();
        let (mut tb, mut xb) = b.split();
        exchange(&cq, [&mut ta, &mut tb], [&mut xa, &mut xb], cs)?;
    }
    for qp in [&mut a, &mut b] {
        ensure!(
            qp.outstanding_sends() == 0 && qp.outstanding_recvs() == DEPTH as usize,
            "failed: {}",
            stringify!(qp.outstanding_sends() == 0 && qp.outstanding_recvs() == DEPTH as usize)
        );
        let back = qp.reset()?;
        ensure!(back.len() == DEPTH as usize, "{} back at RESET", back.len());
    }
    Ok(())
}

/// The same with `into_split` (owned halves), then `reunite`.
fn two_threads_at_full_depth_owned(env: &Env) -> Result<(), Failed> {
    let (pd, cq, a, b) = rc_pair(env)?;
    let cs = chunks(&pd)?;
    let (mut ta, mut xa) = a.into_split();
    let (mut tb, mut xb) = b.into_split();
    exchange(
        &cq,
        [&mut ta.half(), &mut tb.half()],
        [&mut xa.half(), &mut xb.half()],
        cs,
    )?;
    // Mixed up: refused, both halves back unchanged.
    let e = match ta.reunite(xb) {
        Err(e) => e,
        Ok(_) => return Err("halves of two QPs were reunited".into()),
    };
    ensure!(e.to_string().contains("not of one QP"), "{e}");
    let (ta, xb) = (e.send, e.recv);
    for (t, x) in [(ta, xa), (tb, xb)] {
        let mut qp = x.reunite(t)?;
        ensure!(
            qp.outstanding_sends() == 0 && qp.outstanding_recvs() == DEPTH as usize,
            "failed: {}",
            stringify!(qp.outstanding_sends() == 0 && qp.outstanding_recvs() == DEPTH as usize)
        );
        let back = qp.reset()?;
        ensure!(back.len() == DEPTH as usize, "{} back at RESET", back.len());
    }
    Ok(())
}

/// A leaked (`mem::forget`) owned send half keeps the QP and its receive
/// half's parked receives alive: the peer's sends still land in them. (A
/// borrowed half has no `Drop`: forgetting it is dropping it.)
fn leaked_owned_half_keeps_the_qp_alive(env: &Env) -> Result<(), Failed> {
    let (pd, cq, a, mut b) = rc_pair(env)?;
    let (tx, mut rx) = a.into_split();
    let c = pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    let mut c = c.into_iter();
    rx.half()
        .post_recv([RecvWr::new(7).sge(c.next().ok_or("chunk")?)])?;
    std::mem::forget(tx);
    drop(rx);
    b.post_send([SendWr::new(1, SendOp::Send).sge_len(c.next().ok_or("chunk")?, 8)])?;
    let wcs = poll_n(&cq, 2)?;
    ensure!(
        wcs.iter().all(|w| w.status() == Ok(WcStatus::Success)),
        "the QP of a leaked half was destroyed under its peer: {wcs:?}"
    );
    Ok(())
}

/// Owned halves dropped with sends and receives posted: the completions
/// still come, end nothing on the wrong half, and every chunk of an owned
/// region comes back only once both halves are gone (the QP destroyed).
fn dropped_halves_free_chunks_only_after_the_qp(env: &Env) -> Result<(), Failed> {
    let (pd, cq, a, mut b) = rc_pair(env)?;
    let mr = pd
        .register_owned(vec![0u8; 4 * 64], AccessFlags::LOCAL_WRITE)
        .map_err(|r| r.to_string())?;
    let (region, mut cs) = mr.split(64).map_err(|r| r.to_string())?;
    let (mut tx, mut rx) = a.into_split();
    rx.half()
        .post_recv([RecvWr::new(1).sge(cs.pop().ok_or("chunk")?)])?;
    b.post_recv([RecvWr::new(2).sge(cs.pop().ok_or("chunk")?)])?;
    tx.half()
        .post_send([SendWr::new(3, SendOp::Send).sge_len(cs.pop().ok_or("chunk")?, 8)])?;
    drop(tx);
    let wcs = poll_n(&cq, 2)?;
    let region = region
        .into_inner()
        .err()
        .ok_or("the region was handed back with a send outstanding")?;
    let mut region = region.into_value();
    for wc in &wcs {
        ensure!(
            rx.half().reclaim_one(wc).is_none(),
            "the receive half took a send completion"
        );
        ensure!(
            b.reclaim(wc, |_| {}) <= 1,
            "failed: {}",
            stringify!(b.reclaim(wc, |_| {}) <= 1)
        );
    }
    drop(rx);
    drop(b);
    drop(cs);
    // Every chunk is back: the QP was destroyed, then its queues dropped.
    let start = Instant::now();
    loop {
        match region.into_inner() {
            Ok(buf) => {
                ensure!(
                    buf.len() == 4 * 64,
                    "failed: {}",
                    stringify!(buf.len() == 4 * 64)
                );
                return Ok(());
            }
            Err(r) if start.elapsed() < deadline() => region = r.into_value(),
            Err(r) => return Err(format!("chunks still out after both halves went: {r}").into()),
        }
    }
}

/// `reunite` with requests of both halves outstanding: the whole QP has
/// them, reclaims their completions and hands the rest back at RESET; a
/// completion reclaimed through a half before is not reclaimed again.
fn reunite_keeps_what_is_outstanding(env: &Env) -> Result<(), Failed> {
    let (pd, cq, a, mut b) = rc_pair(env)?;
    let mut cs = pd.alloc_chunks(8, 64, AccessFlags::LOCAL_WRITE)?;
    let (mut tx, mut rx) = a.into_split();
    let recvs: Vec<RecvWr> = cs.drain(..3).map(|c| RecvWr::new(10).sge(c)).collect();
    rx.half().post_recv(recvs)?;
    b.post_recv([RecvWr::new(20).sge(cs.pop().ok_or("chunk")?)])?;
    let sends = cs
        .drain(..2)
        .map(|c| SendWr::new(30, SendOp::Send).sge_len(c, 8).unsignaled());
    tx.half().post_send(sends.collect::<Vec<_>>())?;
    ensure!(
        tx.half().outstanding() == 2 && rx.half().outstanding() == 3,
        "failed: {}",
        stringify!(tx.half().outstanding() == 2 && rx.half().outstanding() == 3)
    );
    let mut qp = tx.reunite(rx)?;
    ensure!(
        qp.outstanding_sends() == 2 && qp.outstanding_recvs() == 3,
        "failed: {}",
        stringify!(qp.outstanding_sends() == 2 && qp.outstanding_recvs() == 3)
    );
    // The peer's one receive takes the first send; nothing signals the
    // sends, so they come back at RESET with the unused receives.
    let wc = poll_n(&cq, 1)?[0];
    ensure!(b.reclaim_one(&wc).is_some(), "{wc:?}");
    ensure!(
        qp.reclaim_one(&wc).is_none(),
        "the peer's completion ended something here"
    );
    let back = qp.reset()?;
    ensure!(back.len() == 5, "{} requests back at RESET", back.len());
    ensure!(
        qp.outstanding_sends() == 0 && qp.outstanding_recvs() == 0,
        "failed: {}",
        stringify!(qp.outstanding_sends() == 0 && qp.outstanding_recvs() == 0)
    );
    Ok(())
}

/// A caller's iterator that panics halfway through a half's post: the
/// requests it yielded are taken back out (none reached the device), and
/// each half posts normally afterwards; the other half is untouched.
fn panicking_iterators_leave_each_half_as_it_was(env: &Env) -> Result<(), Failed> {
    let (pd, cq, mut a, mut b) = rc_pair(env)?;
    let mut cs: VecDeque<Chunk> = pd.alloc_chunks(8, 64, AccessFlags::LOCAL_WRITE)?.into();
    let mut next = || cs.pop_front().ok_or("chunk");
    b.post_recv([RecvWr::new(1).sge(next()?)])?;
    {
        let (mut tx, mut rx) = a.split();
        ensure!(
            rx.outstanding() == 0 && rx.state() == rdma_verbs::QpState::Rts,
            "a fresh receive half: {} outstanding, {:?}",
            rx.outstanding(),
            rx.state()
        );
        let (s1, s2) = (next()?, next()?);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut n = 0;
            let it = [s1, s2].into_iter().map(|c| {
                n += 1;
                if n == 2 {
                    panic!("the caller's iterator panics");
                }
                SendWr::new(n, SendOp::Send).sge_len(c, 8)
            });
            tx.post_send(it)
        }));
        ensure!(r.is_err(), "the iterator did not panic");
        ensure!(
            tx.outstanding() == 0,
            "{} sends left by a panic",
            tx.outstanding()
        );
        let (r1, r2) = (next()?, next()?);
        let r = catch_unwind(AssertUnwindSafe(|| {
            let it = [r1, r2].into_iter().enumerate().map(|(i, c)| {
                if i == 1 {
                    panic!("the caller's iterator panics");
                }
                RecvWr::new(i as u64).sge(c)
            });
            rx.post_recv(it)
        }));
        ensure!(r.is_err(), "the iterator did not panic");
        ensure!(
            rx.outstanding() == 0,
            "{} receives left by a panic",
            rx.outstanding()
        );
        rx.post_recv([RecvWr::new(5).sge(next()?)])?;
        tx.post_send([SendWr::new(6, SendOp::Send).sge_len(next()?, 8)])?;
        let wcs = poll_n(&cq, 2)?;
        let mine: usize = wcs
            .iter()
            .map(|wc| usize::from(tx.reclaim_one(wc).is_some()))
            .sum();
        ensure!(mine == 1, "the send half took {mine} of {wcs:?}");
        ensure!(
            rx.outstanding() == 1 && tx.outstanding() == 0,
            "failed: {}",
            stringify!(rx.outstanding() == 1 && tx.outstanding() == 0)
        );
    }
    ensure!(a.state() == rdma_verbs::QpState::Rts, "{:?}", a.state());
    Ok(())
}

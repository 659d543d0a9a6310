//! Posting and polling allocate nothing on the heap in steady state.
//!
//! A counting global allocator counts the allocations made by the test's
//! own thread; after a warm-up (in which chains of 16 give the QP its
//! scratch for requests past the eighth), a
//! thousand ping-pong rounds of post_recv + post_send + poll + reclaim, and
//! a thousand chains of four sends, must make none (a hundred of each under
//! valgrind: `common::under_valgrind`). The same holds for an
//! extended QP's batch (start_batch, post, complete) in place of post_send;
//! an aborted batch makes exactly one: the `Vec` that `abort` returns.
//! Send templates (`post_template_one`, `post_template`) make none either,
//! once the QP has its pin of the template (the first post).

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::{
    AckTimeout, AddressVector, ConnectOptions, GlobalRoute, InitToRtr, MinRnrTimer, Psn, Qp, Rc,
    RecvWr, ResetToInit, RetryCount, RnrRetry, RtrToRts, SendOp, SendOpsFlags, SendWr,
};
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, ProtectionDomain, QpCaps, QpInitAttr, QpType, QueuePair,
    WorkCompletion,
};

use common::{Env, Test};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the
// only addition is bumping a thread-local counter, which does not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

const TESTS: &[Test] = tests![
    steady_state_posting_and_polling_allocate_nothing,
    a_successful_modify_allocates_nothing,
    steady_state_batches_allocate_nothing,
    steady_state_templates_allocate_nothing,
    steady_state_post_recv_one_allocates_nothing,
    steady_state_recv_buffers_allocate_nothing,
];

fn main() -> std::process::ExitCode {
    // rxe before rdma-core 34 has no extended QPs (see `common::Need`).
    common::run_needing(
        "alloc",
        TESTS,
        &[(
            "steady_state_batches_allocate_nothing",
            common::Need::ExtendedQp,
        )],
    )
}

/// Measured rounds per loop: 1000, or 100 under valgrind, where memcheck
/// checks each access however often it runs. Read before any measuring
/// starts (reading the environment allocates).
fn rounds() -> usize {
    if common::under_valgrind() {
        100
    } else {
        1000
    }
}

/// The heap allocations of `ones` calls of `round(1)` and of `fours`
/// calls of `round(4)`, each after 20 warm-up rounds of both.
fn allocations_in_rounds(
    mut round: impl FnMut(u64) -> Result<(), Failed>,
    ones: usize,
    fours: usize,
) -> Result<(u64, u64), Failed> {
    for _ in 0..20 {
        round(1)?;
        round(4)?;
    }
    let before = allocations();
    for _ in 0..ones {
        round(1)?;
    }
    let one = allocations() - before;
    let before = allocations();
    for _ in 0..fours {
        round(4)?;
    }
    Ok((one, allocations() - before))
}

/// A PD, a CQ of 64 and two RC QPs (16/16) on it, connected to each
/// other with `access` for the peer.
fn connected_pair(
    env: &Env,
    access: AccessFlags,
) -> Result<(ProtectionDomain, CompletionQueue, QueuePair, QueuePair), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    common::connect(env, &mut a, &mut b, access)?;
    Ok((pd, cq, a, b))
}

fn steady_state_posting_and_polling_allocate_nothing(env: &Env) -> Result<(), Failed> {
    let (pd, cq, mut a, mut b) = connected_pair(env, AccessFlags::empty())?;

    // Fixed homes for the chunks between rounds: no Vec pushes.
    let mut bufs = pd
        .alloc_chunks(32, 256, AccessFlags::LOCAL_WRITE)?
        .into_iter();
    let mut send: [Option<Chunk>; 16] = std::array::from_fn(|_| bufs.next());
    let mut recv: [Option<Chunk>; 16] = std::array::from_fn(|_| bufs.next());
    let mut wcs = [WorkCompletion::default(); 8];
    // Read once: reading the environment allocates.
    let deadline = common::deadline();

    let mut round = |chain: usize| -> Result<(), Failed> {
        let mut r = recv.iter_mut();
        let mut next_recv =
            || RecvWr::new(1).sge(r.next().and_then(Option::take).expect("a receive chunk"));
        match chain {
            1 => b.post_recv([next_recv()])?,
            4 => b.post_recv([next_recv(), next_recv(), next_recv(), next_recv()])?,
            n => b.post_recv((0..n).map(|_| next_recv()))?,
        }
        let mut s = send.iter_mut();
        let mut next_send = |signaled: bool| {
            let wr = SendWr::new(2, SendOp::Send)
                .sge_len(s.next().and_then(Option::take).expect("a send chunk"), 64);
            if signaled {
                wr
            } else {
                wr.unsignaled()
            }
        };
        match chain {
            1 => a.post_send([next_send(true)])?,
            4 => a.post_send([
                next_send(false),
                next_send(false),
                next_send(false),
                next_send(true),
            ])?,
            n => a.post_send((0..n).map(|i| next_send(i + 1 == n)))?,
        }
        let want = 1 + chain; // one signalled send completion, `chain` receives
        let mut seen = 0;
        let start = Instant::now();
        while seen < want {
            for wc in cq.poll(&mut wcs)? {
                if !wc.is_success() {
                    return Err("a completion failed".into());
                }
                seen += 1;
                let home = if wc.qp_num() == a.qp_num() {
                    &mut send
                } else {
                    &mut recv
                };
                let mut put = |c: Chunk| {
                    if let Some(slot) = home.iter_mut().find(|s| s.is_none()) {
                        *slot = Some(c);
                    }
                };
                a.reclaim(wc, |d| d.chunks().for_each(&mut put));
                b.reclaim(wc, |d| d.chunks().for_each(&mut put));
            }
            if start.elapsed() > deadline {
                return Err("completions did not arrive".into());
            }
        }
        Ok(())
    };

    // The counter does see allocations on this thread.
    let before = allocations();
    let probe = std::hint::black_box(vec![1u8; 16]);
    ensure!(
        allocations() > before,
        "the counting allocator counted nothing"
    );
    drop(probe);

    // A fresh QP's first posts: chains of up to eight requests are built
    // on the stack.
    let before = allocations();
    round(1)?;
    round(4)?;
    let first = allocations() - before;
    eprintln!("alloc: {first} heap allocations in a fresh QP's first posts (chains of 1 and 4)");
    ensure!(
        first == 0,
        "{first} allocations in a fresh QP's first posts (chains of 1 and 4)"
    );

    let n = rounds();
    for _ in 0..20 {
        round(1)?;
        round(4)?;
        round(16)?;
    }
    let before = allocations();
    for _ in 0..n {
        round(1)?;
    }
    let single = allocations() - before;
    let before = allocations();
    for _ in 0..n {
        round(4)?;
    }
    let chained = allocations() - before;
    let before = allocations();
    for _ in 0..n {
        round(16)?;
    }
    let full = allocations() - before;
    eprintln!(
        "alloc: {single} heap allocations in {n} single rounds, {chained} in {n} chains of 4, {full} in {n} chains of 16 = the queue depth (post_recv, post_send, poll, reclaim)"
    );
    ensure!(
        single == 0,
        "{single} allocations in steady-state single posts"
    );
    ensure!(chained == 0, "{chained} allocations in steady-state chains");
    ensure!(
        full == 0,
        "{full} allocations in steady-state chains of the queue depth"
    );
    Ok(())
}

/// RESET -> INIT -> RTR -> RTS through the typed builders, once the
/// context's port cache is warm (the first setup fills it): the checks and
/// the three `ibv_modify_qp` calls make no heap allocation. Creating and
/// destroying the QP are not counted.
fn a_successful_modify_allocates_nothing(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let peer = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
    let o = ConnectOptions {
        port: env.port,
        ..Default::default()
    };
    let ep = peer.local_endpoint(&o, Psn::new(0)?)?;
    let mut av = AddressVector::new(env.port).dlid(ep.lid);
    if !ep.gid.is_zero() {
        let index = env
            .ctx
            .gid_table()?
            .iter()
            .find(|e| e.gid == ep.gid && e.port == u32::from(env.port))
            .map(|e| e.index as u8)
            .ok_or("the endpoint's GID is not in the table")?;
        av = av.global(GlobalRoute::new(ep.gid, index));
    }
    let mtu = env.ctx.query_port(env.port)?.active_mtu;
    let (psn, rnr, timeout, retry) = (
        Psn::new(0)?,
        MinRnrTimer::new(12)?,
        AckTimeout::new(14)?,
        RetryCount::new(7)?,
    );
    let peer_qpn = peer.qp_num();
    let mut counted = Vec::with_capacity(8);
    for round in 0..8 {
        let mut qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
        let before = allocations();
        qp.apply(ResetToInit::<Rc>::new(0, env.port, AccessFlags::empty()))?;
        qp.apply(InitToRtr::<Rc>::new(av, mtu, peer_qpn, psn, 1, rnr))?;
        qp.apply(RtrToRts::<Rc>::new(
            timeout,
            retry,
            RnrRetry::INFINITE,
            psn,
            1,
        ))?;
        let n = allocations() - before;
        // The first round may fill the cache (its one-time allocations).
        if round > 0 {
            counted.push(n);
        }
        qp.into_dynamic().close()?;
    }
    eprintln!("alloc: heap allocations per RESET->INIT->RTR->RTS on a warm cache: {counted:?}");
    ensure!(
        counted.iter().all(|&n| n == 0),
        "a successful modify allocated: {counted:?}"
    );
    Ok(())
}

/// The sender (extended), the receiver (basic), their CQ, and fixed homes
/// for the chunks between rounds (no Vec pushes).
struct BatchRig {
    a: rdma_verbs::QueuePair,
    b: rdma_verbs::QueuePair,
    cq: rdma_verbs::CompletionQueue,
    send: [Option<Chunk>; 16],
    recv: [Option<Chunk>; 16],
    wcs: [WorkCompletion; 8],
    deadline: std::time::Duration,
}

fn put(home: &mut [Option<Chunk>], c: Chunk) {
    if let Some(slot) = home.iter_mut().find(|s| s.is_none()) {
        *slot = Some(c);
    }
}

fn take(home: &mut [Option<Chunk>]) -> Chunk {
    home.iter_mut()
        .find_map(Option::take)
        .expect("a free chunk")
}

impl BatchRig {
    /// One round: `n` receives on b, one batch of `n` sends on a (the last
    /// signalled), and every completion polled and reclaimed.
    fn round(&mut self, n: usize) -> Result<(), Failed> {
        let Self {
            a,
            b,
            cq,
            send,
            recv,
            wcs,
            deadline,
        } = self;
        let mut r = 0..n;
        b.post_recv(std::iter::from_fn(|| {
            r.next().map(|_| RecvWr::new(1).sge(take(recv)))
        }))?;
        let mut batch = a.start_batch()?;
        for i in 0..n {
            let wr = SendWr::new(2, SendOp::Send).sge_len(take(send), 64);
            batch.post(if i + 1 == n { wr } else { wr.unsignaled() })?;
        }
        batch.complete()?;
        let want = 1 + n; // one signalled send completion, `n` receives
        let mut seen = 0;
        let start = Instant::now();
        while seen < want {
            for wc in cq.poll(wcs)? {
                if !wc.is_success() {
                    return Err("a completion failed".into());
                }
                seen += 1;
                if wc.qp_num() == a.qp_num() {
                    a.reclaim(wc, |d| d.chunks().for_each(|c| put(send, c)));
                } else {
                    b.reclaim(wc, |d| d.chunks().for_each(|c| put(recv, c)));
                }
            }
            if start.elapsed() > *deadline {
                return Err("completions did not arrive".into());
            }
        }
        Ok(())
    }
}

/// The extended path (`QpInitAttr::send_ops`, `start_batch`, `post`,
/// `complete`) in steady state: after a warm-up, a thousand ping-pong
/// rounds of post_recv + one batch of one send + poll + reclaim, and a
/// thousand batches of four sends (with their four receives), make no heap
/// allocation on this thread. An aborted batch of four sends makes exactly
/// one (the `Vec<Completed>` that `WrBatch::abort` returns, sized to the
/// batch; its `Completed`s hold their chunks inline), and an aborted empty
/// batch none (the `Vec` is empty).
fn steady_state_batches_allocate_nothing(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(
        &QpInitAttr::new(QpType::Rc, &cq, &cq)
            .caps(caps)
            .send_ops(SendOpsFlags::SEND),
    )?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    ensure!(
        a.send_ops() == Some(SendOpsFlags::SEND),
        "the sender is not an extended QP: {:?}",
        a.send_ops()
    );
    common::connect(env, &mut a, &mut b, AccessFlags::empty())?;
    let mut bufs = pd
        .alloc_chunks(32, 256, AccessFlags::LOCAL_WRITE)?
        .into_iter();
    let mut rig = BatchRig {
        a,
        b,
        cq,
        send: std::array::from_fn(|_| bufs.next()),
        recv: std::array::from_fn(|_| bufs.next()),
        wcs: [WorkCompletion::default(); 8],
        // Read once: reading the environment allocates.
        deadline: common::deadline(),
    };

    let rounds = rounds();
    for _ in 0..20 {
        rig.round(1)?;
        rig.round(4)?;
    }
    let before = allocations();
    for _ in 0..rounds {
        rig.round(1)?;
    }
    let single = allocations() - before;
    let before = allocations();
    for _ in 0..rounds {
        rig.round(4)?;
    }
    let four = allocations() - before;

    // Aborted batches: four sends posted, then abort; every chunk comes
    // back at once, in order, unsignalled, and nothing reached the device.
    let mut aborted = 0;
    let mut empty = 0;
    for k in 0..rounds {
        let before = allocations();
        let mut batch = rig.a.start_batch()?;
        for i in 0..4u64 {
            batch.post(SendWr::new(100 + i, SendOp::Send).sge_len(take(&mut rig.send), 64))?;
        }
        let back = batch.abort();
        let mut ids = [0u64; 4];
        let mut n = 0;
        for (i, c) in back.into_iter().enumerate() {
            ensure!(!c.signaled, "an aborted request came back signalled");
            if let Some(id) = ids.get_mut(i) {
                *id = c.wr_id;
            }
            n += 1;
            c.chunks().for_each(|c| put(&mut rig.send, c));
        }
        aborted += allocations() - before;
        ensure!(
            n == 4 && ids == [100, 101, 102, 103],
            "round {k}: abort gave back {n} requests, wr_ids {ids:?}"
        );
        ensure!(
            rig.send.iter().all(Option::is_some),
            "round {k}: a send chunk did not come back from abort"
        );
        let before = allocations();
        rig.a.start_batch()?.abort();
        empty += allocations() - before;
    }
    // Nothing of the aborted batches ran: no completion, and the queue
    // still works.
    ensure!(
        rig.cq.poll(&mut rig.wcs)?.is_empty(),
        "a completion after aborted batches"
    );
    rig.round(4)?;

    eprintln!(
        "alloc: {single} heap allocations in {rounds} single-send batches, {four} in {rounds} batches of 4 \
         (post_recv, start_batch, post, complete, poll, reclaim); {aborted} in {rounds} aborted batches \
         of 4, {empty} in {rounds} aborted empty batches"
    );
    ensure!(
        single == 0,
        "{single} allocations in steady-state batches of one"
    );
    ensure!(
        four == 0,
        "{four} allocations in steady-state batches of four"
    );
    ensure!(
        aborted == rounds as u64,
        "{aborted} allocations in {rounds} aborted batches of four (expected {rounds}: one Vec each)"
    );
    ensure!(
        empty == 0,
        "{empty} allocations in {rounds} aborted empty batches"
    );
    Ok(())
}

/// A thousand RDMA writes from one template, one per call
/// (`post_template_one`), and a thousand calls of four
/// (`post_template`), each reclaimed with `reclaim_chunks`: no heap
/// allocation once the first post made the QP's pin of the template.
fn steady_state_templates_allocate_nothing(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::qp::RemoteAddr;
    use rdma_verbs::SharedChunk;
    // `_b` (not `_`): the peer QP lives to the end of the test.
    let (pd, cq, mut a, _b) = connected_pair(env, AccessFlags::REMOTE_WRITE)?;
    let target = common::remote_region(&pd, 64)?;
    let remote = RemoteAddr {
        addr: target.addr(),
        rkey: target.rkey(),
    };
    let src = pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .map(SharedChunk::new)
        .ok_or("no chunk")?;
    let t = a.send_template(SendOp::RdmaWrite(remote), Some((&src, 64)))?;
    let mut wcs = [WorkCompletion::default(); 8];
    let mut back: Vec<Chunk> = Vec::with_capacity(16);
    let deadline = common::deadline();
    let round = |n: u64| -> Result<(), Failed> {
        if n == 1 {
            a.post_template_one(&t, 1, true)?;
        } else {
            a.post_template(&t, (0..n).map(|i| (i, i + 1 == n)))?;
        }
        let start = Instant::now();
        loop {
            if let Some(wc) = cq.poll(&mut wcs)?.iter().next() {
                if !wc.is_success() {
                    return Err("a completion failed".into());
                }
                if a.reclaim_chunks(wc, &mut back) != n as usize {
                    return Err(format!("the completion did not end {n} writes").into());
                }
                return Ok(());
            }
            if start.elapsed() > deadline {
                return Err("completions did not arrive".into());
            }
        }
    };
    let n = rounds();
    let (one, four) = allocations_in_rounds(round, n, n)?;
    eprintln!("alloc: {one} heap allocations in {n} post_template_one rounds, {four} in {n} post_template calls of 4 (poll, reclaim_chunks)");
    ensure!(one == 0, "{one} allocations in post_template_one rounds");
    ensure!(four == 0, "{four} allocations in post_template rounds");
    ensure!(back.is_empty(), "template writes handed back chunks");
    Ok(())
}

/// Sends into a pool of queue-owned receive buffers: posting the free
/// buffers, taking each completion and dropping its loan allocate
/// nothing, one buffer a round or four.
fn steady_state_recv_buffers_allocate_nothing(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::qp::{RecvBuffers, Taken};
    let (pd, cq, mut a, mut b) = connected_pair(env, AccessFlags::empty())?;
    let mut bufs = RecvBuffers::new(&pd, 8, 64)?;
    let mut srcs = pd.alloc_chunks(4, 64, AccessFlags::LOCAL_WRITE)?;
    let mut wcs = [WorkCompletion::default(); 16];
    let deadline = common::deadline();
    let round = |n: u64| -> Result<(), Failed> {
        let n = n as usize;
        if bufs.post(&mut b)? == 0 && bufs.posted() < n {
            return Err("no buffer to post".into());
        }
        a.post_send((0..n).map_while(|i| {
            srcs.pop()
                .map(|c| SendWr::new(i as u64, SendOp::Send).sge_len(c, 16))
        }))?;
        let (mut recvs, mut sends) = (0, 0);
        let start = Instant::now();
        while recvs < n || sends < n {
            for wc in cq.poll(&mut wcs)?.iter() {
                if !wc.is_success() {
                    return Err("a completion failed".into());
                }
                if wc.qp_num() == a.qp_num() {
                    sends += a.reclaim_chunks(wc, &mut srcs);
                    continue;
                }
                match bufs.take(&mut b, wc) {
                    Taken::Mine(msg) if msg.len() == 16 => recvs += 1,
                    other => return Err(format!("{other:?}").into()),
                }
            }
            if start.elapsed() > deadline {
                return Err("completions did not arrive".into());
            }
        }
        Ok(())
    };
    let n = rounds();
    let (one, four) = allocations_in_rounds(round, n, n / 2)?;
    eprintln!("alloc: {one} heap allocations in {n} rounds of one pool receive, {} in {} rounds of four (post, poll, take)", four, n / 2);
    ensure!(one == 0, "{one} allocations in rounds of one");
    ensure!(four == 0, "{four} allocations in rounds of four");
    Ok(())
}

/// One receive reposted from its completion (`post_recv_one`), a send
/// into it: 1000 rounds, no heap allocation.
fn steady_state_post_recv_one_allocates_nothing(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::qp::RecvWr;
    let (pd, cq, mut a, mut b) = connected_pair(env, AccessFlags::empty())?;
    let mut rx = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let mut tx = pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?;
    let mut wcs = [WorkCompletion::default(); 8];
    let deadline = common::deadline();
    let mut round = || -> Result<(), Failed> {
        b.post_recv_one(RecvWr::new(1).sge(rx.pop().ok_or("no receive chunk")?))?;
        a.post_send([SendWr::new(2, SendOp::Send).sge_len(tx.pop().ok_or("no send chunk")?, 8)])?;
        let mut n = 0;
        let start = Instant::now();
        while n < 2 {
            for wc in cq.poll(&mut wcs)?.iter() {
                if !wc.is_success() {
                    return Err("a completion failed".into());
                }
                n += if wc.qp_num() == a.qp_num() {
                    a.reclaim_chunks(wc, &mut tx)
                } else {
                    b.reclaim_chunks(wc, &mut rx)
                };
            }
            if start.elapsed() > deadline {
                return Err("completions did not arrive".into());
            }
        }
        Ok(())
    };
    let rounds = rounds();
    for _ in 0..20 {
        round()?;
    }
    let before = allocations();
    for _ in 0..rounds {
        round()?;
    }
    let n = allocations() - before;
    eprintln!(
        "alloc: {n} heap allocations in {rounds} rounds of post_recv_one, a send, poll, reclaim_chunks"
    );
    ensure!(n == 0, "{n} allocations");
    Ok(())
}

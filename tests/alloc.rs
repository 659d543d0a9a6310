//! Posting and polling allocate nothing on the heap in steady state.
//!
//! A counting global allocator counts the allocations made by the test's
//! own thread; after a warm-up (which sizes the QP's scratch space), a
//! thousand ping-pong rounds of post_recv + post_send + poll + reclaim, and
//! a thousand chains of four sends, must make none.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::{
    AckTimeout, AddressVector, ConnectOptions, GlobalRoute, InitToRtr, MinRnrTimer, Psn, Qp, QpNum,
    Rc, RecvWr, ResetToInit, RetryCount, RnrRetry, RtrToRts, SendOp, SendWr,
};
use rdma_verbs::{AccessFlags, Chunk, QpCaps, QpInitAttr, QpType, WorkCompletion};

use common::{Env, TestFn};

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

const TESTS: &[(&str, TestFn)] = &[
    (
        "alloc::steady_state_posting_and_polling_allocate_nothing",
        steady_state,
    ),
    (
        "alloc::a_successful_modify_allocates_nothing",
        modify_success_path,
    ),
];

fn main() -> std::process::ExitCode {
    common::run("alloc", TESTS)
}

fn steady_state(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        ..QpCaps::default()
    };
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    let o = ConnectOptions {
        port: env.port,
        ..Default::default()
    };
    let (ea, eb) = (
        a.local_endpoint(&o, Psn::new(1)?)?,
        b.local_endpoint(&o, Psn::new(2)?)?,
    );
    a.connect(&o, ea.psn, &eb)?;
    b.connect(&o, eb.psn, &ea)?;

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

    for _ in 0..20 {
        round(1)?;
        round(4)?;
        round(16)?;
    }
    let before = allocations();
    for _ in 0..1000 {
        round(1)?;
    }
    let single = allocations() - before;
    let before = allocations();
    for _ in 0..1000 {
        round(4)?;
    }
    let chained = allocations() - before;
    let before = allocations();
    for _ in 0..1000 {
        round(16)?;
    }
    let full = allocations() - before;
    eprintln!(
        "alloc: {single} heap allocations in 1000 single rounds, {chained} in 1000 chains of 4, {full} in 1000 chains of 16 = the queue depth (post_recv, post_send, poll, reclaim)"
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
fn modify_success_path(env: &Env) -> Result<(), Failed> {
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
    let peer_qpn = QpNum::new(peer.qp_num())?;
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

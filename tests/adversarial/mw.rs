//! Attacks on the memory windows' promises, from safe code: a bound
//! window keeps its region registered whatever the program drops, a bind's
//! completion moves the window once and only on its own QP, a window is
//! not bound twice at once, and a refused request leaves everything as it
//! was.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, MwBind, MwType, ProtectionDomain, QueuePair,
    WcOpcode, WcStatus, WorkCompletion,
};

use crate::common::{poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    handles_dropped_while_binding_keep_window_and_region,
    bind_completion_moves_the_window_once_on_its_qp,
    never_bound_or_invalidated_twice_at_once,
    never_bound_windows_refuse_invalidate_and_unbind,
    type1_rebound_elsewhere_while_binding_region_closed,
];

/// Two connected RC QPs (`a` binds, `b` is the peer), extended with every
/// RC operation.
struct Rig {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn rig(env: &Env) -> Result<Rig, Failed> {
    let p = crate::common::ex_rc_pair(env, AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE)?;
    Ok(Rig {
        pd: p.pd,
        cq: p.cq,
        a: p.a,
        b: p.b,
    })
}

/// A region windows may be bound to: byte `i` is `i % 251`.
fn region(pd: &ProtectionDomain, len: usize) -> Result<MemoryRegion, Failed> {
    let mut mr = pd.register(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    mr.write(0, &bytes)?;
    Ok(mr)
}

/// `b` reads `len` bytes at `addr` through `rkey`: the status and bytes.
fn peer_read(r: &mut Rig, addr: u64, rkey: u32, len: usize) -> Result<(WcStatus, Vec<u8>), Failed> {
    let dst =
        r.pd.alloc_chunks(1, len, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    r.b.post_send([SendWr::new(9, SendOp::RdmaRead(RemoteAddr { addr, rkey })).sge(dst)])?;
    let wc = poll_n(&r.cq, 1)?[0];
    let mut got = Vec::new();
    let n = r.b.reclaim(&wc, |d| {
        got.extend(d.chunks().map(|c| c.as_slice().to_vec()))
    });
    ensure!(n == 1, "the read's completion ended {n} requests");
    let status = wc.status().map_err(|s| format!("status {s}"))?;
    Ok((status, got.concat()))
}

/// The program lets go of the window and the region (the `MemoryWindow`
/// and the `MemoryRegion`) while the bind is outstanding: the request keeps
/// both, so the peer still reads the region's bytes through the rkey (under
/// valgrind, a freed buffer would show); once the bind is reclaimed, the
/// last hold goes, the window is deallocated and the rkey refused.
fn handles_dropped_while_binding_keep_window_and_region(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env)?;
    let mr = region(&r.pd, 8192)?;
    let mut mw = r.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 4096, 64, AccessFlags::REMOTE_READ)?.wr_id(1);
    let addr = bind.remote_addr();
    let rkey = r.a.bind_mw(&mut mw, &bind)?;
    // Everything the program holds of the window and region goes now.
    drop(mw);
    drop(mr);
    let wc: WorkCompletion = poll_n(&r.cq, 1)?[0];
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::BindMw),
        "bind {wc:?}"
    );
    // Not reclaimed yet: the window and region are alive and bound.
    let (st, got) = peer_read(&mut r, addr, rkey, 64)?;
    let want: Vec<u8> = (4096..4160).map(|i| (i % 251) as u8).collect();
    ensure!(
        st == WcStatus::Success && got == want,
        "read through a window whose handles were dropped: {st:?} {got:?}"
    );
    ensure!(r.a.reclaim(&wc, drop) == 1, "the bind not ended");
    let (st, _) = peer_read(&mut r, addr, rkey, 64)?;
    ensure!(
        st == WcStatus::RemAccessErr,
        "read through a deallocated window: {st:?}"
    );
    Ok(())
}

/// A bind's completion reclaimed on the wrong QP ends nothing and leaves
/// the window binding; on its own QP it binds the window once; again, it
/// ends nothing and changes nothing (the window stays bound and can be
/// invalidated exactly once).
fn bind_completion_moves_the_window_once_on_its_qp(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env)?;
    let mr = region(&r.pd, 4096)?;
    let mut mw = r.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 256, AccessFlags::REMOTE_READ)?.wr_id(1);
    let rkey = r.a.bind_mw(&mut mw, &bind)?;
    let wc = poll_n(&r.cq, 1)?[0];
    ensure!(r.b.reclaim(&wc, drop) == 0, "the wrong QP ended the bind");
    ensure!(!mw.is_bound(), "bound by a completion reclaimed elsewhere");
    ensure!(r.a.reclaim(&wc, drop) == 1, "the bind not ended");
    ensure!(mw.is_bound(), "not bound after its completion");
    ensure!(r.a.reclaim(&wc, drop) == 0, "the bind ended twice");
    ensure!(
        mw.is_bound() && mw.rkey() == rkey,
        "a second reclaim moved it"
    );
    let (st, got) = peer_read(&mut r, bind.remote_addr(), rkey, 8)?;
    let want: Vec<u8> = (0..8).map(|i| (i % 251) as u8).collect();
    ensure!(st == WcStatus::Success && got == want, "{st:?} {got:?}");
    r.a.invalidate_mw(2, &mut mw)?;
    let inv = poll_n(&r.cq, 1)?[0];
    ensure!(r.a.reclaim(&inv, drop) == 1, "the invalidation not ended");
    ensure!(r.a.reclaim(&inv, drop) == 0, "the invalidation ended twice");
    ensure!(!mw.is_bound(), "bound after the invalidation");
    // The stale completion of the bind, reclaimed once more, does not
    // bring the window back.
    ensure!(r.a.reclaim(&wc, drop) == 0, "an old bind ended again");
    ensure!(!mw.is_bound(), "an old completion rebound the window");
    Ok(())
}

/// A type 2 window is not bound again while bound or binding (on any QP),
/// nor invalidated twice (posted, or twice in one batch); each refusal
/// leaves the window's rkey and state as they were, and the batch open.
fn never_bound_or_invalidated_twice_at_once(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env)?;
    let mr = region(&r.pd, 4096)?;
    let mut mw = r.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 128, AccessFlags::REMOTE_READ)?.wr_id(1);
    let rkey = r.a.bind_mw(&mut mw, &bind)?;
    // Binding: refused on the same QP and on the peer's.
    for qp in [&mut r.a, &mut r.b] {
        let e = qp
            .bind_mw(&mut mw, &bind)
            .err()
            .ok_or("a binding window bound again")?;
        ensure!(e.error.to_string().contains("free"), "{e}");
        ensure!(e.posted == 0 && e.returned.is_empty(), "{e:?}");
    }
    ensure!(mw.rkey() == rkey, "a refused bind moved the rkey");
    let wc = poll_n(&r.cq, 1)?[0];
    ensure!(r.a.reclaim(&wc, drop) == 1, "the bind not ended");
    // Bound: refused in a batch too; then two invalidations in one batch:
    // the second is refused and the batch goes on.
    let mut batch = r.a.start_batch()?;
    let e = batch
        .bind_mw(&mut mw, &bind)
        .err()
        .ok_or("a bound window bound again in a batch")?;
    ensure!(e.error.to_string().contains("bound"), "{e}");
    batch.local_inv(2, &mut mw)?;
    let e = batch
        .local_inv(3, &mut mw)
        .err()
        .ok_or("invalidated twice in one batch")?;
    ensure!(e.error.to_string().contains("in flight"), "{e}");
    batch.complete()?;
    let inv = poll_n(&r.cq, 1)?[0];
    let mut ids = Vec::new();
    ensure!(
        r.a.reclaim(&inv, |d| ids.push(d.wr_id)) == 1 && ids == [2],
        "the batch ended {ids:?}"
    );
    ensure!(!mw.is_bound(), "bound after the invalidation");
    let e =
        r.a.invalidate_mw(4, &mut mw)
            .err()
            .ok_or("a free window invalidated")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    let (st, _) = peer_read(&mut r, bind.remote_addr(), rkey, 8)?;
    ensure!(
        st == WcStatus::RemAccessErr,
        "read after invalidation: {st:?}"
    );
    Ok(())
}

/// Windows never bound: a type 2 one is not invalidated (posted or in a
/// batch: rxe's kernel would dereference its absent region), a type 1 one
/// is not unbound (the request names the bound region) nor invalidated,
/// a type 2 one is not unbound. Each refusal posts nothing and leaves the
/// window as it was: both bind normally afterwards.
fn never_bound_windows_refuse_invalidate_and_unbind(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env)?;
    let mr = region(&r.pd, 4096)?;
    let mut w2 = r.pd.alloc_mw(MwType::Type2)?;
    let mut w1 = r.pd.alloc_mw(MwType::Type1)?;
    let (k2, k1) = (w2.rkey(), w1.rkey());
    let e =
        r.a.invalidate_mw(1, &mut w2)
            .err()
            .ok_or("a never-bound window invalidated")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    ensure!(e.posted == 0 && e.returned.is_empty(), "{e:?}");
    let mut batch = r.a.start_batch()?;
    let e = batch
        .local_inv(2, &mut w2)
        .err()
        .ok_or("a never-bound window invalidated in a batch")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    ensure!(batch.is_empty(), "the batch holds a request");
    drop(batch.abort());
    let e =
        r.a.unbind_mw(3, &mut w1)
            .err()
            .ok_or("a never-bound type 1 window unbound")?;
    ensure!(e.error.to_string().contains("known to be bound"), "{e}");
    let e =
        r.a.invalidate_mw(4, &mut w1)
            .err()
            .ok_or("a type 1 window invalidated")?;
    ensure!(e.error.to_string().contains("type 2"), "{e}");
    let e =
        r.a.unbind_mw(5, &mut w2)
            .err()
            .ok_or("a type 2 window unbound")?;
    ensure!(e.error.to_string().contains("type 1"), "{e}");
    ensure!(r.a.outstanding_sends() == 0, "a refused request was posted");
    ensure!(
        w2.rkey() == k2 && w1.rkey() == k1 && !w2.holds_region() && !w1.holds_region(),
        "a refusal moved a window"
    );
    // Both bind, the type 2 one with the key after its first.
    let bind = MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?;
    r.a.bind_mw(&mut w2, &bind.wr_id(6))?;
    r.a.bind_mw(&mut w1, &bind.wr_id(7))?;
    let mut ids = Vec::new();
    for wc in poll_n(&r.cq, 2)? {
        ensure!(wc.is_success(), "{wc:?}");
        r.a.reclaim(&wc, |d| ids.push(d.wr_id));
    }
    ensure!(ids == [6, 7], "binds ended {ids:?}");
    ensure!(w2.is_bound() && w1.is_bound(), "not bound");
    // Type 2 windows are invalidated before their QP goes (rxe).
    r.a.invalidate_mw(8, &mut w2)?;
    let wc = poll_n(&r.cq, 1)?[0];
    ensure!(wc.is_success() && r.a.reclaim(&wc, drop) == 1, "{wc:?}");
    Ok(())
}

/// A type 1 window bound to region A, then, before that bind's completion
/// is reclaimed, bound again to region B; the program drops A's handle and
/// tries to close B (refused: the window holds it). Both binds end once;
/// the window's key is the second; B is read through it, and the first
/// key reaches nothing.
fn type1_rebound_elsewhere_while_binding_region_closed(env: &Env) -> Result<(), Failed> {
    let mut r = rig(env)?;
    let a = region(&r.pd, 4096)?;
    let b = region(&r.pd, 8192)?;
    let mut mw = r.pd.alloc_mw(MwType::Type1)?;
    let first = MwBind::new(&a, 0, 64, AccessFlags::REMOTE_READ)?.wr_id(1);
    let second = MwBind::new(&b, 5000, 64, AccessFlags::REMOTE_READ)?.wr_id(2);
    let (addr1, addr2) = (first.remote_addr(), second.remote_addr());
    let k1 = r.a.bind_mw(&mut mw, &first)?;
    let k2 = r.a.bind_mw(&mut mw, &second)?;
    ensure!(k1 != k2 && mw.rkey() == k2, "keys {k1:#x} then {k2:#x}");
    drop(a);
    match b.close() {
        Err(rdma_verbs::Error::InUse { .. }) => {}
        other => return Err(format!("close of a region being bound: {other:?}").into()),
    }
    let mut ids = Vec::new();
    for wc in poll_n(&r.cq, 2)? {
        ensure!(
            wc.is_success() && wc.opcode() == Ok(WcOpcode::BindMw),
            "{wc:?}"
        );
        ensure!(r.a.reclaim(&wc, |d| ids.push(d.wr_id)) == 1, "{wc:?}");
    }
    ensure!(ids == [1, 2], "binds ended {ids:?}");
    ensure!(
        mw.is_bound() && mw.holds_region() && mw.rkey() == k2,
        "after both binds: {mw:?}"
    );
    let (st, got) = peer_read(&mut r, addr2 + 3, k2, 8)?;
    let want: Vec<u8> = (5003..5011).map(|i| (i % 251) as u8).collect();
    ensure!(
        st == WcStatus::Success && got == want,
        "read through the second bind: {st:?} {got:?}"
    );
    // Last: a refused read takes the peer's QP to ERR.
    let (st, _) = peer_read(&mut r, addr1, k1, 8)?;
    ensure!(
        st == WcStatus::RemAccessErr,
        "read through the first key: {st:?}"
    );
    Ok(())
}

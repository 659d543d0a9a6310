//! Memory windows on a real device: type 1 and type 2 binds, remote access
//! through the window's rkey, local invalidation (posted and in a batch),
//! remote invalidation by SEND_WITH_INV, access refused afterwards, the
//! rules checked before any call, and the bound region kept registered.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, Error, MemoryRegion, MemoryWindow, MwBind, MwType, ProtectionDomain,
    QpInitAttr, QpState, QpType, QueuePair, SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion,
};

use crate::common::{connect, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    type2_bind_access_invalidate_refused,
    type2_in_a_batch,
    send_with_invalidate_revokes_the_window,
    send_with_invalidate_seen_through_an_extended_cq,
    send_with_invalidate_into_an_srq_of_another_pd,
    type1_bind_and_access,
    type1_unbind_revokes_the_window,
    a_reset_leaves_the_window_state_unknown,
    rules_are_checked_before_any_call,
    a_bound_window_keeps_its_region,
    abort_undoes_a_bind,
    window_on_a_zero_based_owned_region,
];

/// A connected RC pair; `a` binds windows (extended, with every RC op),
/// `b` is the peer that uses them.
struct MwPair {
    pd: ProtectionDomain,
    cq: rdma_verbs::CompletionQueue,
    a: QueuePair,
    b: QueuePair,
}

fn mw_pair(env: &Env) -> Result<MwPair, Failed> {
    mw_pair_srq(env, None)
}

/// As [`mw_pair`], `a` taking its receives from `srq` if given.
fn mw_pair_srq(env: &Env, srq: Option<&SharedReceiveQueue>) -> Result<MwPair, Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let attr =
        QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(SendOpsFlags::for_transport(QpType::Rc));
    let mut a = pd.create_qp(&match srq {
        Some(srq) => attr.clone().srq(srq),
        None => attr.clone(),
    })?;
    let mut b = pd.create_qp(&attr)?;
    // The QPs' own access rights must allow what the windows grant.
    let access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    connect(env, &mut a, &mut b, access)?;
    Ok(MwPair { pd, cq, a, b })
}

/// A region windows may be bound to, filled with a pattern.
fn window_region(pd: &ProtectionDomain, len: usize) -> Result<MemoryRegion, Failed> {
    let mut mr = pd.register(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    let pattern: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    mr.write(0, &pattern)?;
    Ok(mr)
}

/// One completion, reclaimed on its QP: its status, opcode and the ended
/// request's wr_id and chunks.
fn one(p: &mut MwPair) -> Result<(WorkCompletion, u64, Vec<Chunk>), Failed> {
    let wc = poll_n(&p.cq, 1)?[0];
    let mut ended = Vec::new();
    for qp in [&mut p.a, &mut p.b] {
        qp.reclaim(&wc, |c| {
            let id = c.wr_id;
            ended.push((id, c.chunks().collect::<Vec<_>>()));
        });
    }
    ensure!(ended.len() == 1, "{wc:?} ended {} requests", ended.len());
    let (id, chunks) = ended.pop().unwrap();
    Ok((wc, id, chunks))
}

/// `b` reads `len` bytes at `addr` with `rkey`; the completion's status
/// and the bytes read.
fn peer_read(
    p: &mut MwPair,
    addr: u64,
    rkey: u32,
    len: usize,
) -> Result<(WcStatus, Vec<u8>), Failed> {
    let dst =
        p.pd.alloc_chunks(1, len, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    p.b.post_send([SendWr::new(500, SendOp::RdmaRead(RemoteAddr { addr, rkey })).sge(dst)])?;
    let (wc, id, chunks) = one(p)?;
    ensure!(id == 500, "the peer's read ended {id}");
    let status = wc.status().map_err(|s| format!("status {s}"))?;
    Ok((status, chunks[0].as_slice().to_vec()))
}

/// `a` binds `mw` with `bind`; the bind's completion, reclaimed, must be
/// a success. The window's rkey.
fn bind_done(p: &mut MwPair, mw: &mut MemoryWindow, bind: &MwBind<'_>) -> Result<u32, Failed> {
    let rkey = p.a.bind_mw(mw, bind)?;
    let (wc, _, _) = one(p)?;
    ensure!(wc.is_success(), "bind {wc:?}");
    Ok(rkey)
}

/// `b` writes `data` at `addr` with `rkey`; the completion's status.
fn peer_write(p: &mut MwPair, addr: u64, rkey: u32, data: &[u8]) -> Result<WcStatus, Failed> {
    let mut src =
        p.pd.alloc_chunks(1, data.len(), AccessFlags::LOCAL_WRITE)?
            .remove(0);
    src.as_mut_slice().copy_from_slice(data);
    p.b.post_send([SendWr::new(501, SendOp::RdmaWrite(RemoteAddr { addr, rkey })).sge(src)])?;
    let (wc, _, _) = one(p)?;
    Ok(wc.status().map_err(|s| format!("status {s}"))?)
}

/// After a refused remote access both QPs are in ERR: a fresh pair for
/// the next step would be needed; tests end there.
fn expect_refused(status: WcStatus, what: &str) -> Result<(), Failed> {
    ensure!(
        status == WcStatus::RemAccessErr,
        "{what}: {status:?}, not REM_ACCESS_ERR"
    );
    Ok(())
}

fn type2_bind_access_invalidate_refused(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 8192)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    ensure!(
        !mw.is_bound() && !mw.holds_region(),
        "a new window is bound"
    );
    let before = mw.rkey();
    let bind = MwBind::new(
        &mr,
        1024,
        2048,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?
    .wr_id(7);
    let rkey = p.a.bind_mw(&mut mw, &bind)?;
    ensure!(
        rkey != before && mw.rkey() == rkey && mw.holds_region() && !mw.is_bound(),
        "rkey {before:#x} -> {rkey:#x}"
    );
    let (wc, id, chunks) = one(&mut p)?;
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::BindMw),
        "bind: {wc:?}"
    );
    ensure!(
        id == 7 && chunks.is_empty(),
        "bind ended {id} with {} chunks",
        chunks.len()
    );
    ensure!(mw.is_bound(), "not bound after its bind's completion");
    // A bound type 2 window is not bound again before it is invalidated.
    let e =
        p.a.bind_mw(&mut mw, &bind)
            .err()
            .ok_or("a bound window bound again")?;
    ensure!(e.error.to_string().contains("only when free"), "{e}");

    let addr = bind.remote_addr();
    ensure!(addr == mr.addr() + 1024, "remote address {addr:#x}");
    let (st, got) = peer_read(&mut p, addr + 10, rkey, 100)?;
    ensure!(st == WcStatus::Success, "read through the window: {st:?}");
    let want: Vec<u8> = (1034..1134).map(|i| (i % 253) as u8).collect();
    ensure!(got == want, "the window showed other bytes");
    ensure!(
        peer_write(&mut p, addr, rkey, b"through the window")? == WcStatus::Success,
        "write"
    );
    let mut landed = [0u8; 18];
    mr.read(1024, &mut landed)?;
    ensure!(&landed == b"through the window", "{landed:?}");

    p.a.invalidate_mw(8, &mut mw)?;
    ensure!(!mw.is_bound(), "still bound after invalidation was posted");
    let e =
        p.a.invalidate_mw(9, &mut mw)
            .err()
            .ok_or("invalidated twice")?;
    ensure!(e.error.to_string().contains("in flight"), "{e}");
    let (wc, id, _) = one(&mut p)?;
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::LocalInv) && id == 8,
        "invalidate: {wc:?} {id}"
    );
    // A free window is not invalidated (that crashes rxe's kernel).
    let e =
        p.a.invalidate_mw(10, &mut mw)
            .err()
            .ok_or("a free window invalidated")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    ensure!(
        p.a.outstanding_sends() == 0,
        "a refused invalidation was posted"
    );
    let (st, _) = peer_read(&mut p, addr, rkey, 16)?;
    expect_refused(st, "read after local invalidation")
}

fn type2_in_a_batch(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 4096, AccessFlags::REMOTE_READ)?
        .wr_id(1)
        .unsignaled();
    let mut batch = p.a.start_batch()?;
    let rkey = batch.bind_mw(&mut mw, &bind)?;
    // A send after the (unsignalled) bind: its completion ends both.
    batch.post(SendWr::new(2, SendOp::Send).inline(b""))?;
    batch.complete()?;
    p.b.post_recv([RecvWr::new(3).sge(
        p.pd.alloc_chunks(1, 16, AccessFlags::LOCAL_WRITE)?
            .remove(0),
    )])?;
    let wcs = poll_n(&p.cq, 2)?;
    let mut ended = Vec::new();
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        for qp in [&mut p.a, &mut p.b] {
            qp.reclaim(wc, |c| ended.push((c.wr_id, c.signaled)));
        }
    }
    ended.sort();
    ensure!(ended == [(1, false), (2, true), (3, true)], "{ended:?}");
    let (st, got) = peer_read(&mut p, bind.remote_addr() + 7, rkey, 5)?;
    ensure!(
        st == WcStatus::Success && got == [7, 8, 9, 10, 11],
        "{st:?} {got:?}"
    );
    // A write through a read-only window is refused by the device; that
    // ends the pair, so it is the last step of another test. Here:
    // invalidate in a batch, then the read is refused.
    let mut batch = p.a.start_batch()?;
    batch.local_inv(9, &mut mw)?;
    batch.complete()?;
    let (wc, id, _) = one(&mut p)?;
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::LocalInv) && id == 9,
        "{wc:?}"
    );
    let (st, _) = peer_read(&mut p, bind.remote_addr(), rkey, 8)?;
    expect_refused(st, "read after invalidation in a batch")
}

fn send_with_invalidate_revokes_the_window(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 256, AccessFlags::REMOTE_READ)?.wr_id(1);
    let rkey = bind_done(&mut p, &mut mw, &bind)?;
    ensure!(
        peer_read(&mut p, bind.remote_addr(), rkey, 8)?.0 == WcStatus::Success,
        "read"
    );
    // The peer sends with invalidate, naming the window's rkey.
    p.a.post_recv([RecvWr::new(2).sge(
        p.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .remove(0),
    )])?;
    let (wcs, at) = send_with_inv(&mut p, rkey)?;
    let recv = &wcs[at];
    ensure!(
        p.a.invalidated_rkey(recv) == Some(rkey),
        "invalidated {:?}, flags {:?}, rkey {rkey:#x}, {recv:?}",
        p.a.invalidated_rkey(recv),
        recv.flags(),
    );
    ensure!(mw.is_bound(), "bound before the receive is reclaimed");
    for wc in &wcs {
        for qp in [&mut p.a, &mut p.b] {
            qp.reclaim(wc, drop);
        }
    }
    // Reclaiming the receive told the window: it is free, and a local
    // invalidation (which would crash rxe on a free window) is refused.
    ensure!(
        !mw.is_bound() && !mw.holds_region(),
        "still bound after SEND_WITH_INV"
    );
    expect_revoked(&mut p, &mut mw, bind.remote_addr(), rkey)
}

/// `b` sends with invalidate naming `rkey` (a receive must be posted for
/// `a`); both completions, and where `a`'s successful receive is among them.
fn send_with_inv(p: &mut MwPair, rkey: u32) -> Result<(Vec<WorkCompletion>, usize), Failed> {
    p.b.post_send([SendWr::new(3, SendOp::SendWithInv(rkey)).inline(b"")])?;
    let wcs = poll_n(&p.cq, 2)?;
    let at = wcs
        .iter()
        .position(|w| w.qp_num() == p.a.qp_num())
        .ok_or("no receive")?;
    ensure!(wcs[at].is_success(), "{:?}", wcs[at]);
    Ok((wcs, at))
}

/// After the peer invalidated `mw` (and the receive was reclaimed): a
/// local invalidation is refused (the window is free), and the peer's read
/// through `rkey` fails with REM_ACCESS_ERR.
fn expect_revoked(
    p: &mut MwPair,
    mw: &mut MemoryWindow,
    addr: u64,
    rkey: u32,
) -> Result<(), Failed> {
    let e =
        p.a.invalidate_mw(4, mw)
            .err()
            .ok_or("a window freed by the peer invalidated")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    let (st, _) = peer_read(p, addr, rkey, 8)?;
    expect_refused(st, "read after SEND_WITH_INV")
}

/// A peer's SEND_WITH_INV whose receive `a` takes from an SRQ in another
/// PD than the window's: reclaimed on the SRQ itself (not through the QP),
/// the receive still frees the window (looked up on the context), once.
fn send_with_invalidate_into_an_srq_of_another_pd(env: &Env) -> Result<(), Failed> {
    let srq_pd = env.ctx.alloc_pd()?;
    let srq = srq_pd.create_srq(4, 1, 0)?;
    let mut p = mw_pair_srq(env, Some(&srq))?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 256, AccessFlags::REMOTE_READ)?.wr_id(1);
    let rkey = bind_done(&mut p, &mut mw, &bind)?;
    let buf = srq_pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .remove(0);
    srq.post_recv([RecvWr::new(2).sge(buf)])?;
    let (wcs, at) = send_with_inv(&mut p, rkey)?;
    let recv = &wcs[at];
    ensure!(
        srq.invalidated_rkey(recv) == Some(rkey) && p.a.invalidated_rkey(recv) == Some(rkey),
        "invalidated {:?} (SRQ) {:?} (QP), flags {:?}, rkey {rkey:#x}",
        srq.invalidated_rkey(recv),
        p.a.invalidated_rkey(recv),
        recv.flags(),
    );
    ensure!(mw.is_bound(), "bound before the receive is reclaimed");
    let mut ids = Vec::new();
    ensure!(srq.reclaim(recv, |c| ids.push(c.wr_id)) == 1, "reclaim");
    ensure!(ids == [2], "the SRQ handed back {ids:?}");
    ensure!(
        !mw.is_bound() && !mw.holds_region(),
        "still bound after SEND_WITH_INV reclaimed on the SRQ"
    );
    ensure!(srq.reclaim(recv, drop) == 0, "a receive reclaimed twice");
    ensure!(
        p.a.reclaim(recv, drop) == 0,
        "reclaimed again through the QP"
    );
    for wc in &wcs {
        p.b.reclaim(wc, drop);
    }
    expect_revoked(&mut p, &mut mw, bind.remote_addr(), rkey)
}

/// A bind handed back by a RESET may or may not have run: the window's
/// state is unknown, so it is not invalidated (it might be free), keeps its
/// region, and is deallocated cleanly.
fn a_reset_leaves_the_window_state_unknown(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    p.a.bind_mw(
        &mut mw,
        &MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?.wr_id(1),
    )?;
    let back = p.a.reset()?;
    ensure!(back.len() == 1 && back[0].wr_id == 1, "{back:?}");
    ensure!(!mw.is_bound() && mw.holds_region(), "{mw:?}");
    ensure!(format!("{mw:?}").contains("Unknown"), "{mw:?}");
    let e =
        p.b.invalidate_mw(2, &mut mw)
            .err()
            .ok_or("an unknown window invalidated")?;
    ensure!(e.error.to_string().contains("RESET"), "{e}");
    drop(mr); // the window holds it
    mw.close()?;
    Ok(())
}

fn type1_bind_and_access(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type1)?;
    let before = mw.rkey();
    let bind = MwBind::new(&mr, 512, 512, AccessFlags::REMOTE_READ)?.wr_id(4);
    let rkey = p.a.bind_mw(&mut mw, &bind)?;
    ensure!(
        rkey == mw.rkey() && rkey != before,
        "rkey {before:#x} -> {rkey:#x}"
    );
    let (wc, id, _) = one(&mut p)?;
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::BindMw) && id == 4,
        "bind: {wc:?}"
    );
    let (st, got) = peer_read(&mut p, bind.remote_addr(), rkey, 4)?;
    let want: Vec<u8> = (512..516).map(|i| (i % 253) as u8).collect();
    ensure!(st == WcStatus::Success && got == want, "{st:?} {got:?}");
    // Type 1 windows are not invalidated, nor bound in a batch.
    let e =
        p.a.invalidate_mw(5, &mut mw)
            .err()
            .ok_or("type 1 invalidated")?;
    ensure!(e.error.to_string().contains("type 2"), "{e}");
    let mut batch = p.a.start_batch()?;
    let e = batch
        .bind_mw(&mut mw, &bind)
        .err()
        .ok_or("type 1 bound in a batch")?;
    ensure!(e.error.to_string().contains("type 1"), "{e}");
    drop(batch);
    ensure!(mw.rkey() == rkey, "a refused call changed the rkey");
    // Rebinding a type 1 window moves it (new rkey); the old one is dead.
    let again = MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?.wr_id(6);
    let rkey2 = p.a.bind_mw(&mut mw, &again)?;
    let (wc, _, _) = one(&mut p)?;
    ensure!(
        wc.is_success() && rkey2 != rkey,
        "rebind {wc:?} {rkey:#x} -> {rkey2:#x}"
    );
    ensure!(
        peer_read(&mut p, again.remote_addr(), rkey2, 8)?.0 == WcStatus::Success,
        "read after rebind"
    );
    let (st, _) = peer_read(&mut p, bind.remote_addr(), rkey, 4)?;
    expect_refused(st, "read with the rkey of the previous bind")
}

/// A type 1 window unbound (`ibv_bind_mw` of length 0): a new rkey, the
/// region let go once the request is reclaimed, a second unbind refused,
/// and the peer's read through the old rkey refused. Type 2 windows are
/// not unbound (they are invalidated).
fn type1_unbind_revokes_the_window(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type1)?;
    let e =
        p.a.unbind_mw(1, &mut mw)
            .err()
            .ok_or("a window never bound was unbound")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    let mut two = p.pd.alloc_mw(MwType::Type2)?;
    let e =
        p.a.unbind_mw(1, &mut two)
            .err()
            .ok_or("a type 2 window was unbound")?;
    ensure!(e.error.to_string().contains("type 1"), "{e}");
    let bind = MwBind::new(&mr, 256, 256, AccessFlags::REMOTE_READ)?.wr_id(2);
    let rkey = bind_done(&mut p, &mut mw, &bind)?;
    ensure!(
        peer_read(&mut p, bind.remote_addr(), rkey, 8)?.0 == WcStatus::Success,
        "read through the bound window"
    );
    let unbound = p.a.unbind_mw(3, &mut mw)?;
    ensure!(
        unbound != rkey && mw.rkey() == unbound,
        "rkey {rkey:#x} -> {unbound:#x}, window says {:#x}",
        mw.rkey()
    );
    ensure!(!mw.is_bound(), "bound while the unbind is in flight");
    let (wc, id, chunks) = one(&mut p)?;
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::BindMw) && id == 3 && chunks.is_empty(),
        "unbind: {wc:?}, id {id}"
    );
    ensure!(
        !mw.is_bound() && !mw.holds_region(),
        "still bound after the unbind"
    );
    let e = p.a.unbind_mw(4, &mut mw).err().ok_or("unbound twice")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    let (st, _) = peer_read(&mut p, bind.remote_addr(), rkey, 8)?;
    expect_refused(st, "read through an unbound type 1 window")
}

fn rules_are_checked_before_any_call(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let plain = p.pd.register(4096, AccessFlags::LOCAL_WRITE)?;
    let read_only = p.pd.register(4096, AccessFlags::MW_BIND)?;
    let other_pd = env.ctx.alloc_pd()?;
    let other_mr = window_region(&other_pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let mut foreign_mw = other_pd.alloc_mw(MwType::Type2)?;
    let rkey = mw.rkey();
    let r = AccessFlags::REMOTE_READ;
    // Ranges are checked when the bind is made: a bind past the end or
    // empty never exists.
    for (what, offset, len, needle) in [
        ("past the end", 4000, 200, "outside"),
        ("empty", 0, 0, "empty"),
    ] {
        let e = MwBind::new(&mr, offset, len, r)
            .err()
            .ok_or(format!("{what}: accepted"))?;
        ensure!(
            matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains(needle),
            "{what}: {e}"
        );
    }
    let cases: Vec<(&str, MwBind<'_>, &str)> = vec![
        ("no MW_BIND", MwBind::new(&plain, 0, 64, r)?, "MW_BIND"),
        (
            "local rights",
            MwBind::new(&mr, 0, 64, AccessFlags::LOCAL_WRITE)?,
            "REMOTE_READ",
        ),
        (
            "zero based",
            MwBind::new(&mr, 0, 64, r | AccessFlags::ZERO_BASED)?,
            "REMOTE_READ",
        ),
        (
            "write without LOCAL_WRITE",
            MwBind::new(&read_only, 0, 64, AccessFlags::REMOTE_WRITE)?,
            "LOCAL_WRITE",
        ),
        (
            "region of another PD",
            MwBind::new(&other_mr, 0, 64, r)?,
            "protection domains",
        ),
    ];
    for (what, bind, needle) in &cases {
        let e =
            p.a.bind_mw(&mut mw, bind)
                .err()
                .ok_or(format!("{what}: accepted"))?;
        ensure!(e.posted == 0, "{what}: {e}");
        ensure!(
            matches!(e.error, Error::InvalidArgument { .. }),
            "{what}: {e}"
        );
        ensure!(e.error.to_string().contains(needle), "{what}: {e}");
        // The same in a batch.
        let mut batch = p.a.start_batch()?;
        let e = batch
            .bind_mw(&mut mw, bind)
            .err()
            .ok_or(format!("{what} (batch): accepted"))?;
        ensure!(e.error.to_string().contains(needle), "{what} (batch): {e}");
        ensure!(batch.is_empty(), "{what}: the batch holds a request");
        drop(batch);
    }
    let e =
        p.a.bind_mw(&mut foreign_mw, &MwBind::new(&other_mr, 0, 64, r)?)
            .err()
            .ok_or("window of another PD")?;
    ensure!(e.error.to_string().contains("protection domains"), "{e}");
    // A QP below RTS.
    let mut fresh = p.pd.create_qp(&QpInitAttr::new(QpType::Rc, &p.cq, &p.cq))?;
    let e = fresh
        .bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, r)?)
        .err()
        .ok_or("bind in RESET")?;
    ensure!(
        matches!(
            e.error,
            Error::QpState {
                state: QpState::Reset,
                ..
            }
        ),
        "{e}"
    );
    let e = fresh
        .invalidate_mw(1, &mut mw)
        .err()
        .ok_or("invalidate in RESET")?;
    ensure!(matches!(e.error, Error::QpState { .. }), "{e}");
    // A UD QP cannot bind.
    let mut ud = p.pd.create_qp(&QpInitAttr::new(QpType::Ud, &p.cq, &p.cq))?;
    let e = ud
        .bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, r)?)
        .err()
        .ok_or("bind on UD")?;
    ensure!(e.error.to_string().contains("UD"), "{e}");
    // An extended QP without BIND_MW / LOCAL_INV in its send_ops.
    let mut sends_only =
        p.pd.create_qp(&QpInitAttr::new(QpType::Rc, &p.cq, &p.cq).send_ops(SendOpsFlags::SEND))?;
    let mut peer = p.pd.create_qp(&QpInitAttr::new(QpType::Rc, &p.cq, &p.cq))?;
    connect(env, &mut sends_only, &mut peer, AccessFlags::empty())?;
    let mut batch = sends_only.start_batch()?;
    let e = batch
        .bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, r)?)
        .err()
        .ok_or("bind without BIND_MW")?;
    ensure!(e.error.to_string().contains("BIND_MW"), "{e}");
    let e = batch
        .local_inv(1, &mut mw)
        .err()
        .ok_or("local_inv without LOCAL_INV")?;
    ensure!(e.error.to_string().contains("LOCAL_INV"), "{e}");
    drop(batch);
    // A window never bound is not invalidated.
    let e =
        p.a.invalidate_mw(1, &mut mw)
            .err()
            .ok_or("a new window invalidated")?;
    ensure!(e.error.to_string().contains("free"), "{e}");
    // Nothing reached a device or changed the window.
    ensure!(
        mw.rkey() == rkey && !mw.is_bound(),
        "a refused call changed the window"
    );
    for qp in [&p.a, &fresh, &ud, &sends_only] {
        ensure!(qp.outstanding_sends() == 0, "a refused call left a request");
    }
    // Regions for windows have no chunks.
    let e =
        p.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?
            .into_chunks(64)
            .err()
            .ok_or("MW_BIND region split")?;
    ensure!(e.to_string().contains("MW_BIND"), "{e}");
    Ok(())
}

fn a_bound_window_keeps_its_region(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(&mr, 0, 4096, AccessFlags::REMOTE_READ)?.wr_id(1);
    let addr = bind.remote_addr();
    let rkey = p.a.bind_mw(&mut mw, &bind)?;
    one(&mut p)?;
    // The window holds the region: closing it is refused, and dropping the
    // program's handle leaves it registered and readable through the window.
    match mr.close() {
        Err(Error::InUse { .. }) => {}
        other => return Err(format!("close of a bound region: {other:?}").into()),
    }
    let (st, got) = peer_read(&mut p, addr + 3, rkey, 3)?;
    ensure!(
        st == WcStatus::Success && got == [3, 4, 5],
        "{st:?} {got:?}"
    );
    // The window itself is held by nothing else: it closes (and lets go of
    // the region).
    MemoryWindow::close(mw)?;
    Ok(())
}

fn abort_undoes_a_bind(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mr = window_region(&p.pd, 4096)?;
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let rkey = mw.rkey();
    let mut batch = p.a.start_batch()?;
    let new = batch.bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?)?;
    ensure!(mw.rkey() == new && mw.holds_region(), "bind not recorded");
    let back = batch.abort();
    ensure!(back.len() == 1 && back[0].wr_id == 0, "{back:?}");
    ensure!(
        mw.rkey() == rkey && !mw.holds_region() && !mw.is_bound(),
        "abort left rkey {:#x}, region {}",
        mw.rkey(),
        mw.holds_region()
    );
    ensure!(p.a.outstanding_sends() == 0, "requests left");
    // The window binds normally afterwards, with the rkey after the old one.
    let again =
        p.a.bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?)?;
    ensure!(
        again == new,
        "rkey after abort {again:#x}, expected {new:#x}"
    );
    let (wc, _, _) = one(&mut p)?;
    ensure!(wc.is_success(), "{wc:?}");
    ensure!(
        peer_read(&mut p, mr.addr(), again, 8)?.0 == WcStatus::Success,
        "read"
    );
    Ok(())
}

/// The same revocation, the receive read from an extended CQ.
fn send_with_invalidate_seen_through_an_extended_cq(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let mut cq = env.ctx.create_cq_ex(64).imm().qp_num().build()?;
    let attr = QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq())
        .send_ops(SendOpsFlags::for_transport(QpType::Rc));
    let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
    connect(env, &mut a, &mut b, AccessFlags::REMOTE_READ)?;
    let mr = window_region(&pd, 4096)?;
    let mut mw = pd.alloc_mw(MwType::Type2)?;
    let rkey = a.bind_mw(&mut mw, &MwBind::new(&mr, 0, 64, AccessFlags::REMOTE_READ)?)?;
    a.post_recv([RecvWr::new(2).sge(pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?.remove(0))])?;
    b.post_send([SendWr::new(3, SendOp::SendWithInv(rkey)).inline(b"")])?;
    // Three completions: the bind, the send, the receive.
    let (mut seen, mut inv) = (0, None);
    let start = std::time::Instant::now();
    while seen < 3 {
        ensure!(
            start.elapsed() < crate::common::deadline(),
            "{seen} of 3 completions"
        );
        let Some(mut poll) = cq.start_poll()? else {
            continue;
        };
        while let Some(wc) = poll.next()? {
            seen += 1;
            ensure!(wc.is_success(), "{wc:?}");
            if wc.qp_num() == a.qp_num() && wc.opcode() == Ok(WcOpcode::Recv) {
                inv = a.invalidated_rkey(&wc);
            }
            let ended = a.reclaim(&wc, drop) + b.reclaim(&wc, drop);
            ensure!(ended == 1, "{wc:?} ended {ended}");
        }
    }
    ensure!(inv == Some(rkey), "invalidated {inv:?}, rkey {rkey:#x}");
    Ok(())
}

/// A window bound to a region of the program's own buffer registered at
/// iova 0: the window's addresses are offsets; while it is bound the
/// buffer is not handed back (nor the region re-registered), and once the
/// window is closed it is, with the peer's write in it.
fn window_on_a_zero_based_owned_region(env: &Env) -> Result<(), Failed> {
    let mut p = mw_pair(env)?;
    let mut pages = rdma_verbs::Pages::new(8192)?;
    for (i, b) in pages.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let mut mr = p.pd.register_owned_at(pages, access, 0)?;
    ensure!(mr.addr() == 0, "region at {:#x}", mr.addr());
    let mut mw = p.pd.alloc_mw(MwType::Type2)?;
    let bind = MwBind::new(
        &mr,
        1024,
        2048,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    ensure!(
        bind.remote_addr() == 1024,
        "the window starts at {:#x}",
        bind.remote_addr()
    );
    let rkey = bind_done(&mut p, &mut mw, &bind)?;
    let (st, got) = peer_read(&mut p, 1024 + 10, rkey, 4)?;
    let want: Vec<u8> = (1034..1038).map(|i| (i % 251) as u8).collect();
    ensure!(st == WcStatus::Success && got == want, "{st:?} {got:?}");
    ensure!(
        peer_write(&mut p, 2000, rkey, b"window")? == WcStatus::Success,
        "write through the window"
    );
    match mr.rereg_access(AccessFlags::LOCAL_WRITE) {
        Err(Error::InUse { .. }) => {}
        other => return Err(format!("rereg of a region with a bound window: {other:?}").into()),
    }
    let mr = match mr.into_inner() {
        Err(r) if matches!(r.error(), Error::InUse { users: 1, .. }) => r.into_value(),
        Err(r) => return Err(format!("into_inner with a bound window: {}", r.error()).into()),
        Ok(_) => return Err("the buffer came back while a window was bound to it".into()),
    };
    MemoryWindow::close(mw)?;
    let pages = mr.into_inner()?;
    ensure!(
        &pages[2000..2006] == b"window",
        "the write through the window is not in the buffer"
    );
    ensure!(
        pages[2006] == (2006 % 251) as u8,
        "bytes after the write changed"
    );
    Ok(())
}

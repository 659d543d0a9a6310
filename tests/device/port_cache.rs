//! The context's per-port cache behind `QueuePair::modify`'s checks: a warm
//! cache never turns a refusal into a bare errno (refusals re-read the port
//! and the GID entry), and never makes a valid modify fail.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, CompletionQueue, Context, Error, Gid, GidType, Mtu, ProtectionDomain,
};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    refusals_on_port_attributes_stay_typed_with_a_warm_cache,
    a_warm_or_cold_cache_never_fails_a_valid_modify,
    concurrent_setups_on_one_context_all_pass,
];

/// What one loopback RC setup needs.
struct Loop {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    gid_index: u8,
    gid: Gid,
    mtu: Mtu,
    /// The QPN the RTR of every QP names (a QP kept alive here).
    peer: QpNum,
    _peer_qp: Qp<Rc>,
}

/// The GID the connect helper would pick (an IPv4-mapped RoCE v2 one on
/// rxe), or index 0 on a port that needs no GRH.
fn setup(ctx: &Context, port: u8) -> Result<Loop, Failed> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let peer_qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
    let ep = peer_qp.local_endpoint(
        &ConnectOptions {
            port,
            ..Default::default()
        },
        Psn::new(0)?,
    )?;
    let gid_index = ctx
        .gid_table()?
        .iter()
        .find(|e| e.gid == ep.gid && e.port == u32::from(port))
        .map(|e| e.index as u8)
        .unwrap_or(0);
    let mtu = ctx.query_port(port)?.active_mtu;
    Ok(Loop {
        peer: peer_qp.qp_num(),
        pd,
        cq,
        gid_index,
        gid: ep.gid,
        mtu,
        _peer_qp: peer_qp,
    })
}

fn init(port: u8) -> ResetToInit<Rc> {
    ResetToInit::<Rc>::new(0, port, AccessFlags::empty())
}

fn rtr(l: &Loop, av: AddressVector) -> Result<InitToRtr<Rc>, Failed> {
    Ok(InitToRtr::<Rc>::new(
        av,
        l.mtu,
        l.peer,
        Psn::new(0)?,
        1,
        MinRnrTimer::new(12)?,
    ))
}

fn rts() -> Result<RtrToRts<Rc>, Failed> {
    Ok(RtrToRts::<Rc>::new(
        AckTimeout::new(14)?,
        RetryCount::new(7)?,
        RnrRetry::INFINITE,
        Psn::new(0)?,
        1,
    ))
}

fn av(l: &Loop, port: u8) -> AddressVector {
    AddressVector::new(port).global(GlobalRoute::new(l.gid, l.gid_index))
}

/// One QP through RESET -> INIT -> RTR -> RTS, checked against the device.
fn setup_one(l: &Loop, port: u8) -> Result<(), Failed> {
    let mut qp = Qp::<Rc>::new(&l.pd, &l.cq, &l.cq, QpCaps::default())?;
    qp.apply(init(port))?;
    qp.apply(rtr(l, av(l, port))?)?;
    qp.apply(rts()?)?;
    ensure!(
        qp.query_state()? == QpState::Rts,
        "the device does not have the QP in RTS"
    );
    Ok(())
}

/// A `ModifyError::Value` for `flag` whose reason contains `needle`.
fn typed(
    r: rdma_verbs::Result<()>,
    flag: QpAttrMask,
    needle: &str,
    what: &str,
) -> Result<(), Failed> {
    match r {
        Err(Error::Modify(ModifyError::Value { attr, reason, .. }))
            if attr == flag && reason.contains(needle) =>
        {
            eprintln!("port_cache: {what}: {reason}");
            Ok(())
        }
        other => Err(format!(
            "{what}: expected a {flag} value error containing {needle:?}, got {other:?}"
        )
        .into()),
    }
}

/// With the cache warm (a whole setup done on this context, the GID entry
/// in use read), every refusal on a port attribute or GID entry is still
/// the typed error, and a valid modify right after each passes.
fn refusals_on_port_attributes_stay_typed_with_a_warm_cache(env: &Env) -> Result<(), Failed> {
    let port = env.port;
    let l = setup(&env.ctx, port)?;
    setup_one(&l, port)?;
    let pa = env.ctx.query_port(port)?;

    let mut qp = Qp::<Rc>::new(&l.pd, &l.cq, &l.cq, QpCaps::default())?;
    typed(
        qp.apply(ResetToInit::<Rc>::new(
            pa.pkey_tbl_len,
            port,
            AccessFlags::empty(),
        )),
        QpAttrMask::PKEY_INDEX,
        "outside port",
        "P_Key index past the table",
    )?;
    ensure!(
        qp.state() == QpState::Reset && qp.query_state()? == QpState::Reset,
        "moved"
    );
    qp.apply(init(port))?;

    if pa.gid_tbl_len <= 255 {
        let past = AddressVector::new(port).global(GlobalRoute::new(l.gid, pa.gid_tbl_len as u8));
        typed(
            qp.apply(rtr(&l, past)?),
            QpAttrMask::AV,
            "outside port",
            "sgid_index past the GID table",
        )?;
    }
    if let Ok(empty) = crate::common::empty_gid_index(env, 256) {
        // Read once as empty, then asked again: both refusals typed.
        for _ in 0..2 {
            let e = AddressVector::new(port).global(GlobalRoute::new(l.gid, empty as u8));
            typed(
                qp.apply(rtr(&l, e)?),
                QpAttrMask::AV,
                "empty",
                "an empty GID entry",
            )?;
        }
    }
    if pa.grh_required() {
        typed(
            qp.apply(rtr(&l, AddressVector::new(port))?),
            QpAttrMask::AV,
            "needs a GRH",
            "no GRH on a port that needs one",
        )?;
    }
    // The cached entry of the GID in use fits an IPv4 (or IPv6) dgid; a
    // dgid of the other family must be refused after a fresh read.
    let entry = env.ctx.query_gid_entry(port, l.gid_index.into())?;
    if entry.gid_type == Some(GidType::RoceV2) {
        let other: Gid = if entry.gid.as_ipv6().to_ipv4_mapped().is_some() {
            "fe80::1".parse().map_err(|_| "parse")?
        } else {
            "::ffff:10.1.2.3".parse().map_err(|_| "parse")?
        };
        let wrong = AddressVector::new(port).global(GlobalRoute::new(other, l.gid_index));
        typed(
            qp.apply(rtr(&l, wrong)?),
            QpAttrMask::AV,
            "cannot reach",
            "a cached RoCE v2 GID of the other family",
        )?;
    }
    ensure!(
        qp.state() == QpState::Init && qp.query_state()? == QpState::Init,
        "moved"
    );
    // And the valid modify after all those refusals.
    qp.apply(rtr(&l, av(&l, port))?)?;
    qp.apply(rts()?)?;
    ensure!(qp.query_state()? == QpState::Rts, "not in RTS");
    Ok(())
}

/// A cold cache (a context just opened), a cache refreshed by the user's
/// queries, and a cache warmed by refusals: valid setups pass each time.
fn a_warm_or_cold_cache_never_fails_a_valid_modify(env: &Env) -> Result<(), Failed> {
    let port = env.port;
    // Cold: a second context, nothing read yet on it but what setup reads;
    // its first modify is the one that fills the cache.
    let cold = Context::open(env.ctx.name())?;
    {
        let pd = cold.alloc_pd()?;
        let cq = cold.create_cq(16)?;
        let mut qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
        qp.apply(init(port))?;
    }
    let l = setup(&cold, port)?;
    setup_one(&l, port)?;
    // Refreshed by the user's queries in between.
    for _ in 0..3 {
        cold.query_port(port)?;
        cold.gid_table()?;
        cold.query_gid(port, l.gid_index.into())?;
        setup_one(&l, port)?;
    }
    // After refusals (which re-read the port and the entry).
    let mut qp = Qp::<Rc>::new(&l.pd, &l.cq, &l.cq, QpCaps::default())?;
    let len = cold.query_port(port)?.pkey_tbl_len;
    ensure!(
        qp.apply(ResetToInit::<Rc>::new(len, port, AccessFlags::empty()))
            .is_err(),
        "a P_Key index past the table was accepted"
    );
    qp.apply(init(port))?;
    qp.apply(rtr(&l, av(&l, port))?)?;
    qp.apply(rts()?)?;
    // Many in a row on the warm cache.
    for _ in 0..20 {
        setup_one(&l, port)?;
    }
    Ok(())
}

/// The cache is shared by every thread using the context: four threads
/// setting QPs up at once (one filling it while others read it) all pass.
fn concurrent_setups_on_one_context_all_pass(env: &Env) -> Result<(), Failed> {
    let port = env.port;
    // A fresh context, so that the threads race to fill its cache.
    let ctx = Context::open(env.ctx.name())?;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let ctx = &ctx;
                s.spawn(move || -> Result<(), String> {
                    let run = || -> Result<(), Failed> {
                        let pd = ctx.alloc_pd()?;
                        let cq = ctx.create_cq(16)?;
                        let mut qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
                        qp.apply(init(port))?;
                        drop(qp);
                        let l = setup(ctx, port)?;
                        for _ in 0..10 {
                            setup_one(&l, port)?;
                        }
                        Ok(())
                    };
                    run().map_err(|e| format!("{e:?}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(())
}

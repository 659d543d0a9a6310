//! The context's cached endpoint facts (the default GID pick, the LID):
//! the documented path (`local_endpoint`, `connect` with the default
//! `ConnectOptions`) gives what a fresh read gives. That it never hands
//! out a GID that has left the port's table is `tests/gid_change.rs`
//! (a test binary of its own: it adds a device and changes addresses).

use libtest_mimic::Failed;
use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn};
use rdma_verbs::{Context, Gid, GidEntry, GidType, QpInitAttr, QpState, QpType, QueuePair};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![cached_endpoints_match_a_fresh_read,];

/// The default pick, as the docs state it, from a table read fresh: the
/// first RoCE v2 GID of `port`, an IPv4-mapped one if there is one.
pub fn expected_pick(table: &[GidEntry], port: u8) -> Option<Gid> {
    let v2: Vec<&GidEntry> = table
        .iter()
        .filter(|e| {
            e.port == u32::from(port) && e.gid_type == Some(GidType::RoceV2) && e.index < 256
        })
        .collect();
    v2.iter()
        .find(|e| e.gid.as_ipv6().to_ipv4_mapped().is_some())
        .or(v2.first())
        .map(|e| e.gid)
}

/// What a fresh read says `qp`'s endpoint on `port` is: the LID from a
/// port query (0 on RoCE) and the pick from the whole table, read on a
/// context of its own (so that nothing of `qp`'s context is refreshed).
fn fresh_endpoint(name: &str, port: u8, qp: &QueuePair, psn: Psn) -> Result<Endpoint, Failed> {
    let ctx = Context::open(name)?;
    let pa = ctx.query_port(port)?;
    let gid = if pa.grh_required() {
        expected_pick(&ctx.gid_table()?, port).ok_or("no RoCE v2 GID")?
    } else {
        Gid::ZERO
    };
    Ok(Endpoint {
        lid: if pa.is_roce() { 0 } else { pa.lid },
        qpn: qp.qp_num(),
        psn,
        gid,
    })
}

pub fn rc_qp(ctx: &Context) -> Result<(QueuePair, QueuePair), Failed> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    Ok((a, b))
}

/// Connects `a` and `b` the documented way and checks both reached RTS.
pub fn connect_documented(a: &mut QueuePair, b: &mut QueuePair, port: u8) -> Result<(), Failed> {
    let o = ConnectOptions {
        port,
        ..Default::default()
    };
    let psn = Psn::new(7)?;
    let (ea, eb) = (a.local_endpoint(&o, psn)?, b.local_endpoint(&o, psn)?);
    a.connect(&o, psn, &eb)?;
    b.connect(&o, psn, &ea)?;
    ensure!(
        a.query_state()? == QpState::Rts && b.query_state()? == QpState::Rts,
        "not in RTS"
    );
    Ok(())
}

/// A cold context, the same context warm, after `gid_table` and
/// `query_port` refreshed it, and an explicit GID index: each endpoint is
/// the one a fresh read gives, and connecting on the cached pick works.
fn cached_endpoints_match_a_fresh_read(env: &Env) -> Result<(), Failed> {
    let (name, port) = (env.ctx.name().to_owned(), env.port);
    let ctx = Context::open(&name)?;
    let (mut a, mut b) = rc_qp(&ctx)?;
    let o = ConnectOptions {
        port,
        ..Default::default()
    };
    let psn = Psn::new(0x123)?;
    for round in ["cold", "warm", "warm again"] {
        let got = a.local_endpoint(&o, psn)?;
        let want = fresh_endpoint(&name, port, &a, psn)?;
        ensure!(
            got == want,
            "{round}: {got} from the cache, {want} read fresh"
        );
    }
    ctx.gid_table()?;
    ctx.query_port(port)?;
    let got = a.local_endpoint(&o, psn)?;
    let want = fresh_endpoint(&name, port, &a, psn)?;
    ensure!(got == want, "refreshed: {got}, fresh {want}");
    // An explicit index: the entry read now.
    let table = ctx.gid_table()?;
    if let Some(e) = table.iter().find(|e| e.port == u32::from(port)) {
        let o1 = ConnectOptions {
            gid_index: Some(e.index as u8),
            ..o
        };
        let got = a.local_endpoint(&o1, psn)?;
        ensure!(
            got.gid == e.gid,
            "index {}: {} for {}",
            e.index,
            got.gid,
            e.gid
        );
    }
    connect_documented(&mut a, &mut b, port)
}

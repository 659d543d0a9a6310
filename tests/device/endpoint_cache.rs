//! The context's cached endpoint facts (the default GID pick, the LID):
//! the documented path (`local_endpoint`, `connect` with the default
//! `ConnectOptions`) gives what a fresh read gives, and never hands out a
//! GID that has left the port's table.

use std::process::Command;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn};
use rdma_verbs::{Context, Gid, GidEntry, GidType, QpInitAttr, QpState, QpType, QueuePair};

use crate::common::{deadline, Env, TestFn};

pub const TESTS: &[(&str, TestFn)] = &[
    (
        "endpoint_cache::cached_endpoints_match_a_fresh_read",
        cached_matches_fresh,
    ),
    (
        "endpoint_cache::a_gid_gone_from_the_table_is_never_handed_out",
        gid_gone,
    ),
];

/// The default pick, as the docs state it, from a table read fresh: the
/// first RoCE v2 GID of `port`, an IPv4-mapped one if there is one.
fn expected_pick(table: &[GidEntry], port: u8) -> Option<Gid> {
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
        qpn: rdma_verbs::qp::QpNum::new(qp.qp_num())?,
        psn,
        gid,
    })
}

fn rc_qp(ctx: &Context) -> Result<(QueuePair, QueuePair), Failed> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let a = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    Ok((a, b))
}

/// Connects `a` and `b` the documented way and checks both reached RTS.
fn connect_documented(a: &mut QueuePair, b: &mut QueuePair, port: u8) -> Result<(), Failed> {
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
fn cached_matches_fresh(env: &Env) -> Result<(), Failed> {
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

/// Runs `ip ARGS` or `rdma ARGS`, failing with its output.
fn run(cmd: &str, args: &[&str]) -> Result<(), Failed> {
    let out = Command::new(cmd).args(args).output()?;
    ensure!(
        out.status.success(),
        "{cmd} {}: {:?}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A soft-RoCE device of this test's own, on a veth pair of its own, so
/// that changing its addresses disturbs no other test: removed on drop.
struct OwnDevice;

const DEV: &str = "rxegidtest";
const NETDEV: &str = "vgidtest0";

impl OwnDevice {
    fn add() -> Result<(OwnDevice, Context), Failed> {
        // Left over from an interrupted run: removed first (errors ignored).
        let _ = Command::new("rdma").args(["link", "delete", DEV]).output();
        let _ = Command::new("ip").args(["link", "del", NETDEV]).output();
        run(
            "ip",
            &[
                "link",
                "add",
                NETDEV,
                "type",
                "veth",
                "peer",
                "name",
                "vgidtest1",
            ],
        )?;
        let guard = OwnDevice;
        run("ip", &["link", "set", "vgidtest1", "up"])?;
        run("ip", &["link", "set", NETDEV, "up"])?;
        run("ip", &["addr", "add", "10.98.7.1/24", "dev", NETDEV])?;
        run(
            "rdma",
            &["link", "add", DEV, "type", "rxe", "netdev", NETDEV],
        )?;
        let ctx = Context::open(DEV)?;
        wait_for(&ctx, "port 1 active", |c| {
            Ok(c.query_port(1)?.state == rdma_verbs::PortState::Active)
        })?;
        Ok((guard, ctx))
    }
}

impl Drop for OwnDevice {
    fn drop(&mut self) {
        // Every context of the device is closed by now (they are dropped
        // first): rxe's removal waits for them.
        let _ = Command::new("rdma").args(["link", "delete", DEV]).output();
        let _ = Command::new("ip").args(["link", "del", NETDEV]).output();
    }
}

/// Waits until `cond` holds on `ctx`, within the test deadline.
fn wait_for(
    ctx: &Context,
    what: &str,
    cond: impl Fn(&Context) -> Result<bool, Failed>,
) -> Result<(), Failed> {
    let start = Instant::now();
    while !cond(ctx)? {
        ensure!(start.elapsed() < deadline(), "waited too long for {what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}

/// Whether the port-1 table read on `ctx` lists `gid`.
fn listed(ctx: &Context, gid: Gid) -> Result<bool, Failed> {
    Ok(ctx.gid_table()?.iter().any(|e| e.port == 1 && e.gid == gid))
}

/// On a device of its own: the endpoint's GID is cached (the pick of an
/// IPv4 address), then the address leaves the network device, another
/// one takes its place (and, likely, its table entry), and that one
/// leaves too. After each change, once the table (read on a second
/// context, so that the first one's cache is not refreshed) shows it,
/// `local_endpoint` hands out what a fresh read picks, never the GID that
/// is gone; and the documented connect works on the new pick.
fn gid_gone(_env: &Env) -> Result<(), Failed> {
    if std::env::var_os("RDMA_VERBS_VM").is_none() {
        eprintln!("endpoint_cache: adds a device and changes addresses: runs in the VM only");
        return Ok(());
    }
    let (guard, ctx) = OwnDevice::add()?;
    let result = attack(&ctx);
    drop(ctx);
    drop(guard);
    result
}

fn attack(ctx: &Context) -> Result<(), Failed> {
    let observer = Context::open(DEV)?;
    let first: Gid = "::ffff:10.98.7.1".parse().map_err(|_| "parse")?;
    let second: Gid = "::ffff:10.98.7.2".parse().map_err(|_| "parse")?;
    wait_for(&observer, "the IPv4 GID", |c| listed(c, first))?;
    let (mut a, mut b) = rc_qp(ctx)?;
    let o = ConnectOptions::default();
    let psn = Psn::new(1)?;
    for _ in 0..2 {
        let ep = a.local_endpoint(&o, psn)?;
        ensure!(ep.gid == first, "picked {}, not {first}", ep.gid);
    }
    // The address is replaced: its entry is emptied, probably reused.
    run("ip", &["addr", "del", "10.98.7.1/24", "dev", NETDEV])?;
    run("ip", &["addr", "add", "10.98.7.2/24", "dev", NETDEV])?;
    wait_for(&observer, "the GID change", |c| {
        Ok(!listed(c, first)? && listed(c, second)?)
    })?;
    let ep = a.local_endpoint(&o, psn)?;
    ensure!(ep.gid != first, "handed out {first}, which left the table");
    let want = expected_pick(&observer.gid_table()?, 1).ok_or("no RoCE v2 GID")?;
    ensure!(
        ep.gid == want,
        "handed out {}, a fresh read picks {want}",
        ep.gid
    );
    // No IPv4 address at all: the IPv6 link-local GID.
    run("ip", &["addr", "del", "10.98.7.2/24", "dev", NETDEV])?;
    wait_for(&observer, "the GID removal", |c| Ok(!listed(c, second)?))?;
    let ep = a.local_endpoint(&o, psn)?;
    ensure!(
        ep.gid != second,
        "handed out {second}, which left the table"
    );
    let want = expected_pick(&observer.gid_table()?, 1).ok_or("no RoCE v2 GID")?;
    ensure!(
        ep.gid == want,
        "handed out {}, a fresh read picks {want}",
        ep.gid
    );
    connect_documented(&mut a, &mut b, 1)
}

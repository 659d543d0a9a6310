//! The context's cached default GID pick is kept true: `local_endpoint`
//! never hands out a GID that has left the port's table. A test binary of
//! its own, run alone: it adds a soft-RoCE device and a veth pair and
//! changes their addresses, which must not meet other tests' connection
//! manager listeners (a wildcard listen covers every device). Runs in the
//! soft-RoCE VM only (`RDMA_VERBS_VM`); elsewhere it passes without
//! touching the network, saying so.

#[path = "common/mod.rs"]
#[macro_use]
mod common;
#[path = "device/endpoint_cache.rs"]
#[allow(dead_code)]
mod endpoint_cache;

use std::process::Command;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::{ConnectOptions, Psn};
use rdma_verbs::{Context, Gid};

use common::{deadline, Env, Test};
use endpoint_cache::{connect_documented, expected_pick, rc_qp};

const TESTS: &[Test] = tests![a_gid_gone_from_the_table_is_never_handed_out,];

fn main() -> std::process::ExitCode {
    common::run("gid_change", TESTS)
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
/// is gone; and the documented connect works on the second address.
fn a_gid_gone_from_the_table_is_never_handed_out(_env: &Env) -> Result<(), Failed> {
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
    // The documented connect works on the new pick (the new IPv4 address;
    // not on the link-local GID below: connecting through it once failed
    // with ETIMEDOUT at RTR, rxe's address resolution of a link-local
    // address on a veth, which is no part of what is tested here).
    connect_documented(&mut a, &mut b, 1)?;
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
    Ok(())
}

//! Faults across two hosts (`.ci/vm hosts tests`): each test runs in both
//! VMs at once, VM 1 as the server and VM 2 as the client, over TCP and
//! RDMA across the virtual link, and each side reports the chunks it posted
//! and the chunks that came back (equal, or the test fails).
//!
//! Each test runs in a process of its own on each side (see `main`); the
//! receiving peer of two of them is a child process (`hosts/peer.rs`).
//!
//! Outside a two-host run (no `RDMA_VERBS_PEER`) every test reports itself
//! ignored, saying why; with `RDMA_VERBS_REQUIRE_HOSTS=1` it fails instead.
//! `.ci/vm test` leaves this binary out: `.ci/vm hosts tests` runs it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};

use rdma_verbs::qp::{
    AckTimeout, ConnectOptions, Endpoint, Psn, RecvWr, RetryCount, SendOp, SendWr,
};
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Context, PortState, ProtectionDomain, QpCaps, QpInitAttr,
    QpType, QueuePair, WorkCompletion,
};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+).into());
        }
    };
}

// `tests!`, where the binaries that include all of `tests/common` have it.
#[macro_use]
#[path = "common/registry.rs"]
pub mod registry;
mod common {
    pub use super::registry;
}
use registry::Test;

#[path = "hosts/cm.rs"]
mod cm;
#[path = "hosts/peer.rs"]
mod peer;

/// This side of the run: from `.ci/hosts-guest`'s environment.
pub struct Side {
    server: bool,
    /// This VM's address on the link.
    me: String,
    peer: String,
    netdev: String,
}

pub type TestFn = fn(&Side) -> Result<(), Failed>;

const TESTS: &[Test] = tests![
    link_down_during_traffic_then_reconnect,
    different_mtus_never_hang_and_negotiate,
    cm::link_down_disconnect_then_reconnect,
    peer::killed_mid_transfer_then_reconnect,
    cm::peer_device_removed_and_readded,
    // Last: its server side removes rxe0 for a while.
    cm::silent_peer_cm_timeouts_are_typed,
];

fn main() -> ExitCode {
    if let Ok(role) = std::env::var(peer::CHILD_ENV) {
        return peer::child(&role);
    }
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let side = match (
        std::env::var("RDMA_VERBS_HOST"),
        std::env::var("RDMA_VERBS_PEER"),
    ) {
        (Ok(h), Ok(peer)) => Some(Side {
            server: h == "1",
            me: std::env::var("RDMA_VERBS_SELF").unwrap_or_default(),
            peer,
            netdev: std::env::var("RDMA_VERBS_NETDEV").unwrap_or_default(),
        }),
        _ => None,
    };
    let required = std::env::var("RDMA_VERBS_REQUIRE_HOSTS").as_deref() == Ok("1");
    if side.is_none() {
        eprintln!("hosts: SKIPPED: not in a two-host run (.ci/vm hosts tests runs these)");
    }
    // In a two-host run each test runs in a process of its own (this
    // executable again, ONE_ENV set): librdmacm keeps a device's context
    // open for the life of a process that used the CM on it, and rxe's
    // removal waits for every such context, so a test that removes rxe0
    // needs processes that have not touched it.
    let alone = std::env::var_os(ONE_ENV).is_some();
    let side = std::sync::Arc::new(side);
    let trials = TESTS
        .iter()
        .map(|t| {
            let (name, f) = (t.name(), t.f);
            let skip = side.is_none() && !required;
            let side = side.clone();
            Trial::test(name, move || match side.as_ref() {
                Some(s) if alone => f(s),
                Some(_) => in_own_process(name),
                None => {
                    Err("not in a two-host run, which RDMA_VERBS_REQUIRE_HOSTS=1 asks for".into())
                }
            })
            .with_ignored_flag(skip)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Set for the process that runs one test (see `main`).
const ONE_ENV: &str = "RDMA_VERBS_HOSTS_ONE";

/// Runs test `name` in a new process of this executable; its output goes
/// where this one's goes.
fn in_own_process(name: &str) -> Result<(), Failed> {
    let st = Command::new(std::env::current_exe()?)
        .args(["--exact", name, "--test-threads=1", "--quiet"])
        .env(ONE_ENV, "1")
        .status()?;
    ensure!(st.success(), "{name}: {st}");
    Ok(())
}

/// 20 s, times `RDMA_VERBS_TIME_SCALE`.
fn deadline() -> Duration {
    let f: f64 = std::env::var("RDMA_VERBS_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&f: &f64| f > 0.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(20.0 * f)
}

/// The TCP connection of one test: the server listens on `port`, the
/// client connects, retrying until the deadline. A read waits at most 12
/// deadlines (the longest wait of a test is the CM giving up on its REQs: 102 s
/// in a quiet run).
fn tcp(side: &Side, port: u16) -> Result<TcpStream, Failed> {
    let s = tcp_connection(side, port)?;
    s.set_read_timeout(Some(deadline() * 12))?;
    Ok(s)
}

fn tcp_connection(side: &Side, port: u16) -> Result<TcpStream, Failed> {
    if side.server {
        let l = TcpListener::bind(("0.0.0.0", port))?;
        return Ok(l.accept()?.0);
    }
    let end = Instant::now() + deadline() * 3;
    loop {
        match TcpStream::connect((side.peer.as_str(), port)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("cannot connect to {}:{port}: {e}", side.peer).into()),
        }
    }
}

/// One RC QP on rxe0 and what it needs; fast failure on a dead link
/// (ACK timeout about 16 ms, 2 retries).
struct Rc {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    opts: ConnectOptions,
    posted: usize,
    returned: usize,
    failed: usize,
}

impl Rc {
    /// A QP of its own on a context of rxe0 opened here.
    fn new() -> Result<Rc, Failed> {
        Rc::on(Context::open("rxe0")?, |pd, attr| Ok(pd.create_qp(attr)?))
    }

    /// The PD, the CQ and the QP `make` creates on `ctx`.
    fn on(
        ctx: Context,
        make: impl FnOnce(&ProtectionDomain, &QpInitAttr<'_>) -> Result<QueuePair, Failed>,
    ) -> Result<Rc, Failed> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(256)?;
        let qp = make(&pd, &Rc::attr(&cq))?;
        let opts = ConnectOptions {
            gid_index: Some(1),
            timeout: AckTimeout::new(12)?,
            retry_cnt: RetryCount::new(2)?,
            ..ConnectOptions::default()
        };
        Ok(Rc {
            ctx,
            pd,
            cq,
            qp,
            opts,
            posted: 0,
            returned: 0,
            failed: 0,
        })
    }

    fn attr(cq: &CompletionQueue) -> QpInitAttr<'_> {
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            ..QpCaps::default()
        };
        QpInitAttr::new(QpType::Rc, cq, cq).caps(caps)
    }

    /// Connects to the other side's QP: endpoints exchanged over `tcp`.
    fn connect(&mut self, tcp: &mut TcpStream, psn: u32) -> Result<(), Failed> {
        let psn = Psn::new(psn)?;
        let me = self.qp.local_endpoint(&self.opts, psn)?;
        tcp.write_all(&me.to_wire())?;
        let mut theirs = [0u8; Endpoint::WIRE_LEN];
        tcp.read_exact(&mut theirs)?;
        self.qp
            .connect(&self.opts, psn, &Endpoint::from_wire(&theirs)?)?;
        Ok(())
    }

    fn chunks(&self, n: usize) -> Result<Vec<Chunk>, Failed> {
        Ok(self.pd.alloc_chunks(n, 4096, AccessFlags::LOCAL_WRITE)?)
    }

    fn post_sends(&mut self, n: usize) -> Result<(), Failed> {
        self.post_sends_of(n, 64)
    }

    /// `n` sends of `len` bytes each (from chunks of 4096).
    fn post_sends_of(&mut self, n: usize, len: usize) -> Result<(), Failed> {
        for (i, c) in self.chunks(n)?.into_iter().enumerate() {
            self.qp
                .post_send([SendWr::new(i as u64, SendOp::Send).sge_len(c, len)])?;
            self.posted += 1;
        }
        Ok(())
    }

    fn post_recvs(&mut self, n: usize) -> Result<(), Failed> {
        let wrs: Vec<RecvWr> = self
            .chunks(n)?
            .into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect();
        self.qp.post_recv(wrs)?;
        self.posted += n;
        Ok(())
    }

    /// One poll of the CQ, each completion reclaimed (its chunks counted
    /// back): how many succeeded and how many failed.
    fn poll_once(&mut self) -> Result<(usize, usize), Failed> {
        let mut wcs = [WorkCompletion::default(); 32];
        let (mut ok, mut bad) = (0, 0);
        for wc in self.cq.poll(&mut wcs)?.iter() {
            if wc.is_success() {
                ok += 1;
            } else {
                bad += 1;
            }
            let (returned, qp) = (&mut self.returned, &mut self.qp);
            qp.reclaim(wc, |done| *returned += done.chunks().count());
        }
        self.failed += bad;
        Ok((ok, bad))
    }

    /// Polls until `n` completions came (or the deadline), reclaiming each;
    /// counts the chunks back and the failed completions. Returns how many
    /// succeeded.
    fn reap(&mut self, n: usize) -> Result<usize, Failed> {
        let end = Instant::now() + deadline();
        let (mut seen, mut succeeded) = (0, 0);
        while seen < n {
            ensure!(
                Instant::now() < end,
                "{seen} of {n} completions within {:?}",
                deadline()
            );
            let (ok, bad) = self.poll_once()?;
            (seen, succeeded) = (seen + ok + bad, succeeded + ok);
        }
        Ok(succeeded)
    }

    /// Streams 64-byte sends, up to 32 in flight, until one fails (or
    /// `max` went through: an error); then waits for the rest, which the
    /// failure flushes. Returns how many were delivered.
    fn stream_until_failure(&mut self, max: usize) -> Result<usize, Failed> {
        let end = Instant::now() + deadline() * 3;
        let (mut delivered, mut in_flight, before) = (0, 0, self.failed);
        while self.failed == before {
            ensure!(
                delivered < max && Instant::now() < end,
                "{delivered} sends delivered and none failed"
            );
            if in_flight <= 16 {
                self.post_sends(16)?;
                in_flight += 16;
            }
            let (ok, bad) = self.poll_once()?;
            (delivered, in_flight) = (delivered + ok, in_flight - ok - bad);
            if ok + bad == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(delivered + self.reap(in_flight)?)
    }

    /// Receives, each reposted as it completes, until `stop` says so (it
    /// sees how many came so far); polls gently (this VM has one CPU).
    fn sink(
        &mut self,
        mut stop: impl FnMut(usize) -> Result<bool, Failed>,
    ) -> Result<usize, Failed> {
        let mut received = 0;
        while !stop(received)? {
            let (ok, _) = self.poll_once()?;
            if ok > 0 {
                self.post_recvs(ok)?;
                received += ok;
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(received)
    }

    /// RESET: every request still held comes back; completions of them
    /// still in the CQ are polled away (they end nothing now, and count as
    /// no failure).
    fn reset(&mut self) -> Result<(), Failed> {
        for done in self.qp.reset()? {
            self.returned += done.chunks().count();
        }
        let failed = self.failed;
        while self.poll_once()? != (0, 0) {}
        self.failed = failed;
        Ok(())
    }

    /// 20 sends go through; with `netdev` down 10 more fail (retry
    /// exceeded, the rest flushed) and come back; the link goes up again
    /// and rxe0's port is active once more.
    fn sends_across_a_link_flap(&mut self, netdev: &str) -> Result<(), Failed> {
        self.post_sends(20)?;
        ensure!(
            self.reap(20)? == 20,
            "sends failed before the link went down"
        );
        ip_link(netdev, &["down"])?;
        self.post_sends(10)?;
        let delivered = self.reap(10)?;
        ensure!(
            delivered == 0,
            "{delivered} of 10 sends on a dead link went through"
        );
        ip_link(netdev, &["up"])?;
        rxe0_active()
    }

    /// Chunks posted, chunks back, failed completions.
    fn counts(&self) -> (usize, usize, usize) {
        (self.posted, self.returned, self.failed)
    }

    /// Adds the [`counts`](Self::counts) of a QP this one took over from.
    fn carry(&mut self, (posted, returned, failed): (usize, usize, usize)) {
        self.posted += posted;
        self.returned += returned;
        self.failed += failed;
    }

    /// Prints what this side posted and got back; they must be equal.
    fn report(&self, side: &Side, test: &str, what: &str) -> Result<(), Failed> {
        let role = if side.server { "server" } else { "client" };
        let what = if what.is_empty() {
            String::new()
        } else {
            format!("{what}: ")
        };
        eprintln!(
            "hosts: {test} ({role}): {what}posted {} chunks, {} came back ({} completions failed)",
            self.posted, self.returned, self.failed
        );
        ensure!(
            self.posted == self.returned,
            "posted {} chunks, {} came back",
            self.posted,
            self.returned
        );
        Ok(())
    }
}

/// Waits until rxe0 exists and its port is active (after a link up or
/// an `rdma link add`).
fn rxe0_active() -> Result<(), Failed> {
    wait_until("rxe0 active", || {
        Ok(Context::open("rxe0")
            .ok()
            .map(|ctx| ctx.query_port(1))
            .transpose()?
            .is_some_and(|p| p.state == PortState::Active))
    })
}

/// Polls `done` every 100 ms until it says yes; an error once the
/// deadline has passed.
fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool, Failed>) -> Result<(), Failed> {
    let end = Instant::now() + deadline();
    while !done()? {
        ensure!(Instant::now() < end, "{what}: not within {:?}", deadline());
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Runs a command to its end: it must succeed.
fn run(cmd: &mut Command) -> Result<(), Failed> {
    let st = cmd.status()?;
    ensure!(st.success(), "{cmd:?}: {st}");
    Ok(())
}

/// `ip link set NETDEV ARGS...` on this side's link.
fn ip_link(netdev: &str, args: &[&str]) -> Result<(), Failed> {
    run(Command::new("ip").args(["link", "set", netdev]).args(args))
}

/// One line from `tcp`, read a byte at a time (what follows it, an
/// endpoint record, stays in the stream).
fn line(tcp: &mut TcpStream) -> Result<String, Failed> {
    let mut s = Vec::new();
    let mut b = [0u8; 1];
    while s.len() < 256 {
        tcp.read_exact(&mut b)?;
        if b[0] == b'\n' {
            break;
        }
        s.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&s).into_owned())
}

/// Link down during traffic: the client's sends fail (retry exceeded, then
/// flushed), every chunk comes back; with the link up again both sides
/// reset their QP (handing back what it held), reconnect, and 20 messages
/// go through. Each side's posted and returned chunks must be equal.
fn link_down_during_traffic_then_reconnect(side: &Side) -> Result<(), Failed> {
    let mut tcp = tcp(side, 18_600)?;
    let mut rc = Rc::new()?;
    if side.server {
        // Receives after the connect (a QP in RESET takes none); a send
        // that comes first meets RNR NAKs and is retried.
        rc.connect(&mut tcp, 0x1000)?;
        rc.post_recvs(64)?;
        ensure!(
            line(&mut tcp)? == "RECONNECT",
            "the client did not ask to reconnect"
        );
        rc.reap(20)?; // phase 1's receives
        rc.reset()?;
        rc.connect(&mut tcp, 0x2000)?;
        rc.post_recvs(64)?;
        ensure!(line(&mut tcp)? == "DONE", "the client did not finish");
        rc.reap(20)?;
        rc.reset()?;
    } else {
        rc.connect(&mut tcp, 0x3000)?;
        rc.sends_across_a_link_flap(&side.netdev)?;
        let lost = rc.failed;
        rc.reset()?;
        tcp.write_all(b"RECONNECT\n")?;
        rc.connect(&mut tcp, 0x4000)?;
        rc.post_sends(20)?;
        rc.reap(20)?;
        ensure!(
            rc.failed == lost,
            "{} sends failed after the reconnect",
            rc.failed - lost
        );
        tcp.write_all(b"DONE\n")?;
    }
    rc.report(side, "link down", "")
}

/// The server's NIC keeps MTU 1500 (rxe: 1024-byte packets), the client's
/// gets 4500 (4096). Connected each with its own port's MTU, the client's
/// 3000-byte sends travel as one 3000-byte packet: each completes within
/// the deadline, delivered or failed (it says which), every chunk back,
/// never a hang. With the smaller of the two MTUs (exchanged over TCP, as
/// an application does: the endpoint record has no MTU) 3000-byte sends go
/// both ways.
fn different_mtus_never_hang_and_negotiate(side: &Side) -> Result<(), Failed> {
    let mut tcp = tcp(side, 18_601)?;
    let mine = if side.server { 1500 } else { 4500 };
    ip_link(&side.netdev, &["mtu", &mine.to_string()])?;
    rxe0_active()?;
    let mut rc = Rc::new()?;
    let active = rc.ctx.query_port(1)?.active_mtu;
    tcp.write_all(&active.bytes().to_be_bytes())?;
    let mut theirs = [0u8; 4];
    tcp.read_exact(&mut theirs)?;
    let theirs = u32::from_be_bytes(theirs);
    ensure!(
        active.bytes() != theirs,
        "both ports have MTU {theirs}: the NIC MTUs did not differ"
    );
    // Each side's own MTU.
    rc.connect(&mut tcp, 0x5000)?;
    if side.server {
        rc.post_recvs(8)?;
    }
    let mut first = "";
    if !side.server {
        // Each completes, within the deadline: failed (the larger packets
        // dropped: retry exceeded) or delivered (this NIC and rxe take
        // them); never a hang.
        rc.post_sends_of(4, 3000)?;
        rc.reap(4)?;
        first = match rc.failed {
            0 => "delivered",
            4 => "failed",
            n => return Err(format!("{n} of 4 sends at the larger MTU failed").into()),
        };
        tcp.write_all(b"NEGOTIATE\n")?;
    } else {
        ensure!(line(&mut tcp)? == "NEGOTIATE", "the client did not go on");
    }
    rc.reset()?;
    // The smaller of the two.
    let agreed = rdma_verbs::Mtu::from_bytes(active.bytes().min(theirs)).ok_or("no common MTU")?;
    rc.opts.path_mtu = Some(agreed);
    rc.connect(&mut tcp, 0x6000)?;
    rc.post_recvs(8)?;
    let before = rc.failed;
    rc.post_sends_of(4, 3000)?;
    rc.reap(8)?; // its 4 sends and the peer's 4
    ensure!(
        rc.failed == before,
        "{} sends or receives failed at MTU {}",
        rc.failed - before,
        agreed.bytes()
    );
    tcp.write_all(b"DONE\n")?;
    ensure!(line(&mut tcp)? == "DONE", "the other side did not finish");
    rc.reset()?;
    ip_link(&side.netdev, &["mtu", "1500"])?;
    let sent = match first {
        "" => String::new(),
        f => format!(" (3000-byte sends at {} {f})", active.bytes()),
    };
    let what = format!(
        "port MTU {} against {theirs}{sent}, agreed {}",
        active.bytes(),
        agreed.bytes()
    );
    rc.report(side, "MTUs", &what)
}

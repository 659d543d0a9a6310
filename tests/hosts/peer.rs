//! The peer process killed mid-transfer: VM 1's test runs the receiving
//! peer as a child process (this same executable, [`CHILD_ENV`] set) and
//! kills it with SIGKILL while VM 2's client streams sends to it; then a
//! new child takes its place, and the client connects again.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, EventChannel};

use super::cm::{accept, close, connect, listen};
use super::{deadline, Side};

/// Set in a child's environment: run as the receiving peer, not as tests.
pub const CHILD_ENV: &str = "RDMA_VERBS_HOSTS_CHILD";
const PORT: u16 = 18_620;
/// The port of `peer_device_removed_and_readded`.
pub const REMOVAL_PORT: u16 = 18_630;

/// A child's body: listens on its port, accepts one connection, receives
/// (printing `received N` every 20) until the client disconnects (role
/// `sink` on [`PORT`], `sink_removal` on [`REMOVAL_PORT`]) or rxe0 is being removed (role `removal`, port
/// [`REMOVAL_PORT`]: the CM's `DeviceRemoval`), resets and prints its
/// chunk counts (`child: posted P returned R`), and exits: on rxe a
/// process that used the CM on a device holds it until it exits.
pub fn child(role: &str) -> ExitCode {
    let side = Side {
        server: true,
        me: std::env::var("RDMA_VERBS_SELF").unwrap_or_default(),
        peer: String::new(),
        netdev: String::new(),
    };
    let run = || -> Result<(), Failed> {
        let (port, end) = match role {
            "sink" => (PORT, CmEventKind::Disconnected),
            "sink_removal" => (REMOVAL_PORT, CmEventKind::Disconnected),
            "removal" => (REMOVAL_PORT, CmEventKind::DeviceRemoval),
            _ => return Err(format!("unknown child role {role:?}").into()),
        };
        let ch = EventChannel::new()?;
        let _l = listen(&ch, &side, port)?;
        println!("listening");
        let (id, mut rc) = accept(&ch, deadline() * 3)?;
        let mut next = 20;
        let mut disconnected = false;
        rc.sink(|n| {
            if n >= next {
                println!("received {n}");
                next += 20;
            }
            if let Some(ev) = ch.try_get_event()? {
                ensure!(ev.kind() == end, "{} (waiting for {end})", ev.kind());
                disconnected = true;
            }
            Ok(disconnected)
        })?;
        if end == CmEventKind::Disconnected {
            id.disconnect()?;
        }
        rc.reset()?;
        println!("child: posted {} returned {}", rc.posted, rc.returned);
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hosts child: {e:?}");
            ExitCode::FAILURE
        }
    }
}

/// A child process and its output's lines.
pub struct Peer {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    pub fn spawn(role: &str) -> Result<Peer, Failed> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(CHILD_ENV, role)
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(Peer { child, lines })
    }

    /// The next line for which `pick` says something, within `wait`.
    pub fn until<T>(
        &self,
        wait: Duration,
        mut pick: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, Failed> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let l = self
                .lines
                .recv_timeout(left)
                .map_err(|e| format!("the peer's output: {e}"))?;
            if let Some(t) = pick(&l) {
                return Ok(t);
            }
        }
    }
}

impl Peer {
    /// Waits until the peer has received at least `n`; how many it had.
    pub fn received(&self, n: usize) -> Result<usize, Failed> {
        self.until(deadline() * 3, |l| {
            let got: usize = l.strip_prefix("received ")?.parse().ok()?;
            (got >= n).then_some(got)
        })
    }

    /// Waits for the peer's counts (chunks posted, chunks back) and its
    /// successful exit.
    pub fn counts(mut self) -> Result<(usize, usize), Failed> {
        let counts = self.until(deadline() * 6, |l| {
            let mut w = l.strip_prefix("child: posted ")?.split(" returned ");
            Some((
                w.next()?.parse::<usize>().ok()?,
                w.next()?.parse::<usize>().ok()?,
            ))
        })?;
        let st = self.child.wait()?;
        ensure!(st.success(), "the peer process: {st}");
        Ok(counts)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VM 1 kills the first child once it has received 100 sends, starts a
/// second, and reports the second's counts (the first's died with it);
/// VM 2 is the [`survivor`].
pub fn killed_mid_transfer_then_reconnect(side: &Side) -> Result<(), Failed> {
    if !side.server {
        return survivor(side, PORT, "peer killed");
    }
    let first = Peer::spawn("sink")?;
    let got = first.received(100)?;
    drop(first); // SIGKILL, mid-transfer
    eprintln!("hosts: peer killed (server): SIGKILLed the receiving peer after {got} receives");
    let (posted, returned) = Peer::spawn("sink")?.counts()?;
    eprintln!(
        "hosts: peer killed (server): the new peer posted {posted} chunks, {returned} came back"
    );
    ensure!(
        posted == returned,
        "posted {posted} chunks, {returned} came back"
    );
    Ok(())
}

/// The client's side of a peer that goes away mid-transfer (killed, or its
/// device removed): sends stream until one fails (retry exceeded, the rest
/// flushed), the QP is reset (every chunk back), and once the peer is back
/// the client connects again (trying until it answers) and 20 sends go
/// through.
pub fn survivor(side: &Side, port: u16, test: &str) -> Result<(), Failed> {
    let (ch, id, mut rc) = connect(side, port)?;
    let delivered = rc.stream_until_failure(100_000)?;
    let failed = rc.failed;
    // The QP is in ERR already; the DREQ may find nobody.
    let _ = id.disconnect();
    rc.reset()?;
    let first = rc.counts();
    drop((rc, id, ch));
    let (ch, id, mut rc) = connect(side, port)?;
    rc.post_sends(20)?;
    ensure!(rc.reap(20)? == 20, "sends failed after the reconnect");
    close(&ch, &id, &mut rc)?;
    rc.carry(first);
    let what = format!("{delivered} sends delivered, {failed} failed when the peer went away, then 20 after the reconnect");
    rc.report(side, test, &what)
}

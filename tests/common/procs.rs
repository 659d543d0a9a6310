//! Running the examples and rdma-core's C programs as child processes:
//! starting one with its output piped, waiting for it with a time limit
//! (killing it after), and a server and then its client of the pingpong
//! kind (device options, a TCP port for the exchange of addresses).

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::{GidType, LinkLayer};

use super::Env;

/// Starts `cmd` with no input and its stdout and stderr piped (for
/// [`finish`] to collect).
pub fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// Waits for `child` up to `limit`, looking every 20 ms; past the limit,
/// kills it (SIGKILL) and reaps it. Returns its exit status and whether it
/// was killed here.
pub fn wait_or_kill(child: &mut Child, limit: Duration) -> Result<(ExitStatus, bool), Failed> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok((st, false));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            return Ok((child.wait()?, true));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The note for the output of a program killed after `limit`.
pub fn killed_note(limit: Duration) -> String {
    format!("(killed after {limit:?}; raise RDMA_VERBS_TIME_SCALE on a slow machine)")
}

/// What a program left, collected by [`finish`].
pub struct Finished {
    /// The exit code; `None` if it was killed (see `killed_after`) or ended
    /// by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The limit after which [`finish`] killed it, if it did.
    pub killed_after: Option<Duration>,
}

impl Finished {
    /// Its stdout, then its stderr, then (if it was killed) the
    /// [`killed_note`] on a line of its own.
    pub fn merged(&self) -> String {
        let mut out = format!("{}{}", self.stdout, self.stderr);
        if let Some(limit) = self.killed_after {
            out.push('\n');
            out.push_str(&killed_note(limit));
        }
        out
    }
}

/// Waits for `child` (started by [`spawn`]) up to `limit`, killing it after
/// ([`wait_or_kill`]), then reads its stdout and stderr to their ends.
/// The pipes are read only after it ended: for programs that write less
/// than a pipe holds.
pub fn finish(mut child: Child, limit: Duration) -> Result<Finished, Failed> {
    let (status, killed) = wait_or_kill(&mut child, limit)?;
    let (mut stdout, mut stderr) = (String::new(), String::new());
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut stdout)?;
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr)?;
    }
    Ok(Finished {
        code: status.code(),
        stdout,
        stderr,
        killed_after: killed.then_some(limit),
    })
}

/// The GID index for the pingpong-kind programs: a RoCE v2 GID
/// (IPv4-mapped if there is one) on Ethernet ports, none on InfiniBand.
pub fn gid_index(env: &Env) -> Result<Option<u32>, Failed> {
    if env.ctx.query_port(env.port)?.link_layer != LinkLayer::Ethernet {
        return Ok(None);
    }
    let table = env.ctx.gid_table()?;
    let v2: Vec<_> = table
        .iter()
        .filter(|e| e.port == u32::from(env.port) && e.gid_type == Some(GidType::RoceV2))
        .collect();
    let pick = v2
        .iter()
        .find(|e| e.gid.as_ipv6().to_ipv4_mapped().is_some())
        .or(v2.first());
    Ok(Some(pick.ok_or("no RoCE v2 GID")?.index))
}

/// The options a pingpong-kind program (the pingpong examples, `rdma_ops`,
/// `mw_invalidate`, rdma-core's `ibv_*_pingpong`) takes for the test device
/// and port and TCP port `tcp_port`: `-d DEVICE -i PORT -p TCP_PORT`, then
/// `-g INDEX` where [`gid_index`] gives one.
pub fn device_args(env: &Env, tcp_port: u16) -> Result<Vec<String>, Failed> {
    let mut args: Vec<String> = vec![
        "-d".into(),
        env.ctx.name().into(),
        "-i".into(),
        env.port.to_string(),
        "-p".into(),
        tcp_port.to_string(),
    ];
    if let Some(g) = gid_index(env)? {
        args.extend(["-g".into(), g.to_string()]);
    }
    Ok(args)
}

/// Whether something listens on TCP `port` (from /proc/net/tcp and tcp6).
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Runs a pingpong-kind server (a program and its own options, after
/// [`device_args`]) and waits until it listens on `tcp_port` (a server
/// that exits first, or does not listen within [`super::deadline`], is an
/// error naming `what`, with its output); then the client likewise, with
/// `127.0.0.1` last. Waits for the client, then the server, up to two
/// minutes ([`super::scaled`]) each, killing them after. Returns (server,
/// client); their exit codes are the caller's to check.
pub fn tcp_pair(
    env: &Env,
    server: (&Path, &[&str]),
    client: (&Path, &[&str]),
    tcp_port: u16,
    what: &str,
) -> Result<(Finished, Finished), Failed> {
    let args = device_args(env, tcp_port)?;
    let start_one = |bin: &Path, own: &[&str], host: Option<&str>| {
        spawn(Command::new(bin).args(&args).args(own).args(host))
    };
    let mut server_child = start_one(server.0, server.1, None)?;
    let (start, listen_limit) = (Instant::now(), super::deadline());
    while !listening(tcp_port) {
        if let Some(st) = server_child.try_wait()? {
            let out = finish(server_child, Duration::ZERO)?.merged();
            return Err(
                format!("{what}: the server exited ({st}) before listening:\n{out}").into(),
            );
        }
        if start.elapsed() > listen_limit {
            let out = finish(server_child, Duration::ZERO)?.merged();
            return Err(format!(
                "{what}: waited {listen_limit:?} for the server to listen on TCP port {tcp_port} \
                 (raise RDMA_VERBS_TIME_SCALE on a slow machine):\n{out}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client_child = start_one(client.0, client.1, Some("127.0.0.1"))?;
    // A run of 1,000 iterations takes seconds; a loaded machine, minutes.
    let limit = super::scaled(Duration::from_secs(120));
    let client = finish(client_child, limit)?;
    let server = finish(server_child, limit)?;
    Ok((server, client))
}

//! The `cmtime` example against rdma-core's C `cmtime`, over the RDMA CM.
//!
//! Each pairing runs a server (`-b ADDR -p PORT`) and, once it listens, a
//! client with `-c 10`: Rust client with C server (also once with the
//! client's `-b`, which adds the "bind addr" step), C client with Rust
//! server, and Rust with Rust. The client must exit 0 and print the
//! progress lines and the whole table, every row with four numbers that
//! agree with each other; the server must still be running when the client
//! is done (cmtime's servers never exit), and print nothing.
//!
//! Two more compare the programs' output directly: both clients against a
//! port nobody listens on (every connection rejected: the same lines, the
//! same table rows, exit 0), and both with a bad option (the same usage
//! text and exit status).
//!
//! The address is the test port's IPv4 address (its IPv4-mapped RoCE GID),
//! or `RDMA_VERBS_CM_ADDR`. Needs the device (see `tests/common`), the C
//! program (`cmtime`, rdma-core's rdmacm-utils) and the `rdma` tool
//! (iproute2, to see when a server listens): without a device the tests
//! are reported as ignored; with one but without the others they fail.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use libtest_mimic::Failed;

use common::procs::{self, finish, Finished};
use common::{cm_addr, Env, Test};

const TESTS: &[Test] = tests![
    rust_client_c_server,
    rust_client_bind_c_server,
    c_client_rust_server,
    rust_client_rust_server,
    no_server_same_as_c,
    bad_option_same_as_c,
];

/// Connections per client run.
const CONNS: usize = 10;

/// The tests that need the C `cmtime` the example ports (rdma-core 33 to
/// 51's): the C client against the Rust server, and the two that compare
/// the programs' output.
const SAME_AS_C: [&str; 3] = [
    "c_client_rust_server",
    "no_server_same_as_c",
    "bad_option_same_as_c",
];

/// And the two that need its server.
const C_SERVER: [&str; 2] = ["rust_client_c_server", "rust_client_bind_c_server"];

fn main() -> std::process::ExitCode {
    // Fixed ports and one device: one run at a time.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    let ignored = match rewritten_c_cmtime() {
        Some((why, server_too)) => SAME_AS_C
            .iter()
            .chain(if server_too { &C_SERVER[..] } else { &[] })
            .map(|&n| (n, why.clone()))
            .collect(),
        None => Vec::new(),
    };
    common::run_ignoring("cm_cmtime", TESTS, &[], &ignored, args)
}

/// Why the C `cmtime` here is not the program the example ports, if it is
/// not, and whether its server is not either. Its usage text says which:
/// - rdma-core 52 rewrote it (a TCP connection beside the RDMA CM that keeps
///   client and server in step, worker threads, `-S` for a socket
///   baseline; "librdmacm/cmtime: Add OOB sync mechanism for coordination"
///   and the commits around it): its client needs a server of its own
///   kind, and its output and usage are another program's; its server
///   still serves the example's client.
/// - rdma-core 59 made it a mesh test ("Support mesh based connection
///   testing": a controller, `-C`, and listeners, `-L`): neither side
///   pairs with the example's.
fn rewritten_c_cmtime() -> Option<(String, bool)> {
    let c = program(Side::C).ok()?;
    let out = Command::new(&c).arg("-x").output().ok()?;
    let usage = String::from_utf8_lossy(&out.stdout);
    let (what, server_too) = if usage.contains("-C controller_address") {
        (
            "rdma-core 59's mesh cmtime (its usage lists -C controller_address)",
            true,
        )
    } else if usage.contains("[-S]") {
        (
            "rdma-core 52's rewritten cmtime (its usage lists -S; out-of-band sync over TCP)",
            false,
        )
    } else {
        return None;
    };
    let why = format!(
        "{} is {what}, not the program examples/cmtime.rs ports (rdma-core 33 to 51's)",
        c.display()
    );
    Some((why, server_too))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    C,
    Rust,
}

fn program(side: Side) -> Result<PathBuf, Failed> {
    match side {
        Side::C => common::on_path("cmtime", "rdma-core's rdmacm-utils"),
        Side::Rust => common::rust_example("cmtime"),
    }
}

/// What a finished process left ([`finish`]: exit code, `None` if it was
/// killed; stdout; stderr), as the messages here show it.
impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn spawn(bin: &PathBuf, args: &[String]) -> Result<Child, Failed> {
    procs::spawn(Command::new(bin).args(args)).map_err(|e| format!("{}: {e}", bin.display()).into())
}

/// Runs a client to its end (two minutes, scaled, at most).
fn client(bin: &PathBuf, args: &[String]) -> Result<Finished, Failed> {
    finish(spawn(bin, args)?, common::scaled(Duration::from_secs(120)))
}

/// A cmtime server on `addr`, `port`, once it listens.
struct Server {
    child: Child,
    what: String,
}

impl Server {
    fn start(side: Side, addr: IpAddr, port: u16) -> Result<Server, Failed> {
        let what = format!("{side:?} server on {addr} port {port}");
        let args = [
            "-b".to_owned(),
            addr.to_string(),
            "-p".into(),
            port.to_string(),
        ];
        let mut child = spawn(&program(side)?, &args)?;
        let (pid, port) = (child.id().to_string(), format!(":{port}"));
        let ready = |w: &[&str]| {
            w.windows(2).any(|p| p == ["pid", pid.as_str()])
                && w.windows(2).any(|p| p == ["state", "LISTEN"])
                && w.iter().any(|x| x.ends_with(port.as_str()))
        };
        match common::wait_for_cm_id(&mut child, &what, ready) {
            Ok(()) => Ok(Server { child, what }),
            Err(e) => {
                let _ = child.kill();
                let out = finish(child, Duration::ZERO)?;
                Err(format!("{e:?}\n{out}").into())
            }
        }
    }

    /// Checks that the server still runs (cmtime's never exits), stops it
    /// and checks that it printed nothing (stderr: no errors).
    fn stop(mut self) -> Result<(), Failed> {
        let early = self.child.try_wait()?;
        let _ = self.child.kill();
        let out = finish(self.child, common::deadline())?;
        ensure!(
            early.is_none(),
            "{}: exited by itself ({early:?}) before it was stopped\n{out}",
            self.what
        );
        ensure!(
            out.stderr.is_empty(),
            "{}: printed errors\n{out}",
            self.what
        );
        Ok(())
    }
}

const PROGRESS: [&str; 7] = [
    "creating id",
    "resolving address",
    "resolving route",
    "creating qp",
    "connecting",
    "disconnecting",
    "destroying id",
];
const HEADER: &str = "step              total ms     max ms     min us  us / conn";
const ROWS: [&str; 8] = [
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];

/// One table row: its step name and four columns (`%-13s: %11.2f x 4`).
fn parse_row(line: &str) -> Option<(&str, Vec<f64>)> {
    let (name, rest) = (line.get(..13)?, line.get(13..)?);
    let rest = rest.strip_prefix(": ")?;
    if rest.len() != 44 {
        return None;
    }
    let cols: Option<Vec<f64>> = (0..4)
        .map(|i| rest[i * 11..(i + 1) * 11].trim().parse::<f64>().ok())
        .collect();
    Some((name.trim_end(), cols?))
}

/// Checks a successful client's output: the progress lines in order, the
/// header, every row (with `bind addr` when `bind`) with four numbers that
/// fit together, no failed connection, nothing on stderr. Returns the
/// rows.
fn check_table(out: &Finished, bind: bool) -> Result<Vec<(String, Vec<f64>)>, Failed> {
    ensure!(out.code == Some(0), "client failed\n{out}");
    ensure!(out.stderr.is_empty(), "client printed errors\n{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let mut progress: Vec<&str> = PROGRESS.to_vec();
    if bind {
        progress.insert(1, "binding source address");
    }
    let header = lines
        .iter()
        .position(|l| *l == HEADER)
        .ok_or_else(|| format!("no table header\n{out}"))?;
    ensure!(
        lines[..header] == progress[..],
        "progress lines differ (want {progress:?})\n{out}"
    );
    let want: Vec<&str> = ROWS
        .iter()
        .copied()
        .filter(|r| bind || *r != "bind addr")
        .collect();
    let rows = &lines[header + 1..];
    ensure!(
        rows.len() == want.len(),
        "{} table rows, want {}\n{out}",
        rows.len(),
        want.len()
    );
    let mut parsed = Vec::new();
    for (line, name) in rows.iter().zip(&want) {
        let (got, cols) =
            parse_row(line).ok_or_else(|| format!("row without four numbers: {line:?}\n{out}"))?;
        ensure!(got == *name, "row {got:?} where {name:?} belongs\n{out}");
        let [total_ms, max_ms, min_us, per_conn] = cols[..] else {
            unreachable!()
        };
        // Every connection had a sample, so min <= max <= total, and the
        // total per connection is the total over CONNS (each printed
        // rounded to 0.005).
        ensure!(
            min_us > 0.0 || *name == "create id" || *name == "destroy" || *name == "bind addr",
            "{name}: min {min_us} us\n{out}"
        );
        ensure!(
            min_us <= max_ms * 1000.0 + 5.0 && max_ms <= total_ms + 0.01,
            "{name}: min {min_us} us, max {max_ms} ms, total {total_ms} ms do not fit\n{out}"
        );
        let slack = 5.0 + 0.005 * CONNS as f64 + 1.0;
        let fits = (per_conn * CONNS as f64 - total_ms * 1000.0).abs() <= slack;
        ensure!(
            fits,
            "{name}: {per_conn} us/conn is not {total_ms} ms / {CONNS}\n{out}"
        );
        parsed.push((got.to_owned(), cols));
    }
    Ok(parsed)
}

/// A server and a client of the given sides, the client with `-c 10` (and
/// `-b` with the same address when `bind`); checks both.
fn pairing(
    env: &Env,
    server: Side,
    client_side: Side,
    port: u16,
    bind: bool,
) -> Result<(), Failed> {
    let addr = cm_addr(env)?;
    let what = format!("{server:?} server, {client_side:?} client");
    let srv = Server::start(server, addr, port)?;
    let mut args = vec![
        "-s".to_owned(),
        addr.to_string(),
        "-p".into(),
        port.to_string(),
        "-c".into(),
        CONNS.to_string(),
    ];
    if bind {
        args.extend(["-b".to_owned(), addr.to_string()]);
    }
    let out = client(&program(client_side)?, &args);
    let stopped = srv.stop();
    let out = out?;
    let rows = check_table(&out, bind).map_err(|e| context(&what, e))?;
    stopped.map_err(|e| context(&what, e))?;
    let connect = rows
        .iter()
        .find(|(n, _)| n == "connect")
        .map_or(0.0, |(_, c)| c[0]);
    eprintln!("cm_cmtime: {what}, {CONNS} connections: connect {connect:.2} ms");
    Ok(())
}

/// `e` with `what` in front.
fn context(what: &str, e: Failed) -> Failed {
    format!("{what}: {}", e.message().unwrap_or("failed")).into()
}

fn rust_client_c_server(env: &Env) -> Result<(), Failed> {
    pairing(env, Side::C, Side::Rust, 7611, false)
}

fn rust_client_bind_c_server(env: &Env) -> Result<(), Failed> {
    pairing(env, Side::C, Side::Rust, 7612, true)
}

fn c_client_rust_server(env: &Env) -> Result<(), Failed> {
    pairing(env, Side::Rust, Side::C, 7613, false)
}

fn rust_client_rust_server(env: &Env) -> Result<(), Failed> {
    pairing(env, Side::Rust, Side::Rust, 7614, false)
}

/// The output without its numbers: each table row's step name and its
/// column widths, where a step without samples runs its min into the max
/// column (`0.001000000000.00`) in both programs.
fn shape(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| match parse_row(l) {
            Some((name, _)) => format!("{name}: (4 numbers)"),
            None if l.contains(": ") && l.contains("1000000000.00") => {
                let name = l.split(':').next().unwrap_or("").trim_end();
                format!("{name}: (no samples)")
            }
            None => l.to_owned(),
        })
        .collect()
}

/// Both clients against a port nobody listens on: every connection is
/// rejected; the same lines (rejections included), the same rows, exit 0.
fn no_server_same_as_c(env: &Env) -> Result<(), Failed> {
    let addr = cm_addr(env)?;
    let args: Vec<String> = ["-s", &addr.to_string(), "-p", "7619", "-c", "3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let c = client(
        &common::on_path("cmtime", "rdma-core's rdmacm-utils")?,
        &args,
    )?;
    let rust = client(&common::rust_example("cmtime")?, &args)?;
    let both = format!("=== C\n{c}=== Rust\n{rust}");
    ensure!(
        c.code == Some(0) && rust.code == Some(0),
        "exit codes differ from 0\n{both}"
    );
    let rejected = "event: RDMA_CM_EVENT_REJECTED, error: 8";
    ensure!(
        rust.stdout.matches(rejected).count() == 3,
        "the Rust client did not report 3 rejections\n{both}"
    );
    ensure!(
        shape(&c.stdout) == shape(&rust.stdout),
        "outputs differ: C {:#?}\nRust {:#?}\n{both}",
        shape(&c.stdout),
        shape(&rust.stdout)
    );
    ensure!(
        shape(&rust.stdout).contains(&"disconnect: (no samples)".to_owned()),
        "no sample-less disconnect row\n{both}"
    );
    Ok(())
}

/// A bad option: usage text on stdout, getopt's message on stderr, exit 1,
/// as the C program.
fn bad_option_same_as_c(_env: &Env) -> Result<(), Failed> {
    for args in [&["-x"][..], &["-s"][..]] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (cbin, rbin) = (
            common::on_path("cmtime", "rdma-core's rdmacm-utils")?,
            common::rust_example("cmtime")?,
        );
        let c = client(&cbin, &args)?;
        let rust = client(&rbin, &args)?;
        let both = format!("=== C\n{c}=== Rust\n{rust}");
        let norm = |s: &str, bin: &PathBuf| s.replace(&bin.display().to_string(), "cmtime");
        ensure!(
            c.code == Some(1) && rust.code == Some(1),
            "{args:?}: exit codes\n{both}"
        );
        ensure!(
            norm(&c.stdout, &cbin) == norm(&rust.stdout, &rbin)
                && rust.stdout.starts_with("usage: "),
            "{args:?}: usage differs\n{both}"
        );
        ensure!(
            norm(&c.stderr, &cbin) == norm(&rust.stderr, &rbin),
            "{args:?}: getopt's message differs\n{both}"
        );
    }
    Ok(())
}

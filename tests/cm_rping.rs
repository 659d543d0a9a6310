//! The `rping` example against rdma-core's C `rping` (rdmacm-utils), over
//! the connection manager on the test device.
//!
//! The three pairings (Rust server with C client, C server with Rust client,
//! Rust with Rust) run 1,000 pings of 100 bytes with `-V` (the client
//! compares what came back with what it sent) and `-v` on both sides, once
//! with QPs made by the CM and once with `-q` on the Rust side(s) (a QP of
//! the program's own, moved with the CM's attributes). Every run checks
//! both exit statuses, every `ping data:` and `server ping data:` line
//! against the text the C program's format gives (built here from its
//! definition, so the C side checks this builder too), and the exact
//! stderr of both sides (the disconnect lines, nothing else).
//!
//! Further runs compare the Rust program with the C one where they must
//! behave alike: a server whose `-S` is smaller than the client's (the
//! server fails, the client is disconnected), a client with no server to
//! connect to, the persistent server (`-P`) serving two clients, the `-d`
//! lines (with the pointers and keys masked), and bad command lines.
//!
//! The address is the test port's IPv4 address (from its RoCE GID), or
//! `RDMA_VERBS_CM_ADDR`. Each run has its own port (7470 + N), so the runs
//! may go in parallel; a server counts as listening once
//! `rdma resource show cm_id` shows its listener (rping's listener is a CM
//! id, which `ss` does not show). Needs the device (see `tests/common`;
//! without one the runs are ignored), the C `rping` and the `rdma` tool
//! (without them the runs fail, saying what to install).
//!
//! Run a subset with a filter, e.g. `cm_rping rust_server` or
//! `cm_rping -- --exact options_match_c`.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::io::Read;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;

use common::{cm_addr, on_path, procs, Env, Test};

const TESTS: &[Test] = tests![
    rust_server_c_client,
    c_server_rust_client,
    rust_server_rust_client,
    rust_q_server_c_client,
    c_server_rust_q_client,
    rust_q_server_rust_q_client,
    server_size_smaller_than_client,
    nobody_listening,
    persistent_server_two_clients,
    debug_lines_match_c,
    options_match_c,
];

fn main() -> std::process::ExitCode {
    common::run("cm_rping", TESTS)
}

/// Which program plays a role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    C,
    Rust,
}

/// What a finished program left: its status and its output.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    fn show(&self, who: &str) -> String {
        format!(
            "--- {who}: {}\n--- stdout:\n{}--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

fn program(side: Side) -> Result<PathBuf, Failed> {
    match side {
        Side::C => on_path("rping", "rdma-core's rdmacm-utils"),
        Side::Rust => common::rust_example("rping"),
    }
}

fn spawn(bin: &PathBuf, args: &[String]) -> Result<Running, Failed> {
    let mut child = procs::spawn(Command::new(bin).args(args))
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    // Read both pipes as they fill: a -v server writes more than a pipe holds.
    let reader = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().ok_or("no stdout")?));
    let err = reader(Box::new(child.stderr.take().ok_or("no stderr")?));
    Ok(Running {
        child,
        out: Some(out),
        err: Some(err),
    })
}

/// A program running, with its output being collected. Killed if dropped
/// before it finished (a run that failed half way).
struct Running {
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn collect(h: Option<JoinHandle<String>>) -> Result<String, Failed> {
    h.ok_or("output already taken")?
        .join()
        .map_err(|_| "an output reader panicked".into())
}

impl Running {
    /// Waits for the program up to `limit`, killing it then (its stderr
    /// then ends with a note): [`procs::wait_or_kill`], with the output
    /// read all along. Returns its status and output.
    fn finish(mut self, limit: Duration) -> Result<Ran, Failed> {
        let (status, killed) = procs::wait_or_kill(&mut self.child, limit)?;
        let stdout = collect(self.out.take())?;
        let mut stderr = collect(self.err.take())?;
        if killed {
            stderr.push_str(&procs::killed_note(limit));
            stderr.push('\n');
        }
        Ok(Ran {
            status,
            stdout,
            stderr,
        })
    }

    /// Sends SIGTERM (the way a persistent server is stopped).
    fn terminate(&self) -> Result<(), Failed> {
        let st = Command::new("kill")
            .arg(self.child.id().to_string())
            .status()?;
        ensure!(st.success(), "kill {} failed", self.child.id());
        Ok(())
    }
}

/// Waits until `rdma resource show cm_id` lists a listener on `ip:port`.
fn wait_listening(mut server: Running, ip: IpAddr, port: u16) -> Result<Running, Failed> {
    let want = format!("{ip}:{port}");
    let listening = |w: &[&str]| {
        w.windows(2).any(|p| p == ["state", "LISTEN"])
            && w.windows(2).any(|p| p[0] == "src-addr" && p[1] == want)
    };
    match common::wait_for_cm_id(&mut server.child, "the rping server", listening) {
        Ok(()) => Ok(server),
        Err(e) => {
            let _ = server.child.kill();
            let ran = server.finish(Duration::ZERO)?;
            Err(format!("{e:?}\n{}", ran.show("server")).into())
        }
    }
}

/// The port of run `n`.
fn port(n: u16) -> u16 {
    7470 + n
}

/// How long one program may take: 1,000 pings take seconds, a loaded
/// machine minutes.
fn limit() -> Duration {
    common::scaled(Duration::from_secs(120))
}

fn args(list: &[&str], ip: IpAddr, port: u16) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.extend(["-a".into(), ip.to_string(), "-p".into(), port.to_string()]);
    v
}

/// Runs a server and a client on `ip:port`; returns (server, client).
fn pair(
    (server, server_args): (Side, &[&str]),
    (client, client_args): (Side, &[&str]),
    ip: IpAddr,
    port: u16,
) -> Result<(Ran, Ran), Failed> {
    let s = spawn(&program(server)?, &args(server_args, ip, port))?;
    let s = wait_listening(s, ip, port)?;
    let c = spawn(&program(client)?, &args(client_args, ip, port))?;
    let c = c.finish(limit())?;
    let s = s.finish(limit())?;
    Ok((s, c))
}

/// The C program's ping text for ping `p` of `size` bytes, as printed
/// (without its NUL): `rdma-ping-<p>: `, then characters counting up from
/// `'A' + p % 58`, wrapping from `z` to `A`, `size - 1` characters in all.
fn ping_text(p: u32, size: usize) -> String {
    let mut s = format!("rdma-ping-{p}: ");
    let mut c = b'A' + (p % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c == b'z' { b'A' } else { c + 1 };
    }
    s.truncate(size - 1);
    s
}

/// The `-v` lines of `count` pings of `size` bytes, each after `prefix`.
fn ping_lines(prefix: &str, count: u32, size: usize) -> String {
    (0..count)
        .map(|p| format!("{prefix}{}\n", ping_text(p, size)))
        .collect()
}

const SERVER_END: &str = "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n";
const CLIENT_END: &str = "client DISCONNECT EVENT...\n";

/// What a client's stderr must be at the end of a run: its DISCONNECTED
/// event's line. The C client does not wait for that event (it ends as
/// soon as its own receive is flushed), so whether it prints the line
/// depends on how soon the server answers its disconnect request; with
/// the C server it nearly always does, with this one too, but not always.
fn client_end(side: Side) -> &'static [&'static str] {
    match side {
        Side::Rust => &[CLIENT_END],
        Side::C => &[CLIENT_END, ""],
    }
}

/// Compares one side's output with what it must be (`stderr`: one of).
fn expect(ran: &Ran, who: &str, code: i32, stdout: &str, stderr: &[&str]) -> Result<(), Failed> {
    ensure!(
        ran.code() == Some(code),
        "{who}: exit status {:?}, expected {code}\n{}",
        ran.code(),
        ran.show(who)
    );
    if ran.stdout != stdout {
        let (got, want): (Vec<_>, Vec<_>) =
            (ran.stdout.lines().collect(), stdout.lines().collect());
        let at = got.iter().zip(&want).position(|(g, w)| g != w);
        return Err(format!(
            "{who}: stdout differs ({} lines, expected {}); first difference at line {at:?}:\n  got:      {:?}\n  expected: {:?}\n--- stderr:\n{}",
            got.len(),
            want.len(),
            at.and_then(|i| got.get(i)),
            at.and_then(|i| want.get(i)),
            ran.stderr
        )
        .into());
    }
    ensure!(
        stderr.contains(&ran.stderr.as_str()),
        "{who}: stderr is {:?}, expected one of {stderr:?}\n{}",
        ran.stderr,
        ran.show(who)
    );
    Ok(())
}

/// One of the six main runs: 1,000 pings of 100 bytes, checked.
fn main_run(env: &Env, n: u16, server: (Side, bool), client: (Side, bool)) -> Result<(), Failed> {
    const COUNT: u32 = 1000;
    const SIZE: usize = 100;
    let ip = cm_addr(env)?;
    let with_q = |base: &[&'static str], q: bool| {
        let mut v = base.to_vec();
        if q {
            v.push("-q");
        }
        v
    };
    let server_args = with_q(&["-s", "-v", "-S", "100"], server.1);
    let client_args = with_q(&["-c", "-v", "-V", "-C", "1000", "-S", "100"], client.1);
    let start = Instant::now();
    let (s, c) = pair(
        (server.0, &server_args),
        (client.0, &client_args),
        ip,
        port(n),
    )?;
    let took = start.elapsed();
    if client.0 == Side::C && c.stderr.is_empty() {
        eprintln!("cm_rping: note: the C client ended before its DISCONNECTED event");
    }
    expect(
        &c,
        "client",
        0,
        &ping_lines("ping data: ", COUNT, SIZE),
        client_end(client.0),
    )?;
    expect(
        &s,
        "server",
        0,
        &ping_lines("server ping data: ", COUNT, SIZE),
        &[SERVER_END],
    )?;
    eprintln!(
        "cm_rping: {:?} server {server_args:?}, {:?} client {client_args:?}: {COUNT} pings in {:.1} s",
        server.0,
        client.0,
        took.as_secs_f64()
    );
    Ok(())
}

fn rust_server_c_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 0, (Side::Rust, false), (Side::C, false))
}

fn c_server_rust_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 1, (Side::C, false), (Side::Rust, false))
}

fn rust_server_rust_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 2, (Side::Rust, false), (Side::Rust, false))
}

fn rust_q_server_c_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 3, (Side::Rust, true), (Side::C, false))
}

fn c_server_rust_q_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 4, (Side::C, false), (Side::Rust, true))
}

fn rust_q_server_rust_q_client(env: &Env) -> Result<(), Failed> {
    main_run(env, 5, (Side::Rust, true), (Side::Rust, true))
}

/// Server `-S 64` (the default), client `-S 100`: the server's RDMA READ
/// of 100 bytes into its 64 fails, it exits 255; the client is
/// disconnected, says so and exits 0. Both pairings with a Rust side.
fn server_size_smaller_than_client(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let server_fails = "cq completion failed status 4\nwait for RDMA_READ_COMPLETE state 11\nrping server failed: -1\n";
    let client_end = "client DISCONNECT EVENT...\nwait for RDMA_WRITE_ADV state 10\n";
    for (n, server, client) in [(6, Side::Rust, Side::C), (7, Side::C, Side::Rust)] {
        let (s, c) = pair(
            (server, &["-s", "-v"]),
            (client, &["-c", "-v", "-V", "-C", "2", "-S", "100"]),
            ip,
            port(n),
        )?;
        expect(&c, &format!("{client:?} client"), 0, "", &[client_end])?;
        // The server's own DISCONNECTED comes when the client answers its
        // disconnect, which may be after the C server has ended.
        let who = format!("{server:?} server");
        let stderr = if server == Side::C && !s.stderr.contains("DISCONNECT") {
            server_fails.to_owned()
        } else {
            format!("{server_fails}server DISCONNECT EVENT...\n")
        };
        expect(&s, &who, 255, "", &[&stderr])?;
    }
    Ok(())
}

/// A client connecting to a port nobody listens on: the CM rejects it (8),
/// both programs print the same three lines and exit 255.
fn nobody_listening(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let want =
        "cma event RDMA_CM_EVENT_REJECTED, error 8\nwait for CONNECTED state 4\nconnect error -1\n";
    for side in [Side::C, Side::Rust] {
        let c = spawn(
            &program(side)?,
            &args(&["-c", "-v", "-C", "1"], ip, port(8)),
        )?;
        let c = c.finish(limit())?;
        // The C client exits 255 from its CM thread on the reject, racing
        // its main thread: its stderr may end after any of its lines (cut
        // after the first and after the second, both seen in CI). The Rust
        // client must print all three.
        let lines = |n: usize| -> String { want.split_inclusive('\n').take(n).collect() };
        let (one, two) = (lines(1), lines(2));
        let allowed: &[&str] = match side {
            Side::C => &[want, &two, &one],
            Side::Rust => &[want],
        };
        expect(&c, &format!("{side:?} client"), 255, "", allowed)?;
    }
    Ok(())
}

/// `-P`: the Rust server serves two C clients and a Rust `-q -I` client one
/// after the other and runs until SIGTERM; each connection leaves its two
/// disconnect lines. (Its `-v` lines are lost: stdout is still buffered
/// when the signal ends it, as in C.)
fn persistent_server_two_clients(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let p = port(9);
    let s = spawn(
        &common::rust_example("rping")?,
        &args(&["-s", "-P", "-v"], ip, p),
    )?;
    let s = wait_listening(s, ip, p)?;
    let mut clients = Vec::new();
    let src = ip.to_string();
    // The Rust client also names its source address (-I).
    for (side, extra, count, size) in [
        (Side::C, &[][..], 2, 64),
        (Side::Rust, &["-q", "-I", src.as_str()][..], 3, 30),
        (Side::C, &[][..], 1, 50),
    ] {
        let mut a = vec!["-c", "-v", "-V"];
        a.extend(extra);
        let (cs, ss) = (count.to_string(), size.to_string());
        a.extend(["-C", cs.as_str(), "-S", ss.as_str()]);
        let c = spawn(&program(side)?, &args(&a, ip, p))?.finish(limit())?;
        clients.push((side, c, count, size));
    }
    s.terminate()?;
    let s = s.finish(limit())?;
    for (side, c, count, size) in &clients {
        expect(
            c,
            &format!("{side:?} client"),
            0,
            &ping_lines("ping data: ", *count, *size),
            client_end(*side),
        )?;
    }
    use std::os::unix::process::ExitStatusExt;
    ensure!(
        s.status.signal() == Some(15),
        "the persistent server ended with {} rather than SIGTERM\n{}",
        s.status,
        s.show("server")
    );
    ensure!(
        s.stderr == SERVER_END.repeat(clients.len()),
        "persistent server stderr:\n{}",
        s.stderr
    );
    ensure!(s.stdout.is_empty(), "stdout:\n{}", s.stdout);
    Ok(())
}

/// A `-d` line with what differs from run to run masked: pointers (`0x`
/// words) and the keys and addresses after `rkey`, `lkey`, `addr` and
/// `laddr` (hex without `0x`).
fn masked(line: &str) -> String {
    let mut after_key = false;
    line.split(' ')
        .map(|w| {
            let mask = after_key || w.starts_with("0x");
            after_key = matches!(w, "rkey" | "lkey" | "addr" | "laddr");
            if mask {
                "X"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `-d` on both sides: the Rust pair prints the same debug lines as the
/// C pair (compared as sets of lines with pointers, keys and addresses
/// masked: their order between the C program's threads varies), and the
/// first lines, printed while parsing, are the same in order.
fn debug_lines_match_c(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let server_args: &[&str] = &["-d", "-s", "-v", "-C", "3"];
    let client_args: &[&str] = &["-d", "-c", "-v", "-V", "-C", "3"];
    let mut outs = Vec::new();
    // One port for both runs: the first debug lines print it.
    for side in [Side::C, Side::Rust] {
        let (s, c) = pair((side, server_args), (side, client_args), ip, port(10))?;
        expect(
            &s,
            &format!("{side:?} -d server"),
            0,
            &s.stdout,
            &[SERVER_END],
        )?;
        expect(
            &c,
            &format!("{side:?} -d client"),
            0,
            &c.stdout,
            client_end(side),
        )?;
        outs.push((s.stdout, c.stdout));
    }
    let [(cs, mut cc), (rs, rc)] = [outs.remove(0), outs.remove(0)];
    // A C client that ended before its DISCONNECTED event (see client_end)
    // printed no line for it: add it, masked as the Rust one is.
    let disconnected = "cma_event type RDMA_CM_EVENT_DISCONNECTED";
    if !cc.contains(disconnected) {
        cc.push_str(&format!("{disconnected} cma_id 0x0 (parent)\n"));
    }
    for (who, c, r) in [("server", &cs, &rs), ("client", &cc, &rc)] {
        let head = |t: &str| t.lines().take(4).map(masked).collect::<Vec<_>>();
        ensure!(
            head(c) == head(r),
            "{who}: first -d lines differ\n--- C:\n{c}\n--- Rust:\n{r}"
        );
        let sorted = |t: &str| {
            let mut v: Vec<String> = t.lines().map(masked).collect();
            v.sort();
            v
        };
        let (mc, mr) = (sorted(c), sorted(r));
        ensure!(
            mc == mr,
            "{who}: -d lines differ (masked, sorted)\n--- C:\n{}\n--- Rust:\n{}",
            mc.join("\n"),
            mr.join("\n")
        );
    }
    Ok(())
}

/// Command lines that end while the options are parsed: the same stdout,
/// stderr and exit status from both programs.
fn options_match_c(_env: &Env) -> Result<(), Failed> {
    let lines: &[&[&str]] = &[
        &[],
        &["-x"],
        &["-t", "1"],
        &["-s", "-S", "1"],
        &["-s", "-S", "70000"],
        &["-c", "-C", "-1"],
        &["-d", "-v", "-S", "22", "-C", "5x"],
        &["-dvV", "-S"],
        &["--help"],
        &["-d", "-p", "70000", "-C", "4294967297", "-S", "100", "-q"],
        &["-s", "-S", "1", "-C", "-5", "-d", "-x"],
    ];
    let (c, rust) = (program(Side::C)?, common::rust_example("rping")?);
    for args in lines {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let a = spawn(&c, &args)?.finish(limit())?;
        let b = spawn(&rust, &args)?.finish(limit())?;
        ensure!(
            a.code() == b.code() && a.stdout == b.stdout && a.stderr == b.stderr,
            "rping {args:?}:\n{}\n{}",
            a.show("C"),
            b.show("Rust")
        );
    }
    Ok(())
}

//! The `mw_invalidate` example (memory windows), server and client, in each
//! way of revoking the window: a type 2 window invalidated by the server's
//! LOCAL_INV, by the client's SEND_WITH_INV (`--remote-inv`), and a type 1
//! window deallocated (`--type1`); once with a one-byte window.
//!
//! Each run must end with both processes exiting 0 after printing the lines
//! of every step: the read through the window matched, the write through
//! it arrived, the window was revoked (with the rkey the client was given),
//! the read after that failed with `IBV_WC_REM_ACCESS_ERR`, and both QPs
//! ended in ERR. One more run gives the two sides different modes: both
//! must fail, the client saying why.
//!
//! Needs the device (see `tests/common`): without one the runs are
//! reported as ignored.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::{GidType, LinkLayer};

use common::{rust_example, Env, TestFn};

const EXAMPLE: &str = "mw_invalidate";

fn main() -> std::process::ExitCode {
    let tests: &[(&str, TestFn)] = &[
        ("mw_example::local_invalidate", local_invalidate),
        ("mw_example::remote_invalidate", remote_invalidate),
        ("mw_example::type1_dealloc", type1_dealloc),
        ("mw_example::one_byte_window", one_byte_window),
        ("mw_example::mismatched_modes", mismatched_modes),
        ("mw_example::bad_command_line", bad_command_line),
    ];
    // Fixed TCP ports and one device: one run at a time.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    common::run_with("mw_example", tests, args)
}

fn local_invalidate(env: &Env) -> Result<(), Failed> {
    let (server, client) = good_run(env, &[], 19_300, 4096)?;
    expect_line(&server, "window invalidated by LOCAL_INV (rkey ", "server")?;
    ensure!(server.contains("type 2 window bound"), "server:\n{server}");
    eprintln!("mw_example: local: {}", last_line(&client));
    Ok(())
}

fn remote_invalidate(env: &Env) -> Result<(), Failed> {
    let (server, client) = good_run(env, &["--remote-inv"], 19_301, 4096)?;
    let rkey = window_rkey(&client)?;
    expect_line(
        &client,
        &format!("sent SEND_WITH_INV for rkey {rkey}"),
        "client",
    )?;
    ensure!(server.contains("type 2 window bound"), "server:\n{server}");
    // The server's receive completion names the rkey the client sent
    // (through QueuePair::invalidated_rkey, which reads rxe's flag too).
    let reported = format!(
        "the client's SEND_WITH_INV invalidated rkey {rkey} (the receive completion reports it, \
         flagged with "
    );
    let line = server
        .lines()
        .find(|l| l.contains(&reported))
        .ok_or_else(|| {
            format!("the server did not report the SEND_WITH_INV for rkey {rkey}:\n{server}")
        })?;
    eprintln!("mw_example: remote: {line}");
    Ok(())
}

fn type1_dealloc(env: &Env) -> Result<(), Failed> {
    let (server, client) = good_run(env, &["--type1"], 19_302, 4096)?;
    let rkey = window_rkey(&client)?;
    ensure!(server.contains("type 1 window bound"), "server:\n{server}");
    expect_line(
        &server,
        &format!("type 1 window deallocated (rkey {rkey})"),
        "server",
    )?;
    eprintln!("mw_example: type 1: {}", last_line(&client));
    Ok(())
}

fn one_byte_window(env: &Env) -> Result<(), Failed> {
    let (server, _) = good_run(env, &["-s", "1"], 19_303, 1)?;
    expect_line(&server, "window invalidated by LOCAL_INV", "server")?;
    Ok(())
}

/// The server without options (LOCAL_INV), the client with `--remote-inv`:
/// the server refuses, both exit 1, the client says why.
fn mismatched_modes(env: &Env) -> Result<(), Failed> {
    let bin = rust_example(EXAMPLE)?;
    let (s, c) = run_pair(env, &bin, &[], &["--remote-inv"], 19_304)?;
    let both = format!("--- server:\n{}\n--- client:\n{}", s.out, c.out);
    ensure!(
        s.code == Some(1) && c.code == Some(1),
        "expected both to exit 1, got server {:?} client {:?}\n{both}",
        s.code,
        c.code
    );
    ensure!(
        c.out.contains("the peer failed: the client")
            && c.out.contains("--remote-inv")
            && c.out.contains("neither --remote-inv nor --type1"),
        "the client did not say why\n{both}"
    );
    Ok(())
}

/// A bad command line: the usage, exit status 2, no device touched.
fn bad_command_line(_env: &Env) -> Result<(), Failed> {
    let bin = rust_example(EXAMPLE)?;
    for args in [
        &["--remote-inv", "--type1"][..],
        &["-s", "0"],
        &["-s", "x"],
        &["--bogus"],
        &["a", "b"],
    ] {
        let out = Command::new(&bin).args(args).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(2) && err.contains("usage: mw_invalidate"),
            "{args:?}: exit {:?}, stderr:\n{err}",
            out.status.code()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------

/// A server and a client with the same `mode` options that must both
/// succeed, printing every step's line; returns their outputs.
fn good_run(
    env: &Env,
    mode: &[&str],
    tcp_port: u16,
    size: usize,
) -> Result<(String, String), Failed> {
    let bin = rust_example(EXAMPLE)?;
    let (s, c) = run_pair(env, &bin, mode, mode, tcp_port)?;
    let both = format!("--- server:\n{}\n--- client:\n{}", s.out, c.out);
    ensure!(
        s.code == Some(0) && c.code == Some(0),
        "{mode:?}: server exit {:?}, client exit {:?}\n{both}",
        s.code,
        c.code
    );
    let rkey = window_rkey(&c.out)?;
    let size_s = size.to_string();
    for (out, who, lines) in [
        (
            &c.out,
            "client",
            &[
                format!("the read through the window matched: {size_s} bytes"),
                format!("wrote {size_s} bytes through the window"),
                "the read after invalidation failed with IBV_WC_REM_ACCESS_ERR (".to_owned(),
                "client QP state after the failed read: IBV_QPS_ERR".to_owned(),
                "client: every step as expected".to_owned(),
            ][..],
        ),
        (
            &s.out,
            "server",
            &[
                " window bound: addr ".to_owned(),
                format!(" len {size_s} rkey {rkey} "),
                format!("the write through the window arrived: {size_s} bytes checked"),
                "server QP state after the client's failed read: IBV_QPS_ERR".to_owned(),
                "server: every step as expected".to_owned(),
            ][..],
        ),
    ] {
        for l in lines {
            ensure!(out.contains(l.as_str()), "{who} printed no {l:?}\n{both}");
        }
    }
    Ok((s.out, c.out))
}

/// The window's rkey (`0x...`) from the client's first line.
fn window_rkey(client: &str) -> Result<String, Failed> {
    client
        .lines()
        .find_map(|l| l.split_once("; window addr "))
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .filter(|k| k.starts_with("0x"))
        .map(str::to_owned)
        .ok_or_else(|| format!("the client printed no window rkey:\n{client}").into())
}

fn expect_line(out: &str, needle: &str, who: &str) -> Result<(), Failed> {
    ensure!(
        out.lines()
            .any(|l| l.starts_with("mw_invalidate: ") && l.contains(needle)),
        "{who} printed no line with {needle:?}:\n{out}"
    );
    Ok(())
}

fn last_line(out: &str) -> &str {
    out.lines().last().unwrap_or("")
}

struct Outcome {
    /// The exit code; `None` if killed (timeout) or ended by a signal.
    code: Option<i32>,
    out: String,
}

/// Runs the example as a server with `server_args`, waits until it listens,
/// then as a client of 127.0.0.1 with `client_args`, both on the test
/// device and port (and a RoCE v2 GID on Ethernet).
fn run_pair(
    env: &Env,
    bin: &Path,
    server_args: &[&str],
    client_args: &[&str],
    tcp_port: u16,
) -> Result<(Outcome, Outcome), Failed> {
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
    let spawn = |own: &[&str], host: Option<&str>| {
        Command::new(bin)
            .args(&args)
            .args(own)
            .args(host)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    };
    let mut server = spawn(server_args, None)?;
    let (start, limit) = (Instant::now(), common::deadline());
    while !listening(tcp_port) {
        if let Some(st) = server.try_wait()? {
            let out = finish(server, Duration::ZERO)?.out;
            return Err(format!("the server exited ({st}) before listening:\n{out}").into());
        }
        if start.elapsed() > limit {
            let out = finish(server, Duration::ZERO)?.out;
            return Err(format!(
                "waited {limit:?} for the server to listen on TCP port {tcp_port} \
                 (raise RDMA_VERBS_TIME_SCALE on a slow machine):\n{out}"
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = spawn(client_args, Some("127.0.0.1"))?;
    let limit = common::scaled(Duration::from_secs(120));
    let client = finish(client, limit)?;
    let server = finish(server, limit)?;
    Ok((server, client))
}

/// The GID index to use: a RoCE v2 GID (IPv4-mapped if there is one) on
/// Ethernet ports, none on InfiniBand.
fn gid_index(env: &Env) -> Result<Option<u32>, Failed> {
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

/// Whether something listens on TCP `port` (from /proc/net/tcp and tcp6).
fn listening(port: u16) -> bool {
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

/// Waits for `child` up to `limit`, killing it after; its exit code and
/// output (stdout, then stderr).
fn finish(mut child: Child, limit: Duration) -> Result<Outcome, Failed> {
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out)?;
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut out)?;
    }
    if status.is_none() {
        out.push_str(&format!(
            "\n(killed after {limit:?}; raise RDMA_VERBS_TIME_SCALE on a slow machine)"
        ));
    }
    Ok(Outcome {
        code: status.and_then(|s| s.code()),
        out,
    })
}

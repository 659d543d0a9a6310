//! The `mw_invalidate` example (memory windows), server and client, in each
//! way of revoking the window: a type 2 window invalidated by the server's
//! LOCAL_INV, by the client's SEND_WITH_INV (`--remote-inv`), and a type 1
//! window unbound (`--type1`); once with a one-byte window.
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

use std::path::Path;
use std::process::Command;

use libtest_mimic::Failed;

use common::{procs, rust_example, Env, Need, Test};

const EXAMPLE: &str = "mw_invalidate";

fn main() -> std::process::ExitCode {
    let tests: &[Test] = tests![
        local_invalidate,
        remote_invalidate,
        type1_unbind,
        one_byte_window,
        mismatched_modes,
        bad_command_line,
    ];
    // Fixed TCP ports and one device: one run at a time.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    // rxe before rdma-core 36 has no memory windows (see `common::Need`).
    let needs = [
        ("local_invalidate", Need::MemoryWindows),
        ("remote_invalidate", Need::MemoryWindows),
        ("type1_unbind", Need::MemoryWindows),
        ("one_byte_window", Need::MemoryWindows),
    ];
    common::run_with("mw_example", tests, &needs, args)
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

fn type1_unbind(env: &Env) -> Result<(), Failed> {
    let (server, client) = good_run(env, &["--type1"], 19_302, 4096)?;
    let rkey = window_rkey(&client)?;
    ensure!(server.contains("type 1 window bound"), "server:\n{server}");
    expect_line(
        &server,
        &format!("type 1 window unbound by a bind of length 0 (rkey {rkey}, now "),
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

/// A run of the example as the server or the client.
struct Outcome {
    /// The exit code; `None` if killed (timeout) or ended by a signal.
    code: Option<i32>,
    /// Its stdout, then its stderr (and a note if it was killed).
    out: String,
}

/// Runs the example as a server with `server_args`, waits until it listens,
/// then as a client of 127.0.0.1 with `client_args`, both on the test
/// device and port (and a RoCE v2 GID on Ethernet): [`procs::tcp_pair`].
fn run_pair(
    env: &Env,
    bin: &Path,
    server_args: &[&str],
    client_args: &[&str],
    tcp_port: u16,
) -> Result<(Outcome, Outcome), Failed> {
    let (s, c) = procs::tcp_pair(
        env,
        (bin, server_args),
        (bin, client_args),
        tcp_port,
        EXAMPLE,
    )?;
    let outcome = |f: procs::Finished| Outcome {
        code: f.code,
        out: f.merged(),
    };
    Ok((outcome(s), outcome(c)))
}

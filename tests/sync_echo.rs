//! The `sync_echo` example (one thread, no tokio: `CmRouter` and
//! `CqRouter`) on the test device: a server and two client processes of 8
//! connections each at once, every connection making 100 round trips
//! whose echoes it checks byte for byte; a client with nobody listening;
//! bad command lines.
//!
//! The server listens on the test port's IPv4 address (from its RoCE GID,
//! or `RDMA_VERBS_CM_ADDR`) and counts as listening once `rdma resource
//! show cm_id` lists it. Needs the device (see `tests/common`) and the
//! `rdma` tool.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use libtest_mimic::Failed;

use common::{cm_addr, procs, rust_example, Env, Test};

const TESTS: &[Test] = tests![
    two_clients_of_eight_connections_at_once,
    no_server_fails_typed,
    bad_command_lines,
];

fn main() -> std::process::ExitCode {
    common::run("sync_echo", TESTS)
}

fn limit() -> Duration {
    common::deadline() * 6
}

fn two_clients_of_eight_connections_at_once(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let port = 7482;
    let srv = common::echo_server("sync_echo", ip, port, 16)?;
    let exe = rust_example("sync_echo")?;
    let client = || {
        procs::spawn(Command::new(&exe).args([
            "-p",
            &port.to_string(),
            "-c",
            "8",
            "-n",
            "100",
            &ip.to_string(),
        ]))
    };
    let (a, b) = (client()?, client()?);
    let a = procs::finish(a, limit())?;
    let b = procs::finish(b, limit())?;
    let s = procs::finish(srv, limit())?;
    let all = format!(
        "client 1:\n{}\nclient 2:\n{}\nserver:\n{}",
        a.merged(),
        b.merged(),
        s.merged()
    );
    ensure!(
        a.code == Some(0) && b.code == Some(0) && s.code == Some(0),
        "exit codes {:?} {:?} {:?}\n{all}",
        a.code,
        b.code,
        s.code
    );
    for c in [&a, &b] {
        ensure!(
            c.stdout
                .contains("sync_echo: 8 connections, 800 round trips, 0 failed, rtt median "),
            "client line\n{all}"
        );
    }
    ensure!(
        s.stdout.trim() == "sync_echo: served 16 connections, 1600 messages",
        "server line\n{all}"
    );
    ensure!(
        a.stderr.is_empty() && b.stderr.is_empty() && s.stderr.is_empty(),
        "stderr\n{all}"
    );
    eprintln!("sync_echo: {}", a.stdout.trim());
    Ok(())
}

fn no_server_fails_typed(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let client = procs::spawn(Command::new(rust_example("sync_echo")?).args([
        "-p",
        "7483",
        "-c",
        "3",
        "-n",
        "1",
        &ip.to_string(),
    ]))?;
    let c = procs::finish(client, limit())?;
    ensure!(c.code == Some(1), "exit code {:?}\n{}", c.code, c.merged());
    ensure!(
        c.stderr.contains(
            "connection 2: connect: waited for RDMA_CM_EVENT_ESTABLISHED, got RDMA_CM_EVENT_REJECTED"
        ),
        "{}",
        c.merged()
    );
    Ok(())
}

fn bad_command_lines(_env: &Env) -> Result<(), Failed> {
    common::echo_bad_command_lines("sync_echo")
}

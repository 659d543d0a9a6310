//! The `async_echo` example (tokio, RC through the CM) on the test device:
//! a server and 100 clients connected at once, each client making 100
//! round trips whose echoes it checks byte for byte; a client with nobody
//! listening; bad command lines.
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
    hundred_concurrent_clients,
    no_server_fails_typed,
    bad_command_lines,
];

fn main() -> std::process::ExitCode {
    common::run("async_echo", TESTS)
}

fn limit() -> Duration {
    common::deadline() * 6
}

fn hundred_concurrent_clients(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let port = 7480;
    let srv = common::echo_server("async_echo", ip, port, 100)?;
    let client = procs::spawn(Command::new(rust_example("async_echo")?).args([
        "-p",
        &port.to_string(),
        "-c",
        "100",
        "-n",
        "100",
        &ip.to_string(),
    ]))?;
    let c = procs::finish(client, limit())?;
    let s = procs::finish(srv, limit())?;
    let both = format!("client:\n{}\nserver:\n{}", c.merged(), s.merged());
    ensure!(
        c.code == Some(0) && s.code == Some(0),
        "exit codes {:?} {:?}\n{both}",
        c.code,
        s.code
    );
    ensure!(
        c.stdout
            .contains("async_echo: 100 connections, 10000 round trips, 0 failed, rtt median "),
        "client line\n{both}"
    );
    ensure!(
        s.stdout.trim() == "async_echo: served 100 connections, 10000 messages",
        "server line\n{both}"
    );
    ensure!(c.stderr.is_empty() && s.stderr.is_empty(), "stderr\n{both}");
    eprintln!("async_echo: {}", c.stdout.trim());
    Ok(())
}

fn no_server_fails_typed(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let client = procs::spawn(Command::new(rust_example("async_echo")?).args([
        "-p",
        "7481",
        "-c",
        "3",
        "-n",
        "1",
        &ip.to_string(),
    ]))?;
    let c = procs::finish(client, limit())?;
    ensure!(c.code == Some(1), "exit code {:?}\n{}", c.code, c.merged());
    ensure!(
        c.stderr.contains("3 connections, 0 round trips, 3 failed")
            && c.stderr.contains(
                "connect: waited for RDMA_CM_EVENT_ESTABLISHED, got RDMA_CM_EVENT_REJECTED"
            ),
        "{}",
        c.merged()
    );
    Ok(())
}

fn bad_command_lines(_env: &Env) -> Result<(), Failed> {
    common::echo_bad_command_lines("async_echo")
}

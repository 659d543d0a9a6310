//! The pingpong examples against rdma-core's C programs, over the wire.
//!
//! For each of rc, uc, ud and srq: Rust server with C client, C server with
//! Rust client, and Rust with Rust, each exchanging the default 1,000
//! iterations, with default options, with events mode (`-e`) and a
//! non-default size, and with `-c` (each side checks the bytes it received),
//! on the test device over 127.0.0.1. Both processes must exit 0, print
//! their results, and find no invalid data.
//!
//! With `-N` (sends posted through the `ibv_wr_*` API): rc against
//! `ibv_rc_pingpong -N` in both roles and Rust with Rust; uc, ud and srq
//! (where `-N` is an extension of the Rust port) against the C programs
//! without it, in both roles; with default options and with a non-default
//! size, 200 iterations and `-c`. And `rc_pingpong -t` against
//! `ibv_rc_pingpong -t` in both roles: on a device without completion
//! timestamps (rxe) the same message on stderr, nothing on stdout, the same
//! exit status; on a device with them a run of the two (the Rust side with
//! `-e` as client), both printing the timestamp statistics.
//!
//! With `-o` (buffers registered on demand): on a device without RC
//! on-demand paging, `rc_pingpong -o` and `ibv_rc_pingpong -o` fail the
//! same way in each role; on one with it, `ibv_rc_pingpong -o` (and `-o -P`,
//! prefetched) against `rc_pingpong` in both roles, and `rc_pingpong -o`
//! against `ibv_rc_pingpong -o` where the crate takes on-demand regions
//! (on rxe it refuses them, and `rc_pingpong -o` must say so).
//!
//! Also runs the `rdma_ops` example, server and client, which checks every
//! RDMA write, read and atomic result.
//!
//! Needs the device (see `tests/common`) and the C programs
//! (`ibv_rc_pingpong`, ... from rdma-core's ibverbs-utils): without a device
//! the runs are reported as ignored; with one but without the C programs
//! they fail, saying what to install.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::Command;

use libtest_mimic::Failed;

use common::{procs, rust_example, Env, Test};

/// Which program plays which role.
#[derive(Clone, Copy, Debug)]
enum Side {
    C,
    Rust,
}

struct Run {
    example: &'static str,
    server: Side,
    client: Side,
    server_args: &'static [&'static str],
    client_args: &'static [&'static str],
}

/// Eight runs per example: the three pairings with default options; the
/// three with events (`-e`) on one or both sides and a non-default size; and
/// both mixed pairings with `-c`, where each side checks the bytes it got.
macro_rules! runs_for {
    ($ex:literal, $size:literal) => {
        [
            Run {
                example: $ex,
                server: Side::Rust,
                client: Side::C,
                server_args: &[],
                client_args: &[],
            },
            Run {
                example: $ex,
                server: Side::C,
                client: Side::Rust,
                server_args: &[],
                client_args: &[],
            },
            Run {
                example: $ex,
                server: Side::Rust,
                client: Side::Rust,
                server_args: &[],
                client_args: &[],
            },
            Run {
                example: $ex,
                server: Side::Rust,
                client: Side::C,
                server_args: &["-e", "-s", $size],
                client_args: &["-e", "-s", $size],
            },
            Run {
                example: $ex,
                server: Side::C,
                client: Side::Rust,
                server_args: &["-s", $size],
                client_args: &["-e", "-s", $size],
            },
            Run {
                example: $ex,
                server: Side::Rust,
                client: Side::Rust,
                server_args: &["-e", "-s", $size],
                client_args: &["-s", $size],
            },
            Run {
                example: $ex,
                server: Side::Rust,
                client: Side::C,
                server_args: &["-c"],
                client_args: &["-c"],
            },
            Run {
                example: $ex,
                server: Side::C,
                client: Side::Rust,
                server_args: &["-c"],
                client_args: &["-c"],
            },
        ]
    };
}

const RC: [Run; 8] = runs_for!("rc", "1024");
const UC: [Run; 8] = runs_for!("uc", "1024");
const UD: [Run; 8] = runs_for!("ud", "512");
const SRQ: [Run; 8] = runs_for!("srq", "1024");

/// `-N` runs: `ibv_rc_pingpong -N` in both roles and Rust with Rust; the
/// other three with `-N` on the Rust side only (the C programs have none).
/// Each pairing with default options, and with a size of its own, 200
/// iterations and `-c` (events on one side): rc 4096 and 1024 against C and
/// 16 bytes Rust with Rust (inline on most devices: the data goes through
/// `ibv_wr_set_inline_data`), uc 2048 (two packets), ud 512, srq 4096.
const NEW_SEND: [Run; 18] = [
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N"],
        client_args: &["-N"],
    },
    Run {
        example: "rc",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-N"],
        client_args: &["-N"],
    },
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::Rust,
        server_args: &["-N"],
        client_args: &["-N"],
    },
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N", "-e", "-s", "4096", "-n", "200", "-c"],
        client_args: &["-N", "-s", "4096", "-n", "200", "-c"],
    },
    Run {
        example: "rc",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-N", "-s", "1024", "-n", "200", "-c"],
        client_args: &["-N", "-e", "-s", "1024", "-n", "200", "-c"],
    },
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::Rust,
        server_args: &["-N", "-s", "16", "-n", "200", "-c"],
        client_args: &["-N", "-s", "16", "-n", "200", "-c"],
    },
    Run {
        example: "uc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N"],
        client_args: &[],
    },
    Run {
        example: "uc",
        server: Side::C,
        client: Side::Rust,
        server_args: &[],
        client_args: &["-N"],
    },
    Run {
        example: "uc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N", "-s", "2048", "-n", "200", "-c"],
        client_args: &["-s", "2048", "-n", "200", "-c"],
    },
    Run {
        example: "uc",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-s", "2048", "-n", "200", "-c"],
        client_args: &["-N", "-e", "-s", "2048", "-n", "200", "-c"],
    },
    Run {
        example: "ud",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N"],
        client_args: &[],
    },
    Run {
        example: "ud",
        server: Side::C,
        client: Side::Rust,
        server_args: &[],
        client_args: &["-N"],
    },
    Run {
        example: "ud",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N", "-e", "-s", "512", "-n", "200", "-c"],
        client_args: &["-s", "512", "-n", "200", "-c"],
    },
    Run {
        example: "ud",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-s", "512", "-n", "200", "-c"],
        client_args: &["-N", "-s", "512", "-n", "200", "-c"],
    },
    Run {
        example: "srq",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N"],
        client_args: &[],
    },
    Run {
        example: "srq",
        server: Side::C,
        client: Side::Rust,
        server_args: &[],
        client_args: &["-N"],
    },
    Run {
        example: "srq",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-N", "-s", "4096", "-n", "200", "-c"],
        client_args: &["-s", "4096", "-n", "200", "-c"],
    },
    Run {
        example: "srq",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-s", "4096", "-n", "200", "-c"],
        client_args: &["-N", "-e", "-s", "4096", "-n", "200", "-c"],
    },
];

/// `ibv_rc_pingpong -o` against `rc_pingpong`: the C program as server
/// (on demand; the Rust client checks what comes back from that memory),
/// then as client (on demand and prefetched, checking what it receives
/// into it), `-c` on the Rust side and on the C client. Not on the C
/// server: `ibv_rc_pingpong -o -c` as server reports "invalid data in page
/// 0" once per run against a client without `-o`, the C program's own
/// included (rxe on Linux 7.2, 3 runs of 3; none when both use `-o`).
/// Then `rc_pingpong -o` against `ibv_rc_pingpong -o`, each role.
const ODP_C: [Run; 2] = [
    Run {
        example: "rc",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-o"],
        client_args: &["-e", "-c"],
    },
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-c"],
        client_args: &["-o", "-P", "-c"],
    },
];
const ODP_BOTH: [Run; 2] = [
    Run {
        example: "rc",
        server: Side::Rust,
        client: Side::C,
        server_args: &["-o", "-P", "-c"],
        client_args: &["-o", "-c"],
    },
    Run {
        example: "rc",
        server: Side::C,
        client: Side::Rust,
        server_args: &["-o", "-c"],
        client_args: &["-o", "-c"],
    },
];

fn nth(n: usize) -> &'static Run {
    [&RC, &UC, &UD, &SRQ][n / 8].get(n % 8).expect("32 runs")
}

/// The 32 pingpong runs of [`nth`], each its own test.
const PINGPONGS: &[Test] = tests![
    pingpong::<
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        12,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        20,
        21,
        22,
        23,
        24,
        25,
        26,
        27,
        28,
        29,
        30,
        31,
    >
];

/// The 18 runs of `NEW_SEND` (`-N`, the extended QP's `ibv_wr_*` path).
const NEW_SEND_RUNS: &[Test] =
    tests![new_send::<0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17>];

/// `rc_pingpong -t` and ODP runs against C, the Rust program the server
/// (`false`) or the client (`true`).
const AGAINST_C: &[Test] = tests![rc_ts::<false, true>];
const ODP_AGAINST_C: &[Test] = tests![rc_odp::<false, true>];

fn main() -> std::process::ExitCode {
    let mut tests = PINGPONGS.to_vec();
    tests.extend_from_slice(NEW_SEND_RUNS);
    tests.extend_from_slice(AGAINST_C);
    tests.extend_from_slice(ODP_AGAINST_C);
    tests.extend_from_slice(tests![rdma_ops]);
    // Two VMs' worth of pingpongs at once would share the one device and
    // the loopback ports: one at a time.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    // `-N` creates the QP with ibv_create_qp_ex, which rxe lacks before
    // rdma-core 34 (see `common::Need`).
    common::run_with(
        "interop",
        &tests,
        &[("new_send::*", common::Need::ExtendedQp)],
        args,
    )
}

fn pingpong<const N: usize>(env: &Env) -> Result<(), Failed> {
    run(env, nth(N), 19_000 + N as u16)
}

fn new_send<const N: usize>(env: &Env) -> Result<(), Failed> {
    run(env, &NEW_SEND[N], 19_200 + N as u16)
}

/// `rc_pingpong -t` and `ibv_rc_pingpong -t` in one role (`client`: with
/// `127.0.0.1`; the check comes before any connection). On a device without
/// completion timestamps both must fail the same way: the same stdout
/// (nothing), the same stderr ("The device isn't completion timestamp
/// capable"), the same exit status (1). On a device with them
/// ([`rc_ts_run`]) the Rust program in this role runs against the C one.
fn rc_ts<const CLIENT: bool>(env: &Env) -> Result<(), Failed> {
    let mask = env.ctx.query_device()?.completion_timestamp_mask;
    if mask != 0 {
        return rc_ts_run(env, CLIENT, mask);
    }
    let port = if CLIENT { 19_250 } else { 19_251 };
    both_refuse(
        env,
        CLIENT,
        "-t",
        port,
        "The device isn't completion timestamp capable\n",
    )
}

/// `rc_pingpong FLAG` and `ibv_rc_pingpong FLAG` in one role (`client`:
/// with `127.0.0.1`), on a device that lacks what the flag needs: the check
/// comes before any connection, and both must fail the same way: the same
/// stdout (nothing), the same stderr (`expected`), exit status 1.
fn both_refuse(
    env: &Env,
    client: bool,
    flag: &str,
    tcp_port: u16,
    expected: &str,
) -> Result<(), Failed> {
    let mut args: Vec<String> = vec![flag.into()];
    args.extend(procs::device_args(env, tcp_port)?);
    if client {
        args.push("127.0.0.1".into());
    }
    let rust = run_alone(&rust_example("rc_pingpong")?, &args)?;
    let role = if client { "client" } else { "server" };
    let c = run_alone(&on_path_c("ibv_rc_pingpong")?, &args)?;
    ensure!(
        rust == c,
        "{role}: rc_pingpong {flag} and ibv_rc_pingpong {flag} differ\n\
         --- Rust (status, stdout, stderr): {rust:?}\n--- C: {c:?}"
    );
    ensure!(
        c.0 == Some(1) && c.1.is_empty() && c.2 == expected,
        "{role}: ibv_rc_pingpong {flag} did not fail with {expected:?}: {c:?}"
    );
    eprintln!(
        "interop: rc {flag} {role}: both exit {:?} with {:?}",
        c.0,
        c.2.trim()
    );
    Ok(())
}

/// Runs `bin` with `args` to its end (one still running at the deadline is
/// an error): its exit status, stdout and stderr.
fn run_alone(bin: &PathBuf, args: &[String]) -> Result<(Option<i32>, String, String), Failed> {
    let limit = common::deadline();
    let ran = procs::finish(procs::spawn(Command::new(bin).args(args))?, limit)?;
    ensure!(
        ran.killed_after.is_none(),
        "still running after {limit:?} (raise RDMA_VERBS_TIME_SCALE on a slow machine)"
    );
    Ok((ran.code, ran.stdout, ran.stderr))
}

/// `-o` with the C program in one role (`client`). On a device without
/// on-demand paging for RC sends and receives, both programs refuse `-o`
/// alike ([`both_refuse`]). On one with it, `ibv_rc_pingpong -o` runs
/// against `rc_pingpong` ([`ODP_C`]); then, where the crate registers
/// on-demand regions, `rc_pingpong -o` against `ibv_rc_pingpong -o`
/// ([`ODP_BOTH`]), and where it refuses them (rxe), `rc_pingpong -o` in
/// this role must fail with the crate's reason.
fn rc_odp<const CLIENT: bool>(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::{AccessFlags, Error, OdpGeneralCaps, OdpTransportCaps};
    let odp = env.ctx.attr().odp;
    let rc = OdpTransportCaps::SEND | OdpTransportCaps::RECV;
    let port = if CLIENT { 19_260 } else { 19_261 };
    if !odp.general.contains(OdpGeneralCaps::SUPPORT) || !odp.rc.contains(rc) {
        return both_refuse(
            env,
            CLIENT,
            "-o",
            port,
            "The device isn't ODP capable or does not support RC send and receive with ODP\n",
        );
    }
    run(env, &ODP_C[usize::from(CLIENT)], port)?;
    let pd = env.ctx.alloc_pd()?;
    match pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND) {
        Ok(_) => run(env, &ODP_BOTH[usize::from(CLIENT)], port + 2),
        Err(Error::Unsupported { what, .. }) => {
            let mut args = vec!["-o".to_string()];
            args.extend(procs::device_args(env, port + 2)?);
            if !CLIENT {
                args.push("127.0.0.1".into());
            }
            let (code, stdout, stderr) = run_alone(&rust_example("rc_pingpong")?, &args)?;
            ensure!(
                code == Some(1)
                    && stdout.is_empty()
                    && stderr.starts_with("Couldn't register MR (")
                    && stderr.contains(what),
                "rc_pingpong -o where the crate refuses on-demand regions ({what}): \
                 {code:?}, stdout {stdout:?}, stderr {stderr:?}"
            );
            eprintln!("interop: rc_pingpong -o refused: {}", stderr.trim());
            Ok(())
        }
        Err(e) => Err(format!("an on-demand region on a device with ODP: {e}").into()),
    }
}

/// `rc_pingpong -t` against `ibv_rc_pingpong -t` on a device with completion
/// timestamps (`mask`): the Rust program as server or (with `-e`, polling
/// its extended CQ after events) as client, 1,000 iterations. Both must
/// exit 0 and print, after the results, the three statistics lines with
/// numbers (min <= average <= max).
fn rc_ts_run(env: &Env, client: bool, mask: u64) -> Result<(), Failed> {
    let rust = rust_example("rc_pingpong")?;
    let c = on_path_c("ibv_rc_pingpong")?;
    const TS: &[&str] = &["-t"];
    const TS_EVENTS: &[&str] = &["-t", "-e"];
    let (server, client_side) = if client {
        ((&c, TS), (&rust, TS_EVENTS))
    } else {
        ((&rust, TS), (&c, TS))
    };
    let role = if client { "client" } else { "server" };
    let what = format!("rc -t, Rust {role} (completion_timestamp_mask {mask:#x})");
    let port = if client { 19_250 } else { 19_251 };
    let (server_out, client_out) = pair(env, server, client_side, port, &what)?;
    for (who, out) in [("server", &server_out), ("client", &client_out)] {
        let stat = |name: &str| -> Result<f64, Failed> {
            let prefix = format!("{name} receive completion clock cycles = ");
            let line = out
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .ok_or_else(|| format!("{what}: {who} printed no {name:?} line\n{out}"))?;
            Ok(line.parse::<f64>().map_err(|e| {
                format!("{what}: {who}: {name} {line:?} is not a number ({e})\n{out}")
            })?)
        };
        let (max, min, avg) = (stat("Max")?, stat("Min")?, stat("Average")?);
        ensure!(
            min <= avg && avg <= max,
            "{what}: {who}: not min {min} <= average {avg} <= max {max}\n{out}"
        );
        ensure!(
            out.contains(" iters in "),
            "{what}: {who} printed no iteration time\n{out}"
        );
    }
    eprintln!("interop: {what}: both printed the timestamp statistics");
    Ok(())
}

fn run(env: &Env, r: &Run, tcp_port: u16) -> Result<(), Failed> {
    let program = |side: Side| -> Result<PathBuf, Failed> {
        match side {
            Side::C => on_path_c(&format!("ibv_{}_pingpong", r.example)),
            Side::Rust => rust_example(&format!("{}_pingpong", r.example)),
        }
    };
    let what = format!(
        "{} {:?} server {:?}, {:?} client {:?}",
        r.example, r.server, r.server_args, r.client, r.client_args
    );
    let (server_out, client_out) = pair(
        env,
        (&program(r.server)?, r.server_args),
        (&program(r.client)?, r.client_args),
        tcp_port,
        &what,
    )?;
    let both = format!("--- server:\n{server_out}\n--- client:\n{client_out}");
    ensure!(
        !both.contains("invalid data"),
        "{what}: a side found invalid data\n{both}"
    );
    for (who, out) in [("server", &server_out), ("client", &client_out)] {
        ensure!(
            out.contains("  local address:  LID 0x"),
            "{who} printed no local address\n{both}"
        );
        ensure!(
            out.contains("  remote address: LID 0x"),
            "{who} printed no remote address\n{both}"
        );
        ensure!(
            out.contains(" bytes in ") && out.contains("Mbit/sec"),
            "{who} printed no throughput\n{both}"
        );
        ensure!(
            out.contains(" iters in "),
            "{who} printed no iteration time\n{both}"
        );
    }
    let last = client_out
        .lines()
        .filter(|l| l.contains(" in "))
        .collect::<Vec<_>>()
        .join(" | ");
    eprintln!("interop: {what}: {last}");
    Ok(())
}

/// Runs a server and a client (the client gets `127.0.0.1` last) with the
/// device, port, TCP port and GID index options ([`procs::tcp_pair`]);
/// both must exit 0 within two minutes. Returns their outputs.
fn pair(
    env: &Env,
    server: (&PathBuf, &[&str]),
    client: (&PathBuf, &[&str]),
    tcp_port: u16,
    what: &str,
) -> Result<(String, String), Failed> {
    let (s, c) = procs::tcp_pair(
        env,
        (server.0, server.1),
        (client.0, client.1),
        tcp_port,
        what,
    )?;
    let (server_out, client_out) = (s.merged(), c.merged());
    ensure!(
        s.code == Some(0) && c.code == Some(0),
        "{what}: failed\n--- server:\n{server_out}\n--- client:\n{client_out}"
    );
    Ok((server_out, client_out))
}

/// The RDMA write/read/atomic example, server and client, every result checked.
fn rdma_ops(env: &Env) -> Result<(), Failed> {
    let bin = rust_example("rdma_ops")?;
    let (server_out, client_out) = pair(env, (&bin, &[]), (&bin, &[]), 19_100, "rdma_ops")?;
    ensure!(
        client_out.contains("all results checked"),
        "client:\n{client_out}"
    );
    ensure!(
        server_out.contains("region checked"),
        "server:\n{server_out}"
    );
    let summary = client_out
        .lines()
        .rfind(|l| l.contains("all results checked"))
        .unwrap_or("");
    eprintln!("interop: {summary}");
    Ok(())
}

/// An rdma-core C program (ibverbs-utils).
fn on_path_c(name: &str) -> Result<PathBuf, Failed> {
    common::on_path(name, "rdma-core's ibverbs-utils")
}

//! `xtask`: the logic of `.ci/` that is not starting a VM or a guest.
//!
//! The shell scripts of `.ci/` boot the VMs, run the test executables in
//! them and keep their output; everything that *reads* output (cargo's JSON,
//! libtest's and valgrind's logs, Debian's package indexes) or sums it up is
//! here, in Rust, with unit tests on samples of real output
//! (`tests/samples/`). Each subcommand reads files or standard input and
//! prints lines.
//!
//! | subcommand | module | what it does |
//! |---|---|---|
//! | `scale SECONDS` | here | SECONDS times `RDMA_VERBS_TIME_SCALE`, rounded (every deadline of `.ci`) |
//! | `tests ...` | [`tests`](mod@tests) | `.ci/vm test`'s list of executables, its results and closing lines; `.ci/run`'s and `.ci/matrix`'s summaries |
//! | `cargo ...` | [`cargo`] | fields of cargo's JSON (target folder, build script output, test executables, rust-version) |
//! | `packages ...` | [`packages`] | Debian's package indexes (`.ci/rdma-core-prefix`) |
//! | `bench ...` | [`bench`](mod@bench) | the bench's statistics and tables |
//! | `udp-ports N` | here | N free UDP ports on 127.0.0.1 (`.ci/hosts`' link) |
//!
//! ## How the scripts call it
//! `.ci/xtask/xtask.sh` (sourced by `.ci/vm-common`, `.ci/run`, `.ci/matrix`,
//! `.ci/releases` and `.ci/rdma-core-prefix`) defines the shell function
//! `xtask ARGS...`: it builds this package on the host (release, in
//! `.ci/xtask/target` whatever `CARGO_TARGET_DIR` says; a no-op once built)
//! and runs it. Guests cannot build: the scripts that run in a VM call
//! `"$RDMA_VERBS_XTASK" ARGS...`, the binary's path, which the host built
//! before booting and passes on with the rest of the `RDMA_VERBS_*`
//! environment.
//!
//! ## Changing it
//! - What `.ci/vm test` prints at the end (`device-vm: N passed, M failed, K
//!   skipped`, `valgrind-vm: ...; valgrind: E errors (S suppressed)`, `  FAILED:
//!   ...`, `  suppressed N x NAME`) is written in one place,
//!   `src/tests/summary.rs`; `.ci/run`'s and `.ci/matrix`'s summaries read
//!   those lines back through the same module (`src/tests/steps.rs`). The
//!   README and `src/guide/testing.md` quote the first two lines.
//! - Its checks, which `.ci/run` runs as its step `xtask` (beside valgrind):
//!   `cargo fmt --check`, `cargo clippy --all-targets --locked -- -D warnings`
//!   and `cargo test --locked`, each with `--manifest-path .ci/xtask/Cargo.toml`
//!   (or in `.ci/xtask`). The package uses std only and has its own
//!   `Cargo.lock` and `[workspace]`: it is not part of the published crate.
//! - A new parser gets a sample of the real output it reads in
//!   `tests/samples/` (small: a few lines of a real log) and a unit test.

mod bench;
mod cargo;
mod json;
mod packages;
mod tests;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("usage: xtask scale|tests|packages|bench|cargo|udp-ports ...");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "scale" => scale(rest),
        "tests" => tests::main(rest),
        "packages" => packages::main(rest),
        "bench" => bench::main(rest),
        "cargo" => cargo::main(rest),
        "udp-ports" => udp_ports(rest),
        other => Err(format!("unknown subcommand {other:?}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::from(2)
        }
    }
}

/// `xtask scale SECONDS`: a deadline stretched by `RDMA_VERBS_TIME_SCALE`
/// (default 1; a value that is not a positive number counts as 1), rounded
/// to whole seconds.
fn scale(args: &[String]) -> Result<ExitCode, String> {
    let [secs] = args else {
        return Err("usage: xtask scale SECONDS".into());
    };
    let secs: f64 = secs
        .parse()
        .map_err(|_| format!("not a number of seconds: {secs:?}"))?;
    let factor = std::env::var("RDMA_VERBS_TIME_SCALE").ok();
    println!("{}", scaled(secs, factor.as_deref()));
    Ok(ExitCode::SUCCESS)
}

/// `xtask udp-ports N`: N UDP ports on 127.0.0.1 that nothing uses now (the
/// kernel picks them; they are free again when this exits), on one line.
fn udp_ports(args: &[String]) -> Result<ExitCode, String> {
    let n: usize = match args {
        [n] => n.parse().map_err(|_| format!("not a count: {n:?}"))?,
        _ => return Err("usage: xtask udp-ports N".into()),
    };
    let sockets = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("binding a UDP socket: {e}"))?;
    let ports = sockets
        .iter()
        .map(|s| s.local_addr().map(|a| a.port().to_string()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    println!("{}", ports.join(" "));
    Ok(ExitCode::SUCCESS)
}

fn scaled(secs: f64, factor: Option<&str>) -> u64 {
    let f = factor
        .and_then(|f| f.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(1.0);
    (secs * f).round() as u64
}

#[cfg(test)]
mod unit {
    use super::scaled;

    #[test]
    fn scale_multiplies_and_rounds() {
        assert_eq!(scaled(120.0, None), 120);
        assert_eq!(scaled(120.0, Some("2.5")), 300);
        assert_eq!(scaled(7.0, Some("1.5")), 11);
    }

    #[test]
    fn a_bad_scale_counts_as_one() {
        for f in ["0", "-2", "x", "", "NaN", "inf"] {
            assert_eq!(scaled(300.0, Some(f)), 300, "{f:?}");
        }
    }
}

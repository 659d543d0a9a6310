//! Shared by the device test binaries: picks the device, and reports the
//! tests as ignored (not passed) when there is none, or as failed when the
//! run demands a device.
//!
//! Environment:
//! * `RDMA_VERBS_DEVICE`: the device to test (default: the first one);
//! * `RDMA_VERBS_PORT`: the port to test (default: 1);
//! * `RDMA_VERBS_REQUIRE_DEVICE=1`: a missing device fails every test
//!   instead of skipping it (the VM run always sets it).
#![allow(dead_code)]

use std::process::ExitCode;

use libtest_mimic::{Arguments, Failed, Trial};
use rdma_verbs::{Context, DeviceList};

/// What a device test gets: an open context on the chosen device, and the port.
pub struct Env {
    pub ctx: Context,
    pub port: u8,
}

pub type TestFn = fn(&Env) -> Result<(), Failed>;

/// Whether the run demands a device.
pub fn device_required() -> bool {
    matches!(
        std::env::var("RDMA_VERBS_REQUIRE_DEVICE").as_deref(),
        Ok("1" | "true" | "yes")
    )
}

/// The name of the device to test, or why there is none.
pub fn device_name() -> Result<String, String> {
    let list = DeviceList::new().map_err(|e| e.to_string())?;
    match std::env::var("RDMA_VERBS_DEVICE") {
        Ok(name) if !name.is_empty() => list
            .find(&name)
            .map(|d| d.name().to_owned())
            .map_err(|e| format!("{e} (RDMA_VERBS_DEVICE={name})")),
        _ => list
            .get(0)
            .map(|d| d.name().to_owned())
            .ok_or_else(|| "no RDMA devices on this machine".to_owned()),
    }
}

pub fn port() -> u8 {
    std::env::var("RDMA_VERBS_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
}

/// Opens the test device.
pub fn env() -> Result<Env, Failed> {
    let name = device_name()?;
    let ctx = Context::open(&name).map_err(|e| format!("opening {name}: {e}"))?;
    Ok(Env { ctx, port: port() })
}

/// Runs `tests` as libtest-mimic trials, with the command line's arguments.
pub fn run(binary: &str, tests: &[(&'static str, TestFn)]) -> ExitCode {
    run_with(binary, tests, Arguments::from_args())
}

/// Runs `tests` as libtest-mimic trials.
pub fn run_with(binary: &str, tests: &[(&'static str, TestFn)], args: Arguments) -> ExitCode {
    let device = device_name();
    let skip = match &device {
        Ok(name) => {
            eprintln!("{binary}: device tests run against {name}, port {}", port());
            false
        }
        Err(why) if device_required() => {
            eprintln!("{binary}: RDMA_VERBS_REQUIRE_DEVICE is set but there is no device: {why}");
            false
        }
        Err(why) => {
            eprintln!(
                "{binary}: SKIPPED {} device tests: {why} \
                 (set RDMA_VERBS_REQUIRE_DEVICE=1 to make this a failure)",
                tests.len()
            );
            true
        }
    };
    let trials = tests
        .iter()
        .map(|&(name, f)| {
            Trial::test(name, move || {
                let env = env()?;
                f(&env)
            })
            .with_ignored_flag(skip)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit_code()
}

/// Fails with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+).into());
        }
    };
}

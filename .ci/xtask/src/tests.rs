//! `xtask tests`: to be written.

use std::process::ExitCode;

/// Runs `xtask tests ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    Err(format!("no tests subcommand yet: {args:?}"))
}

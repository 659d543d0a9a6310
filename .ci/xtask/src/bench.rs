//! `xtask bench`: to be written.

use std::process::ExitCode;

/// Runs `xtask bench ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    Err(format!("no bench subcommand yet: {args:?}"))
}

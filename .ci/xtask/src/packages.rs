//! `xtask packages`: to be written.

use std::process::ExitCode;

/// Runs `xtask packages ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    Err(format!("no packages subcommand yet: {args:?}"))
}

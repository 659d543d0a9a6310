//! `xtask`: the logic of `.ci/` that is not starting a VM or a guest.
//!
//! Each subcommand reads files or standard input and prints lines; the shell
//! scripts of `.ci/` call it through `xtask` in `.ci/vm-common`.
//!
//! | subcommand | module | what it does |
//! |---|---|---|
//! | `tests ...` | [`tests`] | test lists, a run's results and summary lines |
//! | `packages ...` | [`packages`] | Debian package indexes |
//! | `bench ...` | [`bench`] | the bench's statistics and tables |

mod bench;
mod packages;
mod tests;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("usage: xtask tests|packages|bench ...");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "tests" => tests::main(rest),
        "packages" => packages::main(rest),
        "bench" => bench::main(rest),
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

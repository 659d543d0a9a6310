//! `xtask tests ...`: the test runs of `.ci/vm test`, `.ci/run` and
//! `.ci/matrix`, read and summed up. The shell starts the VM and runs the
//! executables; everything that reads their output is here.
//!
//! | command | called by | what it does |
//! |---|---|---|
//! | `list [SELECT]` | `.ci/vm test` | the executables to run (`RES/tests.list`), from cargo's JSON messages on standard input ([`list`]) |
//! | `ran-whole LOG` | `.ci/vm test`'s `host_first` | exit 0 if LOG (an executable's run on the host, device tests skipped) skipped none: it needs no device |
//! | `valgrind-report VGLOG` | `.ci/vm`'s `guest_tests`, in the guest | memcheck's report without its repeated error list ([`valgrind`]) |
//! | `summary LABEL LIST RES [valgrind]` | `.ci/vm test` | the run's closing lines ([`summary`]); exit 1 if it failed |
//! | `check-suppressions FILE` | `.ci/vm test --valgrind` | the rules of `.ci/valgrind.supp` ([`suppressions`]); exit 1 if broken |
//! | `steps-summary run\|matrix LOGS` | `.ci/run`, `.ci/matrix` | their closing summary ([`steps`]); exit 1 if a step failed |
//!
//! The results folder `RES` of `.ci/vm test` holds, for the N-th line of
//! `LIST`: `N.log` (its output), `N.status` (its exit status; missing if it
//! did not finish) and under valgrind `N.vg.log` (memcheck's log).
//! To change what the summary lines say, edit [`summary`]: `.ci/run` and
//! `.ci/matrix` read them back through it.

mod libtest;
mod list;
mod steps;
mod summary;
mod suppressions;
mod valgrind;

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

/// Runs `xtask tests ARGS...`.
pub fn main(args: &[String]) -> Result<ExitCode, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args[..] {
        ["list"] => list_command(""),
        ["list", select] => list_command(select),
        ["ran-whole", log] => Ok(exit_if(libtest::ran_whole(&read_lossy(Path::new(log)).unwrap_or_default()))),
        ["valgrind-report", log] => {
            match read_lossy(Path::new(log)) {
                Some(text) => print!("{}", valgrind::report(&text)),
                None => println!("(no valgrind log)"),
            }
            Ok(ExitCode::SUCCESS)
        }
        ["summary", label, list, res] => summary_command(label, list, res, false),
        ["summary", label, list, res, "valgrind"] => summary_command(label, list, res, true),
        ["check-suppressions", file] => {
            let text = read_lossy(Path::new(file)).ok_or_else(|| format!("cannot read {file}"))?;
            let problems = suppressions::check(file, &text);
            problems.iter().for_each(|p| println!("{p}"));
            Ok(exit_if(problems.is_empty()))
        }
        ["steps-summary", "run", logs] => Ok(print_lines(steps::lines(steps::Which::Run, Path::new(logs)))),
        ["steps-summary", "matrix", logs] => Ok(print_lines(steps::lines(steps::Which::Matrix, Path::new(logs)))),
        _ => Err("usage: xtask tests list [SELECT] | ran-whole LOG | valgrind-report VGLOG | \
                  summary LABEL LIST RES [valgrind] | check-suppressions FILE | steps-summary run|matrix LOGS"
            .into()),
    }
}

/// A file's text (bytes that are not UTF-8 replaced), `None` if it cannot be
/// read (it is missing: the run did not get that far).
pub fn read_lossy(path: &Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn exit_if(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_lines((lines, ok): (Vec<String>, bool)) -> ExitCode {
    lines.iter().for_each(|l| println!("{l}"));
    exit_if(ok)
}

/// `tests list`: the list on standard output, notes and errors on standard
/// error (exit 1 when the selection names a target that was not built).
fn list_command(select: &str) -> Result<ExitCode, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("standard input: {e}"))?;
    let built = crate::cargo::test_executables(&crate::cargo::messages(&input));
    match list::lines(&built, select) {
        Ok((lines, notes)) => {
            notes.iter().for_each(|n| eprintln!("{n}"));
            lines.iter().for_each(|l| println!("{l}"));
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `tests summary`: each listed executable's results from `res`, summed up.
fn summary_command(label: &str, list: &str, res: &str, valgrind: bool) -> Result<ExitCode, String> {
    let list = read_lossy(Path::new(list)).ok_or_else(|| format!("cannot read {list}"))?;
    let res = Path::new(res);
    let exes = exe_results(&list, res, valgrind);
    let suppressions = if valgrind {
        used_suppressions(res)
    } else {
        Vec::new()
    };
    Ok(print_lines(summary::lines(
        label,
        &exes,
        valgrind,
        &suppressions,
    )))
}

/// The results of the executables of `list` (lines `EXE<TAB>DIR[<TAB>FILTER]`)
/// from their files in `res`.
fn exe_results(list: &str, res: &Path, valgrind: bool) -> Vec<summary::ExeResult> {
    let file = |i: usize, ext: &str| read_lossy(&res.join(format!("{i}.{ext}")));
    list.lines()
        .enumerate()
        .map(|(i, line)| {
            let i = i + 1;
            let mut fields = line.split('\t');
            let (exe, dir, filter) = (
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
                fields.next().unwrap_or(""),
            );
            let short = exe.strip_prefix(&format!("{dir}/")).unwrap_or(exe);
            let name = if filter.is_empty() {
                short.to_owned()
            } else {
                format!("{short} {filter}")
            };
            let status = file(i, "status").map_or("did not finish".to_owned(), |s| {
                s.trim_end_matches('\n').to_owned()
            });
            let counts = libtest::results(&file(i, "log").unwrap_or_default());
            let valgrind = file(i, "vg.log")
                .filter(|_| valgrind)
                .and_then(|l| valgrind::error_summary(&l));
            summary::ExeResult {
                name,
                status,
                counts,
                valgrind,
            }
        })
        .collect()
}

/// The suppressions used in every memcheck log of `res` (`*.vg.log`).
fn used_suppressions(res: &Path) -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir(res) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".vg.log"))
        .filter_map(|e| read_lossy(&e.path()))
        .flat_map(|log| valgrind::used_suppressions(&log))
        .collect()
}

/// For unit tests: `f` on a new folder that holds `files` (name, text),
/// removed afterwards.
#[cfg(test)]
pub fn with_folder<T>(name: &str, files: &[(&str, &str)], f: impl FnOnce(&Path) -> T) -> T {
    let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let result = f(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    result
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_results_folder_is_read_as_the_shell_wrote_it() {
        let vg = include_str!("../tests/samples/valgrind-one-error.vg.log");
        let ok = "test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 68.68s\n";
        let files = [
            ("1.log", ok),
            ("1.status", "97\n"),
            ("1.vg.log", vg),
            ("2.log", "running 5 tests\n"),
        ];
        let list =
            "/p/target/debug/deps/alloc-1\t/p\t\n/p/target/debug/deps/leaks-2\t/p\t-drop::\n";
        let (out, ok) = with_folder("tests", &files, |res| {
            let exes = exe_results(list, res, true);
            summary::lines("valgrind-vm", &exes, true, &used_suppressions(res))
        });
        let want = [
            "",
            "valgrind-vm: 6 passed, 0 failed, 0 skipped; valgrind: 1 errors (3 suppressed)",
            "  suppressed 3 x noisy_cond",
            "  FAILED: target/debug/deps/alloc-1 (1 valgrind errors)",
            "  FAILED: target/debug/deps/leaks-2 -drop:: (no valgrind summary; status: did not finish)",
        ];
        assert_eq!((out, ok), (want.map(String::from).to_vec(), false));
    }
}

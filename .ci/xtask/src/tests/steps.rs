//! The closing summary of `.ci/run` and of `.ci/matrix`, from their logs
//! folder: `results` (a line per step, `ok      NAME (12s)` or `FAILED  NAME
//! (status 1, 12s)`, written by their `step` function) and `STEP.log` (each
//! step's output).
//!
//! `.ci/run` prints the results, the test summary lines of its device suites
//! ([`super::summary`]'s), the two-host lines, the failed executables, its
//! verdict, and last the tests run against rxe0 (`device-tests: ...`: the
//! README's test run and the valgrind run; the host run's device tests are
//! skipped by design). `.ci/matrix` prints the results, its parts' summary
//! and failed lines, and its verdict.

use super::read_lossy;
use super::summary::{counts_line, is_failed_line, parse_counts_line, Counts};
use std::path::Path;

/// Which summary: `.ci/run`'s or `.ci/matrix`'s.
#[derive(Clone, Copy, PartialEq)]
pub enum Which {
    Run,
    Matrix,
}

/// The summary's lines and whether every step passed.
pub fn lines(which: Which, logs: &Path) -> (Vec<String>, bool) {
    let results = read_lossy(&logs.join("results")).unwrap_or_default();
    let passed = !results.lines().any(|l| l.starts_with("FAILED"));
    let mut out: Vec<String> = results.lines().map(|l| format!("  {l}")).collect();
    let (test_lines, who, all_passed) = match which {
        Which::Run => (run_test_lines(logs), "ci", "all steps passed"),
        Which::Matrix => (matrix_test_lines(logs), "matrix", "all parts passed"),
    };
    out.extend(test_lines);
    let verdict = if passed {
        format!("{who}: {all_passed}")
    } else {
        format!("{who}: FAILED (logs in {})", logs.display())
    };
    out.push(verdict);
    if which == Which::Run {
        out.push(device_tests_line(logs));
    }
    (out, passed)
}

/// The lines of the named logs (in that order, each log's in its order) that
/// `keep` keeps.
fn lines_of(logs: &Path, names: &[&str], keep: impl Fn(&str) -> bool) -> Vec<String> {
    let texts = names
        .iter()
        .filter_map(|n| read_lossy(&logs.join(format!("{n}.log"))));
    texts
        .flat_map(|t| {
            t.lines()
                .filter(|l| keep(l))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The steps of `.ci/run` with a device suite, and their summary labels.
const RUN_SUITES: [(&str, &str); 3] = [
    ("readme-test", "device-vm"),
    ("valgrind", "valgrind-vm"),
    ("stack-sid", "device-vm-sid"),
];

/// `.ci/run`'s test lines: the suites' summaries, the two hosts' (each side's
/// `hosts-interop: N steps ...`; each fault test's `hosts: ... came back`
/// and the whole run's `test result`), then the failed executables.
fn run_test_lines(logs: &Path) -> Vec<String> {
    let suites: Vec<&str> = RUN_SUITES.iter().map(|(step, _)| *step).collect();
    let is_suite_line = |l: &str| {
        parse_counts_line(l).is_some_and(|(label, _)| RUN_SUITES.iter().any(|(_, s)| *s == label))
    };
    let mut out: Vec<String> = lines_of(logs, &suites, is_suite_line)
        .iter()
        .map(|l| format!("  {l}"))
        .collect();
    let interop = lines_of(logs, &["hosts-interop"], |l| {
        side_line(l)
            .and_then(|r| r.strip_prefix("hosts-interop: "))
            .is_some_and(|r| {
                let digits = r.bytes().take_while(u8::is_ascii_digit).count();
                digits > 0 && r[digits..].starts_with(" steps")
            })
    });
    let faults = lines_of(logs, &["hosts-tests"], |l| {
        side_line(l).is_some_and(|r| {
            r.strip_prefix("hosts: ")
                .is_some_and(|r| r.contains("came back"))
                || r.strip_prefix("test result: ")
                    .is_some_and(|r| r.contains(" 0 filtered out"))
        })
    });
    out.extend(interop.iter().chain(&faults).map(|l| format!("  {l}")));
    out.extend(lines_of(logs, &suites, is_failed_line));
    out
}

/// A line of one VM of two (`[server] REST`, `[client] REST`): REST.
fn side_line(line: &str) -> Option<&str> {
    line.strip_prefix("[server] ")
        .or_else(|| line.strip_prefix("[client] "))
}

/// `device-tests: P passed, F failed, S skipped`: the README's test run and
/// the valgrind run, added up.
fn device_tests_line(logs: &Path) -> String {
    let mut total = Counts::default();
    let wanted = |label: &str| label == "device-vm" || label == "valgrind-vm";
    for line in lines_of(logs, &["readme-test", "valgrind"], |_| true) {
        if let Some((_, c)) = parse_counts_line(&line).filter(|(label, _)| wanted(label)) {
            total += c;
        }
    }
    counts_line("device-tests", total, None)
}

/// `.ci/matrix`'s test lines: each log's (in the order of their names)
/// device suite summaries and failed executables, indented.
fn matrix_test_lines(logs: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(logs)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.retain(|n| n.ends_with(".log"));
    names.sort();
    let stems: Vec<&str> = names.iter().map(|n| n.trim_end_matches(".log")).collect();
    let keep = |l: &str| {
        let part_line = parse_counts_line(l)
            .is_some_and(|(label, _)| label == "device-vm-trixie" || label == "device-vm-33");
        part_line || is_failed_line(l)
    };
    lines_of(logs, &stems, keep)
        .iter()
        .map(|l| format!("  {l}"))
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::tests::with_folder;

    /// The samples' expected summaries are what the shell code this replaced
    /// printed for the same folders (a failed run's logs of `.ci/run`, cut
    /// short, with the two-host logs of a passing one; `.ci/matrix`'s grep).
    #[test]
    fn the_summaries_are_the_shells() {
        for (which, name) in [(Which::Run, "ci-logs"), (Which::Matrix, "matrix-logs")] {
            let want = std::fs::read_to_string(format!("tests/samples/{name}.summary")).unwrap();
            let (out, passed) = lines(which, Path::new(&format!("tests/samples/{name}")));
            assert_eq!(out.join("\n") + "\n", want, "{name}");
            assert!(!passed);
        }
    }

    #[test]
    fn a_passing_run_says_so() {
        let files = [
            ("results", "ok      fmt (2s)\n"),
            (
                "readme-test.log",
                "device-vm: 546 passed, 0 failed, 0 skipped\n",
            ),
        ];
        let (out, passed) = with_folder("steps", &files, |logs| lines(Which::Run, logs));
        let want = [
            "  ok      fmt (2s)",
            "  device-vm: 546 passed, 0 failed, 0 skipped",
            "ci: all steps passed",
            "device-tests: 546 passed, 0 failed, 0 skipped",
        ];
        assert_eq!((out, passed), (want.map(String::from).to_vec(), true));
    }
}

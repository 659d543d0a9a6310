//! The closing lines of a `.ci/vm test` run, the one place that writes them
//! (and reads them back, for `.ci/run`'s and `.ci/matrix`'s summaries):
//!
//! ```text
//! device-vm: 546 passed, 0 failed, 0 skipped
//! valgrind-vm: 255 passed, 0 failed, 0 skipped; valgrind: 0 errors (0 suppressed)
//!   suppressed 3 x noisy_cond
//!   FAILED: target/debug/deps/device-657ae097990f9fa0 route:: (status: 101)
//!   no test ran
//! ```
//!
//! The README and the testing guide quote the first two: a change here is a
//! change there. [`parse_counts_line`] must read what [`counts_line`] writes
//! (a unit test says so).

use std::ops::AddAssign;

/// Tests passed, failed and skipped (libtest's "ignored").
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.skipped += o.skipped;
    }
}

/// memcheck's errors, and the errors its suppressions hid.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Valgrind {
    pub errors: u64,
    pub suppressed: u64,
}

/// `LABEL: P passed, F failed, S skipped`, with `; valgrind: E errors (S
/// suppressed)` after it for a valgrind run.
pub fn counts_line(label: &str, c: Counts, valgrind: Option<Valgrind>) -> String {
    let mut line = format!(
        "{label}: {} passed, {} failed, {} skipped",
        c.passed, c.failed, c.skipped
    );
    if let Some(v) = valgrind {
        line += &format!(
            "; valgrind: {} errors ({} suppressed)",
            v.errors, v.suppressed
        );
    }
    line
}

/// The label and counts of a line [`counts_line`] wrote (`None` for any
/// other line).
pub fn parse_counts_line(line: &str) -> Option<(&str, Counts)> {
    let (label, rest) = line.split_once(": ")?;
    let mut n = [0u64; 3];
    let mut rest = rest;
    for (i, word) in [" passed, ", " failed, ", " skipped"].iter().enumerate() {
        let (number, after) = rest.split_once(word)?;
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n[i] = number.parse().ok()?;
        rest = after;
    }
    Some((
        label,
        Counts {
            passed: n[0],
            failed: n[1],
            skipped: n[2],
        },
    ))
}

/// `  FAILED: WHAT`: one line per test executable that failed.
pub fn failed_line(what: &str) -> String {
    format!("  FAILED: {what}")
}

/// Is this a line [`failed_line`] wrote (indented `FAILED: `)?
pub fn is_failed_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    trimmed.len() < line.len() && trimmed.starts_with("FAILED: ")
}

/// `  suppressed N x NAME`: a suppression of `.ci/valgrind.supp` that fired.
fn suppressed_line(name: &str, n: u64) -> String {
    format!("  suppressed {n} x {name}")
}

/// What a run that reported no test at all adds.
const NO_TEST_RAN: &str = "  no test ran";

/// One test executable's part of a run, as its files in the results folder
/// tell it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExeResult {
    /// Its path below its package (and its filter, if it has one).
    pub name: String,
    /// Its exit status, or `did not finish`.
    pub status: String,
    /// Its libtest summary lines.
    pub counts: Vec<Counts>,
    /// Under valgrind: its error summary (`None`: valgrind did not finish).
    pub valgrind: Option<Valgrind>,
}

/// The summary of a run: its lines (the first one empty) and whether it
/// passed. `suppressions` are (NAME, N) pairs, in any order, repeated names
/// summed; `valgrind` says whether the run was under valgrind.
pub fn lines(
    label: &str,
    exes: &[ExeResult],
    valgrind: bool,
    suppressions: &[(String, u64)],
) -> (Vec<String>, bool) {
    let mut total = Counts::default();
    let mut vg_total = Valgrind::default();
    let mut failures = Vec::new();
    for exe in exes {
        exe.counts.iter().for_each(|c| total += *c);
        failures.extend(
            failure_reasons(exe, valgrind)
                .into_iter()
                .map(|why| format!("{} ({why})", exe.name)),
        );
        if let Some(v) = exe.valgrind.filter(|_| valgrind) {
            vg_total.errors += v.errors;
            vg_total.suppressed += v.suppressed;
        }
    }
    let mut out = vec![
        String::new(),
        counts_line(label, total, valgrind.then_some(vg_total)),
    ];
    if valgrind {
        out.extend(suppression_lines(suppressions));
    }
    out.extend(failures.iter().map(|f| failed_line(f)));
    if !failures.is_empty() {
        return (out, false);
    }
    if total.passed + total.failed == 0 {
        out.push(NO_TEST_RAN.to_owned());
        return (out, false);
    }
    (out, true)
}

/// Why one executable failed (empty: it passed). Under valgrind its exit
/// status 97 is memcheck's `--error-exitcode`, counted as its errors.
fn failure_reasons(exe: &ExeResult, valgrind: bool) -> Vec<String> {
    let st = &exe.status;
    if !valgrind {
        return if st == "0" {
            vec![]
        } else {
            vec![format!("status: {st}")]
        };
    }
    let Some(v) = exe.valgrind else {
        return vec![format!("no valgrind summary; status: {st}")];
    };
    let mut why = Vec::new();
    if v.errors != 0 {
        why.push(format!("{} valgrind errors", v.errors));
    }
    if st != "0" && st != "97" {
        why.push(format!("status: {st}"));
    }
    why
}

/// A line per suppression name with its summed count, sorted as lines.
fn suppression_lines(suppressions: &[(String, u64)]) -> Vec<String> {
    let mut sums = std::collections::BTreeMap::<&str, u64>::new();
    for (name, n) in suppressions {
        *sums.entry(name).or_default() += n;
    }
    let mut lines: Vec<String> = sums
        .into_iter()
        .map(|(name, n)| suppressed_line(name, n))
        .collect();
    lines.sort();
    lines
}

#[cfg(test)]
mod unit {
    use super::*;

    fn exe(name: &str, status: &str, counts: (u64, u64, u64), vg: Option<(u64, u64)>) -> ExeResult {
        ExeResult {
            name: name.into(),
            status: status.into(),
            counts: vec![Counts {
                passed: counts.0,
                failed: counts.1,
                skipped: counts.2,
            }],
            valgrind: vg.map(|(errors, suppressed)| Valgrind { errors, suppressed }),
        }
    }

    #[test]
    fn a_passing_run() {
        let exes = [
            exe("deps/a-1", "0", (8, 0, 0), None),
            exe("deps/b-2", "0", (538, 0, 0), None),
        ];
        let (out, ok) = lines("device-vm", &exes, false, &[]);
        assert_eq!(out, ["", "device-vm: 546 passed, 0 failed, 0 skipped"]);
        assert!(ok);
    }

    #[test]
    fn a_failing_valgrind_run() {
        let exes = [
            exe("deps/device-1 route::", "101", (20, 3, 0), Some((0, 0))),
            exe("deps/leaks-2", "did not finish", (0, 0, 0), None),
            exe("deps/alloc-3", "97", (6, 0, 0), Some((2, 5))),
        ];
        let supp = [
            ("b".to_owned(), 2),
            ("a".to_owned(), 12),
            ("b".to_owned(), 1),
        ];
        let (out, ok) = lines("valgrind-vm", &exes, true, &supp);
        let want = [
            "",
            "valgrind-vm: 26 passed, 3 failed, 0 skipped; valgrind: 2 errors (5 suppressed)",
            "  suppressed 12 x a",
            "  suppressed 3 x b",
            "  FAILED: deps/device-1 route:: (status: 101)",
            "  FAILED: deps/leaks-2 (no valgrind summary; status: did not finish)",
            "  FAILED: deps/alloc-3 (2 valgrind errors)",
        ];
        assert_eq!(out, want);
        assert!(!ok);
    }

    #[test]
    fn a_run_without_tests_fails() {
        let (out, ok) = lines(
            "device-vm",
            &[exe("deps/a-1", "0", (0, 0, 4), None)],
            false,
            &[],
        );
        assert_eq!(
            out,
            [
                "",
                "device-vm: 0 passed, 0 failed, 4 skipped",
                "  no test ran"
            ]
        );
        assert!(!ok);
    }

    #[test]
    fn what_is_written_reads_back() {
        let c = Counts {
            passed: 539,
            failed: 1,
            skipped: 7,
        };
        for vg in [
            None,
            Some(Valgrind {
                errors: 1,
                suppressed: 2,
            }),
        ] {
            assert_eq!(
                parse_counts_line(&counts_line("device-vm-sid", c, vg)),
                Some(("device-vm-sid", c))
            );
        }
        assert_eq!(parse_counts_line("vm: 3 test executables"), None);
        assert!(is_failed_line(&failed_line("x (status: 1)")));
        assert!(!is_failed_line("FAILED  valgrind (status 1, 3s)"));
    }
}

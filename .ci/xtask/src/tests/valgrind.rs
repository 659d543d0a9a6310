//! What `.ci/vm test --valgrind` reads from memcheck's log of one test
//! executable (`--log-file`, with `--show-error-list=yes`): the closing
//! `ERROR SUMMARY`, the `used_suppression` counts, and the report as shown
//! in the run's output (without the repeated error list).

use super::summary::Valgrind;

/// The rest of a line `==PID== REST` (`marker` `=`) or `--PID-- REST` (`-`).
fn after_pid(line: &str, marker: char) -> Option<&str> {
    let two: String = [marker, marker].iter().collect();
    let rest = line.strip_prefix(two.as_str())?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    rest[digits..].strip_prefix(two.as_str())
}

/// The errors and suppressed errors of the log's last line `ERROR SUMMARY: E
/// errors from C contexts (suppressed: S from N)` (the process's own: its
/// children are silent); `None` if it has none (valgrind did not finish).
pub fn error_summary(log: &str) -> Option<Valgrind> {
    log.lines().filter_map(error_summary_line).next_back()
}

fn error_summary_line(line: &str) -> Option<Valgrind> {
    let rest = after_pid(line, '=')?.strip_prefix(" ERROR SUMMARY: ")?;
    let (errors, rest) = rest.split_once(" errors from ")?;
    let (contexts, rest) = rest.split_once(" contexts (suppressed: ")?;
    let (suppressed, _) = rest.split_once(" from")?;
    let number = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    number(contexts)?;
    Some(Valgrind {
        errors: number(errors)?,
        suppressed: number(suppressed)?,
    })
}

/// Each `--PID-- used_suppression:   N NAME FILE:LINE` line: (NAME, N).
pub fn used_suppressions(log: &str) -> Vec<(String, u64)> {
    log.lines().filter_map(used_suppression_line).collect()
}

fn used_suppression_line(line: &str) -> Option<(String, u64)> {
    let rest = after_pid(line, '-')?.strip_prefix(" used_suppression: ")?;
    let rest = rest.trim_start_matches(' ');
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let count = rest[..digits].parse().ok()?;
    let (name, _) = rest[digits..].strip_prefix(' ')?.split_once(' ')?;
    (!name.is_empty()).then(|| (name.to_owned(), count))
}

/// The log without the error list that `--show-error-list=yes` appends
/// (there for the `used_suppression` counts; each error is in the report
/// already): from each `==PID== N errors in context ...` line to the next
/// line `==PID== ` (both dropped). Every line ends in a newline.
pub fn report(log: &str) -> String {
    let mut out = String::new();
    let mut in_list = false;
    for line in log.lines() {
        if in_list {
            in_list = after_pid(line, '=') != Some(" ");
        } else if starts_error_list(line) {
            in_list = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `==PID== N errors in context ...`.
fn starts_error_list(line: &str) -> bool {
    let Some(rest) = after_pid(line, '=').and_then(|r| r.strip_prefix(' ')) else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with(" errors in context ")
}

#[cfg(test)]
mod unit {
    use super::*;

    /// memcheck's log of a program with two uninitialised reads, one of them
    /// suppressed three times (valgrind 3.19, the options of `.ci/vm`).
    const ONE_ERROR: &str = include_str!("../../tests/samples/valgrind-one-error.vg.log");

    #[test]
    fn reads_the_last_error_summary() {
        assert_eq!(
            error_summary(ONE_ERROR),
            Some(Valgrind {
                errors: 1,
                suppressed: 3
            })
        );
        let clean = "==772== ERROR SUMMARY: 0 errors from 0 contexts (suppressed: 0 from 0)\n";
        assert_eq!(
            error_summary(clean),
            Some(Valgrind {
                errors: 0,
                suppressed: 0
            })
        );
        assert_eq!(
            error_summary("==772== Memcheck, a memory error detector\n"),
            None
        );
    }

    #[test]
    fn reads_the_used_suppressions() {
        assert_eq!(used_suppressions(ONE_ERROR), [("noisy_cond".to_owned(), 3)]);
        assert_eq!(
            used_suppressions("--1-- used_suppression:      3 no_file_after_it\n"),
            []
        );
    }

    #[test]
    fn the_report_drops_the_error_list_only() {
        let r = report(ONE_ERROR);
        assert!(!r.contains("errors in context"), "{r}");
        assert_eq!(r.matches("Conditional jump").count(), 1, "{r}");
        assert!(
            r.contains("--17281-- used_suppression:      3 noisy_cond s.supp:3\n"),
            "{r}"
        );
        assert_eq!(r.lines().count(), ONE_ERROR.lines().count() - 8);
        assert!(r.ends_with("(suppressed: 3 from 1)\n"));
    }
}

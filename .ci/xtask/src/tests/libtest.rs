//! libtest's closing line of a test executable's run, `test result: ok. 8
//! passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s`
//! (libtest-mimic prints the same), read from the run's log.

use super::summary::Counts;

/// The counts of every libtest summary line in `log`, in order (a log holds
/// one per test executable run; none if the run did not get that far).
pub fn results(log: &str) -> Vec<Counts> {
    log.lines().filter_map(result_line).collect()
}

/// `test result: WORD. P passed; F failed; I ignored...` (WORD: letters).
fn result_line(line: &str) -> Option<Counts> {
    let rest = line.strip_prefix("test result: ")?;
    let (word, rest) = rest.split_once(". ")?;
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    let (passed, rest) = count_then(rest, " passed; ")?;
    let (failed, rest) = count_then(rest, " failed; ")?;
    let (skipped, _) = count_then(rest, " ignored")?;
    Some(Counts {
        passed,
        failed,
        skipped,
    })
}

/// A number at the start of `s` followed by `then`; the number and the rest.
fn count_then<'a>(s: &'a str, then: &str) -> Option<(u64, &'a str)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let rest = s[digits..].strip_prefix(then)?;
    Some((s[..digits].parse().ok()?, rest))
}

/// Did the executable whose output is `log` run whole, no test skipped (for
/// want of a device, on the host)? One summary line, with 0 ignored.
pub fn ran_whole(log: &str) -> bool {
    matches!(results(log)[..], [Counts { skipped: 0, .. }])
}

#[cfg(test)]
mod unit {
    use super::*;

    const HOST_RUN: &str = include_str!("../../tests/samples/host-run.log");

    #[test]
    fn reads_each_result_line() {
        let log = "running 2 tests\ntest a ... ok\n\ntest result: FAILED. 5 passed; 2 failed; 3 ignored; 0 measured; 1 filtered out; finished in 0.5s\n\
                   test result: ok. 189 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 558.55s\n\
                   [client] test result: ok. 1 passed; 0 failed; 0 ignored\n";
        let want = [
            Counts {
                passed: 5,
                failed: 2,
                skipped: 3,
            },
            Counts {
                passed: 189,
                failed: 0,
                skipped: 0,
            },
        ];
        assert_eq!(results(log), want);
    }

    #[test]
    fn a_host_run_with_skipped_device_tests_is_not_whole() {
        assert!(!ran_whole(HOST_RUN));
        assert!(ran_whole("test result: ok. 8 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n"));
        assert!(!ran_whole("no summary: the executable crashed\n"));
        let two = "test result: ok. 1 passed; 0 failed; 0 ignored\ntest result: ok. 1 passed; 0 failed; 0 ignored\n";
        assert!(!ran_whole(two));
    }
}

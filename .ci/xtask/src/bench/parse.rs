//! Reading what the bench's programs print: perftest-style result tables,
//! `key=value` result lines, valgrind's and callgrind_annotate's counts,
//! `strace -c` summaries. Each function takes a program's output as text
//! and returns what it found, or `None`.

use std::collections::BTreeMap;

/// Whether `s` is digits with an optional fraction ("12", "0.0428").
pub fn is_decimal(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, "0"));
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    digits(int) && digits(frac)
}

/// Column `col` (1-based) of the result line for message size `size` in a
/// perftest-layout table (`#bytes #iterations ...`, perftest's and
/// `perf`'s): the first line whose first field is `size`, whose second is
/// a count and that has `col` fields. A value that is not a plain number
/// (perftest printed "inf" once, unable to tell the clock rate) is none.
pub fn column(text: &str, size: &str, col: usize) -> Option<String> {
    let line = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| {
            f.len() >= col.max(2) && f[0] == size && f[1].bytes().all(|b| b.is_ascii_digit())
        })?;
    let v = line[col - 1];
    is_decimal(v).then(|| v.to_string())
}

/// The value of `key=VALUE` among a line's whitespace-separated words.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// `key`'s value on the last line that starts with `prefix` and has it
/// (e.g. `perf-result:` and `ops`).
pub fn last_field(text: &str, prefix: &str, key: &str) -> Option<String> {
    text.lines()
        .rev()
        .filter(|l| l.starts_with(prefix))
        .find_map(|l| field(l, key).map(str::to_string))
}

/// `key`'s value on the first line that has it, if it is a number
/// (`qp_scale: ... setup_s=0.9 ...`).
pub fn first_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| field(l, key))
        .filter(|v| super::stats::num(v).is_some())
        .map(str::to_string)
}

/// The instructions valgrind counted: the last `==PID== Collected : N`.
pub fn collected(text: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("==")?;
        let (pid, rest) = rest.split_once("== Collected : ")?;
        pid.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The last `= X usec/iter` of a pingpong client's output.
pub fn usec_per_iter(text: &str) -> Option<String> {
    text.lines().rev().find_map(|l| {
        let (head, _) = l.split_once(" usec/iter")?;
        let v = head.rsplit_once(" = ")?.1;
        is_decimal(v).then(|| v.to_string())
    })
}

/// Microseconds per message, "%.3f", of the first line with `messages=M
/// seconds=S` (`perf_halves`, `halves.c`), if M is positive.
pub fn usec_per_message(text: &str) -> Option<String> {
    let l = text
        .lines()
        .find(|l| field(l, "messages").is_some() && field(l, "seconds").is_some())?;
    let (m, s) = (
        super::stats::num(field(l, "messages")?)?,
        super::stats::num(field(l, "seconds")?)?,
    );
    (m > 0.0).then(|| format!("{:.3}", s * 1e6 / m))
}

/// One function's line of `callgrind_annotate --inclusive=yes`: its
/// inclusive count and the rest of the line (file:function and object, or
/// "PROGRAM TOTALS"), the percentage dropped.
#[derive(Debug, PartialEq)]
pub struct Incl {
    pub count: u64,
    pub name: String,
}

/// Every line of callgrind_annotate's output that starts with a count.
pub fn inclusive(text: &str) -> Vec<Incl> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let (count, rest) = l.split_once(' ')?;
            if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit() || b == b',') {
                return None;
            }
            let count = count.replace(',', "").parse().ok()?;
            let mut rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('(').and_then(|r| r.split_once(')')) {
                rest = after.1.trim_start();
            }
            Some(Incl {
                count,
                name: rest.to_string(),
            })
        })
        .collect()
}

/// The sum of the inclusive counts of the lines that contain any of
/// `needles` (each ends with the space before the object, so that `post `
/// does not match `post_recvs`).
pub fn sum_matching(lines: &[Incl], needles: &[&str]) -> u64 {
    lines
        .iter()
        .filter(|i| needles.iter().any(|n| i.name.contains(n)))
        .map(|i| i.count)
        .sum()
}

/// The count of the first line that contains `needle`.
pub fn first_matching(lines: &[Incl], needle: &str) -> Option<u64> {
    lines
        .iter()
        .find(|i| i.name.contains(needle))
        .map(|i| i.count)
}

/// An `strace -c` summary: calls per system call, "total" included.
pub fn strace_calls(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let first_is_number = f.first().is_some_and(|v| {
                !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            });
            if f.len() < 5 || !first_is_number {
                return None;
            }
            Some((f[f.len() - 1].to_string(), f[3].parse().ok()?))
        })
        .collect()
}

/// Per system call, (calls at `hi` - calls at `lo`) / `n` where they
/// differ, "total" left out, by name.
pub fn strace_per(lo: &str, hi: &str, n: f64) -> Vec<(String, f64)> {
    let (lo, hi) = (strace_calls(lo), strace_calls(hi));
    let names: std::collections::BTreeSet<&String> = lo.keys().chain(hi.keys()).collect();
    names
        .into_iter()
        .filter(|k| *k != "total")
        .filter_map(|k| {
            let (a, b) = (*lo.get(k).unwrap_or(&0), *hi.get(k).unwrap_or(&0));
            (a != b).then(|| (k.clone(), (b as f64 - a as f64) / n))
        })
        .collect()
}

#[cfg(test)]
mod unit;

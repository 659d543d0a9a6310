//! User-space instructions counted by callgrind: per operation of the data
//! path (the inclusive counts of `perf`'s own functions over the operations
//! its `perf-result:` line reports), per iteration of the whole client
//! (valgrind's total of a long run less a short one), per message of
//! `perf_inplace`'s two ways.

use super::parse::{collected, last_field, sum_matching};
use super::stats::{per, ratio};
use super::tables::{DATAPATH, INPLACE, WHOLE};
use super::{folder_and, plan, Out};

/// `perf`'s data-path functions: its post calls and its handling of a poll
/// that found completions (the provider's `ibv_post_send` inside them,
/// `ibv_poll_cq` not).
pub const DP_FNS: &[&str] = &[
    " as perf::path::DataPath>::post ",
    " as perf::path::DataPath>::post_recvs ",
    "::completions ",
];

/// The data path's instructions per operation of the client run `dp.LABEL`
/// (its output `dp.LABEL`, its profile `dp.LABEL.cg`), or "-" with why on
/// standard error (`who` prefixes the message).
pub fn per_op(out: &Out, label: &str, who: &str) -> String {
    let name = format!("dp.{label}");
    let ops: u64 = last_field(&out.text(&name), "perf-result:", "ops")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let sum = sum_matching(&out.annotated(&name), DP_FNS);
    let v = per(sum as f64, ops as f64);
    if v == "-" {
        eprintln!("{who}: {name}: no count (ops '{ops}', instructions '{sum}')");
    }
    v
}

/// User-space instructions per iteration of the client runs `cg.LABEL.short`
/// and `cg.LABEL.long` (valgrind's logs): the difference over `long -
/// short` iterations, so that start-up and teardown cancel; "-" if either
/// has no count.
pub fn whole(out: &Out, label: &str, short: u64, long: u64) -> String {
    let a = collected(&out.text(&format!("cg.{label}.short")));
    let b = collected(&out.text(&format!("cg.{label}.long")));
    match (a, b) {
        (Some(a), Some(b)) if long > short => {
            format!("{:.0}", (b as f64 - a as f64) / (long - short) as f64)
        }
        _ => "-".into(),
    }
}

/// Counts a "-" as a failure.
pub fn failed(v: &str) -> usize {
    usize::from(v == "-")
}

/// `xtask bench datapath OUT`: the data-path table, a row per
/// [`plan::DATAPATH`] entry (`dp.safe.TEST[.rb]` against `dp.raw.TEST`).
pub fn datapath(args: &[String]) -> Result<usize, String> {
    let (out, []) = folder_and(args, "datapath OUT", [])?;
    let mut failures = 0;
    // The raw path's counts, one per test (an "rb" row shares its test's).
    let mut raw = std::collections::BTreeMap::new();
    println!("{}", DATAPATH.header());
    for (test, size, rb) in plan::DATAPATH {
        let sv = per_op(
            &out,
            &format!("safe.{test}{}", if *rb { ".rb" } else { "" }),
            "bench",
        );
        let rv = raw
            .entry(test)
            .or_insert_with(|| per_op(&out, &format!("raw.{test}"), "bench"))
            .clone();
        failures += failed(&sv) + if *rb { 0 } else { failed(&rv) };
        let label = format!("{test} -s {size}{}", if *rb { " (rb)" } else { "" });
        println!(
            "{}",
            DATAPATH.row(&[label.as_str(), &sv, &rv, &ratio(&sv, &rv)])
        );
    }
    Ok(failures)
}

/// `xtask bench whole OUT SHORT LONG`: the whole-client table, a row per
/// [`plan::WHOLE`] entry (`cg.{c,safe,raw}.TEST.{short,long}`).
pub fn whole_table(args: &[String]) -> Result<usize, String> {
    let (out, [short, long]) = folder_and(args, "whole OUT SHORT LONG", ["SHORT", "LONG"])?;
    let mut failures = 0;
    println!("{}", WHOLE.header());
    for (test, size, _) in plan::WHOLE {
        let [cv, sv, rv] =
            ["c", "safe", "raw"].map(|p| whole(&out, &format!("{p}.{test}"), short, long));
        failures += failed(&cv) + failed(&sv) + failed(&rv);
        let label = format!("{test} -s {size} -e");
        println!(
            "{}",
            WHOLE.row(&[
                label.as_str(),
                &cv,
                &sv,
                &rv,
                &ratio(&sv, &cv),
                &ratio(&rv, &cv)
            ])
        );
    }
    Ok(failures)
}

/// `xtask bench inplace OUT N`: `perf_inplace`'s two ways, instructions
/// per message of N (the profile `inplace.cg`).
pub fn inplace(args: &[String]) -> Result<usize, String> {
    let (out, [n]) = folder_and(args, "inplace OUT N", ["N"])?;
    let lines = out.annotated("inplace");
    let [ip, cp] = ["perf_inplace::in_place ", "perf_inplace::copied "]
        .map(|f| per(sum_matching(&lines, &[f]) as f64, n as f64));
    println!("{}", INPLACE.header());
    println!(
        "{}",
        INPLACE.row(&["4096 B, checksum of words", &ip, &cp, &ratio(&ip, &cp)])
    );
    Ok(failed(&ip) + failed(&cp))
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::bench::folder;

    const ANN: &str =
        " 2,158,000 (4.6%)  path.rs:<perf::path::Safe as perf::path::DataPath>::post [/p]\n\
                       \x20 100 (0.1%)  path.rs:perf::path::Safe::completions [/p]\n";

    #[test]
    fn per_operation_and_per_iteration() {
        let (dir, out) = folder(
            "counted",
            &[
                ("dp.safe.send_lat", "perf-result: test=send_lat path=safe size=64 iters=2000 ops=2000 polls=1 empty_polls=0 usec=1\n"),
                ("dp.safe.send_lat.ann", ANN),
                ("dp.raw.send_lat", "no result\n"),
                ("cg.c.send_lat.short", "==7== Collected : 1000000\n"),
                ("cg.c.send_lat.long", "==8== Collected : 2681000\n"),
            ],
        );
        assert_eq!(per_op(&out, "safe.send_lat", "test"), "1079");
        assert_eq!(per_op(&out, "raw.send_lat", "test"), "-");
        assert_eq!(whole(&out, "c.send_lat", 200, 1200), "1681");
        assert_eq!(whole(&out, "safe.send_lat", 200, 1200), "-");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! `.ci/bench/ex-guest`: `perf --ex` (an extended QP's `ibv_wr_*` batch)
//! against `perf` (the basic safe path): each run's check, the latency
//! table with every run listed, and the data path's instructions.

use super::counted::{failed, per_op};
use super::parse::column;
use super::stats::{median, num, range, ratio, ratio3, Even};
use super::tables::{EX_DATAPATH, EX_LATENCY};
use super::{folder_and, plan};

/// `xtask bench ex-check LOG PATH`: whether the client's header names
/// PATH (`safe` or `ex`: that `--ex` took effect); says so if the client
/// or its server (`LOG.server`) counted heap allocations in the timed part.
pub fn check(args: &[String]) -> Result<usize, String> {
    let [log, want] = args else {
        return Err("usage: xtask bench ex-check LOG PATH".into());
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix(" rdma-verbs path : "))
        .and_then(|p| p.split_whitespace().next());
    if path != Some(want.as_str()) {
        eprintln!("ex-bench: {log}: the header does not say path {want}");
        return Ok(1);
    }
    let server = std::fs::read_to_string(format!("{log}.server")).unwrap_or_default();
    let allocs: Vec<&str> = text
        .lines()
        .chain(server.lines())
        .filter(|l| l.contains("heap allocations"))
        .collect();
    if allocs
        .iter()
        .any(|l| l.contains("heap allocations in the timed part"))
    {
        eprintln!("ex-bench: {log}: {} ", allocs.join(" "));
    }
    Ok(0)
}

/// A run's t_min, t_typical, t_avg and t_max for `size`, as the run list
/// prints them.
fn run_line(text: &str, size: &str) -> String {
    let f = [3, 5, 6, 4].map(|c| column(text, size, c).unwrap_or_default());
    if f.iter().all(String::is_empty) {
        return String::new();
    }
    format!("min {} typical {} avg {} max {}", f[0], f[1], f[2], f[3])
}

/// `xtask bench ex-latency OUT REPS`: a row per [`plan::EX_LATENCY`]
/// workload from `TEST_SIZE.{basic,ex}.ROUND` (the first of a round
/// alternating: basic first in odd rounds), then every run in order.
pub fn latency(args: &[String]) -> Result<usize, String> {
    let (out, [reps]) = folder_and(args, "ex-latency OUT REPS", ["REPS"])?;
    let mut failures = 0;
    let mut runs = vec![];
    println!("{}", EX_LATENCY.header());
    for (test, size) in plan::EX_LATENCY {
        let name = format!("{test}_{size}");
        let (mut b, mut x, mut q) = (vec![], vec![], vec![]);
        for i in 1..=reps {
            let order = if i % 2 == 1 {
                ["basic", "ex"]
            } else {
                ["ex", "basic"]
            };
            let (mut bv, mut xv) = (None, None);
            for p in order {
                let text = out.text(&format!("{name}.{p}.{i}"));
                if text.is_empty() {
                    continue;
                }
                runs.push(format!(
                    "{name:<14} round {i} {p:<5} {}",
                    run_line(&text, size)
                ));
                *(if p == "ex" { &mut xv } else { &mut bv }) = column(&text, size, 5);
            }
            let (Some(bv), Some(xv)) = (&bv, &xv) else {
                let [bv, xv] = [bv, xv].map(Option::unwrap_or_default);
                eprintln!(
                    "ex-bench: {name} round {i} left out: no result (basic '{bv}', ex '{xv}')"
                );
                continue;
            };
            q.push(ratio3(num(xv).unwrap_or(0.0), num(bv).unwrap_or(0.0)));
            b.push(bv.clone());
            x.push(xv.clone());
        }
        if b.is_empty() {
            eprintln!("ex-bench: {name}: no round gave a result");
            failures += 1;
        }
        let med = |v: &[String]| median(v, Even::G(4));
        println!(
            "{}",
            EX_LATENCY.row(&[name, med(&b), med(&x), med(&q), range(&q)])
        );
    }
    println!(
        "(usec, t_typical: each run's median half round trip; the columns are the medians over the"
    );
    println!(" rounds, ex/basic the median of the per-round ratios and the range their spread; lower is better)");
    println!("every run, in order (usec):");
    for r in runs {
        println!("  {r}");
    }
    Ok(failures)
}

/// `xtask bench ex-datapath OUT`: a row per [`plan::EX_DATAPATH`] entry,
/// from `dp.{basic,ex}.TEST_SIZE[_MORE]`.
pub fn datapath(args: &[String]) -> Result<usize, String> {
    let (out, []) = folder_and(args, "ex-datapath OUT", [])?;
    let mut failures = 0;
    println!("{}", EX_DATAPATH.header());
    for (test, size, more) in plan::EX_DATAPATH {
        let key = format!("{test} {size} {more}").trim_end().replace(' ', "_");
        let [bv, xv] = ["basic", "ex"].map(|p| per_op(&out, &format!("{p}.{key}"), "ex-bench"));
        failures += failed(&bv) + failed(&xv);
        let label = format!("{test} -s {size} {more}");
        println!(
            "{}",
            EX_DATAPATH.row(&[label.as_str(), &bv, &xv, &ratio(&xv, &bv)])
        );
    }
    Ok(failures)
}

#[cfg(test)]
mod unit {
    use super::run_line;

    /// `perf send_lat -s 64`'s header line and result table.
    const PERF: &str = " rdma-verbs path : ex
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]
 64      2000          10.92          61.37        13.07     	       13.51       	2.10
";

    #[test]
    fn a_run_as_listed() {
        assert_eq!(
            run_line(PERF, "64"),
            "min 10.92 typical 13.07 avg 13.51 max 61.37"
        );
        assert_eq!(run_line(PERF, "2"), "");
    }

    #[test]
    fn the_header_names_the_path() {
        let dir = std::env::temp_dir().join(format!("xtask-ex-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("send_lat_64.ex.1");
        std::fs::write(&log, PERF).unwrap();
        let log = log.to_str().unwrap().to_string();
        assert_eq!(super::check(&[log.clone(), "ex".into()]), Ok(0));
        assert_eq!(super::check(&[log, "safe".into()]), Ok(1));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! Setting up QPs: many connected QPs in one process (`.ci/bench/qp_scale.c`
//! against `examples/perf_scale.rs`, the guest's `scale` part) and one QP
//! at a time (`.ci/bench/qp_setup.c` against `examples/perf_setup.rs`,
//! `.ci/bench/qp-setup.sh`): times, memory, kernel calls per QP under
//! `strace -c`, user-space instructions per QP under callgrind.

use super::parse::{collected, first_field, inclusive, strace_calls, strace_per};
use super::stats::{median, num, range, range_with, ratio, ratio3, Even};
use super::tables::SCALE;
use super::{folder_and, Out};

/// The scale part's three programs, in the order of their columns.
const PROGRAMS: [&str; 3] = ["c", "hand", "doc"];

/// `xtask bench scale OUT REPS LO HI`: the scale table from
/// `scale.{c,hand,doc}.ROUND`, then the kernel calls per QP from
/// `scale.strace.{c,hand,doc}.{lo,hi}` (runs at LO and HI QPs).
pub fn scale(args: &[String]) -> Result<usize, String> {
    let (out, [reps, lo, hi]) = folder_and(args, "scale OUT REPS LO HI", ["REPS", "LO", "HI"])?;
    let keys = ["setup_s", "teardown_s", "rss_kib"];
    // values[key][program] and ratios[key][hand or doc] over the rounds.
    let mut values: [[Vec<String>; 3]; 3] = Default::default();
    let mut ratios: [[Vec<String>; 2]; 3] = Default::default();
    let mut failures = 0;
    for i in 1..=reps {
        let texts = PROGRAMS.map(|p| out.text(&format!("scale.{p}.{i}")));
        if texts.iter().any(|t| first_field(t, "setup_s").is_none()) {
            eprintln!("bench: scale round {i} left out (a run failed)");
            failures += 1;
            continue;
        }
        for (k, key) in keys.iter().enumerate() {
            let v = texts
                .clone()
                .map(|t| first_field(&t, key).unwrap_or_default());
            ratios[k][0].push(ratio(&v[1], &v[0]));
            ratios[k][1].push(ratio(&v[2], &v[0]));
            for (p, x) in v.into_iter().enumerate() {
                values[k][p].push(x);
            }
        }
    }
    let med = |v: &[String]| median(v, Even::G(4));
    println!("{}", SCALE.header());
    for (k, label) in [
        "setup s (create+RTS)",
        "teardown s (destroy)",
        "RSS growth KiB",
    ]
    .into_iter()
    .enumerate()
    {
        let (v, q) = (&values[k], &ratios[k]);
        let row = [
            label.into(),
            med(&v[0]),
            med(&v[1]),
            med(&v[2]),
            med(&q[0]),
            range(&q[0]),
            med(&q[1]),
            range(&q[1]),
        ];
        println!("{}", SCALE.row(&row));
    }
    println!("(medians; X/C: median of the per-round ratios, lower is better for all three)");
    Ok(failures + kernel_calls(&out, lo, hi))
}

/// The scale part's kernel calls per QP: a line of totals, then each
/// program's system calls that differ; returns the programs without both
/// strace runs.
fn kernel_calls(out: &Out, lo: u64, hi: u64) -> usize {
    let mut failures = 0;
    let mut line = String::from("kernel calls per QP:");
    let mut details = vec![];
    for p in PROGRAMS {
        let [a, b] = ["lo", "hi"].map(|s| out.text(&format!("scale.strace.{p}.{s}")));
        if lo == 0 || hi <= lo || a.is_empty() || b.is_empty() {
            line += &format!(" {p}=-");
            failures += 1;
            continue;
        }
        let per = strace_per(&a, &b, (hi - lo) as f64);
        line += &format!(" {p}={:.2}", per.iter().map(|(_, v)| v).sum::<f64>());
        if !per.is_empty() {
            let each: Vec<String> = per.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
            details.push(format!("   {p}: {}", each.join(", ")));
        }
    }
    println!("{line}");
    for d in details {
        println!("{d}");
    }
    failures
}

/// `xtask bench qp-setup WORK ROUNDS`: the lines of `.ci/bench/qp-setup.sh`
/// after its rate lines: the rate ratio of `rate.{c,rust}.ROUND`, the
/// kernel calls per QP of `{c,rust}.{50,100}` (strace at 50 and 100 QPs),
/// and, if the callgrind runs were made, the instructions per QP of
/// `{c,rust}.cg.{50,250}.log` and the Rust functions' share.
pub fn qp_setup(args: &[String]) -> Result<usize, String> {
    let (work, [rounds]) = folder_and(args, "qp-setup WORK ROUNDS", ["ROUNDS"])?;
    if rounds > 0 {
        let mut q = vec![];
        for r in 1..=rounds {
            let [c, rust] =
                ["c", "rust"].map(|p| first_field(&work.text(&format!("rate.{p}.{r}")), "per_sec"));
            let (Some(c), Some(rust)) = (c, rust) else {
                eprintln!("qp-setup: no rate in round {r}");
                return Ok(1);
            };
            q.push(ratio3(num(&rust).unwrap_or(0.0), num(&c).unwrap_or(0.0)));
        }
        let (m, span) = (median(&q, Even::F(3)), range_with(&q, |_, s| s.to_string()));
        println!("qp_setup: rust/c rate ratio median={m} ({span})");
    }
    let per_qp = |p: &str| {
        let [a, b] = ["50", "100"].map(|n| work.text(&format!("{p}.{n}")));
        let total = match (strace_calls(&a).get("total"), strace_calls(&b).get("total")) {
            (Some(x), Some(y)) => format!("{:.2}", (*y as f64 - *x as f64) / 50.0),
            _ => "-".into(),
        };
        let lines: Vec<String> = strace_per(&a, &b, 50.0)
            .iter()
            .map(|(k, v)| format!("qp_setup:   {p} {k} {v:.2} per QP"))
            .collect();
        (total, lines)
    };
    let ((ct, cl), (rt, rl)) = (per_qp("c"), per_qp("rust"));
    println!("qp_setup: kernel calls per QP: c={ct} rust={rt}");
    for l in cl.iter().chain(&rl) {
        println!("{l}");
    }
    let made = |n: &str| work.path(n).exists() || work.path(&format!("{n}.failed")).exists();
    if made("c.cg.50.log") || made("rust.cg.50.log") {
        instructions(&work);
    }
    Ok(0)
}

/// The callgrind lines of the QP setup part: instructions per QP (the run
/// at 250 QPs less the run at 50, over 200), then the Rust functions that
/// take 40 or more per QP, inclusive, heaviest first (also written to
/// `rust.cg.fns`).
fn instructions(work: &Out) {
    let per_qp =
        |p: &str| match ["50", "250"].map(|n| collected(&work.text(&format!("{p}.cg.{n}.log")))) {
            [Some(a), Some(b)] => format!("{:.0}", (b as f64 - a as f64) / 200.0),
            _ => "-".into(),
        };
    let (c, r) = (per_qp("c"), per_qp("rust"));
    println!(
        "qp_setup: user-space instructions per QP (callgrind): c={c} rust={r} rust/c={}",
        ratio(&r, &c)
    );
    let [a, b] = ["50", "250"].map(|n| work.text(&format!("rust.cg.{n}.ann")));
    let (a, b) = if a.is_empty() {
        (annotate(work, "rust.cg.50"), annotate(work, "rust.cg.250"))
    } else {
        (a, b)
    };
    if b.is_empty() {
        return;
    }
    let fns = heaviest(&a, &b);
    let _ = std::fs::write(
        work.path("rust.cg.fns"),
        fns.iter().map(|l| format!("{l}\n")).collect::<String>(),
    );
    println!("qp_setup: Rust functions, inclusive instructions per QP (N=250 minus N=50, over 200; 40 and more):");
    for l in fns {
        println!("qp_setup:   {l}");
    }
}

/// callgrind_annotate's output for the profile `name` (empty if none).
fn annotate(work: &Out, name: &str) -> String {
    std::process::Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(work.path(name))
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Per function of the profile `b` (250 QPs), its inclusive count less
/// that in `a` (50 QPs), over 200, where that is 40 or more: "%8.0f  NAME"
/// lines (the name cut at 140 characters), largest first.
fn heaviest(a: &str, b: &str) -> Vec<String> {
    let before: std::collections::HashMap<String, u64> = inclusive(a)
        .into_iter()
        .map(|i| (i.name, i.count))
        .collect();
    let mut rows: Vec<(f64, String)> = inclusive(b)
        .into_iter()
        .map(|i| {
            (
                (i.count as f64 - *before.get(&i.name).unwrap_or(&0) as f64) / 200.0,
                i.name,
            )
        })
        .filter(|(d, _)| *d >= 40.0)
        .map(|(d, n)| {
            (
                d,
                format!("{d:8.0}  {}", n.chars().take(140).collect::<String>()),
            )
        })
        .collect();
    rows.sort_by(|x, y| y.0.total_cmp(&x.0).then_with(|| y.1.cmp(&x.1)));
    rows.into_iter().map(|(_, l)| l).collect()
}

#[cfg(test)]
mod unit {
    use super::heaviest;

    #[test]
    fn functions_per_qp() {
        let a = "1,000,000 (100.0%)  PROGRAM TOTALS\n  100,000 (10.0%)  qp.rs:rdma_verbs::qp::QueuePair::modify [/p]\n";
        let b = "2,090,600 (100.0%)  PROGRAM TOTALS\n  330,000 (15.0%)  qp.rs:rdma_verbs::qp::QueuePair::modify [/p]\n    7,000 ( 0.3%)  x.rs:small [/p]\n";
        assert_eq!(
            heaviest(a, b),
            vec![
                "    5453  PROGRAM TOTALS".to_string(),
                "    1150  qp.rs:rdma_verbs::qp::QueuePair::modify [/p]".to_string()
            ]
        );
    }
}

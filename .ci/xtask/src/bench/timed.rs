//! The timed parts: rounds of C and Rust runs interleaved, each round's
//! values and per-round ratios summed up as medians and ranges; the parts
//! that also count instructions add their rows through [`counted`].

use super::counted::{failed, whole};
use super::parse::{
    column, field, first_matching, last_field, sum_matching, usec_per_iter, usec_per_message,
};
use super::stats::{median, num, per, range, ratio, ratio3, Even};
use super::tables::{Table, ASYNC, HALVES, HOSTS, PERFTEST, PINGPONG};
use super::{folder_and, plan, Out};

/// perftest-style median: the middle value, or the mean of two as `%.4g`.
fn med(v: &[String]) -> String {
    median(v, Even::G(4))
}

/// The rounds 1..=`reps` in which `get` finds all `K` values: their
/// columns, each in the order of the rounds. A round that misses any is
/// left out, and `left_out` is told what it found.
pub fn rounds<const K: usize>(
    reps: u64,
    get: impl Fn(u64) -> [Option<String>; K],
    mut left_out: impl FnMut(u64, [String; K]),
) -> [Vec<String>; K] {
    let mut cols: [Vec<String>; K] = std::array::from_fn(|_| Vec::new());
    for i in 1..=reps {
        let found = get(i);
        if found.iter().any(Option::is_none) {
            left_out(i, found.map(Option::unwrap_or_default));
            continue;
        }
        for (col, v) in cols.iter_mut().zip(found) {
            col.push(v.unwrap_or_default());
        }
    }
    cols
}

/// The per-round ratios `a[i] / b[i]`, as `f` prints each.
pub fn per_round(a: &[String], b: &[String], f: impl Fn(&str, &str) -> String) -> Vec<String> {
    a.iter().zip(b).map(|(x, y)| f(x, y)).collect()
}

/// [`ratio3`] of two values as printed.
fn r3(a: &str, b: &str) -> String {
    ratio3(num(a).unwrap_or(0.0), num(b).unwrap_or(0.0))
}

/// `xtask bench perftest OUT REPS NAME...`: the first table, a row per
/// named workload of [`plan::WORKLOADS`] (files `NAME.{c,safe,raw}.ROUND`).
pub fn perftest(args: &[String]) -> Result<usize, String> {
    let (out, [reps]) = folder_and(args, "perftest OUT REPS NAME...", ["REPS"])?;
    let progs = [("c", "C"), ("safe", "safe"), ("raw", "raw")];
    let failures = against_c(&out, reps, &args[2..], &PERFTEST, progs)?;
    println!("(medians; X/C is the median of the per-round ratios, the range their spread. usec: latency,");
    println!(" t_typical, lower is better. Mpps, MB/s: rate, higher is better.)");
    Ok(failures)
}

/// `xtask bench hosts OUT REPS NAME...`: `.ci/hosts-bench`'s table, a row
/// per named workload of [`plan::HOSTS`] (files `NAME.{c,rust}.ROUND`).
pub fn hosts(args: &[String]) -> Result<usize, String> {
    let (out, [reps]) = folder_and(args, "hosts OUT REPS NAME...", ["REPS"])?;
    let progs = [("c", "C"), ("rust", "Rust")];
    let failures = against_c(&out, reps, &args[2..], &HOSTS, progs)?;
    println!(
        "(medians over the rounds; Rust/C is the median of the per-round ratios, the range their"
    );
    println!(
        " spread. usec: latency, t_typical, lower is better. Mpps, MB/s: rate, higher is better.)"
    );
    Ok(failures)
}

/// Prints `table`: its header and a [`against_c_row`] per named workload.
/// Returns how many workloads gave no result.
fn against_c<const K: usize>(
    out: &Out,
    reps: u64,
    names: &[String],
    table: &Table,
    progs: [(&str, &str); K],
) -> Result<usize, String> {
    let mut failures = 0;
    println!("{}", table.header());
    for name in names {
        let (row, found) = against_c_row(out, reps, name, progs)?;
        if !found {
            eprintln!("bench: {name}: no round gave a result");
            failures += 1;
        }
        println!("{}", table.row(&row));
    }
    Ok(failures)
}

/// A perftest workload's row, C first, and whether any round gave a
/// result. Its cells: the name and unit, each program's median over the
/// rounds (the files `NAME.FILE.ROUND` of `progs`, each a file name and
/// how a message names it), then for the first program after C the median
/// and range of its per-round ratios to C, for each further one their
/// median. A round that misses a value is left out, and said so.
fn against_c_row<const K: usize>(
    out: &Out,
    reps: u64,
    name: &str,
    progs: [(&str, &str); K],
) -> Result<(Vec<String>, bool), String> {
    let w = plan::workload(name)?;
    let get = |i| progs.map(|(p, _)| column(&out.text(&format!("{name}.{p}.{i}")), w.size, w.col));
    let cols = rounds(reps, get, |i, found| {
        let said: Vec<String> = progs
            .iter()
            .zip(&found)
            .map(|((_, who), v)| format!("{who} '{v}'"))
            .collect();
        eprintln!(
            "bench: {name} round {i} left out: no result ({})",
            said.join(", ")
        );
    });
    let c = &cols[0];
    let mut row = vec![name.to_string(), w.unit.to_string()];
    row.extend(cols.iter().map(|v| med(v)));
    for (k, other) in cols[1..].iter().enumerate() {
        let q = per_round(other, c, r3);
        row.push(med(&q));
        if k == 0 {
            row.push(range(&q));
        }
    }
    Ok((row, !c.is_empty()))
}

/// `xtask bench async OUT REPS SHORT LONG CGREPS`: the async wait against
/// polling and `-e`: t_typical of `async.{poll,e,async}.ROUND`, the whole
/// client's count of `cg.{e,async}.send_lat.I` (I up to CGREPS), and the
/// per-wait counts of `pw.e` and `pw.async`.
pub fn async_wait(args: &[String]) -> Result<usize, String> {
    let usage = "async OUT REPS SHORT LONG CGREPS";
    let (out, [reps, short, long, cgreps]) =
        folder_and(args, usage, ["REPS", "SHORT", "LONG", "CGREPS"])?;
    let mut failures = 0;
    let get =
        |i| ["poll", "e", "async"].map(|m| column(&out.text(&format!("async.{m}.{i}")), "64", 5));
    let [p, e, a] = rounds(reps, get, |i, [p, e, a]| {
        eprintln!("bench: async round {i} left out: no result (poll '{p}', -e '{e}', async '{a}')");
        failures += 1;
    });
    let (rp, re) = (per_round(&a, &p, r3), per_round(&a, &e, r3));
    println!("{}", ASYNC.header());
    let row = [
        "t_typical usec".into(),
        med(&p),
        med(&e),
        med(&a),
        med(&rp),
        range(&rp),
        med(&re),
        range(&re),
    ];
    println!("{}", ASYNC.row(&row));
    let counts = |m: &str| -> Vec<String> {
        (1..=cgreps)
            .map(|i| whole(&out, &format!("{m}.send_lat.{i}"), short, long))
            .collect()
    };
    let (ei, ai) = (counts("e"), counts("async"));
    failures += ei.iter().chain(&ai).map(|v| failed(v)).sum::<usize>();
    let (ei, ai): (Vec<String>, Vec<String>) = (
        ei.into_iter().filter(|v| v != "-").collect(),
        ai.into_iter().filter(|v| v != "-").collect(),
    );
    let (em, am) = (med(&ei), med(&ai));
    let cells = [
        "instructions/iter (cg)".into(),
        "-".into(),
        em.clone(),
        am.clone(),
        format!("async/-e {}", ratio(&am, &em)),
    ];
    println!("{}", ASYNC.row(&cells));
    println!(
        "   (each of {cgreps} runs: -e {}; async {})",
        ei.join(" "),
        ai.join(" ")
    );
    println!("(usec: medians, ratios the median of the per-round ratios; instructions: the client at {long} less at {short} iterations, median of {cgreps})");
    per_wait(&out);
    Ok(failures)
}

/// The per-wait rows of the async part: the inclusive count of `perf`'s
/// wait, and of the crate's part of the async one, over the waits (the
/// empty polls of `perf-result:`), one callgrind run each (`pw.e`, `pw.async`).
fn per_wait(out: &Out) {
    let one = |label: &str, f: &str| {
        let name = format!("pw.{label}");
        let waits = last_field(&out.text(&name), "perf-result:", "empty_polls")
            .and_then(|v| num(&v))
            .unwrap_or(0.0);
        per(
            first_matching(&out.annotated(&name), f).unwrap_or(0) as f64,
            waits,
        )
    };
    let wait = ":perf::setup::Conn::wait_event ";
    let (pe, pa) = (one("e", wait), one("async", wait));
    let pc = one("async", ":rdma_verbs::tokio::cq::Waiter::poll_fill ");
    let cells = [
        "instructions/wait (cg)".into(),
        "-".into(),
        pe,
        pa,
        format!("crate's part of async: {pc}"),
    ];
    println!("{}", ASYNC.row(&cells));
    println!("   (a wait: -e's ibv_get_cq_event, ack and re-arm; async's block_on(AsyncCq::ready()), of which the crate's");
    println!("    poll_fill (polls, arm, event read) is the part named; the rest is tokio's runtime entry and reactor)");
}

/// `xtask bench pingpong OUT REPS SHORT LONG`: rc_pingpong against
/// ibv_rc_pingpong: usec/iter of `pp.{c,rust}.ROUND`, then the whole
/// client's counts `cg.{c,rust}.pingpong` and `cg.{c,rust}.pingpong.eSIZE`.
pub fn pingpong(args: &[String]) -> Result<usize, String> {
    let (out, [reps, short, long]) = folder_and(
        args,
        "pingpong OUT REPS SHORT LONG",
        ["REPS", "SHORT", "LONG"],
    )?;
    let mut failures = 0;
    let get = |i| ["c", "rust"].map(|p| usec_per_iter(&out.text(&format!("pp.{p}.{i}"))));
    let [c, r] = rounds(reps, get, |i, _| {
        eprintln!("bench: pingpong round {i} left out");
        failures += 1;
    });
    let q = per_round(&r, &c, r3);
    println!("{}", PINGPONG.header());
    println!(
        "{}",
        PINGPONG.row(&[
            "client usec/iter".into(),
            med(&c),
            med(&r),
            med(&q),
            range(&q)
        ])
    );
    let mut counts = |label: String, suffix: &str| {
        let [ci, ri] =
            ["c", "rust"].map(|p| whole(&out, &format!("{p}.pingpong{suffix}"), short, long));
        failures += failed(&ci) + failed(&ri);
        println!(
            "{}",
            PINGPONG.row(&[label, ci.clone(), ri.clone(), ratio(&ri, &ci)])
        );
    };
    counts("instructions/iter (cg)".into(), "");
    for sz in plan::PINGPONG_E_SIZES {
        counts(format!("instr/iter -e -s {sz} (cg)"), &format!(".e{sz}"));
    }
    println!("(usec: medians, Rust/C the median of the per-round ratios; instructions: the client at {long} less at {short} iterations)");
    Ok(failures)
}

/// `xtask bench halves OUT REPS N`: two threads on one QP pair: usec per
/// message of `halves.{c,halves,mutex}.ROUND`, and instructions per
/// message of the data path's functions in `halves.{c,halves,mutex}.cg`
/// (runs of N messages each way).
pub fn halves(args: &[String]) -> Result<usize, String> {
    let (out, [reps, n]) = folder_and(args, "halves OUT REPS N", ["REPS", "N"])?;
    let mut failures = 0;
    let texts = |i| ["c", "halves", "mutex"].map(|p| out.text(&format!("halves.{p}.{i}")));
    let v = rounds(
        reps,
        |i| texts(i).map(|t| usec_per_message(&t)),
        |i, _| {
            print!("{}", texts(i).concat());
            eprintln!("bench: halves round {i} left out (a run failed)");
            failures += 1;
        },
    );
    let (rh, rm, rmh) = (
        per_round(&v[1], &v[0], ratio),
        per_round(&v[2], &v[0], ratio),
        per_round(&v[2], &v[1], ratio),
    );
    let instr = |label: &str, fns: &[&str]| {
        per(
            sum_matching(&out.annotated(&format!("halves.{label}")), fns) as f64,
            2.0 * n as f64,
        )
    };
    let rust = [
        " as perf_halves::Queues>::send ",
        " as perf_halves::Queues>::sent ",
        " as perf_halves::Queues>::repost ",
    ];
    let [ic, ih, im] = [
        instr("c", &[":post_send ", ":post_recv "]),
        instr("halves", &rust),
        instr("mutex", &rust),
    ];
    failures += failed(&ic) + failed(&ih) + failed(&im);
    println!("{}", HALVES.header());
    println!(
        "{}",
        HALVES.row(&["C".into(), med(&v[0]), String::new(), String::new(), ic])
    );
    println!(
        "{}",
        HALVES.row(&["halves".into(), med(&v[1]), med(&rh), range(&rh), ih])
    );
    println!(
        "{}",
        HALVES.row(&["mutex".into(), med(&v[2]), med(&rm), range(&rm), im])
    );
    println!("mutex/halves: median {}, range {}", med(&rmh), range(&rmh));
    println!("(medians of {reps} rounds; X/C: median of the per-round ratios; instructions: the data path's functions, inclusive, per message)");
    Ok(failures)
}

/// `xtask bench register FILE`: huge pages against 4 KiB pages (thp off),
/// from `perf_reg`'s lines in FILE; prints nothing if either is missing.
pub fn register(args: &[String]) -> Result<usize, String> {
    let text = std::fs::read_to_string(args.first().ok_or("usage: xtask bench register FILE")?)
        .unwrap_or_default();
    if let Some(line) = register_line(&text) {
        println!("{line}");
    }
    Ok(0)
}

/// The comparison line of `perf_reg`'s output, if it has both kinds.
fn register_line(text: &str) -> Option<String> {
    let times = |kind: &str| {
        let l = text
            .lines()
            .rev()
            .find(|l| l.contains("reg_ms=") && field(l, "pages") == Some(kind))?;
        Some((num(field(l, "reg_ms")?)?, num(field(l, "dereg_ms")?)?))
    };
    let ((rb, db), (rh, dh)) = (times("normal(thp=never)")?, times("huge")?);
    (rb > 0.0 && db > 0.0).then(|| {
        format!(
            "perf_reg: huge against 4 KiB pages: reg_time x{:.3}, dereg_time x{:.3}",
            rh / rb,
            dh / db
        )
    })
}

#[cfg(test)]
mod unit;

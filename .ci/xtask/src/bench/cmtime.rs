//! `cmtime` (rdma-core's C program against `examples/cmtime.rs`): reading
//! the client's per-step table, checking a run, and the bench's tables of
//! `.ci/bench/cmtime-guest`.

use super::folder_and;
use super::stats::{median, range_with, ratio, Even};
use super::tables::{Table, CMTIME_INTEROP, CMTIME_MIN, CMTIME_TOTAL};

/// The steps of the client's table, in order ("bind addr" is not run).
const STEPS: &[&str] = &[
    "create_id",
    "resolve_addr",
    "resolve_route",
    "create_qp",
    "connect",
    "disconnect",
    "destroy",
];
/// Connection setup: the steps up to an established connection.
const SETUP: &[&str] = &[
    "create_id",
    "resolve_addr",
    "resolve_route",
    "create_qp",
    "connect",
];
/// Teardown.
const TEARDOWN: &[&str] = &["disconnect", "destroy"];

/// A step's row: its name (spaces as `_`) and its four columns (total ms,
/// max ms, min us, us per connection).
type Row = (String, [f64; 4]);

/// The rows of the client's table (`%-13s: %11.2f%11.2f%11.2f%11.2f` after
/// the `step  total ms  max ms  min us  us / conn` header) whose four
/// columns are numbers with two places (a step without per-connection
/// samples prints a min of 1000000000.00 that runs into its neighbour).
pub fn rows(text: &str) -> Vec<Row> {
    let mut lines = text.lines().skip_while(|l| {
        l.split_whitespace().collect::<Vec<_>>()
            != [
                "step", "total", "ms", "max", "ms", "min", "us", "us", "/", "conn",
            ]
    });
    lines.next();
    lines
        .filter(|l| l.get(13..15) == Some(": "))
        .filter_map(|l| {
            let name = l[..13].trim_end().replace(' ', "_");
            let f: Vec<&str> = l[15..].split_whitespace().collect();
            let two_places = |v: &&str| {
                let (i, d) = v
                    .strip_prefix('-')
                    .unwrap_or(v)
                    .split_once('.')
                    .unwrap_or(("", ""));
                !i.is_empty()
                    && i.bytes().all(|b| b.is_ascii_digit())
                    && d.len() == 2
                    && d.bytes().all(|b| b.is_ascii_digit())
            };
            (f.len() == 4 && f.iter().all(two_places))
                .then(|| (name, [0, 1, 2, 3].map(|i| f[i].parse().unwrap_or(0.0))))
        })
        .collect()
}

/// The sum over `steps` of column `col` (0: total ms, 2: min us), "%.2f".
fn value(rows: &[Row], col: usize, steps: &[&str]) -> String {
    format!(
        "{:.2}",
        rows.iter()
            .filter(|(n, _)| steps.contains(&n.as_str()))
            .map(|(_, v)| v[col])
            .sum::<f64>()
    )
}

/// `xtask bench cmtime-check LOG`: whether a client's output counts (no
/// failed connection, all seven steps with numbers); says why not.
pub fn check(args: &[String]) -> Result<usize, String> {
    let log = args.first().ok_or("usage: xtask bench cmtime-check LOG")?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // The run's name, as the script calls it: the file's name.
    let name = std::path::Path::new(log)
        .file_name()
        .map_or(log.clone(), |n| n.to_string_lossy().into_owned());
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("event: ") || l.contains("_ERROR, error: "))
        .take(3)
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "cmtime-bench: {name}: connections failed:\n{}",
            failed.join("\n")
        );
        return Ok(1);
    }
    let n = rows(&text).len();
    if n != STEPS.len() {
        eprintln!(
            "cmtime-bench: {name}: {n} of {} table rows with numbers\n{text}",
            STEPS.len()
        );
        return Ok(1);
    }
    Ok(0)
}

/// `xtask bench cmtime OUT CONNS ROUND...`: the two tables over the good
/// ROUNDs (`c.ROUND` against `rust.ROUND`), then the interop runs.
pub fn tables(args: &[String]) -> Result<usize, String> {
    let (out, [conns]) = folder_and(args, "cmtime OUT CONNS ROUND...", ["CONNS"])?;
    let good = &args[2..];
    let runs = |who: &str| -> Vec<Vec<Row>> {
        good.iter()
            .map(|r| rows(&out.text(&format!("{who}.{r}"))))
            .collect()
    };
    let (c, r) = (runs("c"), runs("rust"));
    println!();
    println!("== cmtime: total ms for all {conns} connections per step (median of {} rounds; lower is better)", good.len());
    table(&CMTIME_TOTAL, 0, &c, &r);
    println!(
        "(Rust/C: ratio of the medians; range: the per-round ratios, C and Rust of the same round)"
    );
    println!();
    println!("== cmtime: fastest single connection per step, min us (median of {} rounds; lower is better)", good.len());
    table(&CMTIME_MIN, 2, &c, &r);
    println!(
        "(the table's \"min us\" column: one connection's own time for the step, less subject to"
    );
    println!(
        " queueing behind the other connections than the totals; sums of the per-step minimums)"
    );
    println!();
    println!("== cmtime interop (round 1, once each): setup ms, teardown ms");
    for name in ["rust-server.c-client", "c-server.rust-client"] {
        let rows = rows(&out.text(name));
        if rows.len() == STEPS.len() {
            let cells = [
                name.into(),
                "ok".into(),
                value(&rows, 0, SETUP),
                value(&rows, 0, TEARDOWN),
            ];
            println!("{}", CMTIME_INTEROP.row(&cells));
        } else {
            println!("{}", CMTIME_INTEROP.row(&[name, "FAILED"]));
        }
    }
    Ok(0)
}

/// One table: a row per step, then setup, teardown and all steps, of
/// column `col`: the medians of C's and Rust's sums, the ratio of the
/// medians, and the range of the per-round ratios.
fn table(t: &Table, col: usize, c: &[Vec<Row>], r: &[Vec<Row>]) {
    println!("{}", t.header());
    let mut lines: Vec<(String, &[&str])> = STEPS
        .iter()
        .map(|s| (s.replace('_', " "), std::slice::from_ref(s)))
        .collect();
    lines.push(("setup (create id..connect)".into(), SETUP));
    lines.push(("teardown (disconnect+destroy)".into(), TEARDOWN));
    lines.push(("all steps".into(), STEPS));
    for (label, steps) in lines {
        let cv: Vec<String> = c.iter().map(|rows| value(rows, col, steps)).collect();
        let rv: Vec<String> = r.iter().map(|rows| value(rows, col, steps)).collect();
        let q: Vec<String> = cv.iter().zip(&rv).map(|(a, b)| ratio(b, a)).collect();
        let (cm, rm) = (median(&cv, Even::F(2)), median(&rv, Even::F(2)));
        let span = range_with(&q, |x, _| format!("{x:.2}"));
        println!(
            "{}",
            t.row(&[label, cm.clone(), rm.clone(), ratio(&rm, &cm), span])
        );
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    /// rdma-core's cmtime client (`-c 100`), its bind step never run.
    pub const SAMPLE: &str = "\
step              total ms     max ms     min us  us / conn
create id    :       0.53       0.03       2.00       5.27
bind addr    :       0.00       0.001000000000.00       0.00
resolve addr :      12.31      12.10      35.00     123.10
resolve route:       9.87       9.70      30.00      98.70
create qp    :      25.00       0.40     180.00     250.00
connect      :      60.00      58.00     400.00     600.00
disconnect   :      20.00      19.00     150.00     200.00
destroy      :       3.00       0.05      20.00      30.00
";

    #[test]
    fn the_steps_with_numbers() {
        let r = rows(SAMPLE);
        assert_eq!(r.len(), 7);
        assert_eq!(r[1].0, "resolve_addr");
        assert_eq!(r[1].1, [12.31, 12.10, 35.00, 123.10]);
        assert_eq!(value(&r, 0, SETUP), "107.71");
        assert_eq!(value(&r, 2, TEARDOWN), "170.00");
        assert!(rows("event: RDMA_CM_EVENT_REJECTED\n").is_empty());
    }

    #[test]
    fn a_run_counts_with_seven_steps_and_no_failure() {
        let dir = std::env::temp_dir().join(format!("xtask-cmtime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            vec![p.to_str().unwrap().to_string()]
        };
        assert_eq!(check(&write("good", SAMPLE)), Ok(0));
        let failed = format!("event: RDMA_CM_EVENT_UNREACHABLE, error: -110\n{SAMPLE}");
        assert_eq!(check(&write("failed", &failed)), Ok(1));
        assert_eq!(check(&write("short", &SAMPLE[..SAMPLE.len() - 60])), Ok(1));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

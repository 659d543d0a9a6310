//! The register line on `perf_reg`'s output of the guide's run.

use super::{against_c_row, per_round, r3, register_line, rounds};
use crate::bench::folder;

#[test]
fn huge_against_small_pages() {
    let text = "\
perf_reg: pages=normal(thp=never) page_size=4096 thp_bytes=0 bytes=1073741824 pinned_pages=262144 rounds=3 reg_ms=63.08 dereg_ms=53.95 (median; reg 62.36..75.39, dereg 53.37..56.60)
perf_reg: pages=normal(thp=always) page_size=4096 thp_bytes=1071644672 bytes=1073741824 pinned_pages=262144 rounds=3 reg_ms=28.43 dereg_ms=1.04 (median; reg 25.41..29.13, dereg 0.88..2.45)
perf_reg: pages=huge page_size=2097152 thp_bytes=0 bytes=1073741824 pinned_pages=512 rounds=3 reg_ms=25.47 dereg_ms=1.17 (median; reg 25.12..26.49, dereg 0.68..1.34)
";
    assert_eq!(
        register_line(text).as_deref(),
        Some("perf_reg: huge against 4 KiB pages: reg_time x0.404, dereg_time x0.022")
    );
    assert_eq!(
        register_line("perf_reg: pages=huge refused: ENOMEM\n"),
        None
    );
}

#[test]
fn rounds_with_every_value_count() {
    let found = |i: u64| {
        [
            Some(format!("{i}.0")),
            (i != 2).then(|| format!("{}.5", i + 10)),
        ]
    };
    let mut left = vec![];
    let [a, b] = rounds(3, found, |i, got| left.push((i, got)));
    assert_eq!(a, ["1.0", "3.0"]);
    assert_eq!(b, ["11.5", "13.5"]);
    assert_eq!(left, [(2, ["2.0".to_string(), String::new()])]);
    assert_eq!(per_round(&b, &a, r3), ["11.500", "4.500"]);
}

/// perftest's result line for `size`: t_typical (column 5) is `value`.
fn result_line(size: &str, value: &str) -> String {
    format!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n {size}       1000          1.00           9.00         {value}\n")
}

#[test]
fn a_row_against_c() {
    // Three rounds of C, safe and raw; round 2's raw run gave no result.
    let runs = [
        ("c", ["10.00", "12.00", "11.00"]),
        ("safe", ["11.00", "13.20", "12.10"]),
        ("raw", ["10.50", "", "11.00"]),
    ];
    let mut files = Vec::new();
    for (prog, values) in runs {
        for (i, v) in values.iter().enumerate() {
            let text = if v.is_empty() {
                "error\n".to_string()
            } else {
                result_line("64", v)
            };
            files.push((format!("send_lat_64.{prog}.{}", i + 1), text));
        }
    }
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    let (dir, out) = folder("timed", &files);
    let progs = [("c", "C"), ("safe", "safe"), ("raw", "raw")];
    let (row, found) = against_c_row(&out, 3, "send_lat_64", progs).unwrap();
    assert!(found);
    // Rounds 1 and 3 only: medians of two are their mean.
    assert_eq!(
        row,
        [
            "send_lat_64",
            "usec",
            "10.5",
            "11.55",
            "10.75",
            "1.1",
            "1.1..1.1",
            "1.025"
        ]
    );
    // Two programs (the hosts' table): every round counts, an odd
    // median is the middle value as printed.
    let (row, _) = against_c_row(&out, 3, "send_lat_64", [("c", "C"), ("safe", "Rust")]).unwrap();
    assert_eq!(
        row,
        ["send_lat_64", "usec", "11.00", "12.10", "1.100", "1.1..1.1"]
    );
    // A workload with no file at all: no result, every cell "-".
    let (row, found) =
        against_c_row(&out, 3, "write_lat_64", [("c", "C"), ("rust", "Rust")]).unwrap();
    assert!(!found);
    assert_eq!(row, ["write_lat_64", "usec", "-", "-", "-", "-"]);
    assert!(against_c_row(&out, 1, "no_such", progs).is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

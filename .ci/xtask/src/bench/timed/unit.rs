//! The register line on `perf_reg`'s output of the guide's run.

use super::{per_round, r3, register_line, rounds};

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

//! The command line and the wire format, without a device.

use super::*;

const DEFS: &[OptDef] = &[
    opt('p', "port", true),
    opt('e', "events", false),
    opt('g', "gid-idx", true),
    opt('c', "chk", false),
    opt('i', "ib-port", true),
    opt('d', "ib-dev", true),
];

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn getopt_forms() {
    for form in [
        &["-p", "7"][..],
        &["-p7"],
        &["--port=7"],
        &["--port", "7"],
        &["--po", "7"],
    ] {
        let (o, p) = getopt_long("x", &args(form), DEFS).unwrap();
        assert_eq!(o, vec![('p', Some("7".into()))], "{form:?}");
        assert!(p.is_empty());
    }
    let (o, p) = getopt_long("x", &args(&["host", "-ecg1", "--", "-e"]), DEFS).unwrap();
    assert_eq!(o, vec![('e', None), ('c', None), ('g', Some("1".into()))]);
    assert_eq!(p, args(&["host", "-e"]));
    assert!(getopt_long("x", &args(&["-h"]), DEFS).is_err());
    assert!(getopt_long("x", &args(&["-p"]), DEFS).is_err());
    assert!(getopt_long("x", &args(&["--events=1"]), DEFS).is_err());
    assert!(getopt_long("x", &args(&["--ib"]), DEFS)
        .unwrap_err()
        .contains("ambiguous"));
}

#[test]
fn c_numbers() {
    assert_eq!(parse_c_int("18515"), Some(18515));
    assert_eq!(parse_c_int("0x10"), Some(16));
    assert_eq!(parse_c_int("010"), Some(8));
    assert_eq!(parse_c_int("0"), Some(0));
    assert_eq!(parse_c_int("-1"), Some(-1));
    assert_eq!(parse_c_int("1k"), None);
    // A second sign is no number for strtol (it read 5 or -5 here).
    for s in ["--5", "+-5", "0x-5", "0-5", "-+5", "0x+5"] {
        assert_eq!(parse_c_int(s), None, "{s:?}");
    }
    assert_eq!(parse_c_int("-9223372036854775808"), Some(i64::MIN));
    assert_eq!(parse_c_int("9223372036854775808"), None);
}

#[test]
fn timestamp_statistics() {
    let mut ts = TsStats::new(0xffff);
    assert!(ts.lines().is_empty());
    ts.record(100);
    assert!(ts.lines().is_empty(), "one completion gives no delta");
    ts.record(130);
    ts.record(0xfff0); // +65390
    ts.record(0x10); // wraps: 0xffff - 0xfff0 + 0x10 + 1 = 0x20
    assert_eq!(
        ts.lines(),
        [
            "Max receive completion clock cycles = 65390",
            "Min receive completion clock cycles = 30",
            "Average receive completion clock cycles = 21817.333333",
        ]
    );
}

#[test]
fn timestamp_statistics_as_c() {
    // Equal timestamps: a delta of 0 is a delta (min 0, counted).
    let mut ts = TsStats::new(u64::MAX);
    for t in [5, 5, 5] {
        ts.record(t);
    }
    assert_eq!(
        ts.lines(),
        [
            "Max receive completion clock cycles = 0",
            "Min receive completion clock cycles = 0",
            "Average receive completion clock cycles = 0.000000",
        ]
    );
    // The minimum starts at 0xffffffff, as in C: deltas above it leave
    // it there.
    let mut ts = TsStats::new(u64::MAX);
    ts.record(0);
    ts.record(0x1_0000_0000);
    ts.record(0x3_0000_0000);
    assert_eq!(
        ts.lines(),
        [
            "Max receive completion clock cycles = 8589934592",
            "Min receive completion clock cycles = 4294967295",
            "Average receive completion clock cycles = 6442450944.000000",
        ]
    );
    // A 64-bit clock wrapping: mask - prev + ts + 1 in u64, as C does it
    // (u64::MAX - (u64::MAX - 1) + 2 + 1 = 4).
    let mut ts = TsStats::new(u64::MAX);
    ts.record(u64::MAX - 1);
    ts.record(2);
    assert_eq!(ts.lines()[0], "Max receive completion clock cycles = 4");
    // A 48-bit clock (a common completion_timestamp_mask) wrapping, and
    // %f's rounding of the average (7 / 3).
    let mask = (1u64 << 48) - 1;
    let mut ts = TsStats::new(mask);
    ts.record(mask - 2);
    ts.record(0); // mask - 2 -> mask -> 0: 3
    ts.record(2); // 2
    ts.record(4); // 2
    assert_eq!(
        ts.lines(),
        [
            "Max receive completion clock cycles = 3",
            "Min receive completion clock cycles = 2",
            "Average receive completion clock cycles = 2.333333",
        ]
    );
}

#[test]
fn status_messages() {
    assert_eq!(status_result(Ok(WcStatus::Success), 7, 1), Ok(()));
    assert_eq!(
        status_result(Ok(WcStatus::LocLenErr), 0x33, 1).unwrap_err(),
        format!(
            "Failed status {} (1) for wr_id 1 (vendor error 0x33)",
            WcStatus::LocLenErr.message()
        )
    );
    assert_eq!(
        status_result(Err(99), 0, 2).unwrap_err(),
        "Failed status unknown (99) for wr_id 2 (vendor error 0x0)"
    );
}

#[test]
fn new_send_and_ts_parse() {
    const OPTS: &[OptDef] = &[opt('N', "new_send", false), opt('t', "ts", false)];
    let prog = Program {
        opts: OPTS,
        help: &[],
        default_size: 4096,
    };
    let cfg = parse_config("x", &args(&["--new_send", "-t", "host"]), &prog).unwrap();
    assert!(cfg.new_send && cfg.timestamps && cfg.flags.is_empty());
    assert_eq!(cfg.servername.as_deref(), Some("host"));
    let cfg = parse_config("x", &args(&["-tN"]), &prog).unwrap();
    assert!(cfg.new_send && cfg.timestamps);
    let cfg = parse_config("x", &args(&[]), &prog).unwrap();
    assert!(!cfg.new_send && !cfg.timestamps);
}

#[test]
fn lrand48_matches_glibc() {
    // srand48(1); lrand48() x3 with glibc.
    let mut r = Rand48::seeded(1);
    assert_eq!(
        [r.lrand48(), r.lrand48(), r.lrand48()],
        [89_400_484, 976_015_093, 1_792_756_325]
    );
}

//! The parsers on samples of the programs' own output.

use super::*;

/// `ib_send_lat`'s table (perftest 4.5), a latency run.
const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      2000          10.92          61.37        12.46     	       13.01       	2.10   		20.42   		61.37  
---------------------------------------------------------------------------------------
";

/// `ib_write_bw`'s table, a bandwidth run with a clock it could not read.
const BW: &str = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             41.52              41.34  		   0.000661
 64         20000            inf                inf    		   0.045800
";

#[test]
fn perftest_columns() {
    assert_eq!(column(LAT, "64", 5).as_deref(), Some("12.46"));
    assert_eq!(column(LAT, "64", 3).as_deref(), Some("10.92"));
    assert_eq!(column(LAT, "65536", 5), None);
    assert_eq!(column(BW, "65536", 4).as_deref(), Some("41.34"));
    assert_eq!(column(BW, "64", 5).as_deref(), Some("0.045800"));
    assert_eq!(column(BW, "64", 4), None, "inf is no result");
    assert_eq!(column(BW, "64", 9), None, "too few fields");
}

#[test]
fn result_lines() {
    let perf = "perf-result: test=send_lat path=safe size=64 iters=2000 ops=4000 polls=9000 empty_polls=5000 usec=12.5\n\
                perf-result: test=send_lat path=safe size=64 iters=2000 ops=4002 polls=9000 empty_polls=4999 usec=12.5\n";
    assert_eq!(
        last_field(perf, "perf-result:", "ops").as_deref(),
        Some("4002")
    );
    assert_eq!(
        last_field(perf, "perf-result:", "polls").as_deref(),
        Some("9000")
    );
    assert_eq!(
        last_field(perf, "perf-result:", "empty_polls").as_deref(),
        Some("4999")
    );
    let scale = "qp_scale: path=c qps=1000 setup_s=0.900029 teardown_s=0.136880 rss_kib=48536\n";
    assert_eq!(first_field(scale, "setup_s").as_deref(), Some("0.900029"));
    assert_eq!(first_field(scale, "rss_kib").as_deref(), Some("48536"));
    assert_eq!(first_field("qp_scale: failed\n", "setup_s"), None);
    let pp = "  local address:  LID 0x0000, QPN 0x000011\n40000 bytes in 0.06 seconds = 5.61 Mbit/sec\n20000 iters in 0.56 seconds = 27.83 usec/iter\n";
    assert_eq!(usec_per_iter(pp).as_deref(), Some("27.83"));
}

#[test]
fn halves_per_message() {
    let c = "perf_halves: path=c messages=40000 seconds=0.815440\n";
    assert_eq!(usec_per_message(c).as_deref(), Some("20.386"));
    assert_eq!(
        usec_per_message("perf_halves: path=c messages=0 seconds=1\n"),
        None
    );
    assert_eq!(
        usec_per_message("ibv_post_send: Cannot allocate memory\n"),
        None
    );
}

#[test]
fn valgrind_collected() {
    let log = "==16968== Events    : Ir\n==16968== Collected : 529516\n==16968== \n==16968== I   refs:      529,516\n";
    assert_eq!(collected(log), Some(529516));
    assert_eq!(collected("no count\n"), None);
}

/// `callgrind_annotate --inclusive=yes --threshold=100` (valgrind 3.19) of
/// a `perf` client.
const ANNOTATE: &str = "\
--------------------------------------------------------------------------------
Ir                
--------------------------------------------------------------------------------
29,335,120 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                 file:function
--------------------------------------------------------------------------------
29,335,120 (100.0%)  ???:_start [/tmp/perf]
 1,372,000 ( 4.68%)  examples/perf/path.rs:<perf::path::Safe as perf::path::DataPath>::post [/tmp/perf]
   760,000 ( 2.59%)  examples/perf/path.rs:<perf::path::Safe as perf::path::DataPath>::post_recvs [/tmp/perf]
   184,000 ( 0.63%)  examples/perf/path.rs:perf::path::Safe::completions [/tmp/perf]
    99,000 ( 0.34%)  examples/perf/path.rs:perf::path::Safe::completions_of [/tmp/perf]
";

#[test]
fn callgrind_inclusive_counts() {
    let lines = inclusive(ANNOTATE);
    assert_eq!(
        lines[0],
        Incl {
            count: 29_335_120,
            name: "PROGRAM TOTALS".into()
        }
    );
    assert_eq!(lines.len(), 6);
    let dp = [
        " as perf::path::DataPath>::post ",
        " as perf::path::DataPath>::post_recvs ",
        "::completions ",
    ];
    assert_eq!(sum_matching(&lines, &dp), 1_372_000 + 760_000 + 184_000);
    assert_eq!(first_matching(&lines, "::completions_of "), Some(99_000));
    assert_eq!(first_matching(&lines, "::nothing "), None);
}

/// `strace -f -c` of a run (strace 6.1), errors in some rows.
const STRACE_LO: &str = "\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 60.00    0.000300           1       250           ioctl
 20.00    0.000100           1       100           mmap
 10.00    0.000050           1       100           munmap
 10.00    0.000050          25         2         2 access
------ ----------- ----------- --------- --------- ----------------
100.00    0.000500           1       452         2 total
";

#[test]
fn strace_summaries() {
    let calls = strace_calls(STRACE_LO);
    assert_eq!(calls["ioctl"], 250);
    assert_eq!(calls["access"], 2);
    assert_eq!(calls["total"], 452);
    let hi = STRACE_LO
        .replace("250  ", "500  ")
        .replace("100           mmap", "200           mmap")
        .replace("452", "802")
        .replace("100           munmap", "200           munmap")
        .replace("       2 total", "   2 total");
    let per = strace_per(STRACE_LO, &hi, 50.0);
    assert_eq!(
        per,
        vec![
            ("ioctl".into(), 5.0),
            ("mmap".into(), 2.0),
            ("munmap".into(), 2.0)
        ]
    );
    assert_eq!(strace_calls(&hi)["total"], 802);
}

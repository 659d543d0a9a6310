//! What the bench runs, where a table has a row per run: the workloads of
//! each table, printed by `xtask bench list NAME` for the guest scripts to
//! run (one word per field, a line per row) and read back by the tables.
//! A row added here is run and printed; the scripts need no change.

use std::process::ExitCode;

/// A perftest workload: perftest's program against `perf`'s test.
pub struct Workload {
    /// The row's name, and the prefix of its outputs' files.
    pub name: &'static str,
    /// perftest's program.
    pub cprog: &'static str,
    /// `perf`'s test.
    pub test: &'static str,
    /// The message size (`-s`; 8 for the atomics, which take none).
    pub size: &'static str,
    /// Iterations (`-n`).
    pub iters: &'static str,
    /// The result table's column read: 5 is t_typical (usec) for latency
    /// and MsgRate (Mpps) for bandwidth, 4 is the average bandwidth (MB/s).
    pub col: usize,
    pub unit: &'static str,
}

const fn w(
    name: &'static str,
    cprog: &'static str,
    test: &'static str,
    size: &'static str,
    iters: &'static str,
    col: usize,
    unit: &'static str,
) -> Workload {
    Workload {
        name,
        cprog,
        test,
        size,
        iters,
        col,
        unit,
    }
}

/// The first table's workloads (`.ci/bench/guest`).
pub const WORKLOADS: &[Workload] = &[
    w(
        "send_lat_64",
        "ib_send_lat",
        "send_lat",
        "64",
        "2000",
        5,
        "usec",
    ),
    w(
        "write_lat_64",
        "ib_write_lat",
        "write_lat",
        "64",
        "2000",
        5,
        "usec",
    ),
    w(
        "read_lat_64",
        "ib_read_lat",
        "read_lat",
        "64",
        "2000",
        5,
        "usec",
    ),
    w(
        "atomic_lat",
        "ib_atomic_lat",
        "atomic_lat",
        "8",
        "2000",
        5,
        "usec",
    ),
    w(
        "send_bw_64",
        "ib_send_bw",
        "send_bw",
        "64",
        "20000",
        5,
        "Mpps",
    ),
    w(
        "write_bw_64",
        "ib_write_bw",
        "write_bw",
        "64",
        "20000",
        5,
        "Mpps",
    ),
    w(
        "write_bw_64K",
        "ib_write_bw",
        "write_bw",
        "65536",
        "2000",
        4,
        "MB/s",
    ),
    w(
        "read_bw_64K",
        "ib_read_bw",
        "read_bw",
        "65536",
        "2000",
        4,
        "MB/s",
    ),
    w(
        "atomic_bw",
        "ib_atomic_bw",
        "atomic_bw",
        "8",
        "20000",
        5,
        "Mpps",
    ),
];

/// `.ci/hosts-bench`'s workloads across the link between two VMs: names
/// of [`WORKLOADS`], each with its iterations there.
pub const HOSTS: &[(&str, &str)] = &[
    ("send_lat_64", "1000"),
    ("write_lat_64", "1000"),
    ("read_lat_64", "1000"),
    ("send_bw_64", "5000"),
    ("write_bw_64", "5000"),
    ("write_bw_64K", "1000"),
];

/// The workload of [`WORKLOADS`] named `name`.
pub fn workload(name: &str) -> Result<&'static Workload, String> {
    WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .ok_or(format!("no workload {name}"))
}

/// The data-path count's rows: test, size, and whether the safe path
/// receives into queue-owned buffers (`--recv-buffers`, "rb": no raw run
/// of its own, the raw column is the row's test without it).
pub const DATAPATH: &[(&str, &str, bool)] = &[
    ("send_lat", "64", false),
    ("send_lat", "64", true),
    ("write_bw", "64", false),
    ("send_bw", "64", false),
    ("write_lat", "64", false),
];

/// The whole-client count's rows: `perf`'s test, size, perftest's program.
pub const WHOLE: &[(&str, &str, &str)] = &[
    ("send_lat", "64", "ib_send_lat"),
    ("send_bw", "64", "ib_send_bw"),
];

/// `.ci/bench/ex-guest`'s latency rows: test, size.
pub const EX_LATENCY: &[(&str, &str)] = &[
    ("send_lat", "2"),
    ("send_lat", "64"),
    ("write_lat", "2"),
    ("write_lat", "64"),
];

/// `.ci/bench/ex-guest`'s data-path rows: test, size, more options.
pub const EX_DATAPATH: &[(&str, &str, &str)] = &[
    ("send_lat", "64", ""),
    ("write_lat", "64", ""),
    ("write_bw", "64", ""),
    ("write_bw", "64", "-l 4"),
];

/// The sizes of the pingpong part's `-e` rows.
pub const PINGPONG_E_SIZES: &[&str] = &["64", "4096"];

/// `xtask bench list NAME`: NAME's rows, a line each, fields separated by
/// a space (an empty last field left out).
pub fn list(args: &[String]) -> Result<ExitCode, String> {
    let lines: Vec<String> = match args {
        [n] if n == "perftest" => WORKLOADS
            .iter()
            .map(|w| format!("{} {} {} {} {}", w.name, w.cprog, w.test, w.size, w.iters))
            .collect(),
        [n] if n == "hosts" => {
            let mut lines = Vec::new();
            for (name, iters) in HOSTS {
                let w = workload(name)?;
                lines.push(format!("{} {} {} {} {iters}", w.name, w.cprog, w.test, w.size));
            }
            lines
        }
        [n] if n == "datapath" => DATAPATH
            .iter()
            .map(|(t, s, rb)| format!("{t} {s}{}", if *rb { " rb" } else { "" }))
            .collect(),
        [n] if n == "whole" => WHOLE
            .iter()
            .map(|(t, s, c)| format!("{t} {s} {c}"))
            .collect(),
        [n] if n == "ex-latency" => EX_LATENCY.iter().map(|(t, s)| format!("{t} {s}")).collect(),
        [n] if n == "ex-datapath" => EX_DATAPATH
            .iter()
            .map(|(t, s, r)| format!("{t} {s} {r}").trim_end().to_string())
            .collect(),
        [n] if n == "pingpong-e" => PINGPONG_E_SIZES.iter().map(|s| s.to_string()).collect(),
        _ => {
            return Err(
                "usage: xtask bench list perftest|hosts|datapath|whole|pingpong-e|ex-latency|ex-datapath"
                    .into(),
            )
        }
    };
    for l in lines {
        println!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

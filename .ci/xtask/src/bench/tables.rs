//! Every table the bench prints, one definition each: its columns' headers,
//! widths and alignment, in the order printed. A row is printed through
//! its table ([`Table::row`]), so a column changed here changes the header
//! and every row at once; the values of a row are computed where the table
//! is filled (the module named in each table's comment).

/// One column: its header, its width, and whether its cells are aligned
/// to the left (the first, naming, columns) or to the right (numbers).
pub struct Col {
    pub head: &'static str,
    pub width: usize,
    pub left: bool,
}

/// A table: its columns, separated by one space.
pub struct Table {
    pub cols: &'static [Col],
}

/// A column aligned to the left.
const fn l(head: &'static str, width: usize) -> Col {
    Col {
        head,
        width,
        left: true,
    }
}

/// A column aligned to the right.
const fn r(head: &'static str, width: usize) -> Col {
    Col {
        head,
        width,
        left: false,
    }
}

impl Table {
    /// The header line: every column's header.
    pub fn header(&self) -> String {
        let heads: Vec<&str> = self.cols.iter().map(|c| c.head).collect();
        self.row(&heads)
    }

    /// A line of the first `cells.len()` columns (a row may stop early:
    /// the async table's instruction rows fill five of its eight). A cell
    /// wider than its column is printed whole, as printf does.
    pub fn row<S: AsRef<str>>(&self, cells: &[S]) -> String {
        assert!(cells.len() <= self.cols.len(), "more cells than columns");
        let parts: Vec<String> = self
            .cols
            .iter()
            .zip(cells)
            .map(|(c, v)| {
                let (v, w) = (v.as_ref(), c.width);
                if c.left {
                    format!("{v:<w$}")
                } else {
                    format!("{v:>w$}")
                }
            })
            .collect();
        parts.join(" ")
    }
}

/// perftest against `perf` (safe and raw), per workload
/// (`timed::perftest`, its rows `timed::against_c_row`).
pub const PERFTEST: Table = Table {
    cols: &[
        l("workload", 13),
        l("unit", 5),
        r("C", 10),
        r("safe", 10),
        r("raw", 10),
        r("safe/C", 8),
        r("safe/C range", 12),
        r("raw/C", 8),
    ],
};

/// perftest against `perf` between two hosts (`timed::hosts` for
/// `.ci/hosts-bench`, its rows `timed::against_c_row`).
pub const HOSTS: Table = Table {
    cols: &[
        l("workload", 13),
        l("unit", 5),
        r("C", 10),
        r("Rust", 10),
        r("Rust/C", 8),
        r("Rust/C range", 12),
    ],
};

/// Data-path instructions per operation, safe against raw (`counted::datapath`).
pub const DATAPATH: Table = Table {
    cols: &[
        l("workload", 22),
        r("safe", 10),
        r("raw", 10),
        r("safe/raw", 10),
    ],
};

/// The whole client's instructions per iteration (`counted::whole_table`).
pub const WHOLE: Table = Table {
    cols: &[
        l("workload", 22),
        r("C", 10),
        r("safe", 10),
        r("raw", 10),
        r("safe/C", 10),
        r("raw/C", 10),
    ],
};

/// The async wait against polling and `-e` (`timed::async_wait`, its
/// per-wait row `timed::per_wait`).
pub const ASYNC: Table = Table {
    cols: &[
        l("send_lat 64 B", 26),
        r("poll", 10),
        r("-e", 10),
        r("async", 10),
        r("async/poll", 12),
        r("async/poll range", 14),
        r("async/-e", 12),
        r("async/-e range", 14),
    ],
};

/// rc_pingpong against ibv_rc_pingpong (`timed::pingpong`).
pub const PINGPONG: Table = Table {
    cols: &[
        l("measure", 26),
        r("C", 10),
        r("Rust", 10),
        r("Rust/C", 8),
        r("Rust/C range", 14),
    ],
};

/// Reading in place against copying out (`counted::inplace`).
pub const INPLACE: Table = Table {
    cols: &[
        l("message", 28),
        r("in place", 10),
        r("copied", 10),
        r("in place/copied", 12),
    ],
};

/// Many QPs in one process: C, hand and doc (`scale::table`).
pub const SCALE: Table = Table {
    cols: &[
        l("measure", 22),
        r("C", 10),
        r("hand", 10),
        r("doc", 10),
        r("hand/C", 7),
        r("hand/C range", 11),
        r("doc/C", 7),
        r("doc/C range", 11),
    ],
};

/// Two threads on one QP: C, halves, mutex (`timed::halves`).
pub const HALVES: Table = Table {
    cols: &[
        l("path", 10),
        r("usec/message", 14),
        r("X/C", 10),
        r("X/C range", 14),
        r("instr/message", 14),
    ],
};

/// cmtime, total ms per step (`cmtime::table`).
pub const CMTIME_TOTAL: Table = Table {
    cols: &[
        l("step", 28),
        r("C ms", 10),
        r("Rust ms", 10),
        r("Rust/C", 8),
        r("Rust/C range", 14),
    ],
};

/// cmtime, the fastest connection's us per step (`cmtime::table`).
pub const CMTIME_MIN: Table = Table {
    cols: &[
        l("step", 28),
        r("C us", 10),
        r("Rust us", 10),
        r("Rust/C", 8),
        r("Rust/C range", 14),
    ],
};

/// cmtime's interop runs (no header): name, "ok" or "FAILED", setup ms,
/// teardown ms (`cmtime::tables`).
pub const CMTIME_INTEROP: Table = Table {
    cols: &[l("", 24), l("", 3), r("setup ms", 10), r("teardown ms", 10)],
};

/// `perf --ex` against `perf`, latency (`ex::latency`).
pub const EX_LATENCY: Table = Table {
    cols: &[
        l("workload", 16),
        r("basic", 10),
        r("ex", 10),
        r("ex/basic", 8),
        r("ex/b range", 12),
    ],
};

/// `perf --ex` against `perf`, data-path instructions (`ex::datapath`).
pub const EX_DATAPATH: Table = Table {
    cols: &[
        l("workload", 22),
        r("basic", 10),
        r("ex", 10),
        r("ex/basic", 10),
    ],
};

#[cfg(test)]
mod unit {
    use super::*;

    /// The headers as `src/guide/performance.md` quotes the bench's output:
    /// a column changed here changes these lines, and the guide with them.
    #[test]
    fn headers_are_the_guides() {
        let quoted = [
            (&HOSTS, "workload      unit           C       Rust   Rust/C Rust/C range"),
            (&DATAPATH, "workload                     safe        raw   safe/raw"),
            (&WHOLE, "workload                        C       safe        raw     safe/C      raw/C"),
            (&PINGPONG, "measure                             C       Rust   Rust/C   Rust/C range"),
            (&SCALE, "measure                         C       hand        doc  hand/C hand/C range   doc/C doc/C range"),
            (&EX_LATENCY, "workload              basic         ex ex/basic   ex/b range"),
            (&EX_DATAPATH, "workload                    basic         ex   ex/basic"),
            (&INPLACE, "message                        in place     copied in place/copied"),
            (&HALVES, "path         usec/message        X/C      X/C range  instr/message"),
            (&ASYNC, "send_lat 64 B                    poll         -e      async   async/poll async/poll range     async/-e async/-e range"),
        ];
        for (table, line) in quoted {
            assert_eq!(table.header(), line);
        }
    }

    #[test]
    fn rows_are_printf_lines() {
        // The first table's header and a row as the guide quotes them.
        assert_eq!(
            PERFTEST.header(),
            "workload      unit           C       safe        raw   safe/C safe/C range    raw/C"
        );
        let row = [
            "send_lat_64",
            "usec",
            "12.46",
            "13.91",
            "13.65",
            "1.116",
            "1.1..1.13",
            "1.096",
        ];
        assert_eq!(
            PERFTEST.row(&row),
            "send_lat_64   usec       12.46      13.91      13.65    1.116    1.1..1.13    1.096"
        );
        // A short row, and an empty cell.
        assert_eq!(
            PINGPONG.row(&["instructions/iter (cg)", "693", "957", "1.38"]),
            "instructions/iter (cg)            693        957     1.38"
        );
        assert_eq!(
            HALVES.row(&["C", "20.386", "", "", "486"]).len(),
            10 + 14 + 10 + 14 + 14 + 4
        );
        assert_eq!(
            CMTIME_INTEROP.row(&["c-server.rust-client", "FAILED"]),
            "c-server.rust-client     FAILED"
        );
    }
}

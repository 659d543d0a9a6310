//! Many connected RC QPs in one process through [`QueuePair::connect`]:
//! the Rust side of `.ci/bench/qp_scale.c`, doing the same thing with the
//! same options.
//!
//! ```text
//! cargo run --release --example perf_scale -- [--documented] [-d DEV] [-i PORT] [-x GIDIDX] [-n N]
//! ```
//!
//! One PD and one CQ pair (a send CQ and a receive CQ, shared by every QP);
//! N RC QPs (default 1000, even) of depth 64/64, one SGE each way, made as
//! N/2 loopback pairs on one port (QP 2i and QP 2i+1 are each other's
//! peer): each is taken RESET -> RTS by [`QueuePair::connect`] with the
//! default [`ConnectOptions`] (rdma-core's `ibv_rc_pingpong` settings), the
//! GID index `-x` and the port's active MTU. The port and the GID are read
//! once, before the clock starts, as the C program does, and the peer's
//! endpoint is built by hand from them.
//!
//! With `--documented`, each QP takes the documented path instead: its
//! endpoint from [`QueuePair::local_endpoint`], then
//! [`QueuePair::connect`] to its peer's endpoint, with the default
//! [`ConnectOptions`] but the port and the GID index `-x` (without `-x`,
//! the crate picks the GID; the path MTU is the port's active MTU as
//! `connect` finds it). Nothing is read before the clock starts.
//!
//! Then every QP is closed. Prints
//!
//! ```text
//! qp_scale: path=rust qps=N setup_s=S teardown_s=T rss_kib=R
//! ```
//!
//! (`path=documented` with `--documented`)
//! where setup is creating and connecting all N QPs, teardown closing
//! them, and `rss_kib` the growth of the process's `VmRSS`
//! (`/proc/self/status`) from before the first QP to after the last one is
//! connected. `.ci/bench/guest` (part `scale`) runs it against the C
//! program.
#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::time::Instant;

use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn};
use rdma_verbs::{Context, Gid, QpCaps, QpInitAttr, QpType, QueuePair, Result};

struct Options {
    /// `-h`/`--help`: print the usage and the options, and exit.
    help: bool,
    /// `--documented`: every QP through `local_endpoint` and `connect`.
    documented: bool,
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
    n: usize,
}

/// The options, below [`USAGE`] in `--help`.
const OPTIONS: &str = concat!(
    "  --documented  each QP: local_endpoint, then connect (the documented path)\n",
    "  -d DEV        the device (default: the first)\n",
    "  -i PORT       its port (default 1)\n",
    "  -x GIDIDX     the source GID index (default: none; with --documented the\n",
    "                crate picks one where the port needs a GRH, else no GRH)\n",
    "  -n N          connected QPs, an even count (default 1000)\n",
    "  -h, --help    this text",
);

const USAGE: &str = "usage: perf_scale [--documented] [-d DEV] [-i PORT] [-x GIDIDX] [-n N]";
const DEPTH: u32 = 64;

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        help: false,
        documented: false,
        device: None,
        port: 1,
        gid_index: None,
        n: 1000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-d" => o.device = Some(value()?),
            "-i" => o.port = value()?.parse().map_err(|_| "bad -i (a port number)")?,
            "-x" => o.gid_index = Some(value()?.parse().map_err(|_| "bad -x (a GID index)")?),
            "-n" => {
                o.n = value()?
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0 && n % 2 == 0)
                    .ok_or("bad -n (a positive even count)")?
            }
            "--documented" => o.documented = true,
            "-h" | "--help" => o.help = true,
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    quiet_pipe::install();
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("perf_scale: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if opts.help {
        println!("{USAGE}\n{OPTIONS}");
        return ExitCode::SUCCESS;
    }
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf_scale: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The process's resident set in KiB (`VmRSS` of `/proc/self/status`).
fn vm_rss_kib() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run(o: &Options) -> Result<()> {
    let ctx = match &o.device {
        Some(d) => Context::open(d)?,
        None => Context::open_first()?,
    };
    let pd = ctx.alloc_pd()?;
    let scq = ctx.create_cq(4096)?;
    let rcq = ctx.create_cq(4096)?;
    let caps = QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr::new(QpType::Rc, &scq, &rcq).caps(caps);
    let psn = Psn::new(0)?;
    let mut qps: Vec<QueuePair> = Vec::with_capacity(o.n);

    // The hand-built path reads the port and the GID before the clock.
    let hand = if o.documented {
        None
    } else {
        let port = ctx.query_port(o.port)?;
        let gid = match o.gid_index {
            Some(i) => ctx.query_gid(o.port, i.into())?,
            None => Gid::ZERO,
        };
        Some((port.lid, port.active_mtu, gid))
    };
    let rss0 = vm_rss_kib();
    let start = Instant::now();
    for _ in 0..o.n {
        qps.push(pd.create_qp(&init)?);
    }
    match hand {
        Some((lid, mtu, gid)) => {
            let opts = ConnectOptions {
                port: o.port,
                gid_index: o.gid_index,
                path_mtu: Some(mtu),
                ..Default::default()
            };
            for i in 0..o.n {
                let peer = Endpoint {
                    lid,
                    qpn: qps[i ^ 1].qp_num(),
                    psn,
                    gid,
                };
                qps[i].connect(&opts, psn, &peer)?;
            }
        }
        None => {
            let opts = ConnectOptions {
                port: o.port,
                gid_index: o.gid_index,
                ..Default::default()
            };
            let mut ends = Vec::with_capacity(o.n);
            for qp in &qps {
                ends.push(qp.local_endpoint(&opts, psn)?);
            }
            for (i, qp) in qps.iter_mut().enumerate() {
                qp.connect(&opts, psn, &ends[i ^ 1])?;
            }
        }
    }
    let setup = start.elapsed().as_secs_f64();
    let rss1 = vm_rss_kib();
    let start = Instant::now();
    for qp in qps.drain(..) {
        qp.close()?;
    }
    let teardown = start.elapsed().as_secs_f64();
    let rss = match (rss0, rss1) {
        (Some(a), Some(b)) => b - a,
        _ => -1,
    };
    let path = if o.documented { "documented" } else { "rust" };
    println!(
        "qp_scale: path={path} qps={} setup_s={setup:.6} teardown_s={teardown:.6} rss_kib={rss}",
        o.n
    );
    Ok(())
}

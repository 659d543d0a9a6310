//! QP setup rate through the typed builders: the Rust side of
//! `.ci/bench/qp_setup.c`, doing the same thing with the same options.
//!
//! ```text
//! cargo run --release --example perf_setup -- [-d DEV] [-i PORT] [-x GIDIDX] [-n N]
//! ```
//!
//! N times (default 200): create an RC QP ([`Qp<Rc>`]) on one PD and CQ,
//! move it RESET -> INIT -> RTR -> RTS with [`ResetToInit`], [`InitToRtr`]
//! and [`RtrToRts`] (RTR to a second QP on the same device: loopback, with
//! a GRH from GID index `-x` when given), and destroy it. Prints
//!
//! ```text
//! qp_setup: path=rust qps=N seconds=S per_sec=R
//! ```
//!
//! `.ci/bench/qp-setup.sh` runs it against the C program and counts the
//! kernel calls of each with strace.
#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::time::Instant;

use rdma_verbs::qp::{
    AckTimeout, AddressVector, GlobalRoute, InitToRtr, MinRnrTimer, Psn, Qp, QpCaps, Rc,
    ResetToInit, RetryCount, RnrRetry, RtrToRts,
};
use rdma_verbs::{AccessFlags, Context, Result};

struct Options {
    /// `-h`/`--help`: print the usage and the options, and exit.
    help: bool,
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
    n: u32,
}

/// The options, below [`USAGE`] in `--help`.
const OPTIONS: &str = concat!(
    "  -d DEV      the device (default: the first)\n",
    "  -i PORT     its port (default 1)\n",
    "  -x GIDIDX   the source GID index (default: none, no GRH; RoCE needs one)\n",
    "  -n N        QPs to set up and destroy (default 200)\n",
    "  -h, --help  this text",
);

const USAGE: &str = "usage: perf_setup [-d DEV] [-i PORT] [-x GIDIDX] [-n N]";

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        help: false,
        device: None,
        port: 1,
        gid_index: None,
        n: 200,
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
                    .filter(|&n| n > 0)
                    .ok_or("bad -n (a positive count)")?
            }
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
            eprintln!("perf_setup: {e}\n{USAGE}");
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
            eprintln!("perf_setup: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options) -> Result<()> {
    let ctx = match &o.device {
        Some(d) => Context::open(d)?,
        None => Context::open_first()?,
    };
    let port = ctx.query_port(o.port)?;
    let gid = match o.gid_index {
        Some(i) => Some((i, ctx.query_gid(o.port, i.into())?)),
        None => None,
    };
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let peer = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
    let peer_qpn = peer.qp_num();

    let mut av = AddressVector::new(o.port).dlid(port.lid);
    if let Some((i, g)) = gid {
        av = av.global(GlobalRoute::new(g, i));
    }
    let psn = Psn::new(0)?;
    let (rnr_timer, timeout, retry) = (
        MinRnrTimer::new(12)?,
        AckTimeout::new(14)?,
        RetryCount::new(7)?,
    );

    let start = Instant::now();
    for _ in 0..o.n {
        let mut qp = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
        // The builders are not Copy (their transport is a type
        // parameter): building them is a few stores, no allocation.
        qp.apply(ResetToInit::<Rc>::new(0, o.port, AccessFlags::empty()))?;
        qp.apply(InitToRtr::<Rc>::new(
            av,
            port.active_mtu,
            peer_qpn,
            psn,
            1,
            rnr_timer,
        ))?;
        qp.apply(RtrToRts::<Rc>::new(
            timeout,
            retry,
            RnrRetry::INFINITE,
            psn,
            1,
        ))?;
        qp.into_dynamic().close()?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "qp_setup: path=rust qps={} seconds={secs:.6} per_sec={:.1}",
        o.n,
        if secs > 0.0 {
            f64::from(o.n) / secs
        } else {
            0.0
        }
    );
    Ok(())
}

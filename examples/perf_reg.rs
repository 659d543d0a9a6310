//! Memory registration cost on normal and on huge pages: how long
//! `ibv_reg_mr` and `ibv_dereg_mr` take for one large region, and how many
//! pages the region pins.
//!
//! ```text
//! cargo run --release --example perf_reg -- [-d DEV] [-s BYTES] [-n ROUNDS] [-k normal|huge|both]
//! ```
//!
//! For each kind of page, normal ([`Pages::new`]) and huge ([`Pages::huge`],
//! the system's default huge page size, from the pool in
//! `/proc/sys/vm/nr_hugepages`), ROUNDS times (default 3): map BYTES
//! (default 1 GiB), touch every page (so that the registration's time is
//! pinning and translation, not page faults), register the mapping with
//! [`ProtectionDomain::register_owned`] (local write, remote read and
//! write), and have it back with [`MemoryRegion::into_inner`]
//! (deregistration). Prints one line per kind:
//!
//! ```text
//! perf_reg: pages=normal page_size=4096 thp_bytes=0 bytes=1073741824 pinned_pages=262144 rounds=3 reg_ms=... dereg_ms=... (median; min..max)
//! perf_reg: pages=huge page_size=2097152 thp_bytes=0 bytes=1073741824 pinned_pages=512 rounds=3 reg_ms=... dereg_ms=...
//! perf_reg: huge/normal reg_time=... dereg_time=...
//! ```
//!
//! `thp_bytes` is how much of the process's anonymous memory the kernel
//! backs with transparent huge pages after the touch (`AnonHugePages` of
//! `/proc/self/smaps_rollup`): with THP on, "normal" pages may be 2 MiB
//! ones too, and `pinned_pages` counts base pages of `page_size`. The
//! bench runs the normal kind with THP off and on (see `.ci/bench/guest`).
//!
//! Where the system has too few huge pages free, the huge line says so
//! (the typed [`Error::HugePages`](rdma_verbs::Error::HugePages) refusal)
//! and the run still exits 0. `.ci/vm bench` runs it in the VM with 512
//! huge pages reserved (`RDMA_VERBS_BENCH_ONLY=register` for that part alone).
#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::{AccessFlags, Context, Error, Pages, ProtectionDomain, Result};

const USAGE: &str = "usage: perf_reg [-d DEVICE] [-s BYTES] [-n ROUNDS] [-k normal|huge|both]";

struct Options {
    device: Option<String>,
    bytes: usize,
    rounds: usize,
    normal: bool,
    huge: bool,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        device: None,
        bytes: 1 << 30,
        rounds: 3,
        normal: true,
        huge: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-d" | "--ib-dev" => o.device = Some(value()?),
            "-s" | "--size" => o.bytes = value()?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" | "--rounds" => o.rounds = value()?.parse().map_err(|e| format!("-n: {e}"))?,
            "-k" | "--kind" => {
                (o.normal, o.huge) = match value()?.as_str() {
                    "normal" => (true, false),
                    "huge" => (false, true),
                    "both" => (true, true),
                    k => return Err(format!("-k: {k} is not normal, huge or both")),
                }
            }
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    if o.bytes == 0 || o.rounds == 0 {
        return Err("-s and -n must be at least 1".into());
    }
    Ok(o)
}

fn main() -> ExitCode {
    quiet_pipe::install();
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("perf_reg: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf_reg: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The medians of one kind of page: (registration, deregistration).
type Medians = (Duration, Duration);

fn run(o: &Options) -> Result<()> {
    let ctx = match &o.device {
        Some(d) => Context::open(d)?,
        None => Context::open_first()?,
    };
    let pd = ctx.alloc_pd()?;
    let normal = match o.normal {
        true => Some(measure(&pd, o, "normal", Pages::new)?),
        false => None,
    };
    let huge = match o.huge.then(|| measure(&pd, o, "huge", Pages::huge)) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e @ Error::HugePages { .. })) => {
            println!("perf_reg: pages=huge refused: {e}");
            None
        }
        Some(Err(e)) => return Err(e),
    };
    if let (Some(n), Some(h)) = (normal, huge) {
        println!(
            "perf_reg: huge/normal reg_time={:.3} dereg_time={:.3}",
            h.0.as_secs_f64() / n.0.as_secs_f64().max(1e-9),
            h.1.as_secs_f64() / n.1.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}

fn measure(
    pd: &ProtectionDomain,
    o: &Options,
    kind: &str,
    map: fn(usize) -> Result<Pages>,
) -> Result<Medians> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let (mut reg, mut dereg) = (Vec::new(), Vec::new());
    let (mut page_size, mut thp) = (0, 0);
    for _ in 0..o.rounds {
        let mut pages = map(o.bytes)?;
        page_size = pages.page_size();
        // Touch every page, so that the registration does not fault them in.
        for b in pages.iter_mut().step_by(page_size) {
            *b = 1;
        }
        thp = thp_bytes();
        let t = Instant::now();
        let mr = pd.register_owned(pages, access)?;
        reg.push(t.elapsed());
        let t = Instant::now();
        let pages = mr.into_inner()?;
        dereg.push(t.elapsed());
        drop(pages);
    }
    let pinned = o.bytes.div_ceil(page_size);
    let (r, d) = (stats(&mut reg), stats(&mut dereg));
    println!(
        "perf_reg: pages={kind} page_size={page_size} thp_bytes={thp} bytes={} pinned_pages={pinned} rounds={} \
         reg_ms={:.2} dereg_ms={:.2} (median; reg {:.2}..{:.2}, dereg {:.2}..{:.2})",
        o.bytes, o.rounds, r.1, d.1, r.0, r.2, d.0, d.2
    );
    reg.sort();
    dereg.sort();
    Ok((reg[reg.len() / 2], dereg[dereg.len() / 2]))
}

/// (min, median, max) in milliseconds.
fn stats(v: &mut [Duration]) -> (f64, f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(v[0]), ms(v[v.len() / 2]), ms(v[v.len() - 1]))
}

/// The process's anonymous memory on transparent huge pages, in bytes.
fn thp_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("AnonHugePages:")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

//! Memory registration cost on normal and on huge pages: how long
//! `ibv_reg_mr` and `ibv_dereg_mr` take for one large region, and how many
//! pages the region pins.
//!
//! ```text
//! cargo run --release --example perf_reg -- [-d DEV] [-s BYTES] [-n ROUNDS]
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
//! perf_reg: pages=normal page_size=4096 bytes=1073741824 pinned_pages=262144 rounds=3 reg_ms=... dereg_ms=... (median; min..max)
//! perf_reg: pages=huge page_size=2097152 bytes=1073741824 pinned_pages=512 rounds=3 reg_ms=... dereg_ms=...
//! perf_reg: huge/normal reg_time=... dereg_time=...
//! ```
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

const USAGE: &str = "usage: perf_reg [-d DEVICE] [-s BYTES] [-n ROUNDS]";

struct Options {
    device: Option<String>,
    bytes: usize,
    rounds: usize,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        device: None,
        bytes: 1 << 30,
        rounds: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-d" | "--ib-dev" => o.device = Some(value()?),
            "-s" | "--size" => o.bytes = value()?.parse().map_err(|e| format!("-s: {e}"))?,
            "-n" | "--rounds" => o.rounds = value()?.parse().map_err(|e| format!("-n: {e}"))?,
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
    let normal = measure(&pd, o, "normal", Pages::new)?;
    let huge = match measure(&pd, o, "huge", Pages::huge) {
        Ok(m) => Some(m),
        Err(e @ Error::HugePages { .. }) => {
            println!("perf_reg: pages=huge refused: {e}");
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(h) = huge {
        let n = normal;
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
    let mut page_size = 0;
    for _ in 0..o.rounds {
        let mut pages = map(o.bytes)?;
        page_size = pages.page_size();
        // Touch every page, so that the registration does not fault them in.
        for b in pages.iter_mut().step_by(page_size) {
            *b = 1;
        }
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
        "perf_reg: pages={kind} page_size={page_size} bytes={} pinned_pages={pinned} rounds={} \
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

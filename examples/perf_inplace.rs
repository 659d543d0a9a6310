//! Reading in place against copying out: the user-space instructions it
//! takes to verify a message that a peer wrote into a region (a checksum of
//! its 8-byte words), read in place through a [`PeerView`]
//! ([`MemoryRegion::view`], no copy) and copied out first with
//! [`MemoryRegion::read`] into a scratch buffer.
//!
//! ```text
//! cargo run --release --example perf_inplace -- [-d DEV] [-n MESSAGES] [-s BYTES]
//! ```
//!
//! Registers 64 slots of BYTES (default 4096) with remote write access,
//! fills each with numbered words, then verifies MESSAGES (default 2000)
//! slots in turn both ways, checks that both ways agree, and prints
//!
//! ```text
//! perf_inplace: messages=2000 bytes=4096 checksum=0x...
//! ```
//!
//! The program writes the slots itself: who wrote the bytes does not change
//! what reading them costs. Each way is a function of its own (`in_place`,
//! `copied`), so that callgrind counts them apart: `.ci/vm bench` (its
//! `inplace` part) prints the instructions per message of each.
#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;

use rdma_verbs::{AccessFlags, Context, MemoryRegion, PeerView, Result};

const USAGE: &str = "usage: perf_inplace [-d DEVICE] [-n MESSAGES] [-s BYTES]";
const SLOTS: usize = 64;

/// The checksum of a message read in place, word by word.
#[inline(never)]
fn in_place(view: PeerView<'_>) -> Result<u64> {
    Ok(view
        .words()?
        .iter()
        .fold(0u64, |s, w| s.rotate_left(1) ^ w.load(Relaxed)))
}

/// The same checksum of the message copied out first.
#[inline(never)]
fn copied(region: &MemoryRegion, offset: usize, scratch: &mut [u8]) -> Result<u64> {
    region.read(offset, scratch)?;
    Ok(scratch.chunks_exact(8).fold(0u64, |s, w| {
        s.rotate_left(1) ^ u64::from_ne_bytes(w.try_into().expect("8 bytes"))
    }))
}

struct Options {
    device: Option<String>,
    messages: usize,
    bytes: usize,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        device: None,
        messages: 2000,
        bytes: 4096,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-d" => o.device = Some(value()?),
            "-n" => o.messages = value()?.parse().map_err(|e| format!("-n: {e}"))?,
            "-s" => o.bytes = value()?.parse().map_err(|e| format!("-s: {e}"))?,
            "-x" => drop(value()?),
            _ => return Err(format!("unknown option {a}")),
        }
    }
    if o.bytes == 0 || o.bytes % 8 != 0 {
        return Err(format!("-s {}: a positive multiple of 8", o.bytes));
    }
    Ok(o)
}

fn run(o: &Options) -> Result<()> {
    let ctx = match &o.device {
        Some(name) => Context::open(name)?,
        None => Context::open_first()?,
    };
    let pd = ctx.alloc_pd()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut region = pd.register(SLOTS * o.bytes, access)?;
    let words: Vec<u8> = (0..(SLOTS * o.bytes / 8) as u64)
        .flat_map(|i| (i * 0x9e37_79b9_7f4a_7c15).to_ne_bytes())
        .collect();
    region.write(0, &words)?;
    let mut scratch = vec![0u8; o.bytes];
    let mut sum = 0u64;
    for m in 0..o.messages {
        let offset = (m % SLOTS) * o.bytes;
        let a = in_place(region.view(offset, o.bytes)?)?;
        let b = copied(&region, offset, &mut scratch)?;
        if a != b {
            eprintln!("perf_inplace: message {m}: in place {a:#x}, copied {b:#x}");
            std::process::exit(1);
        }
        sum = sum.wrapping_add(a);
    }
    println!(
        "perf_inplace: messages={} bytes={} checksum={sum:#x}",
        o.messages, o.bytes
    );
    Ok(())
}

fn main() -> ExitCode {
    quiet_pipe::install();
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("perf_inplace: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf_inplace: {e}");
            ExitCode::FAILURE
        }
    }
}

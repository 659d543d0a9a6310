//! One-sided RDMA operations against a peer's memory region: RDMA WRITE,
//! RDMA WRITE WITH IMM, RDMA READ, ATOMIC COMPARE-AND-SWAP and ATOMIC
//! FETCH-AND-ADD, every result checked.
//!
//! ```text
//! rdma_ops [OPTIONS]          # server: registers a region and exposes it
//! rdma_ops [OPTIONS] HOST     # client: connects to the server over TCP
//!
//!   -p, --port PORT       TCP port (default 18516)
//!   -d, --ib-dev DEVICE   RDMA device (default: the first one)
//!   -i, --ib-port PORT    port of the device (default 1)
//!   -g, --gid-idx INDEX   local GID index (default: chosen by QueuePair::connect)
//!   -s, --size BYTES      bytes per RDMA write and read (default 4096)
//!   -n, --iters N         iterations (default 100)
//! ```
//! Both sides must be given the same `--size` and `--iters`. On soft-RoCE,
//! both can run on one machine: `rdma_ops -g 1 & rdma_ops -g 1 127.0.0.1`.
//!
//! # The server's region
//!
//! `64 + 2 * size` bytes, registered with remote read, write and atomic
//! access, filled with a known pattern:
//!
//! | offset | what |
//! |---|---|
//! | 0 | 8-byte counter for COMPARE-AND-SWAP |
//! | 8 | 8-byte counter for FETCH-AND-ADD |
//! | 16..64 | untouched by the client |
//! | 64 | `size` bytes the client WRITEs and READs back |
//! | 64 + size | `size` bytes the client WRITEs WITH IMM |
//!
//! Peers may write it at any time, so the server only ever copies in and out
//! of it ([`MemoryRegion::write`], [`MemoryRegion::read`]).
//!
//! # The TCP exchange
//!
//! 1. client -> server: its [`Endpoint`] wire record (52 bytes), then its
//!    size and iteration count (big-endian u64 each);
//! 2. the server connects its QP, posts receives for the immediates, then
//!    server -> client: its endpoint record, then the region's
//!    [`RemoteBuf`] wire record (address, rkey and length as text, 43 bytes
//!    with the NUL; [`MemoryRegion::remote_buf`]);
//! 3. the client connects its QP and runs the operations;
//! 4. client -> server: `DONE\n` (or `FAIL reason\n`); the server checks
//!    its region and the immediates it received and answers `OK\n` or
//!    `FAIL reason\n`, so both exit non-zero if either side's check fails.
//!
//! # Byte order of atomics
//!
//! The atomics work on the 8 bytes at the remote address as a native
//! (host-order) `u64`, and the original value comes back into the local
//! 8-byte chunk in host order too: the IB specification defines atomics on
//! the responder's memory as integers of the responder's host, and the
//! network byte order of the ATOMIC ACK header is undone by the requester.
//! Measured on soft-RoCE (rxe, Linux 6.1): with values whose bytes differ
//! (so the two orders cannot be confused) both the old values and the final
//! counters match host order. The kernel source agrees: the responder
//! (`rxe_resp.c`) compares and adds on `*vaddr` as a CPU `u64` and sends the
//! old value with `cpu_to_be64`; the requester (`rxe_comp.c`, `do_atomic`)
//! takes it back with `be64_to_cpu` and copies that CPU `u64` into the local
//! buffer. Some older Mellanox adapters under MLNX_OFED reported
//! `IBV_EXP_ATOMIC_HCA_REPLY_BE` (a big-endian reply on a little-endian
//! host) unless the QP asked for the standard behaviour; a wrong byte order
//! shows here as an error that says so.

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/tcp_example.rs"]
mod tcp_example;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::qp::{ConnectOptions, Endpoint, RecvWr, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, AtomicCap, Chunk, CompletionQueue, Context, MemoryRegion, QueuePair, RemoteBuf,
    WcOpcode, WorkCompletion,
};

use tcp_example::{
    accept, be_u64, check_bytes, connect_tcp, create_rc_qp, fill, filled, fresh_psn, grant,
    parse_grant, timeout, Res, GRANT_LEN,
};

const DEFAULT_TCP_PORT: u16 = 18516;
/// The region's header: the two counters and some bytes nobody writes.
const HEADER: usize = 64;
const CAS_OFFSET: usize = 0;
const FAA_OFFSET: usize = 8;
/// The counters' first values: eight different bytes, so that a value in
/// the other byte order cannot pass for the right one.
const CAS_START: u64 = 0x0123_4567_89ab_cdef;
const FAA_START: u64 = 0x1122_3344_5566_7788;
/// Seed of the pattern the server fills its region with.
const FILL_SEED: u64 = 0xfeed_f00d;
/// The byte the server fills its receive buffers with: a WRITE WITH IMM
/// consumes a receive but places no data in it.
const RECV_FILL: u8 = 0x5a;
const RECV_DEPTH: usize = 16;
const RECV_LEN: usize = 64;
/// How the server's answer starts when the client said it failed.
const CLIENT_FAILED: &str = "the client failed";

// wr_ids of the client's requests, one of each per iteration.
const WR_WRITE: u64 = 1;
const WR_READ: u64 = 2;
const WR_WRITE_IMM: u64 = 3;
const WR_CAS: u64 = 4;
const WR_FAA: u64 = 5;
// wr_id of the server's receives.
const WR_RECV: u64 = 100;

fn describe(wr_id: u64) -> &'static str {
    match wr_id {
        WR_WRITE => "RDMA WRITE",
        WR_READ => "RDMA READ",
        WR_WRITE_IMM => "RDMA WRITE WITH IMM",
        WR_CAS => "ATOMIC CMP_AND_SWP",
        WR_FAA => "ATOMIC FETCH_AND_ADD",
        WR_RECV => "receive",
        _ => "unknown request",
    }
}

// ---------------------------------------------------------------------------
// What both sides agree on: the data of every operation, from its iteration
// (the shared pattern, with a seed of the iteration's own, so that the data
// of every iteration differs from that of every other and from the initial
// fill).

fn write_seed(i: u64) -> u64 {
    2 * i + 1
}

fn imm_seed(i: u64) -> u64 {
    2 * i + 2
}

/// The immediate value of iteration `i` (four different bytes).
fn imm_value(i: u64) -> u32 {
    0xc0de_0000u32 ^ (i as u32).wrapping_mul(0x0001_0203)
}

/// Iteration `i`'s compare-and-swap on a counter holding `current`:
/// `(compare, swap, swaps)`. Every fourth compare is deliberately wrong,
/// which must leave the counter alone and still return its value.
fn cas_args(i: u64, current: u64) -> (u64, u64, bool) {
    // An LCG step: never equal to `current` (no fixed point).
    let swap = current
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    if i % 4 == 3 {
        (current ^ 0x00ff_0000_ff00, swap, false)
    } else {
        (current, swap, true)
    }
}

/// Iteration `i`'s fetch-and-add operand.
fn faa_add(i: u64) -> u64 {
    (i + 1).wrapping_mul(0x0000_0102_0304_0506)
}

/// The counters after `iters` iterations.
fn final_counters(iters: u64) -> (u64, u64) {
    let (mut cas, mut faa) = (CAS_START, FAA_START);
    for i in 0..iters {
        let (_, swap, swaps) = cas_args(i, cas);
        if swaps {
            cas = swap;
        }
        faa = faa.wrapping_add(faa_add(i));
    }
    (cas, faa)
}

fn check_u64(what: &str, got: u64, want: u64) -> Res<()> {
    if got == want {
        return Ok(());
    }
    let hint = if got == want.swap_bytes() {
        " (the expected value in the other byte order)"
    } else {
        ""
    };
    Err(format!("{what} is {got:#018x}, expected {want:#018x}{hint}").into())
}

// ---------------------------------------------------------------------------
// Options.

struct Options {
    common: tcp_example::Common,
    iters: u64,
}

const USAGE: &str = "usage: rdma_ops [-p PORT] [-d DEVICE] [-i IB_PORT] [-g GID_INDEX] \
                     [-s SIZE] [-n ITERS] [HOST]";

fn parse() -> std::result::Result<(Options, Option<String>), String> {
    let mut iters = 100;
    let (common, host) = tcp_example::parse(DEFAULT_TCP_PORT, |a| {
        match a.name.as_str() {
            "-n" | "--iters" => iters = a.num()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if common.size == 0 || iters == 0 {
        return Err("--size and --iters must be at least 1".into());
    }
    if HEADER + 2 * common.size > u32::MAX as usize {
        return Err("--size is too large".into());
    }
    Ok((Options { common, iters }, host))
}

fn main() -> ExitCode {
    quiet_pipe::install();
    tcp_example::main("rdma_ops", USAGE, parse, server, client)
}

// ---------------------------------------------------------------------------
// Pieces both sides use.

/// The device, which must support atomic operations.
fn open_device(o: &Options) -> Res<Context> {
    let ctx = tcp_example::open_device(&o.common)?;
    if ctx.attr().atomic_cap == AtomicCap::None {
        return Err(format!("device {} does not support atomic operations", ctx.name()).into());
    }
    Ok(ctx)
}

/// A finished request: its completion, the caller's wr_id (which
/// [`Completed`](rdma_verbs::qp::Completed) carries; the completion's own
/// `wr_id` is the crate's bookkeeping number) and its chunk.
struct Done {
    wc: WorkCompletion,
    wr_id: u64,
    chunk: Chunk,
}

/// Polls `cq` once; every completion of `qp` has its request reclaimed and
/// is checked for success, then appended to `out`. Returns how many were
/// appended.
fn poll_once(cq: &CompletionQueue, qp: &mut QueuePair, out: &mut Vec<Done>) -> Res<usize> {
    let mut wcs = [WorkCompletion::default(); 16];
    let polled = cq.poll(&mut wcs)?;
    for wc in polled.iter() {
        let mut request = None;
        qp.reclaim(wc, |done| request = Some((done.wr_id, done.into_chunk())));
        let (wr_id, chunk) = request.ok_or("a completion that no posted request matches")?;
        if !wc.is_success() {
            let status = match wc.status() {
                Ok(s) => s.to_string(),
                Err(raw) => format!("status {raw}"),
            };
            return Err(format!(
                "{} completed with {status} (vendor error {:#x})",
                describe(wr_id),
                wc.vendor_err()
            )
            .into());
        }
        let chunk =
            chunk.ok_or_else(|| format!("{} came back without its chunk", describe(wr_id)))?;
        out.push(Done {
            wc: *wc,
            wr_id,
            chunk,
        });
    }
    Ok(polled.len())
}

fn expect_opcode(d: &Done, want: WcOpcode) -> Res<()> {
    match d.wc.opcode() {
        Ok(op) if op == want => Ok(()),
        got => Err(format!(
            "{} completed as {got:?}, expected {want}",
            describe(d.wr_id)
        )
        .into()),
    }
}

/// Reads one `\n`-terminated line (without the `\n`), blocking.
fn read_line(tcp: &mut TcpStream) -> Res<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match tcp.read(&mut byte)? {
            0 => return Err("the peer closed the connection".into()),
            _ if byte[0] == b'\n' => break,
            _ => line.push(byte[0]),
        }
        if line.len() > 4096 {
            return Err("the peer sent an overlong line".into());
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

// ---------------------------------------------------------------------------
// Server.

fn server(o: &Options) -> Res<()> {
    let ctx = open_device(o)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(2 * RECV_DEPTH as u32)?;
    let mut qp = create_rc_qp(&pd, &cq, 1, RECV_DEPTH as u32)?;

    let (mut tcp, peer) = accept("rdma_ops", &ctx, &o.common)?;
    tcp.set_nodelay(true)?;

    let mut hello = [0u8; Endpoint::WIRE_LEN + 16];
    tcp.read_exact(&mut hello)?;
    let remote = Endpoint::from_wire(&hello[..Endpoint::WIRE_LEN])?;
    let size = be_u64(&hello[Endpoint::WIRE_LEN..Endpoint::WIRE_LEN + 8]);
    let iters = be_u64(&hello[Endpoint::WIRE_LEN + 8..]);
    if size != o.common.size as u64 || iters != o.iters {
        return Err(format!(
            "the client {peer} runs --size {size} --iters {iters}, \
             this server --size {} --iters {}",
            o.common.size, o.iters
        )
        .into());
    }

    // The exposed region, filled with the known pattern and the counters'
    // first values in host order (see the module docs on byte order).
    let len = HEADER + 2 * o.common.size;
    let mut region = pd.register(
        len,
        AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
    )?;
    region.write(0, &filled(len, FILL_SEED, 0))?;
    region.write(CAS_OFFSET, &CAS_START.to_ne_bytes())?;
    region.write(FAA_OFFSET, &FAA_START.to_ne_bytes())?;

    // The QP's access flags are what incoming operations may do.
    let opts = ConnectOptions {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        ..o.common.connect_options()
    };
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;
    qp.connect(&opts, psn, &remote)?;

    // Receives for the immediates, posted before the client learns where
    // to write (it would otherwise meet RNR NAKs and retry).
    let mut recv_chunks = pd.alloc_chunks(RECV_DEPTH, RECV_LEN, AccessFlags::LOCAL_WRITE)?;
    for c in &mut recv_chunks {
        c.as_mut_slice().fill(RECV_FILL);
    }
    let first = recv_chunks.len().min(o.iters as usize);
    recv_chunks.truncate(first);
    qp.post_recv(recv_chunks.into_iter().map(|c| RecvWr::new(WR_RECV).sge(c)))?;
    let mut posted = first as u64;

    tcp.write_all(&grant(&me, region.remote_buf()?))?;
    println!(
        "rdma_ops: client {peer}; region addr {:#x} rkey {:#x} len {len}",
        region.addr(),
        region.rkey()
    );

    let result = serve(o, &cq, &mut qp, &mut posted, &mut tcp, &region);
    // Tell the client how it went, whichever way it went.
    let answer = match &result {
        Ok(()) => "OK\n".to_owned(),
        Err(e) => format!("FAIL {e}\n"),
    };
    tcp.set_nonblocking(false)?;
    let _ = tcp.write_all(answer.as_bytes());
    result?;
    println!(
        "rdma_ops: server: {} writes with imm received, region checked: all as expected",
        o.iters
    );
    Ok(())
}

/// Takes the immediates as they come until the client says it is done,
/// then checks the region.
fn serve(
    o: &Options,
    cq: &CompletionQueue,
    qp: &mut QueuePair,
    posted: &mut u64,
    tcp: &mut TcpStream,
    region: &MemoryRegion,
) -> Res<()> {
    let mut got = 0u64;
    let mut done = Vec::new();
    let mut line = Vec::new();
    let mut client_done = false;
    let mut deadline = Instant::now() + timeout();
    tcp.set_nonblocking(true)?;
    while !(client_done && got == o.iters) {
        done.clear();
        if poll_once(cq, qp, &mut done)? > 0 {
            deadline = Instant::now() + timeout();
        }
        for d in done.drain(..) {
            expect_opcode(&d, WcOpcode::RecvRdmaWithImm)?;
            let wc = d.wc;
            if got >= o.iters {
                return Err(format!("more than {} writes with imm arrived", o.iters).into());
            }
            if wc.imm_data() != Some(imm_value(got)) {
                return Err(format!(
                    "write with imm {got}: immediate {:x?}, expected {:#x}",
                    wc.imm_data(),
                    imm_value(got)
                )
                .into());
            }
            // For a WRITE WITH IMM, byte_len is the length of the write.
            if wc.byte_len() as usize != o.common.size {
                return Err(format!(
                    "write with imm {got}: byte_len {}, expected {}",
                    wc.byte_len(),
                    o.common.size
                )
                .into());
            }
            if d.chunk.as_slice().iter().any(|&b| b != RECV_FILL) {
                return Err(format!("write with imm {got} changed the receive buffer").into());
            }
            got += 1;
            if *posted < o.iters {
                qp.post_recv([RecvWr::new(WR_RECV).sge(d.chunk)])?;
                *posted += 1;
            }
        }
        if !client_done {
            let mut buf = [0u8; 256];
            match tcp.read(&mut buf) {
                Ok(0) => return Err("the client closed the connection before DONE".into()),
                Ok(n) => {
                    line.extend_from_slice(&buf[..n]);
                    deadline = Instant::now() + timeout();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            if let Some(end) = line.iter().position(|&b| b == b'\n') {
                let msg = String::from_utf8_lossy(&line[..end]).into_owned();
                if msg != "DONE" {
                    let why = msg.strip_prefix("FAIL ").unwrap_or(&msg);
                    return Err(format!("{CLIENT_FAILED}: {why}").into());
                }
                client_done = true;
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "nothing happened for {}s ({got} of {} writes with imm received)",
                timeout().as_secs(),
                o.iters
            )
            .into());
        }
        if done.is_empty() {
            thread::yield_now();
        }
    }
    check_region(o, region)
}

fn check_region(o: &Options, region: &MemoryRegion) -> Res<()> {
    let last = o.iters - 1;
    let mut data = vec![0u8; o.common.size];
    region.read(HEADER, &mut data)?;
    check_bytes(
        "written area",
        &data,
        &filled(o.common.size, write_seed(last), 0),
    )?;
    region.read(HEADER + o.common.size, &mut data)?;
    check_bytes(
        "written-with-imm area",
        &data,
        &filled(o.common.size, imm_seed(last), 0),
    )?;
    let mut header = [0u8; HEADER];
    region.read(0, &mut header)?;
    check_bytes(
        "header bytes 16..64",
        &header[16..],
        &filled(HEADER, FILL_SEED, 0)[16..],
    )?;
    let (cas, faa) = final_counters(o.iters);
    let host = |off: usize| u64::from_ne_bytes(header[off..off + 8].try_into().expect("8 bytes"));
    check_u64("the compare-and-swap counter", host(CAS_OFFSET), cas)?;
    check_u64("the fetch-and-add counter", host(FAA_OFFSET), faa)?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Client.

/// What the client does, counted.
#[derive(Default)]
struct Counts {
    writes: u64,
    reads: u64,
    writes_imm: u64,
    cas: u64,
    cas_mismatched: u64,
    faa: u64,
}

fn client(o: &Options, host: &str) -> Res<()> {
    let ctx = open_device(o)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32)?;
    let mut qp = create_rc_qp(&pd, &cq, 8, 1)?;
    // The client exposes nothing: no remote access on its QP. One read or
    // atomic outstanding each way (the defaults) is what every device and
    // peer supports; more needs agreement with the peer's responder side.
    let opts = o.common.connect_options();
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;

    let mut tcp = connect_tcp(host, o.common.tcp_port)?;
    tcp.set_nodelay(true)?;
    let mut hello = Vec::with_capacity(Endpoint::WIRE_LEN + 16);
    hello.extend_from_slice(&me.to_wire());
    hello.extend_from_slice(&(o.common.size as u64).to_be_bytes());
    hello.extend_from_slice(&o.iters.to_be_bytes());
    tcp.write_all(&hello)?;

    let mut reply = [0u8; GRANT_LEN];
    tcp.read_exact(&mut reply).map_err(|e| {
        format!("no answer from the server ({e}): are --size and --iters the same on both sides?")
    })?;
    let (remote, memory) = parse_grant(&reply)?;
    let RemoteBuf { addr, rkey, len } = memory;
    if len < (HEADER + 2 * o.common.size) as u64 {
        return Err(format!("the server's region has {len} bytes, too few").into());
    }
    qp.connect(&opts, psn, &remote)?;
    println!(
        "rdma_ops: client on {} port {}; server region addr {addr:#x} rkey {rkey:#x} len {len}",
        ctx.name(),
        o.common.ib_port
    );

    let mut counts = Counts::default();
    let result = run_client(o, &pd, &cq, &mut qp, memory, &mut counts);
    if let Err(e) = result {
        // Let the server stop waiting; it may have stopped first, on a
        // failed check of its own (an operation then fails here because
        // the server's QP is gone), and have said why.
        let _ = tcp.write_all(format!("FAIL {e}\n").as_bytes());
        let _ = tcp.set_read_timeout(Some(Duration::from_secs(2)));
        if let Ok(answer) = read_line(&mut tcp) {
            if let Some(why) = answer.strip_prefix("FAIL ") {
                if !why.starts_with(CLIENT_FAILED) {
                    return Err(format!("{e}\n  the server had stopped: {why}").into());
                }
            }
        }
        return Err(e);
    }
    tcp.write_all(b"DONE\n")?;
    tcp.set_read_timeout(Some(timeout()))?;
    let answer = read_line(&mut tcp).map_err(|e| format!("no verdict from the server: {e}"))?;
    if answer != "OK" {
        let why = answer.strip_prefix("FAIL ").unwrap_or(&answer);
        return Err(format!("the server's check failed: {why}").into());
    }
    println!(
        "rdma_ops: {} writes, {} reads, {} writes with imm, {} cmp_and_swp \
         ({} with a mismatched compare), {} fetch_and_add: all results checked",
        counts.writes,
        counts.reads,
        counts.writes_imm,
        counts.cas,
        counts.cas_mismatched,
        counts.faa
    );
    Ok(())
}

/// Polls until `want` completions arrived, or the timeout.
fn wait(cq: &CompletionQueue, qp: &mut QueuePair, want: usize, out: &mut Vec<Done>) -> Res<()> {
    out.clear();
    let deadline = Instant::now() + timeout();
    while out.len() < want {
        if poll_once(cq, qp, out)? == 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} of {want} completions after {}s",
                    out.len(),
                    timeout().as_secs()
                )
                .into());
            }
            thread::yield_now();
        }
    }
    Ok(())
}

fn run_client(
    o: &Options,
    pd: &rdma_verbs::ProtectionDomain,
    cq: &CompletionQueue,
    qp: &mut QueuePair,
    memory: RemoteBuf,
    counts: &mut Counts,
) -> Res<()> {
    // Each place, checked once to lie inside the server's region.
    let size = o.common.size as u64;
    let at = |offset: usize, len: u64| memory.at(offset as u64, len);
    let (cas_remote, faa_remote) = (at(CAS_OFFSET, 8)?, at(FAA_OFFSET, 8)?);
    let (area, imm_area) = (at(HEADER, size)?, at(HEADER + o.common.size, size)?);

    // Local buffers: what to write, what to read into, what to write with
    // imm, and one 8-byte chunk per atomic for the old value.
    let mut data = pd
        .alloc_chunks(3, o.common.size, AccessFlags::LOCAL_WRITE)?
        .into_iter();
    let mut atomics = pd.alloc_chunks(2, 8, AccessFlags::LOCAL_WRITE)?.into_iter();
    let mut write_buf = data.next().expect("3 chunks");
    let mut read_buf = data.next().expect("3 chunks");
    let mut imm_buf = data.next().expect("3 chunks");
    let mut cas_buf = atomics.next().expect("2 chunks");
    let mut faa_buf = atomics.next().expect("2 chunks");
    let mut done = Vec::new();

    // First, read the area back as the server filled it.
    read_buf.as_mut_slice().fill(0);
    qp.post_send([SendWr::new(WR_READ, SendOp::RdmaRead(area)).sge(read_buf)])?;
    wait(cq, qp, 1, &mut done)?;
    let d = done.pop().expect("one completion");
    expect_opcode(&d, WcOpcode::RdmaRead)?;
    check_bytes(
        "initial read",
        d.chunk.as_slice(),
        &filled(o.common.size, FILL_SEED, HEADER),
    )?;
    read_buf = d.chunk;
    counts.reads += 1;

    let (mut cas_now, mut faa_now) = (CAS_START, FAA_START);
    for i in 0..o.iters {
        fill(write_buf.as_mut_slice(), write_seed(i), 0);
        fill(imm_buf.as_mut_slice(), imm_seed(i), 0);
        // Sentinels, so that an operation that leaves its buffer alone shows.
        read_buf.as_mut_slice().fill(0);
        cas_buf.as_mut_slice().fill(0xee);
        faa_buf.as_mut_slice().fill(0xee);
        let (compare, swap, swaps) = cas_args(i, cas_now);
        let add = faa_add(i);

        // One chain: the READ comes after the WRITE on the same QP, so it
        // sees what the WRITE put there (RC executes them in order).
        qp.post_send([
            SendWr::new(WR_WRITE, SendOp::RdmaWrite(area)).sge(write_buf),
            SendWr::new(WR_READ, SendOp::RdmaRead(area)).sge(read_buf),
            SendWr::new(
                WR_WRITE_IMM,
                SendOp::RdmaWriteWithImm(imm_area, imm_value(i)),
            )
            .sge(imm_buf),
            SendWr::new(
                WR_CAS,
                SendOp::CompareSwap {
                    remote: cas_remote,
                    compare,
                    swap,
                },
            )
            .sge(cas_buf),
            SendWr::new(
                WR_FAA,
                SendOp::FetchAdd {
                    remote: faa_remote,
                    add,
                },
            )
            .sge(faa_buf),
        ])?;
        wait(cq, qp, 5, &mut done)?;

        let mut back: [Option<Chunk>; 5] = Default::default();
        for d in done.drain(..) {
            let what = describe(d.wr_id);
            let old = || u64::from_ne_bytes(d.chunk.as_slice().try_into().expect("8 bytes"));
            match d.wr_id {
                WR_WRITE => {
                    expect_opcode(&d, WcOpcode::RdmaWrite)?;
                    counts.writes += 1;
                }
                WR_READ => {
                    expect_opcode(&d, WcOpcode::RdmaRead)?;
                    check_bytes(
                        &format!("iteration {i}: {what}"),
                        d.chunk.as_slice(),
                        &filled(o.common.size, write_seed(i), 0),
                    )?;
                    counts.reads += 1;
                }
                WR_WRITE_IMM => {
                    expect_opcode(&d, WcOpcode::RdmaWrite)?;
                    counts.writes_imm += 1;
                }
                WR_CAS => {
                    expect_opcode(&d, WcOpcode::CompSwap)?;
                    // The old value, in host order (see the module docs).
                    check_u64(
                        &format!("iteration {i}: {what}'s old value"),
                        old(),
                        cas_now,
                    )?;
                    counts.cas += 1;
                    if !swaps {
                        counts.cas_mismatched += 1;
                    }
                }
                WR_FAA => {
                    expect_opcode(&d, WcOpcode::FetchAdd)?;
                    check_u64(
                        &format!("iteration {i}: {what}'s old value"),
                        old(),
                        faa_now,
                    )?;
                    counts.faa += 1;
                }
                other => return Err(format!("unexpected wr_id {other}").into()),
            }
            back[(d.wr_id - 1) as usize] = Some(d.chunk);
        }
        let [w, r, im, c, f] = back;
        let missing = || "a request's buffer did not come back";
        write_buf = w.ok_or_else(missing)?;
        read_buf = r.ok_or_else(missing)?;
        imm_buf = im.ok_or_else(missing)?;
        cas_buf = c.ok_or_else(missing)?;
        faa_buf = f.ok_or_else(missing)?;
        if swaps {
            cas_now = swap;
        }
        faa_now = faa_now.wrapping_add(add);
    }

    // The counters as the server should see them, read back over RDMA too.
    let (cas, faa) = final_counters(o.iters);
    for (remote, buf, want, what) in [
        (
            cas_remote,
            cas_buf,
            cas,
            "the compare-and-swap counter read back",
        ),
        (
            faa_remote,
            faa_buf,
            faa,
            "the fetch-and-add counter read back",
        ),
    ] {
        qp.post_send([SendWr::new(WR_READ, SendOp::RdmaRead(remote)).sge(buf)])?;
        wait(cq, qp, 1, &mut done)?;
        let d = done.pop().expect("one completion");
        expect_opcode(&d, WcOpcode::RdmaRead)?;
        let value = u64::from_ne_bytes(d.chunk.as_slice().try_into().expect("8 bytes"));
        check_u64(what, value, want)?;
        counts.reads += 1;
    }
    Ok(())
}

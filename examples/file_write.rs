//! A file sent by RDMA WRITE straight from its memory mapping into the
//! peer's memory, which the peer then writes to disk: no copy of the data
//! in user space on either side.
//!
//! ```text
//! file_write [OPTIONS] -f OUT_FILE          # server: receives into OUT_FILE
//! file_write [OPTIONS] -f IN_FILE HOST      # client: sends IN_FILE
//!
//!   -f, --file FILE       the file to receive into (server) or send (client)
//!   -p, --port PORT       TCP port (default 18517)
//!   -d, --ib-dev DEVICE   RDMA device (default: the first one)
//!   -i, --ib-port PORT    port of the device (default 1)
//!   -g, --gid-idx INDEX   local GID index (default: chosen by QueuePair::connect)
//!   -s, --size BYTES      bytes per RDMA WRITE (default 1048576)
//! ```
//! On soft-RoCE both run on one machine:
//! `file_write -g 1 -f copy & file_write -g 1 -f original 127.0.0.1`.
//!
//! # The memory on each side
//!
//! * The client maps `IN_FILE` privately (`memmap2::MmapOptions::map_copy`,
//!   the file opened read-only) and registers the mapping itself with
//!   [`ProtectionDomain::register_owned`], local read access only: the
//!   device reads the page cache's own pages. It splits the region into
//!   `--size` chunks ([`MemoryRegion::split`]), RDMA-WRITEs each to its
//!   offset in the server's region, and once every chunk is back, has the
//!   mapping back ([`ChunkedRegion::into_inner`]).
//! * The server sizes `OUT_FILE` to the client's length, maps it shared
//!   (`MmapMut::map_mut`) and registers that mapping with remote write
//!   access: the client's writes land in `OUT_FILE`'s page cache. After the
//!   client's `DONE`, [`MemoryRegion::into_inner`] deregisters it and hands
//!   the mapping back, which the server flushes (`msync`) to disk. Linux
//!   6.5 and later refuse writable long-term pins of most file systems'
//!   shared mappings (`EFAULT`); the server then registers a `Vec<u8>` in
//!   its place, has it back the same way, and writes it to the file: still
//!   no copy in user space. It says which it used.
//!
//! # The TCP exchange
//!
//! 1. client -> server: its [`Endpoint`] wire record, then the file's
//!    length (big-endian u64);
//! 2. server -> client: its endpoint record and its region's [`RemoteBuf`]
//!    wire record (for an empty file, a record of length 0 and no region);
//! 3. the client writes the file, then client -> server: `DONE\n` (or
//!    `FAIL reason\n`);
//! 4. server -> client: `OK\n` once the file is on disk (or `FAIL reason\n`).
//!
//! Both print the FNV-1a hash of the bytes, read from the mapping each
//! side has back, so a run shows the copy is exact.

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/tcp_example.rs"]
#[allow(dead_code)] // its pattern helpers serve rdma_ops and mw_invalidate
mod tcp_example;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Instant;

use memmap2::{MmapMut, MmapOptions};
use rdma_verbs::qp::{ConnectOptions, Endpoint, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, Chunk, ChunkedRegion, CompletionQueue, Error, MemoryRegion, ProtectionDomain,
    QueuePair, RemoteBuf, WorkCompletion,
};

use tcp_example::{
    accept, be_u64, connect_tcp, create_rc_qp, fresh_psn, grant, parse_grant, Res, GRANT_LEN,
};

const DEFAULT_TCP_PORT: u16 = 18517;
const DEFAULT_WRITE_SIZE: usize = 1 << 20;
/// RDMA WRITEs outstanding at once.
const DEPTH: usize = 16;

struct Options {
    common: tcp_example::Common,
    file: String,
}

const USAGE: &str = "usage: file_write -f FILE [-p PORT] [-d DEVICE] [-i IB_PORT] [-g GID_INDEX] \
                     [-s WRITE_SIZE] [HOST]";

fn parse() -> std::result::Result<(Options, Option<String>), String> {
    let mut file = None;
    let mut size_given = false;
    let (mut common, host) = tcp_example::parse(DEFAULT_TCP_PORT, |a| {
        match a.name.as_str() {
            "-f" | "--file" => file = Some(a.value()?),
            "-s" | "--size" => {
                size_given = true;
                return Ok(false);
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if !size_given && common.size == 4096 {
        common.size = DEFAULT_WRITE_SIZE;
    }
    if common.size == 0 {
        return Err("--size must be at least 1".into());
    }
    let file = file.ok_or("-f FILE is required")?;
    Ok((Options { common, file }, host))
}

fn main() -> ExitCode {
    quiet_pipe::install();
    tcp_example::main("file_write", USAGE, parse, server, client)
}

/// FNV-1a, 64 bits: enough to show two copies are the same.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn connect(
    qp: &mut QueuePair,
    o: &Options,
    access: AccessFlags,
    remote: &Endpoint,
) -> Res<Endpoint> {
    let opts = ConnectOptions {
        access,
        ..o.common.connect_options()
    };
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;
    qp.connect(&opts, psn, remote)?;
    Ok(me)
}

/// The peer's next line must be `want`; `FAIL reason` (or nothing) is
/// the peer's failure, named by `peer`.
fn expect_line(tcp: &TcpStream, want: &str, peer: &str) -> Res<()> {
    let mut line = String::new();
    BufReader::new(tcp).read_line(&mut line)?;
    if line.strip_suffix('\n') == Some(want) {
        return Ok(());
    }
    let reason = line
        .trim_end()
        .strip_prefix("FAIL ")
        .unwrap_or(&format!("the {peer} left"))
        .to_owned();
    Err(format!("the {peer} failed: {reason}").into())
}

// ---------------------------------------------------------------------------
// The server.

/// Where the client's writes land: `OUT_FILE`'s own pages, or a buffer
/// written to it afterwards.
enum Landing {
    File(MemoryRegion<MmapMut>),
    Buffer(MemoryRegion<Vec<u8>>, File),
}

fn server(o: &Options) -> Res<()> {
    let ctx = tcp_example::open_device(&o.common)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4)?;
    let mut qp = create_rc_qp(&pd, &cq, 1, 1)?;
    let (mut tcp, _peer) = accept("file_write", &ctx, &o.common)?;

    let mut hello = [0u8; Endpoint::WIRE_LEN + 8];
    tcp.read_exact(&mut hello)?;
    let remote = Endpoint::from_wire(&hello[..Endpoint::WIRE_LEN])?;
    let len = usize::try_from(be_u64(&hello[Endpoint::WIRE_LEN..]))?;

    let out = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&o.file)
        .map_err(|e| format!("cannot create {}: {e}", o.file))?;
    out.set_len(len as u64)?;
    let landing = if len == 0 {
        None
    } else {
        Some(land(&pd, out, len)?)
    };
    let memory = match &landing {
        Some(Landing::File(mr)) => mr.remote_buf()?,
        Some(Landing::Buffer(mr, _)) => mr.remote_buf()?,
        None => RemoteBuf {
            addr: 0,
            rkey: 0,
            len: 0,
        },
    };
    let me = connect(&mut qp, o, AccessFlags::REMOTE_WRITE, &remote)?;
    tcp.write_all(&grant(&me, memory))?;

    expect_line(&tcp, "DONE", "client")?;
    let result = finish(landing, len, &o.file);
    let answer = match &result {
        Ok(()) => "OK\n".to_owned(),
        Err(e) => format!("FAIL {e}\n"),
    };
    tcp.write_all(answer.as_bytes())?;
    result
}

/// Registers the memory the client writes into: the file's shared mapping,
/// or (where the kernel refuses to pin it) a buffer of `len` bytes.
fn land(pd: &ProtectionDomain, out: File, len: usize) -> Res<Landing> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // SAFETY: this program created the file and is its only user while it
    // runs; nothing truncates it while it is mapped.
    let map = unsafe { MmapMut::map_mut(&out)? };
    match pd.register_owned(map, access) {
        Ok(mr) => Ok(Landing::File(mr)),
        Err(refused) if refused.error().errno() == Some(libc::EFAULT) => {
            drop(refused);
            Ok(Landing::Buffer(
                pd.register_owned(vec![0u8; len], access)?,
                out,
            ))
        }
        Err(refused) => Err(refused.into()),
    }
}

/// Deregisters the landing memory, has it back and puts it on disk.
fn finish(landing: Option<Landing>, len: usize, name: &str) -> Res<()> {
    let (hash, how) = match landing {
        None => (fnv1a(&[]), "nothing to write"),
        Some(Landing::File(mr)) => {
            let map = mr.into_inner().map_err(Error::from)?;
            map.flush()?;
            (fnv1a(&map), "written in place in the file's pages")
        }
        Some(Landing::Buffer(mr, mut file)) => {
            let buf = mr.into_inner().map_err(Error::from)?;
            file.write_all(&buf)?;
            file.sync_all()?;
            (fnv1a(&buf), "written to a buffer, then to the file")
        }
    };
    println!("file_write: received {len} bytes into {name} ({how}), fnv1a {hash:016x}");
    Ok(())
}

// ---------------------------------------------------------------------------
// The client.

fn client(o: &Options, host: &str) -> Res<()> {
    let file = File::open(&o.file).map_err(|e| format!("cannot open {}: {e}", o.file))?;
    let len = usize::try_from(file.metadata()?.len())?;
    let ctx = tcp_example::open_device(&o.common)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(DEPTH as u32)?;
    let mut qp = create_rc_qp(&pd, &cq, DEPTH as u32, 1)?;

    let mut tcp = connect_tcp(host, o.common.tcp_port)?;
    tcp.set_nodelay(true)?;
    let opts = o.common.connect_options();
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;
    let mut hello = me.to_wire().to_vec();
    hello.extend_from_slice(&(len as u64).to_be_bytes());
    tcp.write_all(&hello)?;
    let mut reply = [0u8; GRANT_LEN];
    tcp.read_exact(&mut reply)?;
    let (remote, memory) = parse_grant(&reply)?;
    if memory.len != len as u64 {
        return Err(format!(
            "the server offers {} bytes for a {len}-byte file",
            memory.len
        )
        .into());
    }
    qp.connect(&opts, psn, &remote)?;

    let result = if len == 0 {
        Ok(fnv1a(&[]))
    } else {
        send_file(o, &pd, &cq, &mut qp, &file, memory)
    };
    match &result {
        Ok(_) => tcp.write_all(b"DONE\n")?,
        Err(e) => tcp.write_all(format!("FAIL {e}\n").as_bytes())?,
    }
    let hash = result?;
    expect_line(&tcp, "OK", "server")?;
    println!(
        "file_write: sent {len} bytes from {}, fnv1a {hash:016x}",
        o.file
    );
    Ok(())
}

/// Registers the file's mapping, writes it to `memory` in `--size`
/// pieces, and hashes the mapping once it is back.
fn send_file(
    o: &Options,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    qp: &mut QueuePair,
    file: &File,
    memory: RemoteBuf,
) -> Res<u64> {
    // SAFETY: the file is only read, by this program, and the user is told
    // not to change it while it is sent (a change would only change what
    // is sent: the mapping is private).
    let map = unsafe { MmapOptions::new().map_copy(file)? };
    // Local read only: the device reads the page cache's pages in place.
    let region = pd
        .register_owned(map, AccessFlags::empty())
        .map_err(Error::from)?;
    let (region, chunks) = region.split(o.common.size).map_err(Error::from)?;
    let started = Instant::now();
    let total = chunks.len();
    let mut waiting = chunks.into_iter().enumerate();
    let (mut posted, mut done) = (0, 0);
    let mut wcs = [WorkCompletion::default(); DEPTH];
    while done < total {
        while posted - done < DEPTH {
            let Some((i, chunk)) = waiting.next() else {
                break;
            };
            post_write(qp, &memory, i, chunk, o.common.size)?;
            posted += 1;
        }
        for wc in cq.poll(&mut wcs)?.iter() {
            let mut back: Option<Chunk> = None;
            qp.reclaim(wc, |c| back = c.into_chunk());
            if !wc.is_success() {
                return Err(format!("an RDMA WRITE completed with {:?}", wc.status()).into());
            }
            drop(back.ok_or("an RDMA WRITE came back without its chunk")?);
            done += 1;
        }
    }
    let took = started.elapsed();
    let map = take_back(region)?;
    let secs = took.as_secs_f64().max(1e-9);
    eprintln!(
        "file_write: {} RDMA WRITEs in {:.3} s ({:.1} MB/s)",
        total,
        secs,
        map.len() as f64 / secs / 1e6
    );
    Ok(fnv1a(&map))
}

fn post_write(
    qp: &mut QueuePair,
    memory: &RemoteBuf,
    i: usize,
    chunk: Chunk,
    size: usize,
) -> Res<()> {
    let offset = (i * size) as u64;
    let at = memory.at(offset, chunk.len() as u64)?;
    qp.post_send([SendWr::new(i as u64, SendOp::RdmaWrite(at)).sge(chunk)])?;
    Ok(())
}

/// Every chunk is back: the mapping too.
fn take_back(region: ChunkedRegion<MmapMut>) -> Res<MmapMut> {
    Ok(region.into_inner().map_err(Error::from)?)
}

//! Memory windows: a server grants a client RDMA access to part of a region
//! through a window, the client reads and writes through it, the window is
//! invalidated, and the client's next read through it fails with
//! `IBV_WC_REM_ACCESS_ERR`. Every step is checked.
//!
//! ```text
//! mw_invalidate [OPTIONS]          # server: registers a region, binds a window
//! mw_invalidate [OPTIONS] HOST     # client: connects to the server over TCP
//!
//!   -p, --port PORT       TCP port (default 18518)
//!   -d, --ib-dev DEVICE   RDMA device (default: the first one)
//!   -i, --ib-port PORT    port of the device (default 1)
//!   -g, --gid-idx INDEX   local GID index (default: chosen by QueuePair::connect)
//!   -s, --size BYTES      bytes of the window (default 4096)
//!       --remote-inv      the client invalidates the window with SEND_WITH_INV
//!                         (default: the server invalidates it with LOCAL_INV)
//!       --type1           a type 1 window, bound with ibv_bind_mw and revoked by
//!                         unbinding it (default: a type 2 window)
//! ```
//! Both sides must be given the same `--size`, `--remote-inv` and `--type1`.
//! On soft-RoCE both can run on one machine:
//! `mw_invalidate -g 1 & mw_invalidate -g 1 127.0.0.1`.
//! No rdma-core program does this; the shape (server and client, TCP for
//! the endpoint exchange) is that of the `rdma_ops` example.
//!
//! # What happens
//!
//! 1. The server registers a region of `3 * size` bytes with
//!    `LOCAL_WRITE | MW_BIND` only (no remote rights of its own: peers can
//!    reach it only through a window), fills it with a known pattern,
//!    allocates a window and binds it to the middle third with
//!    `REMOTE_READ | REMOTE_WRITE` ([`QueuePair::bind_mw`]), waits for the
//!    bind's completion and reclaims it, then sends the client the
//!    window's address, rkey and length.
//! 2. The client RDMA-reads the window (the pattern must match), then
//!    RDMA-writes a new pattern through it; the server checks with
//!    `MemoryRegion::read` that the window now holds it and that the
//!    bytes around it are untouched.
//! 3. The window is revoked:
//!    * type 2, default: the server posts a local invalidation
//!      ([`QueuePair::invalidate_mw`]) and waits for its completion. The
//!      crate refuses to invalidate a window it does not know to be bound
//!      (its bind's completion reclaimed): on rxe (Linux 6.1) a LOCAL_INV
//!      of a type 2 window that was never bound (or was invalidated
//!      already) takes the whole (virtual) machine down;
//!    * type 2, `--remote-inv`: the client sends `SEND_WITH_INV` naming the
//!      window's rkey; the server's receive completion must report that
//!      rkey ([`QueuePair::invalidated_rkey`]). That, not
//!      `WorkCompletion::invalidated_rkey`, because rxe (Linux 6.1) flags
//!      the completion with the kernel's `IB_WC_WITH_INVALIDATE` bit
//!      (`1 << 2`), which libibverbs passes on unchanged and calls
//!      `IBV_WC_IP_CSUM_OK` (its `IBV_WC_WITH_INV` is `1 << 3`): only the
//!      QP, which knows its device, reads that bit as an invalidation;
//!    * `--type1`: type 1 windows cannot be invalidated (neither
//!      `LOCAL_INV` nor `SEND_WITH_INV`); ibv_alloc_mw(3) names two ways
//!      to revoke one: binding it with zero length, which the server does
//!      (`QueuePair::unbind_mw`, a new rkey), or deallocating it.
//! 4. The client RDMA-reads through the window once more: the read must
//!    complete with `IBV_WC_REM_ACCESS_ERR`. That error is fatal to the
//!    connection: the client's QP (the requester) and the server's (the
//!    responder, which answered with a NAK) are both in ERR after it, so
//!    both sides report their QP's state, and end.
//!
//! Each side exits 0 only when every step behaved as described.
//!
//! # The TCP exchange
//!
//! 1. client -> server: its [`Endpoint`] wire record, its size (big-endian
//!    u64) and its mode (one byte: 0 local invalidation, 1 remote, 2 type 1);
//! 2. server -> client: the line `WINDOW`, its endpoint record, the window's
//!    [`RemoteBuf`](rdma_verbs::RemoteBuf) wire record (address, rkey and
//!    length as text, 43 bytes with the NUL), sent once the bind has completed;
//! 3. then lines: client `WRITTEN`; server `SEND_INV` (remote mode: the
//!    client then posts the SEND_WITH_INV); server `INVALIDATED`; client
//!    `DONE`; server `OK`. Either side sends `FAIL reason` instead when a
//!    step went wrong, so that both stop and say why.

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/tcp_example.rs"]
mod tcp_example;

use std::error::Error as StdError;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::qp::{ConnectOptions, Endpoint, RecvWr, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, MwBind, MwType, QpState, QueuePair, RemoteBuf, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
};

use tcp_example::{
    accept, be_u64, check_bytes, connect_tcp, create_rc_qp, fill, filled, fresh_psn, grant,
    open_device, parse_grant, timeout, Res, GRANT_LEN,
};

const DEFAULT_TCP_PORT: u16 = 18518;
/// Seeds of the patterns: the window's first contents, the bytes around
/// it, and what the client writes through it.
const WINDOW_SEED: u64 = 0x5717_d0e5;
const OUTSIDE_SEED: u64 = 0x0b57_ac1e;
const WRITE_SEED: u64 = 0xc0ff_ee00;
/// What the client's SEND_WITH_INV carries, and the receive buffer for it.
const INV_MESSAGE: &[u8] = b"invalidate, please";
const RECV_LEN: usize = 64;
const RECV_FILL: u8 = 0x5a;

// wr_ids.
const WR_BIND: u64 = 1;
const WR_INV: u64 = 2;
const WR_RECV: u64 = 3;
const WR_UNBIND: u64 = 4;
const WR_READ: u64 = 10;
const WR_WRITE: u64 = 11;
const WR_SEND_INV: u64 = 12;
const WR_READ_AFTER: u64 = 13;

fn describe(wr_id: u64) -> &'static str {
    match wr_id {
        WR_BIND => "the bind",
        WR_INV => "the local invalidation",
        WR_RECV => "the receive",
        WR_UNBIND => "the unbind",
        WR_READ => "the RDMA read through the window",
        WR_WRITE => "the RDMA write through the window",
        WR_SEND_INV => "the SEND_WITH_INV",
        WR_READ_AFTER => "the RDMA read after invalidation",
        _ => "an unknown request",
    }
}

/// How the window is revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Type 2, `IBV_WR_LOCAL_INV` by the server.
    Local,
    /// Type 2, `IBV_WR_SEND_WITH_INV` by the client.
    Remote,
    /// Type 1, unbound by the server (a bind of length 0).
    Type1,
}

impl Mode {
    fn wire(self) -> u8 {
        match self {
            Mode::Local => 0,
            Mode::Remote => 1,
            Mode::Type1 => 2,
        }
    }

    fn from_wire(b: u8) -> Option<Self> {
        [Mode::Local, Mode::Remote, Mode::Type1]
            .into_iter()
            .find(|m| m.wire() == b)
    }

    fn option(self) -> &'static str {
        match self {
            Mode::Local => "neither --remote-inv nor --type1",
            Mode::Remote => "--remote-inv",
            Mode::Type1 => "--type1",
        }
    }

    fn mw_type(self) -> MwType {
        match self {
            Mode::Type1 => MwType::Type1,
            Mode::Local | Mode::Remote => MwType::Type2,
        }
    }
}

// ---------------------------------------------------------------------------
// Options.

struct Options {
    common: tcp_example::Common,
    mode: Mode,
}

const USAGE: &str = "usage: mw_invalidate [-p PORT] [-d DEVICE] [-i IB_PORT] [-g GID_INDEX] \
                     [-s SIZE] [--remote-inv | --type1] [HOST]";

fn parse() -> std::result::Result<(Options, Option<String>), String> {
    let (mut remote_inv, mut type1) = (false, false);
    let (common, host) = tcp_example::parse(DEFAULT_TCP_PORT, |a| {
        // Flags, which take no `=value` (`--type1=x` is an unknown option).
        match a.name.as_str() {
            "--remote-inv" if a.inline.is_none() => remote_inv = true,
            "--type1" if a.inline.is_none() => type1 = true,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let mode = match (remote_inv, type1) {
        (false, false) => Mode::Local,
        (true, false) => Mode::Remote,
        (false, true) => Mode::Type1,
        (true, true) => {
            return Err("--remote-inv and --type1 exclude each other: \
                        a type 1 window cannot be invalidated by SEND_WITH_INV"
                .into())
        }
    };
    if common.size == 0 {
        return Err("--size must be at least 1".into());
    }
    if common.size > u32::MAX as usize / 3 {
        return Err("--size is too large".into());
    }
    Ok((Options { common, mode }, host))
}

fn main() -> ExitCode {
    quiet_pipe::install();
    tcp_example::main("mw_invalidate", USAGE, parse, server, client)
}

// ---------------------------------------------------------------------------
// Pieces both sides use.

/// The TCP connection to the peer, read line by line; a `FAIL reason`
/// line from the peer becomes an error of ours.
struct Peer {
    tcp: TcpStream,
    buf: Vec<u8>,
}

/// How an error starts when it only repeats the peer's `FAIL` line (so that
/// it is not sent back).
const PEER_FAILED: &str = "the peer failed: ";

impl Peer {
    fn new(tcp: TcpStream) -> Res<Self> {
        tcp.set_nodelay(true)?;
        Ok(Peer {
            tcp,
            buf: Vec::new(),
        })
    }

    fn send(&mut self, line: &str) -> Res<()> {
        self.tcp.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    /// A complete line from the buffer, if there is one.
    fn take_line(&mut self) -> Res<Option<String>> {
        let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
            if self.buf.len() > 4096 {
                return Err("the peer sent an overlong line".into());
            }
            return Ok(None);
        };
        let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..=end);
        if let Some(why) = line.strip_prefix("FAIL ") {
            return Err(format!("{PEER_FAILED}{why}").into());
        }
        Ok(Some(line))
    }

    /// Reads what has arrived, without blocking, and fails if the peer
    /// has sent `FAIL` or closed the connection. Other lines stay buffered
    /// for [`expect`](Self::expect): the peer may run ahead of our
    /// completions (it can see the effect of a request before our
    /// completion of it arrives).
    fn check(&mut self) -> Res<()> {
        self.tcp.set_nonblocking(true)?;
        let mut chunk = [0u8; 256];
        let read = self.tcp.read(&mut chunk);
        self.tcp.set_nonblocking(false)?;
        match read {
            Ok(0) => return Err("the peer closed the connection".into()),
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
        let complete = self
            .buf
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |end| end + 1);
        for line in self.buf[..complete].split(|&b| b == b'\n') {
            if let Some(why) = line.strip_prefix(b"FAIL ") {
                let why = String::from_utf8_lossy(why);
                return Err(format!("{PEER_FAILED}{why}").into());
            }
        }
        Ok(())
    }

    /// Waits for the line `want` (up to the timeout).
    fn expect(&mut self, want: &str) -> Res<()> {
        let deadline = Instant::now() + timeout();
        loop {
            if let Some(line) = self.take_line()? {
                if line == want {
                    return Ok(());
                }
                return Err(format!("the peer said {line:?}, expected {want:?}").into());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(
                    format!("no {want:?} from the peer after {}s", timeout().as_secs()).into(),
                );
            }
            self.tcp.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 256];
            match self.tcp.read(&mut chunk) {
                Ok(0) => return Err("the peer closed the connection".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads exactly `out.len()` bytes (up to the timeout).
    fn read_exact(&mut self, out: &mut [u8]) -> Res<()> {
        let have = self.buf.len().min(out.len());
        out[..have].copy_from_slice(&self.buf[..have]);
        self.buf.drain(..have);
        self.tcp.set_read_timeout(Some(timeout()))?;
        self.tcp
            .read_exact(&mut out[have..])
            .map_err(|e| format!("reading from the peer: {e}"))?;
        Ok(())
    }

    /// Tells the peer why this side stops (unless the peer stopped first),
    /// then hands the error back.
    fn fail(&mut self, e: Box<dyn StdError>) -> Box<dyn StdError> {
        let text = e.to_string();
        if !text.starts_with(PEER_FAILED) {
            let _ = self.send(&format!("FAIL {}", text.replace('\n', " ")));
        }
        e
    }
}

/// A finished request: its completion, the caller's wr_id (the
/// completion's own `wr_id` is the crate's bookkeeping number) and its
/// chunk, if it had one.
struct Done {
    wc: WorkCompletion,
    wr_id: u64,
    chunk: Option<Chunk>,
}

impl Done {
    /// The completion's status, for messages.
    fn status(&self) -> String {
        match self.wc.status() {
            Ok(s) => format!("{s} ({})", s.message()),
            Err(raw) => format!("status {raw}"),
        }
    }

    /// Fails unless the request succeeded as `want`.
    fn expect(&self, wr_id: u64, want: WcOpcode) -> Res<()> {
        if self.wr_id != wr_id {
            return Err(format!(
                "{} completed while waiting for {}",
                describe(self.wr_id),
                describe(wr_id)
            )
            .into());
        }
        if !self.wc.is_success() {
            return Err(format!(
                "{} completed with {} (vendor error {:#x})",
                describe(wr_id),
                self.status(),
                self.wc.vendor_err()
            )
            .into());
        }
        match self.wc.opcode() {
            Ok(op) if op == want => Ok(()),
            got => Err(format!("{} completed as {got:?}, expected {want}", describe(wr_id)).into()),
        }
    }
}

/// Waits for the next completion on `cq` (all requests here are signalled,
/// so each completion ends one request) and reclaims its request. Stops
/// early if the peer reports a failure.
fn wait_one(cq: &CompletionQueue, qp: &mut QueuePair, peer: &mut Peer) -> Res<Done> {
    let deadline = Instant::now() + timeout();
    let mut wcs = [WorkCompletion::default(); 1];
    loop {
        if let Some(&wc) = cq.poll(&mut wcs)?.first() {
            let mut request = None;
            qp.reclaim(&wc, |c| {
                if c.signaled {
                    request = Some((c.wr_id, c.into_chunk()));
                }
            });
            let (wr_id, chunk) = request.ok_or("a completion that no posted request matches")?;
            return Ok(Done { wc, wr_id, chunk });
        }
        peer.check()?;
        if Instant::now() > deadline {
            return Err(format!("no completion after {}s", timeout().as_secs()).into());
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// The QP's state as the device reports it (`ibv_query_qp`), which also
/// becomes the state the crate knows it in ([`QueuePair::resync`]): the
/// device moved it to ERR on its own.
fn device_state(qp: &mut QueuePair) -> Res<QpState> {
    Ok(qp.resync()?)
}

// ---------------------------------------------------------------------------
// Server.

fn server(o: &Options) -> Res<()> {
    let ctx = open_device(&o.common)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(8)?;
    let mut qp = create_rc_qp(&pd, &cq, 4, 1)?;

    let (tcp, client) = accept("mw_invalidate", &ctx, &o.common)?;
    let mut peer = Peer::new(tcp)?;

    let mut hello = [0u8; Endpoint::WIRE_LEN + 9];
    peer.tcp.read_exact(&mut hello)?;
    let w = Endpoint::WIRE_LEN;
    let remote = Endpoint::from_wire(&hello[..w])?;
    let size = be_u64(&hello[w..w + 8]);
    let mode = Mode::from_wire(hello[w + 8]);
    if size != o.common.size as u64 || mode != Some(o.mode) {
        let theirs = mode.map_or("an unknown mode", Mode::option);
        let e = format!(
            "the client {client} runs --size {size} with {theirs}, \
             this server --size {} with {}",
            o.common.size,
            o.mode.option()
        );
        return Err(peer.fail(e.into()));
    }
    let result = serve(o, &pd, &cq, &mut qp, &mut peer, &remote);
    result.map_err(|e| peer.fail(e))
}

fn serve(
    o: &Options,
    pd: &rdma_verbs::ProtectionDomain,
    cq: &CompletionQueue,
    qp: &mut QueuePair,
    peer: &mut Peer,
    remote: &Endpoint,
) -> Res<()> {
    let size = o.common.size;
    // The region: no remote rights of its own, only MW_BIND (and
    // LOCAL_WRITE, which a window with REMOTE_WRITE needs). The window is
    // its middle third.
    let len = 3 * size;
    let mut region = pd.register(len, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    region.write(0, &filled(len, OUTSIDE_SEED, 0))?;
    region.write(size, &filled(size, WINDOW_SEED, 0))?;

    // Incoming RDMA is also gated by the QP's access flags.
    let opts = ConnectOptions {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        ..o.common.connect_options()
    };
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;
    qp.connect(&opts, psn, remote)?;

    // The receive the client's SEND_WITH_INV will consume.
    if o.mode == Mode::Remote {
        let mut chunk = pd
            .alloc_chunks(1, RECV_LEN, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no receive chunk")?;
        chunk.as_mut_slice().fill(RECV_FILL);
        qp.post_recv([RecvWr::new(WR_RECV).sge(chunk)])?;
    }

    // The window, bound once the QP is in RTS (a bind is a send request).
    let mut mw = pd.alloc_mw(o.mode.mw_type())?;
    let unbound_rkey = mw.rkey();
    let bind = MwBind::new(
        &region,
        size,
        size,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?
    .wr_id(WR_BIND);
    let addr = bind.remote_addr();
    let rkey = qp.bind_mw(&mut mw, &bind)?;
    wait_one(cq, qp, peer)?.expect(WR_BIND, WcOpcode::BindMw)?;
    if mw.rkey() != rkey || !mw.is_bound() {
        return Err(format!(
            "after the bind the window says rkey {:#x} (bound: {}), bind_mw returned {rkey:#x}",
            mw.rkey(),
            mw.is_bound()
        )
        .into());
    }
    if rkey == region.rkey() || rkey == unbound_rkey {
        return Err(format!(
            "the window's rkey {rkey:#x} is the region's ({:#x}) or the unbound window's ({:#x})",
            region.rkey(),
            unbound_rkey
        )
        .into());
    }
    println!(
        "mw_invalidate: type {} window bound: addr {addr:#x} len {size} rkey {rkey:#x} \
         (region rkey {:#x}, unbound window rkey {unbound_rkey:#x})",
        if o.mode == Mode::Type1 { 1 } else { 2 },
        region.rkey()
    );

    let window = RemoteBuf {
        addr,
        rkey,
        len: size as u64,
    };
    peer.send("WINDOW")?;
    peer.tcp.write_all(&grant(&me, window))?;

    // The client reads, then writes the new pattern.
    peer.expect("WRITTEN")?;
    let mut got = vec![0u8; len];
    region.read(0, &mut got)?;
    check_bytes(
        "the window after the client's write",
        &got[size..2 * size],
        &filled(size, WRITE_SEED, 0),
    )?;
    let outside = filled(len, OUTSIDE_SEED, 0);
    check_bytes(
        "the bytes before the window",
        &got[..size],
        &outside[..size],
    )?;
    check_bytes(
        "the bytes after the window",
        &got[2 * size..],
        &outside[2 * size..],
    )?;
    println!("mw_invalidate: the write through the window arrived: {size} bytes checked");

    match o.mode {
        Mode::Local => {
            qp.invalidate_mw(WR_INV, &mut mw)?;
            wait_one(cq, qp, peer)?.expect(WR_INV, WcOpcode::LocalInv)?;
            if mw.is_bound() {
                return Err("the window still says it is bound after LOCAL_INV".into());
            }
            println!("mw_invalidate: window invalidated by LOCAL_INV (rkey {rkey:#x})");
        }
        Mode::Remote => {
            peer.send("SEND_INV")?;
            let d = wait_one(cq, qp, peer)?;
            d.expect(WR_RECV, WcOpcode::Recv)?;
            let chunk = d.chunk.ok_or("the receive came back without its chunk")?;
            let n = d.wc.byte_len() as usize;
            check_bytes(
                "the SEND_WITH_INV's message",
                &chunk.as_slice()[..n.min(RECV_LEN)],
                INV_MESSAGE,
            )?;
            // QueuePair::invalidated_rkey, not WorkCompletion's: rxe flags
            // the invalidation with the kernel's bit (see the module docs),
            // which only the QP (knowing its device) reads as such.
            let flags = d.wc.flags();
            match qp.invalidated_rkey(&d.wc) {
                Some(k) if k == rkey => {
                    let how = if flags.contains(WcFlags::WITH_INV) {
                        "IBV_WC_WITH_INV"
                    } else {
                        "rxe's IB_WC_WITH_INVALIDATE bit"
                    };
                    println!(
                        "mw_invalidate: the client's SEND_WITH_INV invalidated rkey {rkey:#x} \
                         (the receive completion reports it, flagged with {how})"
                    );
                }
                other => {
                    return Err(format!(
                        "the receive reports invalidated rkey {other:x?}, expected {rkey:#x} \
                         (flags {flags:?})"
                    )
                    .into())
                }
            }
        }
        Mode::Type1 => {
            // No LOCAL_INV for type 1 (the crate refuses it, as the verbs
            // do): a bind of length 0 unbinds it.
            let new = qp.unbind_mw(WR_UNBIND, &mut mw)?;
            wait_one(cq, qp, peer)?.expect(WR_UNBIND, WcOpcode::BindMw)?;
            if mw.is_bound() {
                return Err("the window still says it is bound after the unbind".into());
            }
            println!(
                "mw_invalidate: type 1 window unbound by a bind of length 0 \
                 (rkey {rkey:#x}, now {new:#x})"
            );
        }
    }
    peer.send("INVALIDATED")?;

    // The client's read through the revoked window fails; the responder
    // (this QP) answered it with a NAK and went to ERR.
    peer.expect("DONE")?;
    let state = device_state(qp)?;
    println!("mw_invalidate: server QP state after the client's failed read: {state}");
    if state != QpState::Err {
        return Err(format!("the server's QP is in {state}, expected IBV_QPS_ERR").into());
    }
    peer.send("OK")?;
    println!("mw_invalidate: server: every step as expected");
    Ok(())
}

// ---------------------------------------------------------------------------
// Client.

fn client(o: &Options, host: &str) -> Res<()> {
    let ctx = open_device(&o.common)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(8)?;
    let mut qp = create_rc_qp(&pd, &cq, 4, 1)?;
    let opts = o.common.connect_options();
    let psn = fresh_psn();
    let me = qp.local_endpoint(&opts, psn)?;

    let mut peer = Peer::new(connect_tcp(host, o.common.tcp_port)?)?;
    let mut hello = Vec::with_capacity(Endpoint::WIRE_LEN + 9);
    hello.extend_from_slice(&me.to_wire());
    hello.extend_from_slice(&(o.common.size as u64).to_be_bytes());
    hello.push(o.mode.wire());
    peer.tcp.write_all(&hello)?;

    // The server's answer: `WINDOW` and the record, or `FAIL reason`.
    peer.expect("WINDOW")?;
    let mut reply = [0u8; GRANT_LEN];
    peer.read_exact(&mut reply)?;
    let (remote, window) = parse_grant(&reply)?;
    let len = window.len;
    if len != o.common.size as u64 {
        return Err(
            peer.fail(format!("the window has {len} bytes, expected {}", o.common.size).into())
        );
    }
    qp.connect(&opts, psn, &remote)
        .map_err(|e| peer.fail(e.into()))?;
    println!(
        "mw_invalidate: client on {} port {}; window addr {:#x} rkey {:#x} len {len}",
        ctx.name(),
        o.common.ib_port,
        window.addr,
        window.rkey
    );
    let result = run_client(o, &pd, &cq, &mut qp, &mut peer, window);
    result.map_err(|e| peer.fail(e))?;
    println!("mw_invalidate: client: every step as expected");
    Ok(())
}

fn run_client(
    o: &Options,
    pd: &rdma_verbs::ProtectionDomain,
    cq: &CompletionQueue,
    qp: &mut QueuePair,
    peer: &mut Peer,
    window: RemoteBuf,
) -> Res<()> {
    let size = o.common.size;
    let whole = window.at(0, size as u64)?;
    let mut bufs = pd
        .alloc_chunks(2, size, AccessFlags::LOCAL_WRITE)?
        .into_iter();
    let (mut read_buf, mut write_buf) = (
        bufs.next().ok_or("no chunk")?,
        bufs.next().ok_or("no chunk")?,
    );

    // 1. Read through the window: the server's pattern.
    read_buf.as_mut_slice().fill(0);
    qp.post_send([SendWr::new(WR_READ, SendOp::RdmaRead(whole)).sge(read_buf)])?;
    let d = wait_one(cq, qp, peer)?;
    d.expect(WR_READ, WcOpcode::RdmaRead)?;
    read_buf = d.chunk.ok_or("the read came back without its chunk")?;
    check_bytes(
        "the read through the window",
        read_buf.as_slice(),
        &filled(size, WINDOW_SEED, 0),
    )?;
    println!("mw_invalidate: the read through the window matched: {size} bytes");

    // 2. Write a new pattern through it; the server checks it.
    fill(write_buf.as_mut_slice(), WRITE_SEED, 0);
    qp.post_send([SendWr::new(WR_WRITE, SendOp::RdmaWrite(whole)).sge(write_buf)])?;
    let d = wait_one(cq, qp, peer)?;
    d.expect(WR_WRITE, WcOpcode::RdmaWrite)?;
    println!("mw_invalidate: wrote {size} bytes through the window");
    peer.send("WRITTEN")?;

    // 3. The window is revoked: by us (remote mode) or by the server.
    if o.mode == Mode::Remote {
        peer.expect("SEND_INV")?;
        let mut msg = pd
            .alloc_chunks(1, INV_MESSAGE.len(), AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
        msg.as_mut_slice().copy_from_slice(INV_MESSAGE);
        qp.post_send([SendWr::new(WR_SEND_INV, SendOp::SendWithInv(window.rkey)).sge(msg)])?;
        wait_one(cq, qp, peer)?.expect(WR_SEND_INV, WcOpcode::Send)?;
        println!(
            "mw_invalidate: sent SEND_WITH_INV for rkey {:#x}",
            window.rkey
        );
    }
    peer.expect("INVALIDATED")?;

    // 4. Read through the revoked window: it must fail with REM_ACCESS_ERR.
    read_buf.as_mut_slice().fill(0);
    qp.post_send([SendWr::new(WR_READ_AFTER, SendOp::RdmaRead(whole)).sge(read_buf)])?;
    let d = wait_one(cq, qp, peer)?;
    if d.wr_id != WR_READ_AFTER {
        return Err(format!(
            "{} completed while waiting for {}",
            describe(d.wr_id),
            describe(WR_READ_AFTER)
        )
        .into());
    }
    match d.wc.status() {
        Ok(WcStatus::RemAccessErr) => {}
        _ if d.wc.is_success() => {
            return Err("the read after invalidation succeeded: the window was not revoked".into())
        }
        _ => {
            return Err(format!(
                "the read after invalidation failed with {}, expected IBV_WC_REM_ACCESS_ERR",
                d.status()
            )
            .into())
        }
    }
    let status = d.status();
    let buf = d
        .chunk
        .ok_or("the failed read came back without its chunk")?;
    if buf.as_slice().iter().any(|&b| b != 0) {
        return Err("the failed read changed its buffer".into());
    }
    println!("mw_invalidate: the read after invalidation failed with {status}, as expected");
    let state = device_state(qp)?;
    println!("mw_invalidate: client QP state after the failed read: {state}");
    if state != QpState::Err {
        return Err(format!("the client's QP is in {state}, expected IBV_QPS_ERR").into());
    }
    peer.send("DONE")?;
    peer.expect("OK")?;
    Ok(())
}

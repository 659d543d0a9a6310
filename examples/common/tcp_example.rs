//! What the two examples with a server and a client that exchange their
//! endpoints over TCP (`rdma_ops` and `mw_invalidate`) share: the options
//! both take, `main`'s exit codes, the device, the RC QP, the TCP
//! connection, the server's answer that grants the client a remote region,
//! the PSN, the timeout and the data patterns.
//!
//! Each includes this file with
//! `#[path = "common/tcp_example.rs"] mod tcp_example;`; both use all of it.

#[path = "time.rs"]
mod time;

use std::error::Error as StdError;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::str::FromStr;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn};
use rdma_verbs::{
    CompletionQueue, Context, ProtectionDomain, QpCaps, QpInitAttr, QpType, QueuePair, RemoteBuf,
};

/// What the examples' fallible steps return.
pub type Res<T> = std::result::Result<T, Box<dyn StdError>>;

/// How long a side waits for its peer or a completion: 60 s, stretched by
/// `RDMA_VERBS_TIME_SCALE`.
pub fn timeout() -> Duration {
    time::scaled(Duration::from_secs(60))
}

// ---------------------------------------------------------------------------
// Options.

/// The options both examples take.
pub struct Common {
    /// `-p, --port`: the TCP port.
    pub tcp_port: u16,
    /// `-d, --ib-dev`: the RDMA device (default: the first one).
    pub device: Option<String>,
    /// `-i, --ib-port`: the port of the device (default 1).
    pub ib_port: u8,
    /// `-g, --gid-idx`: the local GID index (default: chosen by
    /// `QueuePair::connect`).
    pub gid_index: Option<u8>,
    /// `-s, --size`: bytes per operation (default 4096).
    pub size: usize,
}

impl Common {
    /// The options of `QueuePair::connect` that come from the command line
    /// (the port and GID index), the rest default.
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            port: self.ib_port,
            gid_index: self.gid_index,
            ..ConnectOptions::default()
        }
    }
}

/// One option of the command line, as [`parse`] meets it.
pub struct Arg<'a> {
    /// The option: the whole argument, or the `--name` of `--name=value`.
    pub name: String,
    /// The value of `--name=value`.
    pub inline: Option<String>,
    rest: &'a mut dyn Iterator<Item = String>,
}

impl Arg<'_> {
    /// The option's value: the one after `=`, else the next argument.
    pub fn value(&mut self) -> std::result::Result<String, String> {
        self.inline
            .clone()
            .or_else(|| self.rest.next())
            .ok_or(format!("{} needs a value", self.name))
    }

    /// The option's value as a number.
    pub fn num<T: FromStr>(&mut self) -> std::result::Result<T, String> {
        let v = self.value()?;
        v.parse()
            .map_err(|_| format!("bad value {v:?} for {}", self.name))
    }
}

/// Parses the command line (`--name=value` as well as `--name value`): the
/// options of [`Common`], with `tcp_port` as the default port; `-h` and
/// `--help` (an empty error: the usage alone); at most one HOST, returned
/// next to the options (`None`: be the server). An argument that is none of
/// these goes to `extra` first, which returns whether it was one of the
/// example's own options.
pub fn parse(
    tcp_port: u16,
    mut extra: impl FnMut(&mut Arg) -> std::result::Result<bool, String>,
) -> std::result::Result<(Common, Option<String>), String> {
    let mut o = Common {
        tcp_port,
        device: None,
        ib_port: 1,
        gid_index: None,
        size: 4096,
    };
    let mut host = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut a = Arg {
            name: name.clone(),
            inline,
            rest: &mut args,
        };
        match name.as_str() {
            "-p" | "--port" => o.tcp_port = a.num()?,
            "-d" | "--ib-dev" => o.device = Some(a.value()?),
            "-i" | "--ib-port" => o.ib_port = a.num()?,
            "-g" | "--gid-idx" => o.gid_index = Some(a.num()?),
            "-s" | "--size" => o.size = a.num()?,
            _ if extra(&mut a)? => {}
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option {s}")),
            _ if host.is_none() => host = Some(arg),
            _ => return Err(format!("unexpected argument {arg}")),
        }
    }
    Ok((o, host))
}

/// An example's `main`: `parse`s the command line (on an error, prints
/// `program: error` unless it is empty, then `usage`, and exits 2), then
/// runs the `server`, or the `client` of the HOST `parse` found, and exits
/// 0, or prints `program: error` and exits 1.
pub fn main<O>(
    program: &str,
    usage: &str,
    parse: impl FnOnce() -> std::result::Result<(O, Option<String>), String>,
    server: impl FnOnce(&O) -> Res<()>,
    client: impl FnOnce(&O, &str) -> Res<()>,
) -> ExitCode {
    let (opts, host) = match parse() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{program}: {e}");
            }
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    let result = match &host {
        None => server(&opts),
        Some(host) => client(&opts, host),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// The device, the QP and the TCP connection.

/// Opens the device `--ib-dev` names, or the first one.
pub fn open_device(o: &Common) -> Res<Context> {
    Ok(match &o.device {
        Some(name) => Context::open(name)?,
        None => Context::open_first()?,
    })
}

/// An RC QP whose sends and receives complete on `cq`, with room for
/// `max_send_wr` sends and `max_recv_wr` receives.
pub fn create_rc_qp(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> Res<QueuePair> {
    let caps = QpCaps {
        max_send_wr,
        max_recv_wr,
        ..QpCaps::default()
    };
    Ok(pd.create_qp(&QpInitAttr::new(QpType::Rc, cq, cq).caps(caps))?)
}

/// A first PSN that differs from run to run, as the pingpong examples make
/// theirs (no random number crate needed for 24 bits).
pub fn fresh_psn() -> Psn {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Psn::truncate(nanos ^ std::process::id().wrapping_mul(0x9e37_79b9))
}

/// The server's side: listens on `--port`, says so on stdout
/// (`program: server on DEVICE port N, waiting on TCP port P`) and takes
/// the first client that connects.
pub fn accept(program: &str, ctx: &Context, o: &Common) -> Res<(TcpStream, SocketAddr)> {
    let listener = TcpListener::bind(("0.0.0.0", o.tcp_port))
        .map_err(|e| format!("cannot listen on TCP port {}: {e}", o.tcp_port))?;
    println!(
        "{program}: server on {} port {}, waiting on TCP port {}",
        ctx.name(),
        o.ib_port,
        o.tcp_port
    );
    Ok(listener.accept()?)
}

/// The client's side: connects, retrying for a while if the server is not
/// listening yet.
pub fn connect_tcp(host: &str, port: u16) -> Res<TcpStream> {
    let deadline = Instant::now() + time::scaled(Duration::from_secs(20));
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(e) => return Err(format!("cannot connect to {host}:{port}: {e}").into()),
        }
    }
}

// ---------------------------------------------------------------------------
// The wire.

/// The big-endian `u64` in `b` (8 bytes).
pub fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

/// Bytes of [`grant`]'s record.
pub const GRANT_LEN: usize = Endpoint::WIRE_LEN + RemoteBuf::WIRE_LEN;

/// The server's answer to the client: its endpoint record, then the wire
/// record of the memory the client may reach ([`RemoteBuf::to_wire`]:
/// address, rkey and length as text, NUL-terminated).
pub fn grant(me: &Endpoint, memory: RemoteBuf) -> Vec<u8> {
    let mut reply = Vec::with_capacity(GRANT_LEN);
    reply.extend_from_slice(&me.to_wire());
    reply.extend_from_slice(&memory.to_wire());
    reply
}

/// The server's endpoint and the memory, from [`grant`]'s record; a
/// malformed record is an error that says which half was wrong.
pub fn parse_grant(reply: &[u8; GRANT_LEN]) -> Res<(Endpoint, RemoteBuf)> {
    let (ep, memory) = reply.split_at(Endpoint::WIRE_LEN);
    let remote = Endpoint::from_wire(ep).map_err(|e| format!("the server's endpoint: {e}"))?;
    let memory =
        RemoteBuf::from_wire(memory).map_err(|e| format!("the server's memory record: {e}"))?;
    Ok((remote, memory))
}

// ---------------------------------------------------------------------------
// Patterns and checks.

/// Byte `j` of the pattern with `seed`: a hash, so that the patterns of
/// different seeds differ.
pub fn pattern(seed: u64, j: usize) -> u8 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ j as u64;
    x = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x ^ (x >> 29)) as u8
}

/// Fills `out` with bytes `first..` of the pattern with `seed`.
pub fn fill(out: &mut [u8], seed: u64, first: usize) {
    for (j, b) in out.iter_mut().enumerate() {
        *b = pattern(seed, first + j);
    }
}

/// Bytes `first..first + len` of the pattern with `seed`.
pub fn filled(len: usize, seed: u64, first: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill(&mut v, seed, first);
    v
}

/// Fails, naming `what` and the first byte that differs, unless `got` is
/// `want`.
pub fn check_bytes(what: &str, got: &[u8], want: &[u8]) -> Res<()> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None if got.len() == want.len() => Ok(()),
        None => Err(format!("{what}: {} bytes, expected {}", got.len(), want.len()).into()),
        Some(j) => Err(format!(
            "{what}: byte {j} is {:#04x}, expected {:#04x}",
            got[j], want[j]
        )
        .into()),
    }
}

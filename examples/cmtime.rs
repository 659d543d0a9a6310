//! A port of rdma-core 44's `cmtime` (librdmacm's examples, the version
//! with eight timed steps): it times each step of setting up and tearing
//! down many RDMA CM connections (RC, `RDMA_PS_TCP`), and speaks the same
//! CM protocol, so either side can be the C program.
//!
//! ```text
//! cmtime [-b bind_address] [-p port_number]         server: accepts every connection
//! cmtime -s server_address [-b bind_address] [-c connections]
//!        [-p port_number] [-r retries] [-t timeout_ms]
//!
//!   -s addr   server address: run as the client (without it: the server)
//!   -b addr   bind address (server: the address to listen on; client: the
//!             source address, and a "bind addr" step)
//!   -c n      number of connections (client; default 100)
//!   -p port   port number or service name (default 7471)
//!   -r n      retries of a failed address or route resolution, and the
//!             connection's retry_count (default 2)
//!   -t ms     timeout of address and route resolution (default 2000)
//! ```
//!
//! The client runs each step for all connections before the next: it
//! makes every request of a step (resolve every address, ...), then waits
//! until an event thread has seen the outcome of each, busy-waiting with
//! `sched_yield` as the C program does. Then it prints, per step, the total
//! time, the slowest and the fastest connection, and the total per
//! connection:
//!
//! ```text
//! step              total ms     max ms     min us  us / conn
//! create id    :        2.56       0.31       8.00      25.62
//! resolve addr :       11.67      10.27    4480.00     116.71
//! resolve route:        4.76       2.21      29.00      47.57
//! create qp    :       42.72       9.19     183.00     427.17
//! connect      :      255.94     157.86   18959.00    2559.42
//! disconnect   :      160.15      75.06    1448.00    1601.49
//! destroy      :        2.56       0.24      11.00      25.59
//! ```
//!
//! | step | what is timed, per connection |
//! |---|---|
//! | create id | `create_id` (`rdma_create_id`) |
//! | bind addr | only with `-b`: `bind` |
//! | resolve addr | `resolve_addr` until its `AddrResolved` event |
//! | resolve route | `resolve_route` until its `RouteResolved` event |
//! | create qp | the CQs and the QP (`rdma_create_qp`), see below |
//! | connect | `connect` until its `Established` event |
//! | disconnect | `disconnect` and destroying the QP, until its `Disconnected` event |
//! | destroy | dropping the id (`rdma_destroy_id`) |
//!
//! The server never ends (stop it with a signal) and prints nothing: it
//! hands each connection request to a thread that creates the QP and
//! accepts, and each disconnection to another that disconnects and
//! destroys the QP and the id, as the C server does.
//!
//! The same work as the C program, so that the times compare: the C
//! program creates its QPs with `rdma_create_qp(id, NULL, attr)` in
//! librdmacm's default PD; for the first QP librdmacm also makes a
//! completion channel and a one-entry CQ for each direction, which every
//! later QP then shares (see `QpMaker`). This program makes the same (a PD
//! and the CQs with the first QP) and gives them to [`CmId::create_qp`];
//! dropping a QP destroys it as `rdma_destroy_qp` does. The server accepts
//! with [`ConnParam::new`], which sends what librdmacm sends for
//! `rdma_accept(id, NULL)`.
//!
//! Output is the C program's: the progress lines and the table on stdout,
//! which is line-buffered on a terminal and block-buffered otherwise (as
//! stdio does), errors as `perror` prints them on stderr, and the same exit
//! statuses, with one exception: when the server cannot listen (a bad `-b`
//! address, a port in use), the C program prints its error and then
//! crashes in its cleanup (SIGSEGV, status 139); this one exits with
//! status 255 (the `-1` the C code returns) or, for a failed lookup, the
//! `getaddrinfo` code.
//!
//! On soft-RoCE (address 10.99.0.1): `cargo run --example cmtime` on one
//! side, `cargo run --example cmtime -- -s 10.99.0.1 -c 100` on the other.

#![forbid(unsafe_code)]

#[path = "common/gai.rs"]
mod gai;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdma_verbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::{
    CompletionChannel, CompletionQueue, Error, ProtectionDomain, QpCaps, QpInitAttr, QpType,
    QueuePair,
};

// ---------------------------------------------------------------------------
// Output as C's stdio does it.

/// stdout: line-buffered on a terminal, block-buffered (4 KiB) otherwise,
/// shared by the threads that print.
static OUT: OnceLock<Mutex<Box<dyn Write + Send>>> = OnceLock::new();

fn out() -> std::sync::MutexGuard<'static, Box<dyn Write + Send>> {
    OUT.get_or_init(|| {
        let w: Box<dyn Write + Send> = if io::stdout().is_terminal() {
            Box::new(io::stdout())
        } else {
            Box::new(BufWriter::with_capacity(4096, io::stdout()))
        };
        Mutex::new(w)
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

fn out_line(args: fmt::Arguments<'_>) {
    let mut o = out();
    // Like printf, a failed write (a closed pipe) is not an error here.
    let _ = o.write_fmt(args);
    let _ = o.write_all(b"\n");
}

macro_rules! outln {
    ($($arg:tt)*) => {
        out_line(format_args!($($arg)*))
    };
}

fn flush_out() {
    let _ = out().flush();
}

/// `strerror(errno)`.
fn strerror(errno: i32) -> String {
    let s = io::Error::from_raw_os_error(errno).to_string();
    match s.rfind(" (os error ") {
        Some(at) => s[..at].to_owned(),
        None => s,
    }
}

/// `perror(what)` for a failed call (its errno's text), or the crate's
/// message for something refused before any call.
fn perror(what: &str, e: &Error) {
    match e.errno() {
        Some(errno) => eprintln!("{what}: {}", strerror(errno)),
        None => eprintln!("{what}: {e}"),
    }
}

/// The C program's `return ret` as an exit status (the low 8 bits).
fn status(ret: i32) -> ExitCode {
    ExitCode::from(ret as u8)
}

// ---------------------------------------------------------------------------
// The steps and the table.

const CREATE_ID: usize = 0;
const BIND: usize = 1;
const RESOLVE_ADDR: usize = 2;
const RESOLVE_ROUTE: usize = 3;
const CREATE_QP: usize = 4;
const CONNECT: usize = 5;
const DISCONNECT: usize = 6;
const DESTROY: usize = 7;
const STEPS: usize = 8;

const STEP_NAMES: [&str; STEPS] = [
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];

/// The QP both sides make: one work request and one SGE each way, no
/// inline data (the C program's `init_qp_attr`).
const CAPS: QpCaps = QpCaps {
    max_send_wr: 1,
    max_recv_wr: 1,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

/// Microseconds on a monotonic clock, truncated as `gettimeofday` gives
/// them; never 0, which stands for "not taken".
struct Clock(Instant);

impl Clock {
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_micros()).unwrap_or(u64::MAX - 1) + 1
    }
}

/// The C program's `diff_us`: the difference as a `float`.
fn diff_us(end: u64, start: u64) -> f32 {
    (end as f64 - start as f64) as f32
}

/// What one connection records: when each of its steps started and ended,
/// whether it failed, and its resolution retries left.
#[derive(Default)]
struct Node {
    times: [[AtomicU64; 2]; STEPS],
    error: AtomicBool,
    retries: AtomicI32,
}

/// The client's records, shared with its event thread.
struct Nodes {
    clock: Clock,
    nodes: Vec<Node>,
    /// Per step: the connections whose outcome the event thread has seen.
    completed: [AtomicUsize; STEPS],
}

impl Nodes {
    fn start(&self, i: usize, step: usize) {
        self.nodes[i].times[step][0].store(self.clock.now(), Ordering::Relaxed);
    }

    fn end(&self, i: usize, step: usize) {
        self.nodes[i].times[step][1].store(self.clock.now(), Ordering::Relaxed);
    }

    /// The event thread saw connection `i`'s outcome of `step` (failed:
    /// marked so before it is counted, so the next step skips it).
    fn complete(&self, i: usize, step: usize, failed: bool) {
        self.end(i, step);
        if failed {
            self.nodes[i].error.store(true, Ordering::Relaxed);
        }
        self.completed[step].fetch_add(1, Ordering::Release);
    }

    fn failed(&self, i: usize) -> bool {
        self.nodes[i].error.load(Ordering::Acquire)
    }

    /// Waits (spinning with `sched_yield`, as the C program does) until
    /// the event thread has seen `started` outcomes of `step`.
    fn wait(&self, step: usize, started: usize) {
        while self.completed[step].load(Ordering::Acquire) != started {
            std::thread::yield_now();
        }
    }
}

/// One `%11.2f` column.
struct Col(f64);

impl fmt::Display for Col {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v.is_nan() {
            // glibc prints the sign of a NaN; 0.0 / 0 has it set on x86.
            let s = if v.is_sign_negative() { "-nan" } else { "nan" };
            write!(f, "{s:>11}")
        } else if v.is_infinite() {
            let s = if v < 0.0 { "-inf" } else { "inf" };
            write!(f, "{s:>11}")
        } else {
            write!(f, "{v:11.2}")
        }
    }
}

/// The table, computed as the C program's `show_perf` does (in `float`,
/// min starting at 999999999, which prints as 1000000000.00 when a step
/// has no sample).
fn show_perf(nodes: &Nodes, steps: &[[u64; 2]; STEPS], connections: i32, with_bind: bool) {
    let mut max = [0f32; STEPS];
    let mut min = [999_999_999f32; STEPS];
    for step in 0..STEPS {
        for n in &nodes.nodes {
            let start = n.times[step][0].load(Ordering::Relaxed);
            let end = n.times[step][1].load(Ordering::Relaxed);
            if start != 0 && end != 0 {
                let us = diff_us(end, start);
                if us > max[step] {
                    max[step] = us;
                }
                if us < min[step] {
                    min[step] = us;
                }
            }
        }
    }
    outln!("step              total ms     max ms     min us  us / conn");
    for step in 0..STEPS {
        if step == BIND && !with_bind {
            continue;
        }
        let us = diff_us(steps[step][1], steps[step][0]);
        outln!(
            "{:<13}: {}{}{}{}",
            STEP_NAMES[step],
            Col(f64::from(us) / 1000.0),
            Col(f64::from(max[step]) / 1000.0),
            Col(f64::from(min[step])),
            Col(f64::from(us / connections as f32)),
        );
    }
}

// ---------------------------------------------------------------------------
// The command line.

struct Options {
    dst: Option<String>,
    src: Option<String>,
    connections: i32,
    port: String,
    retries: i32,
    timeout_ms: i32,
}

fn usage(argv0: &str) {
    outln!("usage: {argv0}");
    outln!("\t[-s server_address]");
    outln!("\t[-b bind_address]");
    outln!("\t[-c connections]");
    outln!("\t[-p port_number]");
    outln!("\t[-r retries]");
    outln!("\t[-t timeout_ms]");
}

/// `getopt(argc, argv, "s:b:c:p:r:t:")` as glibc does it: other arguments
/// may come between the options (they are ignored), `--` ends the options,
/// an option's argument may be attached (`-c10`). A bad option is the
/// message getopt prints.
fn getopt(argv0: &str, args: &[String]) -> Result<Vec<(char, String)>, String> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            break;
        }
        let Some(body) = arg.strip_prefix('-').filter(|b| !b.is_empty()) else {
            continue;
        };
        let mut chars = body.chars();
        let c = chars.next().unwrap_or('-');
        if !"sbcprt".contains(c) {
            return Err(format!("{argv0}: invalid option -- '{c}'"));
        }
        let rest = chars.as_str();
        let value = if !rest.is_empty() {
            rest.to_owned()
        } else if i < args.len() {
            i += 1;
            args[i - 1].clone()
        } else {
            return Err(format!("{argv0}: option requires an argument -- '{c}'"));
        };
        found.push((c, value));
    }
    Ok(found)
}

/// `atoi`: leading blanks, a sign and decimal digits, as far as they go
/// (0 if none); a number beyond `long` saturates, and is then cut to `int`
/// as C's conversion does.
fn atoi(s: &str) -> i32 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut v: i64 = 0;
    for d in digits.bytes().take_while(u8::is_ascii_digit) {
        v = v.saturating_mul(10).saturating_add(i64::from(d - b'0'));
    }
    (if neg { v.saturating_neg() } else { v }) as i32
}

fn parse_args() -> Result<Options, ExitCode> {
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_else(|| "cmtime".into());
    let args: Vec<String> = argv.collect();
    let mut o = Options {
        dst: None,
        src: None,
        connections: 100,
        port: "7471".into(),
        retries: 2,
        timeout_ms: 2000,
    };
    let found = match getopt(&argv0, &args) {
        Ok(found) => found,
        Err(msg) => {
            eprintln!("{msg}");
            usage(&argv0);
            flush_out();
            return Err(ExitCode::from(1));
        }
    };
    for (c, v) in found {
        match c {
            's' => o.dst = Some(v),
            'b' => o.src = Some(v),
            'c' => o.connections = atoi(&v),
            'p' => o.port = v,
            'r' => o.retries = atoi(&v),
            _ => o.timeout_ms = atoi(&v),
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------
// Addresses, as `rdma_getaddrinfo` finds them for the C program.

/// A failed lookup: the `EAI_*` code and its text.
struct GaiError(i32, String);

impl GaiError {
    fn of(code: i32) -> Self {
        GaiError(code, gai::text_of(code).to_owned())
    }
}

/// The TCP port of a service: a number, or a name from `/etc/services`.
fn service_port(service: &str) -> Result<u16, GaiError> {
    if !service.is_empty() && service.bytes().all(|b| b.is_ascii_digit()) {
        // getaddrinfo keeps the low 16 bits of a larger number.
        return Ok(service.parse::<u64>().map_or(u16::MAX, |n| n as u16));
    }
    let services = std::fs::read_to_string("/etc/services").unwrap_or_default();
    for line in services.lines() {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let (Some(name), Some(port_proto)) = (words.next(), words.next()) else {
            continue;
        };
        let Some((port, "tcp")) = port_proto.split_once('/') else {
            continue;
        };
        if name == service || words.any(|alias| alias == service) {
            if let Ok(port) = port.parse() {
                return Ok(port);
            }
        }
    }
    Err(GaiError::of(-8))
}

/// The first address of `host` (TCP, any family) with `port`; with no
/// host, the wildcard address (as for `AI_PASSIVE`).
fn lookup(host: Option<&str>, port: u16) -> Result<SocketAddr, GaiError> {
    let Some(host) = host else {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
    };
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| GaiError::of(-5)),
        Err(e) => {
            // std says "failed to lookup address information: <gai_strerror>".
            let text = gai::text_in(&e);
            let code = gai::code_of(&text).unwrap_or(-11);
            Err(GaiError(code, text))
        }
    }
}

/// The client's addresses (`get_rdma_addr` in the C program): the source
/// (`-b`, port 0) if given, and the server's.
fn client_addrs(o: &Options, dst: &str) -> Result<(Option<SocketAddr>, SocketAddr), GaiError> {
    let src = match &o.src {
        Some(s) => Some(lookup(Some(s), 0)?),
        None => None,
    };
    let dst = lookup(Some(dst), service_port(&o.port)?)?;
    Ok((src, dst))
}

// ---------------------------------------------------------------------------
// QPs, made as librdmacm makes them for `rdma_create_qp(id, NULL, attr)`.

/// What the QPs are made with, per device: a PD (librdmacm's default PD)
/// and the pair of CQs the first QP brought.
///
/// The C program hands the same `init_qp_attr` to every `rdma_create_qp`,
/// without CQs; librdmacm makes a completion channel and a one-entry CQ
/// for each direction of the first QP, and writes the CQs back into that
/// struct, so every later QP of the process uses the first one's CQs.
/// This program does the same, so that the work per connection is the
/// same: one QP each, the CQs (and their channels) once. Unlike C's, its
/// CQs live as long as a QP uses them or the program may make another:
/// the C server, once its only connection is gone, has destroyed them and
/// fails every later request (`failure creating qp: No such file or
/// directory`).
#[derive(Default)]
struct QpMaker {
    devices: Vec<(ProtectionDomain, CompletionQueue, CompletionQueue)>,
}

impl QpMaker {
    /// A QP on `id` in its device's PD, on its device's CQs (made now, if
    /// this is the device's first QP). The QP holds its CQs, and they
    /// their channels.
    fn create_qp(&mut self, id: &CmId) -> rdma_verbs::Result<QueuePair> {
        let ctx = id.context()?;
        let at = match self
            .devices
            .iter()
            .position(|(pd, _, _)| pd.context().same_as(&ctx))
        {
            Some(at) => at,
            None => {
                let pd = ctx.alloc_pd()?;
                let recv_channel = CompletionChannel::new(&ctx)?;
                let recv_cq = ctx.create_cq_with_channel(CAPS.max_recv_wr, &recv_channel, 0)?;
                let send_channel = CompletionChannel::new(&ctx)?;
                let send_cq = ctx.create_cq_with_channel(CAPS.max_send_wr, &send_channel, 0)?;
                self.devices.push((pd, send_cq, recv_cq));
                self.devices.len() - 1
            }
        };
        let (pd, send_cq, recv_cq) = &self.devices[at];
        id.create_qp(
            pd,
            &QpInitAttr::new(QpType::Rc, send_cq, recv_cq).caps(CAPS),
        )
    }
}

// ---------------------------------------------------------------------------
// The client.

/// What the client's event thread needs besides the records.
struct Resolve {
    src: Option<SocketAddr>,
    dst: SocketAddr,
    timeout: Duration,
}

fn timeout_of(ms: i32) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The client's event thread: records each id's outcome of the step it is
/// in, retrying failed resolutions while the id has retries left.
fn client_events(
    ch: EventChannel,
    nodes: Arc<Nodes>,
    index: HashMap<u64, usize>,
    ids: Vec<Weak<CmId>>,
    resolve: Resolve,
) {
    loop {
        let event = match ch.get_event() {
            Ok(event) => event,
            Err(e) => {
                perror("failure in rdma_get_cm_event in process_server_events", &e);
                return;
            }
        };
        let Some(&i) = index.get(&event.id_key()) else {
            continue;
        };
        client_event(&nodes, i, &ids[i], &resolve, &event);
    }
}

fn client_event(nodes: &Nodes, i: usize, id: &Weak<CmId>, r: &Resolve, event: &CmEvent) {
    let n = &nodes.nodes[i];
    // C's `if (n->retries--)`: whether any was left; one fewer either way.
    let retry = || n.retries.fetch_sub(1, Ordering::Relaxed) != 0;
    match event.kind() {
        CmEventKind::AddrResolved => nodes.complete(i, RESOLVE_ADDR, false),
        CmEventKind::RouteResolved => nodes.complete(i, RESOLVE_ROUTE, false),
        CmEventKind::Established => nodes.complete(i, CONNECT, false),
        CmEventKind::Disconnected => nodes.complete(i, DISCONNECT, false),
        CmEventKind::AddrError => {
            if retry() {
                if let Some(id) = id.upgrade() {
                    if id.resolve_addr(r.src, r.dst, r.timeout).is_ok() {
                        return;
                    }
                }
            }
            outln!("RDMA_CM_EVENT_ADDR_ERROR, error: {}", event.status());
            nodes.complete(i, RESOLVE_ADDR, true);
        }
        CmEventKind::RouteError => {
            if retry() {
                if let Some(id) = id.upgrade() {
                    if id.resolve_route(r.timeout).is_ok() {
                        return;
                    }
                }
            }
            outln!("RDMA_CM_EVENT_ROUTE_ERROR, error: {}", event.status());
            nodes.complete(i, RESOLVE_ROUTE, true);
        }
        CmEventKind::ConnectError | CmEventKind::Unreachable | CmEventKind::Rejected => {
            outln!(
                "event: {}, error: {}",
                event.kind().c_name(),
                event.status()
            );
            nodes.complete(i, CONNECT, true);
        }
        _ => {}
    }
}

fn client(ch: &EventChannel, o: &Options, dst: &str) -> ExitCode {
    let count = usize::try_from(o.connections).unwrap_or(0);
    let nodes = Arc::new(Nodes {
        clock: Clock(Instant::now()),
        nodes: (0..count).map(|_| Node::default()).collect(),
        completed: Default::default(),
    });
    let mut steps = [[0u64; 2]; STEPS];
    let now = || nodes.clock.now();

    let mut ids = Vec::with_capacity(count);
    // For a negative count the C program's calloc fails, and it skips this
    // step (without its line).
    let create = o.connections >= 0;
    if create {
        outln!("creating id");
        steps[CREATE_ID][0] = now();
    }
    for i in 0..count {
        nodes.start(i, CREATE_ID);
        match ch.create_id(PortSpace::Tcp) {
            Ok(id) => ids.push(Arc::new(id)),
            Err(e) => {
                // The C program ignores this failure and goes on with freed
                // memory; stop instead.
                perror("rdma_create_id", &e);
                flush_out();
                return status(-1);
            }
        }
        nodes.end(i, CREATE_ID);
    }
    if create {
        steps[CREATE_ID][1] = now();
    }

    let ret = run_client(ch, o, dst, &nodes, &ids, &mut steps);

    outln!("destroying id");
    steps[DESTROY][0] = now();
    for (i, id) in ids.into_iter().enumerate() {
        nodes.start(i, DESTROY);
        drop(id);
        nodes.end(i, DESTROY);
    }
    steps[DESTROY][1] = now();

    show_perf(&nodes, &steps, o.connections, o.src.is_some());
    flush_out();
    status(ret)
}

/// Steps 1 to 6; returns what the C program's `run_client` returns (the
/// outcome of the last call it made: 0, or -1 for a failure).
fn run_client(
    ch: &EventChannel,
    o: &Options,
    dst: &str,
    nodes: &Arc<Nodes>,
    ids: &[Arc<CmId>],
    steps: &mut [[u64; 2]; STEPS],
) -> i32 {
    let (src, dst) = match client_addrs(o, dst) {
        Ok(addrs) => addrs,
        Err(GaiError(code, text)) => {
            outln!("getaddrinfo error: {text}");
            return code;
        }
    };
    let timeout = timeout_of(o.timeout_ms);
    // The kernel keeps at most 7 (a 3-bit field).
    let retry_count = u8::try_from(o.retries & 0xff).unwrap_or(7).min(7);
    let param = ConnParam::new()
        .responder_resources(1)
        .initiator_depth(1)
        .retry_count(retry_count)
        .rnr_retry_count(0);

    let index = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.key(), i))
        .collect();
    let weak = ids.iter().map(Arc::downgrade).collect();
    let thread = {
        let (ch, nodes) = (ch.clone(), nodes.clone());
        let resolve = Resolve { src, dst, timeout };
        std::thread::Builder::new()
            .name("cm events".into())
            .spawn(move || client_events(ch, nodes, index, weak, resolve))
    };
    if let Err(e) = thread {
        eprintln!("failure creating event thread: {e}");
        return -1;
    }
    // The thread is never joined: it waits for events until the process
    // ends, as the C program's does.

    let now = || nodes.clock.now();
    // The outcome of the last call made, as C's `ret` holds it.
    let mut ret = 0;
    let code = |ok: bool| if ok { 0 } else { -1 };
    let live = |i: usize| !nodes.failed(i);

    if let Some(src) = src {
        outln!("binding source address");
        steps[BIND][0] = now();
        for (i, id) in ids.iter().enumerate() {
            nodes.start(i, BIND);
            let r = id.bind(src);
            ret = code(r.is_ok());
            if let Err(e) = r {
                perror("failure bind addr", &e);
                nodes.nodes[i].error.store(true, Ordering::Relaxed);
                continue;
            }
            nodes.end(i, BIND);
        }
        steps[BIND][1] = now();
    }

    outln!("resolving address");
    steps[RESOLVE_ADDR][0] = now();
    let mut started = 0;
    for (i, id) in ids.iter().enumerate().filter(|&(i, _)| live(i)) {
        nodes.nodes[i].retries.store(o.retries, Ordering::Relaxed);
        nodes.start(i, RESOLVE_ADDR);
        let r = id.resolve_addr(src, dst, timeout);
        ret = code(r.is_ok());
        if let Err(e) = r {
            perror("failure getting addr", &e);
            nodes.nodes[i].error.store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    nodes.wait(RESOLVE_ADDR, started);
    steps[RESOLVE_ADDR][1] = now();

    outln!("resolving route");
    steps[RESOLVE_ROUTE][0] = now();
    let mut started = 0;
    for (i, id) in ids.iter().enumerate().filter(|&(i, _)| live(i)) {
        nodes.nodes[i].retries.store(o.retries, Ordering::Relaxed);
        nodes.start(i, RESOLVE_ROUTE);
        let r = id.resolve_route(timeout);
        ret = code(r.is_ok());
        if let Err(e) = r {
            perror("failure resolving route", &e);
            nodes.nodes[i].error.store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    nodes.wait(RESOLVE_ROUTE, started);
    steps[RESOLVE_ROUTE][1] = now();

    outln!("creating qp");
    let mut maker = QpMaker::default();
    let mut qps: Vec<Option<QueuePair>> = (0..ids.len()).map(|_| None).collect();
    steps[CREATE_QP][0] = now();
    for (i, id) in ids.iter().enumerate().filter(|&(i, _)| live(i)) {
        nodes.start(i, CREATE_QP);
        let r = maker.create_qp(id);
        ret = code(r.is_ok());
        match r {
            Ok(qp) => qps[i] = Some(qp),
            Err(e) => {
                perror("failure creating qp", &e);
                nodes.nodes[i].error.store(true, Ordering::Relaxed);
                continue;
            }
        }
        nodes.end(i, CREATE_QP);
    }
    steps[CREATE_QP][1] = now();

    outln!("connecting");
    steps[CONNECT][0] = now();
    let mut started = 0;
    for (i, id) in ids.iter().enumerate().filter(|&(i, _)| live(i)) {
        nodes.start(i, CONNECT);
        let r = id.connect(&param);
        ret = code(r.is_ok());
        if let Err(e) = r {
            perror("failure rconnecting", &e);
            nodes.nodes[i].error.store(true, Ordering::Relaxed);
            continue;
        }
        started += 1;
    }
    nodes.wait(CONNECT, started);
    steps[CONNECT][1] = now();

    outln!("disconnecting");
    steps[DISCONNECT][0] = now();
    let mut started = 0;
    for (i, id) in ids.iter().enumerate().filter(|&(i, _)| live(i)) {
        nodes.start(i, DISCONNECT);
        // As in C, a failed disconnect is not checked: its event never
        // comes then, and the wait below does not end.
        let _ = id.disconnect();
        drop(qps[i].take());
        started += 1;
    }
    nodes.wait(DISCONNECT, started);
    steps[DISCONNECT][1] = now();
    ret
}

// ---------------------------------------------------------------------------
// The server.

/// An accepted connection: its id and QP, until it is disconnected.
struct Conn {
    id: Arc<CmId>,
    qp: QueuePair,
}

type Conns = Arc<Mutex<HashMap<u64, Conn>>>;

fn lock(conns: &Conns) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
    conns.lock().unwrap_or_else(|e| e.into_inner())
}

/// The request thread's work: a QP for the new id, then accept; on failure
/// reject and destroy the id.
fn accept_request(id: CmId, conns: &Conns, maker: &mut QpMaker) {
    let key = id.key();
    let qp = match maker.create_qp(&id) {
        Ok(qp) => qp,
        Err(e) => {
            perror("failure creating qp", &e);
            outln!("failing connection request");
            let _ = id.reject(&[]);
            return;
        }
    };
    // Known before the accept goes out, so that its disconnection, however
    // soon it comes, finds it.
    let id = Arc::new(id);
    lock(conns).insert(key, Conn { id: id.clone(), qp });
    if let Err(e) = id.accept(&ConnParam::new()) {
        perror("failure accepting", &e);
        drop(lock(conns).remove(&key));
        outln!("failing connection request");
        let _ = id.reject(&[]);
    }
}

/// The disconnect thread's work: disconnect, destroy the QP, destroy the id.
fn close_conn(conn: Conn) {
    let _ = conn.id.disconnect();
    drop(conn.qp);
    drop(conn.id);
}

fn server(ch: &EventChannel, o: &Options) -> i32 {
    let conns: Conns = Arc::default();
    let (req_tx, req_rx) = mpsc::channel::<CmId>();
    let (disc_tx, disc_rx) = mpsc::channel::<Conn>();
    let spawned = {
        let conns = conns.clone();
        std::thread::Builder::new()
            .name("requests".into())
            .spawn(move || {
                let mut maker = QpMaker::default();
                for id in req_rx {
                    accept_request(id, &conns, &mut maker);
                }
            })
    };
    if let Err(e) = spawned {
        eprintln!("failed to create req handler thread: {e}");
        return -1;
    }
    let spawned = std::thread::Builder::new()
        .name("disconnects".into())
        .spawn(move || disc_rx.into_iter().for_each(close_conn));
    if let Err(e) = spawned {
        eprintln!("failed to create disconnect handler thread: {e}");
        return -1;
    }

    let listen = match ch.create_id(PortSpace::Tcp) {
        Ok(id) => id,
        Err(e) => {
            perror("listen request failed", &e);
            return -1;
        }
    };
    let addr = match service_port(&o.port).and_then(|port| lookup(o.src.as_deref(), port)) {
        Ok(addr) => addr,
        Err(GaiError(code, text)) => {
            outln!("getrdmaaddr error: {text}");
            return code;
        }
    };
    if let Err(e) = listen.bind(addr) {
        perror("bind address failed", &e);
        return -1;
    }
    if let Err(e) = listen.listen(0) {
        perror("failure trying to listen", &e);
        return -1;
    }

    loop {
        let mut event = match ch.get_event() {
            Ok(event) => event,
            Err(e) => {
                perror("failure in rdma_get_cm_event in process_server_events", &e);
                return 0;
            }
        };
        let kind = event.kind();
        let key = event.id_key();
        let request = event.take_request();
        // Acknowledged before the work is handed on, so that the other
        // threads' destroy_id does not wait for it.
        drop(event);
        match kind {
            CmEventKind::ConnectRequest => {
                if let Some(id) = request {
                    let _ = req_tx.send(id);
                }
            }
            CmEventKind::Disconnected => {
                let conn = lock(&conns).remove(&key);
                if let Some(conn) = conn {
                    let _ = disc_tx.send(conn);
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------

fn main() -> ExitCode {
    quiet_pipe::install();
    let o = match parse_args() {
        Ok(o) => o,
        Err(code) => return code,
    };
    let ch = match EventChannel::new() {
        Ok(ch) => ch,
        Err(e) => {
            if e.errno() == Some(libc::ENODEV) {
                eprintln!("No RDMA devices were detected");
            } else {
                perror("failed to create RDMA CM event channel", &e);
            }
            flush_out();
            return ExitCode::from(1);
        }
    };
    match o.dst.clone() {
        Some(dst) => client(&ch, &o, &dst),
        None => {
            let ret = server(&ch, &o);
            flush_out();
            status(ret)
        }
    }
}

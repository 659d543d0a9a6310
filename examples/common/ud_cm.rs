//! What the `udaddy` and `mckey` examples share: output buffered the way C's
//! stdio buffers it, a `getopt` that behaves like glibc's, C's number
//! parsing, address lookup with `getaddrinfo`'s error texts, and a "node":
//! one CM id with its PD, CQ, UD queue pair and message buffers, as both C
//! programs build it (`init_node`, `post_recvs`, `post_sends`, `poll_cqs`).
//!
//! Each example includes this file with
//! `#[path = "common/ud_cm.rs"] mod ud_cm;` and uses the parts it needs.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::{self, IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Mutex;

#[path = "gai.rs"]
mod gai;

use rdma_verbs::cm::{CmId, EventChannel, UDP_QKEY};
use rdma_verbs::qp::{QKey, QpNum, RecvWr, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, AddressHandle, CompletionQueue, Error, Gid, ProtectionDomain, QpCaps, QpInitAttr,
    QpType, QueuePair, SharedChunk, WorkCompletion,
};

/// Bytes of GRH in front of every UD receive (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;

// ---------------------------------------------------------------------------
// Output: stdout buffered as stdio buffers it, stderr unbuffered
// ---------------------------------------------------------------------------

/// Where [`say`] writes: straight through on a terminal (stdio's line
/// buffering), or a 4 KiB buffer otherwise (stdio's full buffering of a pipe
/// or file), so that with `2>&1` the lines come in the C program's order.
enum Sink {
    Terminal,
    Buffered(io::BufWriter<io::Stdout>),
}

static STDOUT: Mutex<Option<Sink>> = Mutex::new(None);

/// `printf("%s\n", line)`.
pub fn say(line: impl Display) {
    let mut guard = STDOUT.lock().unwrap_or_else(|e| e.into_inner());
    let sink = guard.get_or_insert_with(|| {
        if io::stdout().is_terminal() {
            Sink::Terminal
        } else {
            Sink::Buffered(io::BufWriter::with_capacity(4096, io::stdout()))
        }
    });
    // Like printf, a failed write is not reported.
    let _ = match sink {
        Sink::Terminal => writeln!(io::stdout(), "{line}"),
        Sink::Buffered(w) => writeln!(w, "{line}"),
    };
}

/// Writes out what [`say`] buffered.
pub fn flush() {
    let mut guard = STDOUT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Sink::Buffered(w)) = guard.as_mut() {
        let _ = w.flush();
    }
}

/// `exit(status)`: flushes stdout, exits with `status` (the shell sees its
/// low 8 bits, as for C: -1 is 255).
pub fn exit(status: i32) -> ! {
    flush();
    std::process::exit(status)
}

/// A line on stderr, unbuffered, in one write.
pub fn warn(line: impl Display) {
    let _ = io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// `strerror(errno)`.
pub fn strerror(errno: i32) -> String {
    let text = io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    text.strip_suffix(&suffix).unwrap_or(&text).to_owned()
}

/// `perror(what)` with `errno` set to `errno`.
pub fn perror(what: &str, errno: i32) {
    warn(format_args!("{what}: {}", strerror(errno)));
}

/// The `errno` a C program would have seen for a crate error: the one the
/// library reported, or, for a request the crate refused before calling
/// the library, what the library says for such a request (`EINVAL`, or
/// `EOPNOTSUPP` for something the device does not do).
pub fn errno_of(e: &Error) -> i32 {
    if let Some(errno) = e.errno() {
        return errno;
    }
    match e {
        Error::Unsupported { .. } => libc::EOPNOTSUPP,
        Error::NoDevices | Error::DeviceNotFound(_) => libc::ENODEV,
        _ => libc::EINVAL,
    }
}

/// `create_first_event_channel()` of rdma-core's `common.c`: the event
/// channel, or `None` after saying why not (on stderr).
pub fn create_first_event_channel() -> Option<EventChannel> {
    match EventChannel::new() {
        Ok(ch) => Some(ch),
        Err(e) => {
            let errno = errno_of(&e);
            if errno == libc::ENODEV {
                warn("No RDMA devices were detected");
            } else {
                perror("failed to create RDMA CM event channel", errno);
            }
            None
        }
    }
}

// ---------------------------------------------------------------------------
// Command line: glibc's getopt and C's number parsing
// ---------------------------------------------------------------------------

/// The program name as typed (`argv[0]`) and the arguments.
pub fn args() -> Vec<String> {
    std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// What [`Getopt`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// An option and its argument, if it takes one.
    Opt(char, Option<String>),
    /// An unknown option, or one without its argument: glibc's message is
    /// on stderr already (`prog: invalid option -- 'x'`).
    Bad,
}

/// `getopt(argc, argv, spec)` as glibc runs it: options may come after
/// other arguments (which are skipped), may be grouped (`-so`), and take
/// their argument from the rest of the word (`-C5`) or from the next word
/// (`-C 5`, even `-c -1`); `--` ends the options.
pub struct Getopt<'a> {
    args: &'a [String],
    spec: &'static str,
    /// The word being read.
    word: usize,
    /// The byte in it (0: the next word starts).
    pos: usize,
}

impl<'a> Getopt<'a> {
    /// Reads `args` (`argv`, with the program name first) against `spec`.
    pub fn new(args: &'a [String], spec: &'static str) -> Self {
        Getopt {
            args,
            spec,
            word: 1,
            pos: 0,
        }
    }

    fn prog(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    /// Whether option `c` exists and whether it takes an argument.
    fn lookup(&self, c: char) -> Option<bool> {
        if c == ':' {
            return None;
        }
        let at = self.spec.find(c)?;
        Some(self.spec[at + c.len_utf8()..].starts_with(':'))
    }
}

impl Iterator for Getopt<'_> {
    type Item = Got;

    fn next(&mut self) -> Option<Got> {
        if self.pos == 0 {
            loop {
                let w = self.args.get(self.word)?;
                if w == "--" {
                    return None;
                }
                if w.len() > 1 && w.starts_with('-') {
                    self.pos = 1;
                    break;
                }
                // Not an option: glibc moves it to the end; these programs
                // never read it.
                self.word += 1;
            }
        }
        let w = &self.args[self.word];
        let c = w[self.pos..].chars().next()?;
        self.pos += c.len_utf8();
        let rest = &w[self.pos..];
        let at_end = rest.is_empty();
        let step = |g: &mut Self| {
            g.word += 1;
            g.pos = 0;
        };
        match self.lookup(c) {
            None => {
                warn(format_args!("{}: invalid option -- '{c}'", self.prog()));
                if at_end {
                    step(self);
                }
                Some(Got::Bad)
            }
            Some(false) => {
                if at_end {
                    step(self);
                }
                Some(Got::Opt(c, None))
            }
            Some(true) if !at_end => {
                let arg = rest.to_owned();
                step(self);
                Some(Got::Opt(c, Some(arg)))
            }
            Some(true) => match self.args.get(self.word + 1) {
                Some(arg) => {
                    let arg = arg.clone();
                    self.word += 2;
                    self.pos = 0;
                    Some(Got::Opt(c, Some(arg)))
                }
                None => {
                    warn(format_args!(
                        "{}: option requires an argument -- '{c}'",
                        self.prog()
                    ));
                    step(self);
                    Some(Got::Bad)
                }
            },
        }
    }
}

/// The sign, magnitude and overflow of the number at the start of `s`, as
/// `strtol`/`strtoul` read it (leading space, a sign, `0x` or `0` prefixes
/// for base 0, digits up to the first that is not one).
fn c_number(s: &str, base: u32) -> (bool, u64, bool) {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let hex_prefix = (s.starts_with("0x") || s.starts_with("0X"))
        && s[2..].chars().next().is_some_and(|c| c.is_ascii_hexdigit());
    let (base, digits) = match base {
        0 if hex_prefix => (16, &s[2..]),
        0 if s.starts_with('0') => (8, s),
        0 => (10, s),
        16 if hex_prefix => (16, &s[2..]),
        b => (b, s),
    };
    let mut value: u64 = 0;
    let mut overflow = false;
    for d in digits.chars().map_while(|c| c.to_digit(base)) {
        match value
            .checked_mul(u64::from(base))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
    }
    (neg, value, overflow)
}

/// `strtol(s, NULL, base)`.
pub fn strtol(s: &str, base: u32) -> i64 {
    let (neg, mag, overflow) = c_number(s, base);
    match (neg, overflow) {
        (false, true) => i64::MAX,
        (true, true) => i64::MIN,
        (false, false) => i64::try_from(mag).unwrap_or(i64::MAX),
        (true, false) => i64::try_from(-i128::from(mag)).unwrap_or(i64::MIN),
    }
}

/// `strtoul(s, NULL, base)` (a minus sign negates, modulo 2^64).
pub fn strtoul(s: &str, base: u32) -> u64 {
    let (neg, mag, overflow) = c_number(s, base);
    match (neg, overflow) {
        (_, true) => u64::MAX,
        (false, false) => mag,
        (true, false) => mag.wrapping_neg(),
    }
}

/// `atoi(s)`: glibc's `(int) strtol(s, NULL, 10)`.
pub fn atoi(s: &str) -> i32 {
    strtol(s, 10) as i32
}

/// `strncasecmp(word, arg, n) == 0`: whether the first `n` bytes of `arg`
/// spell `word` (of `n` bytes), ignoring case.
pub fn prefix_is(word: &str, arg: &str, n: usize) -> bool {
    arg.len() >= n && arg.as_bytes()[..n].eq_ignore_ascii_case(&word.as_bytes()[..n])
}

// ---------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------

/// A failed `getaddrinfo`: its return code (`EAI_*`) and `gai_strerror`.
#[derive(Debug, Clone)]
pub struct GaiError {
    pub code: i32,
    pub text: String,
}

impl GaiError {
    /// The error for `EAI_*` code `code`.
    pub fn code(code: i32) -> Self {
        GaiError {
            code,
            text: gai::text_of(code).to_owned(),
        }
    }

    /// Recovers the code from the standard library's lookup error, whose
    /// message is "failed to lookup address information: " and the
    /// `gai_strerror` text (or an OS error, for `EAI_SYSTEM`).
    fn from_io(e: &io::Error) -> Self {
        match gai::code_of(&gai::text_in(e)) {
            Some(code) => GaiError::code(code),
            None => GaiError::code(-11),
        }
    }
}

/// The first address `getaddrinfo(host, port)` gives (glibc's order), or
/// with `numeric_only` (`AI_NUMERICHOST`) the address `host` spells.
pub fn lookup(host: &str, port: u16, numeric_only: bool) -> Result<SocketAddr, GaiError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if numeric_only {
        return Err(GaiError::code(-2));
    }
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| GaiError::code(-2)),
        Err(e) => Err(GaiError::from_io(&e)),
    }
}

/// The wildcard address a passive `getaddrinfo(NULL, port)` gives first.
pub fn wildcard(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
}

/// `inet_ntop(AF_INET6, gid)` as glibc writes it: like Rust's IPv6
/// display, except for the "IPv4-compatible" form `::a.b.c.d`.
pub fn inet_ntop6(gid: &Gid) -> String {
    let b = gid.0;
    let word6 = u16::from_be_bytes([b[12], b[13]]);
    if b[..12].iter().all(|&x| x == 0) && word6 != 0 {
        return format!("::{}", Ipv4Addr::new(b[12], b[13], b[14], b[15]));
    }
    Ipv6Addr::from(b).to_string()
}

// ---------------------------------------------------------------------------
// Nodes: one CM id with its PD, CQ, UD QP and buffers
// ---------------------------------------------------------------------------

/// The settings every node is made with (the C programs' globals).
pub struct Test {
    /// "udaddy" or "mckey", in front of the messages.
    pub prog: &'static str,
    /// Messages per node (`-C`); set to 0 when `size` is 0, as in C.
    pub count: i32,
    /// Message size (`-S`).
    pub size: i32,
    /// How many nodes have not finished connecting or joining yet.
    pub connects_left: i32,
}

/// One connection (udaddy) or group member (mckey).
#[derive(Default)]
pub struct Node {
    pub id: Option<CmId>,
    pub connected: bool,
    pub pd: Option<ProtectionDomain>,
    pub cq: Option<CompletionQueue>,
    pub qp: Option<QueuePair>,
    pub ah: Option<AddressHandle>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
    /// The send buffer: `size + 40` bytes, like C's one message buffer.
    send_buf: Option<SharedChunk>,
}

impl Test {
    /// The length of C's message buffer, `size + sizeof(struct ibv_grh)`.
    fn buffer_len(&self) -> i64 {
        i64::from(self.size) + GRH_LEN as i64
    }

    /// `verify_test_params`: the message must fit the port's active MTU.
    pub fn verify_params(&self, node: &Node) -> i32 {
        let Some(id) = &node.id else {
            return libc::EINVAL;
        };
        let port = match id.context().and_then(|ctx| ctx.query_port(id.port_num())) {
            Ok(p) => p,
            Err(e) => return errno_of(&e),
        };
        let mtu = port.active_mtu.bytes() as i32;
        if self.count != 0 && self.size > mtu {
            say(format_args!(
                "{}: message_size {} is larger than active mtu {mtu}",
                self.prog, self.size
            ));
            return -libc::EINVAL;
        }
        0
    }

    /// `init_node`: PD, CQ, the UD QP (through the CM) and the message
    /// buffer. `block_loopback` (mckey's `-l`) asks for a QP that does not
    /// receive its own multicast, which this crate cannot create.
    pub fn init_node(&mut self, node: &mut Node, block_loopback: bool) -> i32 {
        let prog = self.prog;
        let Some(id) = &node.id else {
            return -libc::EINVAL;
        };
        let pd = match id.context().and_then(|ctx| ctx.alloc_pd()) {
            Ok(pd) => pd,
            Err(_) => {
                say(format_args!("{prog}: unable to allocate PD"));
                return -libc::ENOMEM;
            }
        };
        let node_pd = node.pd.insert(pd);
        let cqe = if self.count != 0 {
            self.count.wrapping_mul(2)
        } else {
            2
        };
        let cq = u32::try_from(cqe)
            .ok()
            .and_then(|cqe| node_pd.context().create_cq(cqe).ok());
        let Some(cq) = cq else {
            say(format_args!("{prog}: unable to create CQ"));
            return -libc::ENOMEM;
        };
        let cq: &CompletionQueue = node.cq.insert(cq);
        let wrs = if self.count != 0 {
            self.count as u32
        } else {
            1
        };
        let caps = QpCaps {
            max_send_wr: wrs,
            max_recv_wr: wrs,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        if block_loopback {
            // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: QpInitAttr has no create flags.
            perror(&format!("{prog}: unable to create QP"), libc::EOPNOTSUPP);
            return -1;
        }
        let attr = QpInitAttr::new(QpType::Ud, cq, cq).caps(caps);
        match id.create_qp(node_pd, &attr) {
            Ok(qp) => node.qp = Some(qp),
            Err(e) => {
                perror(&format!("{prog}: unable to create QP"), errno_of(&e));
                return -1;
            }
        }
        // create_message
        if self.size == 0 {
            self.count = 0;
        }
        if self.count == 0 {
            return 0;
        }
        let len = self.buffer_len();
        let chunk = match usize::try_from(len) {
            Err(_) => Err("failed message allocation"),
            Ok(len) => node_pd
                .alloc_chunks(1, len, AccessFlags::LOCAL_WRITE)
                .ok()
                .and_then(|mut v| v.pop())
                .ok_or("failed to reg MR"),
        };
        match chunk {
            Ok(chunk) => {
                node.send_buf = Some(SharedChunk::new(chunk));
                0
            }
            Err(why) => {
                say(why);
                say(format_args!("{prog}: failed to create messages: -1"));
                -1
            }
        }
    }

    /// `post_recvs`: `count` receives of `size + 40` bytes each.
    pub fn post_recvs(&self, node: &mut Node) -> i32 {
        if self.count <= 0 {
            return 0;
        }
        let (Some(pd), Some(qp)) = (&node.pd, &mut node.qp) else {
            return libc::EINVAL;
        };
        let posted = usize::try_from(self.buffer_len())
            .map_err(|_| libc::ENOMEM)
            .and_then(|len| {
                pd.alloc_chunks(self.count as usize, len, AccessFlags::LOCAL_WRITE)
                    .map_err(|e| errno_of(&e))
            })
            .and_then(|bufs| {
                qp.post_recv(
                    bufs.into_iter()
                        .enumerate()
                        .map(|(i, b)| RecvWr::new(i as u64).sge(b)),
                )
                .map_err(|e| errno_of(&e.error))
            });
        match posted {
            Ok(()) => 0,
            Err(errno) => {
                say(format_args!("failed to post receives: {errno}"));
                errno
            }
        }
    }

    /// `post_sends`: `count` SEND_WITH_IMM of `size` bytes to the node's
    /// address handle, the immediate data being our own QP number (which a
    /// udaddy server replies to); signalled or not.
    pub fn post_sends(&self, node: &mut Node, signaled: bool) -> i32 {
        if !node.connected || self.count <= 0 {
            return 0;
        }
        let (Some(qp), Some(buf)) = (&mut node.qp, &node.send_buf) else {
            return 0;
        };
        let posted = match (&node.ah, QpNum::new(node.remote_qpn)) {
            (Some(ah), Ok(qpn)) => {
                let own = qp.qp_num();
                let qkey = QKey(node.remote_qkey);
                let len = usize::try_from(self.size).unwrap_or(usize::MAX);
                qp.post_send((0..self.count).map(|i| {
                    let wr = SendWr::new(i as u64, SendOp::SendWithImm(own.get()))
                        .ud(ah, qpn, qkey)
                        .sge_shared(buf, len);
                    if signaled {
                        wr
                    } else {
                        wr.unsignaled()
                    }
                }))
                .map_err(|e| errno_of(&e.error))
            }
            _ => Err(libc::EINVAL),
        };
        match posted {
            Ok(()) => 0,
            Err(errno) => {
                say(format_args!("failed to post sends: {errno}"));
                errno
            }
        }
    }

    /// `poll_cqs`: waits until every connected node has `count`
    /// completions (of any status: the C programs only count them). With
    /// `reply`, a node without an address handle makes one back to the
    /// sender of its first datagram, whose QP number is in the immediate
    /// data (udaddy's server).
    pub fn poll_cqs(&self, nodes: &mut [Node], reply: bool) -> i32 {
        let mut wcs = [WorkCompletion::default(); 8];
        for node in nodes.iter_mut().filter(|n| n.connected) {
            let mut done = 0;
            while done < self.count {
                let Some(cq) = &node.cq else { break };
                let got = match cq.poll(&mut wcs) {
                    Ok(got) => got,
                    Err(e) => {
                        let ret = -errno_of(&e);
                        say(format_args!("{}: failed polling CQ: {ret}", self.prog));
                        return ret;
                    }
                };
                if got.is_empty() {
                    std::thread::yield_now();
                    continue;
                }
                let mut grh = None;
                if let Some(qp) = &mut node.qp {
                    for (i, wc) in got.iter().enumerate() {
                        qp.reclaim(wc, |c| {
                            if i == 0 {
                                grh = c
                                    .into_chunk()
                                    .and_then(|c| c.as_slice().get(..GRH_LEN)?.try_into().ok());
                            }
                        });
                    }
                }
                if reply && node.ah.is_none() {
                    create_reply_ah(node, &got[0], grh.as_ref());
                }
                done += got.len() as i32;
            }
        }
        0
    }
}

/// `create_reply_ah`: the address handle back to the sender of `wc`, the
/// sender's QP number from the immediate data, and our own QP's Q_Key.
/// A handle that cannot be made stays missing, as in C.
fn create_reply_ah(node: &mut Node, wc: &WorkCompletion, grh: Option<&[u8; GRH_LEN]>) {
    let (Some(id), Some(pd), Some(qp)) = (&node.id, &node.pd, &node.qp) else {
        return;
    };
    let zero = [0; GRH_LEN];
    node.ah = pd
        .create_ah_from_wc(id.port_num(), wc, grh.unwrap_or(&zero))
        .ok();
    node.remote_qpn = wc.imm_data().unwrap_or(0);
    node.remote_qkey = qp.query().map_or(UDP_QKEY, |(attr, _)| attr.qkey.0);
}

/// `connections` empty nodes, or `None` where C's `malloc` would fail
/// (a negative count, or no memory).
pub fn alloc_nodes(connections: i32) -> Option<Vec<Node>> {
    let n = usize::try_from(connections).ok()?;
    let mut nodes = Vec::new();
    nodes.try_reserve_exact(n).ok()?;
    nodes.resize_with(n, Node::default);
    Some(nodes)
}

/// An id in port space `ps` (a C enum value) for every node, on `ch`;
/// exits with status 1, as the C programs do, when one cannot be made.
pub fn create_ids(ch: &EventChannel, nodes: &mut [Node], ps: u32) {
    for node in nodes {
        let Some(ps) = rdma_verbs::cm::PortSpace::from_raw(ps) else {
            exit(1)
        };
        match ch.create_id(ps) {
            Ok(id) => node.id = Some(id),
            Err(_) => exit(1),
        }
    }
}

impl Test {
    /// An error event: the C programs' `PROG: event: NAME, error: STATUS`
    /// line; one node fewer to wait for; the status as the handler's result.
    pub fn event_error(&mut self, ev: &rdma_verbs::cm::CmEvent) -> i32 {
        say(format_args!(
            "{}: event: {}, error: {}",
            self.prog,
            ev.kind().c_name(),
            ev.status()
        ));
        self.connects_left -= 1;
        ev.status()
    }

    /// The settings of `prog` for `connections` nodes.
    pub fn new(prog: &'static str, count: i32, size: i32, connections: i32) -> Self {
        Test {
            prog,
            count,
            size,
            connects_left: connections,
        }
    }
}

impl Node {
    /// `destroy_node`: the address handle, QP, CQ, buffers, PD, then the id.
    pub fn destroy(mut self) {
        drop(self.ah.take());
        drop(self.qp.take());
        drop(self.cq.take());
        drop(self.send_buf.take());
        drop(self.pd.take());
        drop(self.id.take());
    }
}

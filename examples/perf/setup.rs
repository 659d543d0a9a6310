//! Bringing the QPs up: device, PD, CQ, the QPs, the region peers use, the
//! TCP exchange of endpoints, and the per-size handshake.
//!
//! The TCP protocol is lines of text:
//! 1. client: `PERF1 <fingerprint>`; server: `OK` (or `ERR <why>`): both
//!    ends were given the same test and options;
//! 2. client: one `QP <endpoint> <buffer>` per QP (the buffer in
//!    [`RemoteBuf`]'s text form, `ADDR:RKEY:LEN`); the server connects
//!    its QPs and answers with its own lines; the client connects;
//! 3. per size: client `SIZE <n>`, server (receives posted) `READY`, the
//!    client runs, client `DONE <ops>`, server `DONE <ops>` once its side
//!    is finished; at the end client `BYE`.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn, RemoteAddr, RemoteBuf, SendOpsFlags};
use rdma_verbs::tokio::AsyncCq;
use rdma_verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, LinkLayer, MemoryRegion,
    ProtectionDomain, QpCaps, QpInitAttr, QpType, QueuePair, WorkCompletion,
};

use crate::opts::{AtomicType, Opts, PathKind, Verb};
use crate::path::Progress;
use crate::pingpong::{open_device, OrFail, Res};
use crate::wait;

/// An open device with its QPs connected.
pub struct Conn {
    /// Declared first so that they are destroyed before any region below.
    pub qps: Vec<QueuePair>,
    pub cq: CompletionQueue,
    pub channel: Option<CompletionChannel>,
    /// `--async`: the CQ's `AsyncCq` and the runtime its waits run on.
    pub async_wait: Option<AsyncWait>,
    /// This end's region that the peer writes, reads or runs atomics on.
    pub target: MemoryRegion,
    /// The peer's region, per QP.
    pub remote: Vec<RemoteAddr>,
    pub pd: ProtectionDomain,
    pub ctx: Context,
    pub local_eps: Vec<Endpoint>,
    pub remote_eps: Vec<Endpoint>,
    pub mtu: u32,
    pub link: LinkLayer,
    pub gid_index: Option<u8>,
    pub max_inline: u32,
    /// The QPs' rd_atomic setting (reads and atomics in flight per QP).
    pub rd_atomic: u8,
}

/// `--async`: waits through tokio's reactor. A current-thread runtime
/// whose `block_on` runs each wait: it sleeps in `epoll_wait` on the CQ's
/// completion channel and wakes the wait's task, as a task of an async
/// program is woken.
pub struct AsyncWait {
    pub cq: AsyncCq,
    pub rt: tokio::runtime::Runtime,
}

impl Conn {
    /// One poll of the CQ into `wcs` (through the `AsyncCq` with
    /// `--async`, which hands out first what its wait polled), counted in `p`.
    #[inline]
    pub fn poll(&mut self, wcs: &mut [WorkCompletion], p: &mut Progress) -> Res<usize> {
        p.polls += 1;
        let got = match &mut self.async_wait {
            Some(a) => a.cq.try_poll(wcs),
            None => self.cq.poll(wcs),
        };
        let n = got.or_fail("poll CQ failed")?.len();
        if n == 0 {
            p.empty_polls += 1;
        }
        Ok(n)
    }

    /// Blocks until the CQ has a completion event (`-e`), then re-arms it;
    /// with `--async`, until the `AsyncCq` has a completion.
    pub fn wait_event(&mut self) -> Res<()> {
        if let Some(a) = &mut self.async_wait {
            wait::arm_cq_event(wait::stall_limit());
            let r = a.rt.block_on(a.cq.ready());
            wait::disarm();
            return r.or_fail("Failed to wait for a completion");
        }
        let ch = self
            .channel
            .as_ref()
            .ok_or("internal: no completion channel")?;
        wait::arm_cq_event(wait::stall_limit());
        let ev = ch.get_event();
        wait::disarm();
        let ev = ev.or_fail("Failed to get cq_event")?;
        if !ev.is_for(&self.cq) {
            return Err("CQ event for an unknown CQ".into());
        }
        self.cq
            .req_notify(false)
            .or_fail("Couldn't request CQ notification")
    }
}

/// The TCP control connection.
pub struct Ctrl {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Ctrl {
    pub fn send(&mut self, line: &str) -> Res<()> {
        self.writer
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("TCP write to the peer failed: {e}"))
    }

    /// The next line, waiting at most `limit`.
    pub fn recv(&mut self, limit: Duration, what: &str) -> Res<String> {
        self.writer
            .set_read_timeout(Some(limit))
            .or_fail("TCP set_read_timeout")?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(format!(
                "the peer closed the TCP connection (waiting for {what})"
            )),
            Ok(_) => Ok(line.trim_end().to_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(format!(
                    "timed out after {limit:.0?} waiting for {what} from the peer"
                ))
            }
            Err(e) => Err(format!("TCP read failed waiting for {what}: {e}")),
        }
    }

    /// The next line, which must start with `word`; returns the rest.
    pub fn expect(&mut self, word: &str, limit: Duration) -> Res<String> {
        let line = self.recv(limit, word)?;
        if let Some(rest) = line.strip_prefix("ERR ") {
            return Err(format!("the peer failed: {rest}"));
        }
        match line.strip_prefix(word) {
            Some(rest) => Ok(rest.trim().to_owned()),
            None => Err(format!("protocol error: expected {word}, got '{line}'")),
        }
    }
}

fn stream_ctrl(sock: TcpStream) -> Res<Ctrl> {
    sock.set_nodelay(true).or_fail("TCP_NODELAY")?;
    let writer = sock.try_clone().or_fail("TCP socket clone")?;
    Ok(Ctrl {
        reader: BufReader::new(sock),
        writer,
    })
}

/// Waits (with a deadline) for one client on `port`.
pub fn accept(port: u16) -> Res<Ctrl> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .or_else(|_| TcpListener::bind(("::", port)))
        .map_err(|e| format!("Couldn't listen to TCP port {port} ({e})"))?;
    listener
        .set_nonblocking(true)
        .or_fail("TCP set_nonblocking")?;
    println!("\n************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    let limit = wait::handshake_limit() * 2;
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((sock, _)) => {
                sock.set_nonblocking(false).or_fail("TCP set_nonblocking")?;
                return stream_ctrl(sock);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() > limit {
                    return Err(format!(
                        "timed out after {limit:.0?} waiting for a client on TCP port {port}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("accept() failed: {e}")),
        }
    }
}

/// Connects to the server, retrying for a while (it may still be starting).
pub fn dial(host: &str, port: u16) -> Res<Ctrl> {
    let limit = wait::handshake_limit();
    let start = Instant::now();
    loop {
        let addrs = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{e} for {host}:{port}"))?;
        let mut last = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
                Ok(s) => return stream_ctrl(s),
                Err(e) => last = Some(e),
            }
        }
        if start.elapsed() > limit {
            return Err(format!(
                "Couldn't connect to {host}:{port} within {limit:.0?} ({})",
                last.map_or("no address".into(), |e| e.to_string())
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn random_psn() -> Psn {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
        .unwrap_or(0);
    let x = t.wrapping_mul(2_654_435_761) ^ std::process::id().wrapping_mul(40_503);
    Psn::truncate(x)
}

/// Receive-queue depth per QP (send tests only).
pub fn rx_depth(o: &Opts) -> usize {
    if o.test.verb() == Verb::Send {
        o.rx_depth
    } else {
        1
    }
}

/// `--ex`: the one operation the test posts, which is all its extended
/// QPs are created for (both ends: the server of a passive test never
/// posts, but its QP is made the same way).
pub fn send_ops(o: &Opts) -> SendOpsFlags {
    match (o.test.verb(), o.atomic) {
        (Verb::Send, _) => SendOpsFlags::SEND,
        (Verb::Write, _) => SendOpsFlags::RDMA_WRITE,
        (Verb::Read, _) => SendOpsFlags::RDMA_READ,
        (Verb::Atomic, AtomicType::FetchAndAdd) => SendOpsFlags::ATOMIC_FETCH_AND_ADD,
        (Verb::Atomic, AtomicType::CmpAndSwap) => SendOpsFlags::ATOMIC_CMP_AND_SWP,
    }
}

/// Opens the device, creates everything, exchanges endpoints over `ctrl`
/// and connects the QPs.
pub fn connect(o: &Opts, ctrl: &mut Ctrl) -> Res<Conn> {
    let ctx = open_device(o.dev.as_deref())?;
    let port = ctx
        .query_port(o.ib_port)
        .or_fail("Couldn't query the port")?;
    let gid_index = match (o.gid_index, port.link_layer) {
        (Some(g), _) => Some(g),
        (None, LinkLayer::Ethernet) => Some(0),
        (None, _) => None,
    };
    let pd = ctx.alloc_pd().or_fail("Couldn't allocate PD")?;
    let channel = if o.events && !o.async_wait {
        Some(CompletionChannel::new(&ctx).or_fail("Couldn't create completion channel")?)
    } else {
        None
    };
    let rx = rx_depth(o);
    let cqe = o.qps * (o.tx_depth + rx) + 16;
    let cqe = u32::try_from(cqe).map_err(|_| "CQ too large")?;
    let async_wait = if o.async_wait {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|e| format!("Couldn't start a tokio runtime: {e}"))?;
        let cq = {
            let _in = rt.enter();
            AsyncCq::new(&ctx, cqe).or_fail("Couldn't create the async CQ")?
        };
        Some(AsyncWait { cq, rt })
    } else {
        None
    };
    let cq = match (&async_wait, &channel) {
        (Some(a), _) => Ok(a.cq.cq().clone()),
        (None, Some(ch)) => ctx.create_cq_with_channel(cqe, ch, 0),
        (None, None) => ctx.create_cq(cqe),
    }
    .or_fail("Couldn't create CQ")?;
    if channel.is_some() {
        cq.req_notify(false)
            .or_fail("Couldn't request CQ notification")?;
    }
    let attr = ctx.attr();
    let rd_atomic = attr
        .max_qp_rd_atom
        .min(attr.max_qp_init_rd_atom)
        .clamp(1, 16) as u8;
    let caps = QpCaps {
        max_send_wr: o.tx_depth as u32,
        max_recv_wr: rx as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: o.inline_size as u32,
    };
    let mut qp_attr = QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps);
    if o.path == PathKind::Ex {
        qp_attr = qp_attr.send_ops(send_ops(o));
    }
    let mut qps = Vec::with_capacity(o.qps);
    for _ in 0..o.qps {
        qps.push(pd.create_qp(&qp_attr).or_fail("Couldn't create QP")?);
    }
    let max_inline = qps[0].caps().max_inline_data;
    let target = pd
        .register(
            o.max_size().max(64),
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .or_fail("Couldn't register the target region")?;
    let copts = ConnectOptions {
        port: o.ib_port,
        gid_index,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        max_rd_atomic: rd_atomic,
        max_dest_rd_atomic: rd_atomic,
        ..Default::default()
    };
    let mut local_eps = Vec::with_capacity(o.qps);
    let mut psns = Vec::with_capacity(o.qps);
    for qp in &qps {
        let psn = random_psn();
        psns.push(psn);
        local_eps.push(
            qp.local_endpoint(&copts, psn)
                .or_fail("Couldn't get the local endpoint")?,
        );
    }
    let limit = wait::handshake_limit();
    let target_buf = target
        .remote_buf()
        .or_fail("Couldn't describe the target region")?;
    let lines: Vec<String> = local_eps
        .iter()
        .map(|ep| format!("QP {ep} {target_buf}"))
        .collect();
    // The most any operation of this run reaches at the peer's address.
    let reach = o.max_size().max(64) as u64;
    let fp = o.fingerprint();
    let mut remote_eps = Vec::with_capacity(o.qps);
    let mut remote = Vec::with_capacity(o.qps);
    let mut read_peer = |ctrl: &mut Ctrl| -> Res<()> {
        for _ in 0..o.qps {
            let rest = ctrl.expect("QP ", limit)?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [ep, buf] = f[..] else {
                return Err(format!("protocol error: bad QP line '{rest}'"));
            };
            let ep: Endpoint = ep.parse().or_fail("bad endpoint from the peer")?;
            let buf: RemoteBuf = buf.parse().or_fail("bad buffer from the peer")?;
            remote_eps.push(ep);
            remote.push(
                buf.at(0, reach)
                    .or_fail("the peer's buffer is smaller than this run's largest operation")?,
            );
        }
        Ok(())
    };
    let connect_all = |qps: &mut Vec<QueuePair>, remote_eps: &[Endpoint]| -> Res<()> {
        for (i, qp) in qps.iter_mut().enumerate() {
            qp.connect(&copts, psns[i], &remote_eps[i])
                .or_fail("Couldn't connect the QP")?;
        }
        Ok(())
    };
    if o.server.is_some() {
        ctrl.send(&format!("PERF1 {fp}"))?;
        ctrl.expect("OK", limit)?;
        for l in &lines {
            ctrl.send(l)?;
        }
        read_peer(ctrl)?;
        connect_all(&mut qps, &remote_eps)?;
    } else {
        let theirs = ctrl.expect("PERF1 ", limit)?;
        if theirs != fp {
            let msg =
                format!("the ends were given different options: server {fp}, client {theirs}");
            ctrl.send(&format!("ERR {msg}"))?;
            return Err(msg);
        }
        ctrl.send("OK")?;
        read_peer(ctrl)?;
        if let Err(e) = connect_all(&mut qps, &remote_eps) {
            let _ = ctrl.send(&format!("ERR {e}"));
            return Err(e);
        }
        for l in &lines {
            ctrl.send(l)?;
        }
    }
    Ok(Conn {
        qps,
        cq,
        channel,
        async_wait,
        target,
        remote,
        pd,
        ctx,
        local_eps,
        remote_eps,
        mtu: port.active_mtu.bytes(),
        link: port.link_layer,
        gid_index,
        max_inline,
        rd_atomic,
    })
}

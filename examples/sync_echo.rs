//! An echo server and client over RC through the connection manager, each
//! in one thread, without an async runtime (feature `cm`): the blocking
//! twin of `async_echo`, with the same command line and output.
//!
//! ```text
//! sync_echo [OPTIONS]          server: echo every message of every connection
//! sync_echo [OPTIONS] HOST     client: -c connections at once, -n round trips each
//!
//!   -p, --port=N          CM port (default 7472)
//!   -b, --bind=ADDR       server: the address to listen on (default 0.0.0.0)
//!   -c, --connections=N   client: connections at once (default 100)
//!   -n, --iters=N         client: round trips per connection (default 100)
//!   -s, --size=BYTES      message size, 8..=4096 (default 64)
//!   -x, --exit-after=N    server: exit once N connections have ended
//!                         (default: serve until killed)
//! ```
//!
//! The server is one loop in one thread. The CM events of the listener
//! and of every connection it accepted arrive interleaved on one channel;
//! a [`CmRouter`] hands the loop those of the listener's family
//! ([`EventsOf::Listener`]): requests (accepted at once), `ESTABLISHED`,
//! `DISCONNECTED` (answered, and the connection dropped). Every
//! connection's QP is on one CQ, whose completions a [`CqRouter`] routes
//! to each connection's [`QpInbox`] by QP number: the loop never matches
//! a completion to a connection by hand. When neither has anything, the
//! loop sleeps in `poll(2)` ([`Poller`]) on the CM channel and the CQ's
//! completion channel, armed first.
//!
//! The client opens `-c` connections from one thread, all ids on one
//! [`CmRouter`] and all QPs on one CQ with a [`CqRouter`]: it starts each
//! step (resolve, route, connect) on every id, then collects the events
//! one id at a time with [`CmRouter::expect`], in the reverse order, so
//! that each wait keeps the events of the others for them. Each round it
//! sends message `i` on every connection, then waits for each echo in its
//! connection's inbox and checks every byte. At the end it prints one
//! line, as `async_echo` does:
//!
//! ```text
//! sync_echo: 8 connections, 800 round trips, 0 failed, rtt median 412.0 us p99 1650.3 us max 2911.6 us, 1.93 s
//! ```
//!
//! The server, at exit: `sync_echo: served 8 connections, 800 messages`.
//! Exit status 1 on any failure, 2 on a bad command line.

#[path = "common/echo_opts.rs"]
mod echo_opts;
#[path = "common/time.rs"]
mod time;

use echo_opts::{parse, Opts};

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::cm::{CmEventKind, CmId, CmRouter, ConnParam, EventsOf, PortSpace};
use rdma_verbs::qp::{RecvWr, RequestKind, SendOp, SendWr};
use rdma_verbs::wait::Poller;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionChannel, CompletionQueue, Context, CqRouter, ProtectionDomain,
    QpCaps, QpInbox, QpInitAttr, QpType, QueuePair, WorkCompletion,
};

type Res<T> = Result<T, String>;

/// Receives a server connection keeps posted.
const SERVER_RECVS: usize = 8;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse("sync_echo", &args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sync_echo: {e}");
            return ExitCode::from(2);
        }
    };
    let r = match &o.host {
        None => server(&o),
        Some(h) => client(&o, h),
    };
    match r {
        Ok(line) => {
            println!("sync_echo: {line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sync_echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn at(what: &str) -> impl Fn(rdma_verbs::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The server's per-device objects: a PD, and one CQ for every
/// connection's QP, with its completion channel and router.
struct Device {
    pd: ProtectionDomain,
    comp: CompletionChannel,
    cq: CompletionQueue,
    router: CqRouter,
}

impl Device {
    fn new(ctx: &Context) -> Res<Self> {
        let pd = ctx.alloc_pd().map_err(at("ibv_alloc_pd"))?;
        let comp = CompletionChannel::new(ctx).map_err(at("ibv_create_comp_channel"))?;
        comp.set_nonblocking(true).map_err(at("O_NONBLOCK"))?;
        let cq = ctx
            .create_cq_with_channel(8192, &comp, 0)
            .map_err(at("ibv_create_cq"))?;
        let router = CqRouter::new(&cq);
        Ok(Device {
            pd,
            comp,
            cq,
            router,
        })
    }
}

/// One server connection.
struct Conn {
    id: CmId,
    qp: QueuePair,
    inbox: QpInbox,
}

fn server(o: &Opts) -> Res<String> {
    let router = CmRouter::new().map_err(at("CM channel"))?;
    let listener = router
        .create_id(PortSpace::Tcp)
        .map_err(at("rdma_create_id"))?;
    listener
        .bind(SocketAddr::new(o.bind, o.port))
        .map_err(at("rdma_bind_addr"))?;
    listener.listen(1024).map_err(at("rdma_listen"))?;
    let mut devices: Vec<Device> = Vec::new();
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let (mut ended, mut messages) = (0u64, 0u64);
    let want = o.exit_after.unwrap_or(u64::MAX);
    let mut wcs = [WorkCompletion::default(); 16];
    while ended < want {
        let mut busy = false;
        // Every event of the listener and of the connections taken from it.
        while let Some(mut event) = router
            .try_next(EventsOf::Listener(&listener))
            .map_err(at("CM event"))?
        {
            busy = true;
            match event.kind() {
                CmEventKind::ConnectRequest => {
                    let Some(id) = event.take_request() else {
                        continue;
                    };
                    drop(event);
                    let conn = accept(id, &mut devices, o.size)?;
                    conns.insert(conn.id.key(), conn);
                }
                CmEventKind::Disconnected => {
                    let key = event.id_key();
                    drop(event);
                    if let Some(conn) = conns.remove(&key) {
                        // Answer the peer's disconnect (its own
                        // DISCONNECTED waits for it).
                        let _ = conn.id.disconnect();
                        ended += 1;
                    }
                }
                _ => {}
            }
        }
        for dev in &devices {
            dev.router.route().map_err(at("ibv_poll_cq"))?;
        }
        for conn in conns.values_mut() {
            if conn.inbox.queued() > 0 {
                busy = true;
                messages += echo(conn, &mut wcs)?;
            }
        }
        if !busy {
            sleep(&router, &devices)?;
        }
    }
    Ok(format!("served {ended} connections, {messages} messages"))
}

/// Makes the request's QP on the shared CQ of its device, posts its
/// receives and accepts it.
fn accept(id: CmId, devices: &mut Vec<Device>, size: usize) -> Res<Conn> {
    let ctx = id.context().map_err(at("the request's device"))?;
    let dev = match devices.iter().position(|d| d.pd.context().same_as(&ctx)) {
        Some(i) => i,
        None => {
            devices.push(Device::new(&ctx)?);
            devices.len() - 1
        }
    };
    let d = &devices[dev];
    let caps = QpCaps {
        max_send_wr: SERVER_RECVS as u32,
        max_recv_wr: SERVER_RECVS as u32,
        ..QpCaps::default()
    };
    let attr = QpInitAttr::new(QpType::Rc, &d.cq, &d.cq).caps(caps);
    let mut qp = id.create_qp(&d.pd, &attr).map_err(at("rdma_create_qp"))?;
    let inbox = d.router.register(&qp).map_err(at("register"))?;
    let bufs =
        d.pd.alloc_chunks(SERVER_RECVS, size, AccessFlags::LOCAL_WRITE)
            .map_err(at("buffers"))?;
    qp.post_recv(bufs.into_iter().map(|c| RecvWr::new(0).sge(c)))
        .map_err(|e| format!("post_recv: {e}"))?;
    id.accept(&ConnParam::new()).map_err(at("rdma_accept"))?;
    Ok(Conn { id, qp, inbox })
}

/// Echoes each message that arrived by sending the chunk it arrived in,
/// and posts each sent chunk as a receive again; how many messages.
fn echo(conn: &mut Conn, wcs: &mut [WorkCompletion]) -> Res<u64> {
    let mut messages = 0;
    for wc in conn.inbox.poll(wcs).map_err(at("ibv_poll_cq"))?.iter() {
        let done = conn.qp.reclaim_one(wc);
        if !wc.is_success() {
            // Flushed after the peer went away: its DISCONNECTED ends it.
            continue;
        }
        let Some(done) = done else { continue };
        let kind = done.kind;
        let Some(chunk) = done.into_chunk() else {
            continue;
        };
        if kind == RequestKind::Recv {
            messages += 1;
            let len = wc.byte_len() as usize;
            conn.qp
                .post_send([SendWr::new(0, SendOp::Send).sge_len(chunk, len)])
                .map_err(|e| format!("post_send: {e}"))?;
        } else {
            conn.qp
                .post_recv([RecvWr::new(0).sge(chunk)])
                .map_err(|e| format!("post_recv: {e}"))?;
        }
    }
    Ok(messages)
}

/// Sleeps until the CM channel or a CQ's completion channel has
/// something: each CQ is armed, then routed once more (what came before
/// the arm is found there), and only then does `poll(2)` wait.
fn sleep(router: &CmRouter, devices: &[Device]) -> Res<()> {
    for d in devices {
        // Read (and acknowledge) the events that woke us; EAGAIN ends it.
        while d.comp.get_event().is_ok() {}
        d.cq.req_notify(false).map_err(at("ibv_req_notify_cq"))?;
        if d.router.route().map_err(at("ibv_poll_cq"))? > 0 {
            return Ok(());
        }
    }
    // An event the router kept would not show on the descriptor: look.
    if router.kept() > 0 {
        return Ok(());
    }
    let mut poller = Poller::new();
    poller.add(router);
    for d in devices {
        poller.add(&d.comp);
    }
    poller
        .wait(Some(Duration::from_millis(200)))
        .map_err(at("poll"))?;
    Ok(())
}

/// One client connection.
struct Client {
    id: CmId,
    qp: QueuePair,
    inbox: QpInbox,
    send: Option<Chunk>,
}

fn client(o: &Opts, host: &str) -> Res<String> {
    let dst = (host, o.port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or(format!("{host}: no address"))?;
    let start = Instant::now();
    let t = time::scaled(Duration::from_secs(5));
    let router = CmRouter::new().map_err(at("CM channel"))?;
    let (_cqr, mut conns) = connect_all(&router, dst, o, t)?;
    let mut rtts = Vec::with_capacity(o.connections * o.iters as usize);
    let mut expect = vec![0u8; o.size];
    let mut wcs = [WorkCompletion::default(); 4];
    for i in 0..o.iters {
        let t0 = Instant::now();
        for (k, c) in conns.iter_mut().enumerate() {
            let mut send = c.send.take().ok_or("no send buffer")?;
            fill(send.as_mut_slice(), k as u32, i);
            c.qp.post_send([SendWr::new(u64::from(i), SendOp::Send).sge_len(send, o.size)])
                .map_err(|x| format!("connection {k}: post_send: {x}"))?;
        }
        for (k, c) in conns.iter_mut().enumerate() {
            fill(&mut expect, k as u32, i);
            round_trip(c, k, i, &expect, &mut wcs, t)?;
            rtts.push(t0.elapsed());
        }
    }
    for c in &conns {
        c.id.disconnect().map_err(at("rdma_disconnect"))?;
    }
    for (k, c) in conns.iter().enumerate().rev() {
        router
            .expect(&c.id, CmEventKind::Disconnected, t)
            .map_err(|e| format!("connection {k}: disconnect: {e}"))?;
    }
    Ok(summary(o, rtts, start.elapsed()))
}

/// The client's line: connections, round trips, the round-trip times.
fn summary(o: &Opts, mut rtts: Vec<Duration>, elapsed: Duration) -> String {
    rtts.sort();
    let pick = |q: f64| {
        let n = rtts.len();
        if n == 0 {
            return 0.0;
        }
        let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        rtts[i].as_secs_f64() * 1e6
    };
    format!(
        "{} connections, {} round trips, 0 failed, rtt median {:.1} us p99 {:.1} us max {:.1} us, {:.2} s",
        o.connections,
        rtts.len(),
        pick(0.5),
        pick(0.99),
        pick(1.0),
        elapsed.as_secs_f64()
    )
}

/// Opens `-c` connections on `router`, all QPs on one CQ: each step
/// starts on every id, then its events are collected one id at a time.
fn connect_all(
    router: &CmRouter,
    dst: SocketAddr,
    o: &Opts,
    t: Duration,
) -> Res<(CqRouter, Vec<Client>)> {
    let ids = (0..o.connections)
        .map(|_| router.create_id(PortSpace::Tcp))
        .collect::<Result<Vec<_>, _>>()
        .map_err(at("rdma_create_id"))?;
    // Each step starts on every id; the events come in any order, and
    // each wait takes its own id's (the reverse order keeps the most).
    for id in &ids {
        id.resolve_addr(None, dst, t)
            .map_err(at("rdma_resolve_addr"))?;
    }
    expect_each(router, &ids, CmEventKind::AddrResolved, t)?;
    for id in &ids {
        id.resolve_route(t).map_err(at("rdma_resolve_route"))?;
    }
    expect_each(router, &ids, CmEventKind::RouteResolved, t)?;
    let ctx = ids[0].context().map_err(at("the id's device"))?;
    let pd = ctx.alloc_pd().map_err(at("ibv_alloc_pd"))?;
    let cqe = u32::try_from(o.connections * 4).unwrap_or(u32::MAX);
    let cq = ctx.create_cq(cqe).map_err(at("ibv_create_cq"))?;
    let cqr = CqRouter::new(&cq);
    let mut conns = Vec::with_capacity(ids.len());
    for id in ids {
        conns.push(client_qp(id, &pd, &cqr, o.size)?);
    }
    for c in &conns {
        c.id.connect(&ConnParam::new())
            .map_err(at("rdma_connect"))?;
    }
    for (k, c) in conns.iter().enumerate().rev() {
        router
            .expect(&c.id, CmEventKind::Established, t)
            .map_err(|e| format!("connection {k}: connect: {e}"))?;
    }
    Ok((cqr, conns))
}

/// Waits for `kind` on each id, the last first.
fn expect_each(router: &CmRouter, ids: &[CmId], kind: CmEventKind, t: Duration) -> Res<()> {
    for (k, id) in ids.iter().enumerate().rev() {
        router
            .expect(id, kind, t)
            .map_err(|e| format!("connection {k}: {e}"))?;
    }
    Ok(())
}

/// The connection's QP on the shared CQ, its inbox, a receive posted.
fn client_qp(id: CmId, pd: &ProtectionDomain, cqr: &CqRouter, size: usize) -> Res<Client> {
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        ..QpCaps::default()
    };
    let attr = QpInitAttr::new(QpType::Rc, cqr.cq(), cqr.cq()).caps(caps);
    let mut qp = id.create_qp(pd, &attr).map_err(at("rdma_create_qp"))?;
    let inbox = cqr.register(&qp).map_err(at("register"))?;
    let mut bufs = pd
        .alloc_chunks(2, size, AccessFlags::LOCAL_WRITE)
        .map_err(at("buffers"))?;
    let send = bufs.pop().ok_or("no buffer")?;
    qp.post_recv(bufs.into_iter().map(|c| RecvWr::new(0).sge(c)))
        .map_err(|e| format!("post_recv: {e}"))?;
    Ok(Client {
        id,
        qp,
        inbox,
        send: Some(send),
    })
}

/// Waits in connection `k`'s inbox for its send and the echo of message
/// `i`, checks the echo, posts its chunk as a receive again.
fn round_trip(
    c: &mut Client,
    k: usize,
    i: u32,
    expect: &[u8],
    wcs: &mut [WorkCompletion],
    t: Duration,
) -> Res<()> {
    let mut echoed = false;
    while c.send.is_none() || !echoed {
        let got = c
            .inbox
            .wait(wcs, t)
            .map_err(|e| format!("connection {k}: round trip {i}: {e}"))?;
        for wc in got.iter() {
            if !wc.is_success() {
                return Err(format!("connection {k}: round trip {i}: {wc:?}"));
            }
            let done =
                c.qp.reclaim_one(wc)
                    .ok_or(format!("connection {k}: stray {wc:?}"))?;
            let kind = done.kind;
            let chunk = done
                .into_chunk()
                .ok_or("a request came back without its chunk")?;
            if kind == RequestKind::Send {
                c.send = Some(chunk);
                continue;
            }
            if chunk.as_slice() != expect || wc.byte_len() as usize != expect.len() {
                return Err(format!("connection {k}: round trip {i}: the echo differs"));
            }
            echoed = true;
            c.qp.post_recv([RecvWr::new(0).sge(chunk)])
                .map_err(|x| format!("connection {k}: post_recv: {x}"))?;
        }
    }
    Ok(())
}

/// The message of connection `k`, round trip `i`: `k`, `i`, then bytes
/// that depend on both.
fn fill(buf: &mut [u8], k: u32, i: u32) {
    buf[..4].copy_from_slice(&k.to_le_bytes());
    buf[4..8].copy_from_slice(&i.to_le_bytes());
    for (j, b) in buf[8..].iter_mut().enumerate() {
        *b = (k as usize + i as usize + j) as u8;
    }
}

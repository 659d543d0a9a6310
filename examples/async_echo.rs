//! An echo server and client over RC through the connection manager, on
//! tokio (features `cm` and `tokio`): a task per connection, no polling
//! thread, every message echoed from the buffer it arrived in.
//!
//! ```text
//! async_echo [OPTIONS]          server: echo every message of every connection
//! async_echo [OPTIONS] HOST     client: -c connections at once, -n round trips each
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
//! The server keeps every connection's QP on one CQ ([`SharedCq`], a
//! single descriptor however many connections there are), each
//! connection's completions routed to its task; all connections' CM events
//! arrive on the listener's channel ([`AsyncCmChannel`]) and are routed
//! by id. A task posts receives, echoes each message by sending the very
//! chunk it arrived in, and posts that chunk as a receive again once the
//! send completes; it ends at the peer's disconnect, which it answers.
//!
//! Each client connection has its own [`AsyncCq`] (all on one CM channel),
//! sends message `i` (its connection number and `i`, then a pattern),
//! waits for the echo and checks every byte. At the end it prints one line
//! with the connections, round trips, failures, and the round-trip latency
//! (median, 99th percentile, worst) over all connections:
//!
//! ```text
//! async_echo: 100 connections, 10000 round trips, 0 failed, rtt median 412.0 us p99 1650.3 us max 2911.6 us, 1.93 s
//! ```
//!
//! The server, at exit: `async_echo: served 100 connections, 10000 messages`.
//! Exit status 1 on any failure. On soft-RoCE: `async_echo -x 100` on one
//! side, `async_echo 192.168.0.1` (the rxe device's IPv4 address) on the
//! other.

#[path = "common/echo_opts.rs"]
mod echo_opts;
#[path = "common/time.rs"]
mod time;

use echo_opts::{parse, Opts};

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::cm::{CmEventKind, CmId, ConnParam, PortSpace};
use rdma_verbs::qp::{RecvWr, RequestKind, SendOp, SendWr};
use rdma_verbs::tokio::{AsyncCmChannel, AsyncCq, SharedCq};
use rdma_verbs::{
    AccessFlags, Chunk, Context, ProtectionDomain, QpCaps, QpInitAttr, QpType, QueuePair,
    WorkCompletion,
};

type Res<T> = Result<T, String>;

/// Receives a server connection keeps posted.
const SERVER_RECVS: usize = 8;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse("async_echo", &args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("async_echo: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async_echo: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async {
        match &o.host {
            None => server(&o).await,
            Some(h) => client(&o, h).await,
        }
    });
    match r {
        Ok(line) => {
            println!("async_echo: {line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("async_echo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn at(what: &str) -> impl Fn(rdma_verbs::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// What the server shares between its connections per device: a PD and
/// one CQ for every connection's QP.
#[derive(Clone)]
struct Device {
    pd: ProtectionDomain,
    cq: SharedCq,
}

async fn server(o: &Opts) -> Res<String> {
    let ch = AsyncCmChannel::new().map_err(at("CM channel"))?;
    let listener = ch.create_id(PortSpace::Tcp).map_err(at("rdma_create_id"))?;
    listener
        .bind(SocketAddr::new(o.bind, o.port))
        .map_err(at("rdma_bind_addr"))?;
    listener.listen(1024).map_err(at("rdma_listen"))?;
    let mut devices: Vec<Device> = Vec::new();
    let ended = Arc::new(tokio::sync::Semaphore::new(0));
    let messages = Arc::new(AtomicU64::new(0));
    let mut accepted = 0u64;
    let want = o.exit_after.unwrap_or(u64::MAX);
    while accepted < want {
        let mut req = ch
            .get_request(&listener)
            .await
            .map_err(at("connection request"))?;
        let Some(id) = req.take_request() else {
            continue;
        };
        drop(req);
        let ctx = id.context().map_err(at("the request's device"))?;
        let dev = match devices.iter().find(|d| d.pd.context().same_as(&ctx)) {
            Some(d) => d.clone(),
            None => {
                let d = Device {
                    pd: ctx.alloc_pd().map_err(at("ibv_alloc_pd"))?,
                    cq: SharedCq::new(&ctx, 8192).map_err(at("the shared CQ"))?,
                };
                devices.push(d.clone());
                d
            }
        };
        accepted += 1;
        let (ch, ended, messages, size) = (ch.clone(), ended.clone(), messages.clone(), o.size);
        tokio::spawn(async move {
            if let Err(e) = serve(&ch, &id, &dev, size, &messages).await {
                eprintln!("async_echo: connection from {:?}: {e}", id.peer_addr());
            }
            ended.add_permits(1);
        });
    }
    // Wait for every accepted connection to end.
    let n = u32::try_from(accepted).unwrap_or(u32::MAX);
    let _all = ended.acquire_many(n).await.map_err(|e| e.to_string())?;
    Ok(format!(
        "served {accepted} connections, {} messages",
        messages.load(Ordering::Relaxed)
    ))
}

/// One server connection: accept, echo until the peer disconnects.
async fn serve(
    ch: &AsyncCmChannel,
    id: &CmId,
    dev: &Device,
    size: usize,
    messages: &AtomicU64,
) -> Res<()> {
    let caps = QpCaps {
        max_send_wr: SERVER_RECVS as u32,
        max_recv_wr: SERVER_RECVS as u32,
        ..QpCaps::default()
    };
    let attr = QpInitAttr::new(QpType::Rc, dev.cq.cq(), dev.cq.cq()).caps(caps);
    let mut qp = id.create_qp(&dev.pd, &attr).map_err(at("rdma_create_qp"))?;
    let mut completions = dev.cq.register(&qp).map_err(at("register"))?;
    let bufs = dev
        .pd
        .alloc_chunks(SERVER_RECVS, size, AccessFlags::LOCAL_WRITE)
        .map_err(at("buffers"))?;
    qp.post_recv(
        bufs.into_iter()
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )
    .map_err(|e| format!("post_recv: {e}"))?;
    ch.accept(id, &ConnParam::new())
        .await
        .map_err(at("accept"))?;
    let mut wcs = [WorkCompletion::default(); 16];
    loop {
        // Both waits are cancel safe: whichever loses keeps its
        // completions or event for the next round.
        tokio::select! {
            got = completions.poll(&mut wcs) => {
                for wc in got.map_err(at("completions"))?.iter() {
                    if !wc.is_success() {
                        // Flushed after the peer went away: the disconnect
                        // event ends the loop.
                        qp.reclaim_one(wc);
                        continue;
                    }
                    let Some(done) = qp.reclaim_one(wc) else { continue };
                    let kind = done.kind;
                    let Some(chunk) = done.into_chunk() else { continue };
                    match kind {
                        RequestKind::Recv => {
                            messages.fetch_add(1, Ordering::Relaxed);
                            let len = wc.byte_len() as usize;
                            qp.post_send([SendWr::new(0, SendOp::Send).sge_len(chunk, len)])
                                .map_err(|e| format!("post_send: {e}"))?;
                        }
                        _ => qp
                            .post_recv([RecvWr::new(0).sge(chunk)])
                            .map_err(|e| format!("post_recv: {e}"))?,
                    }
                }
            }
            event = ch.next_event_for(id) => {
                let event = event.map_err(at("CM event"))?;
                if event.kind() == CmEventKind::Disconnected {
                    break;
                }
            }
        }
    }
    // Answer the peer's disconnect (its own DISCONNECTED waits for it).
    let _ = id.disconnect();
    Ok(())
}

/// What the client tasks add up.
#[derive(Default)]
struct Tally {
    rtts: Vec<Duration>,
    failures: Vec<String>,
}

async fn client(o: &Opts, host: &str) -> Res<String> {
    let dst = (host, o.port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or(format!("{host}: no address"))?;
    let ch = AsyncCmChannel::new().map_err(at("CM channel"))?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(o.connections);
    for k in 0..o.connections {
        let (ch, o) = (ch.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            connection(&ch, dst, k as u32, &o).await
        }));
    }
    let mut tally = Tally::default();
    for t in tasks {
        match t.await {
            Ok(Ok(rtts)) => tally.rtts.extend(rtts),
            Ok(Err(e)) => tally.failures.push(e),
            Err(e) => tally.failures.push(format!("task: {e}")),
        }
    }
    let elapsed = start.elapsed();
    tally.rtts.sort();
    let pick = |q: f64| {
        let n = tally.rtts.len();
        if n == 0 {
            return 0.0;
        }
        let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        tally.rtts[i].as_secs_f64() * 1e6
    };
    let line = format!(
        "{} connections, {} round trips, {} failed, rtt median {:.1} us p99 {:.1} us max {:.1} us, {:.2} s",
        o.connections,
        tally.rtts.len(),
        tally.failures.len(),
        pick(0.5),
        pick(0.99),
        pick(1.0),
        elapsed.as_secs_f64()
    );
    if let Some(first) = tally.failures.first() {
        return Err(format!("{line}\nfirst failure: {first}"));
    }
    Ok(line)
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

/// One client connection: connect, `iters` round trips, disconnect.
async fn connection(ch: &AsyncCmChannel, dst: SocketAddr, k: u32, o: &Opts) -> Res<Vec<Duration>> {
    let e =
        |what: &'static str| move |err: rdma_verbs::Error| format!("connection {k}: {what}: {err}");
    let id = ch.create_id(PortSpace::Tcp).map_err(e("rdma_create_id"))?;
    let t = time::scaled(Duration::from_secs(5));
    ch.resolve_addr(&id, None, dst, t)
        .await
        .map_err(e("resolve_addr"))?;
    ch.resolve_route(&id, t).await.map_err(e("resolve_route"))?;
    let ctx: Context = id.context().map_err(e("the id's device"))?;
    let pd = ctx.alloc_pd().map_err(e("ibv_alloc_pd"))?;
    let mut cq = AsyncCq::new(&ctx, 8).map_err(e("AsyncCq"))?;
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        ..QpCaps::default()
    };
    let attr = QpInitAttr::new(QpType::Rc, cq.cq(), cq.cq()).caps(caps);
    let mut qp: QueuePair = id.create_qp(&pd, &attr).map_err(e("rdma_create_qp"))?;
    let mut bufs = pd
        .alloc_chunks(2, o.size, AccessFlags::LOCAL_WRITE)
        .map_err(e("buffers"))?;
    let mut send: Chunk = bufs.pop().ok_or("no buffer")?;
    qp.post_recv([RecvWr::new(0).sge(bufs.pop().ok_or("no buffer")?)])
        .map_err(|x| format!("connection {k}: post_recv: {x}"))?;
    ch.connect(&id, &ConnParam::new())
        .await
        .map_err(e("connect"))?;
    let mut expect = vec![0u8; o.size];
    let mut rtts = Vec::with_capacity(o.iters as usize);
    let mut wcs = [WorkCompletion::default(); 4];
    for i in 0..o.iters {
        fill(send.as_mut_slice(), k, i);
        fill(&mut expect, k, i);
        let t0 = Instant::now();
        qp.post_send([SendWr::new(u64::from(i), SendOp::Send).sge_len(send, o.size)])
            .map_err(|x| format!("connection {k}: post_send: {x}"))?;
        let (mut sent, mut echoed) = (None, false);
        while sent.is_none() || !echoed {
            for wc in cq.poll(&mut wcs).await.map_err(e("poll"))?.iter() {
                if !wc.is_success() {
                    return Err(format!("connection {k}: round trip {i}: {wc:?}"));
                }
                let done = qp
                    .reclaim_one(wc)
                    .ok_or(format!("connection {k}: stray {wc:?}"))?;
                let kind = done.kind;
                let chunk = done
                    .into_chunk()
                    .ok_or("a request came back without its chunk")?;
                if kind == RequestKind::Send {
                    sent = Some(chunk);
                    continue;
                }
                if chunk.as_slice() != expect.as_slice() || wc.byte_len() as usize != o.size {
                    return Err(format!("connection {k}: round trip {i}: the echo differs"));
                }
                rtts.push(t0.elapsed());
                echoed = true;
                qp.post_recv([RecvWr::new(0).sge(chunk)])
                    .map_err(|x| format!("connection {k}: post_recv: {x}"))?;
            }
        }
        send = sent.ok_or("no send")?;
    }
    ch.disconnect(&id).await.map_err(e("disconnect"))?;
    Ok(rtts)
}

//! Two threads on one QP: one posts sends, the other posts and reaps
//! receives. The Rust side of `.ci/bench/halves.c`, doing the same thing.
//!
//! ```text
//! cargo run --release --example perf_halves -- [--mutex] [-d DEV] [-i PORT] [-x GIDIDX] [-n N] [-s SIZE]
//! ```
//!
//! Two RC QPs of depth 64 in loopback on one port, each sending N messages
//! of SIZE bytes to the other. The send thread posts both QPs' sends
//! (signalled) and reaps their completions from the send CQ; the receive
//! thread keeps 64 receives posted on each QP, reaps them from the receive
//! CQ and posts each buffer again at once. A send goes only where the peer
//! has a receive posted (a credit count the receive thread raises), so no
//! message waits for a retry. By default each thread holds its half of
//! each QP ([`QueuePair::split`]); with `--mutex` both threads share each
//! QP behind a `Mutex`, the way to do it without halves. Prints
//!
//! ```text
//! perf_halves: path=halves|mutex messages=M seconds=S
//! ```
//!
//! where M is every message of both QPs and S the time from the first
//! post to the last receive. `.ci/bench/guest` (part `halves`) runs it
//! against the C program.
#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rdma_verbs::qp::{ConnectOptions, Endpoint, Psn, RecvHalf, RecvWr, SendHalf, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Context, Gid, QpCaps, QpInitAttr, QpType, QueuePair,
    WorkCompletion,
};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const DEPTH: u32 = 64;
const USAGE: &str = "usage: perf_halves [--mutex] [-d DEV] [-i PORT] [-x GIDIDX] [-n N] [-s SIZE]";

struct Options {
    mutex: bool,
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
    n: u64,
    size: usize,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        mutex: false,
        device: None,
        port: 1,
        gid_index: None,
        n: 100_000,
        size: 64,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--mutex" => o.mutex = true,
            "-d" => o.device = Some(value()?),
            "-i" => o.port = value()?.parse().map_err(|_| "bad -i (a port number)")?,
            "-x" => o.gid_index = Some(value()?.parse().map_err(|_| "bad -x (a GID index)")?),
            "-n" => o.n = value()?.parse().ok().filter(|&n| n > 0).ok_or("bad -n")?,
            "-s" => o.size = value()?.parse().ok().filter(|&s| s > 0).ok_or("bad -s")?,
            _ => return Err(format!("unknown option {a}")),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    quiet_pipe::install();
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("perf_halves: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perf_halves: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the two threads share: receives posted per QP, which a send to
/// that QP's peer may use.
struct Credits([AtomicU64; 2]);

/// The send side of one QP: posts while the peer has receives posted and
/// the send queue has room, reaps from the send CQ.
struct Sends {
    free: [Vec<Chunk>; 2],
    sent: [u64; 2],
    done: u64,
}

/// One thread's way to its queue of each QP: the halves, or the locked QPs.
trait Queues {
    /// Posts `wr` on QP `q` (a send, for the send thread).
    fn send(&mut self, q: usize, wr: SendWr<'static>) -> Res<()>;
    /// Reclaims send completion `wc` of QP `q`, its chunk into `back`.
    fn sent(&mut self, q: usize, wc: &WorkCompletion, back: &mut Vec<Chunk>);
    /// Reclaims receive completion `wc` of QP `q` and posts its buffer again.
    fn repost(&mut self, q: usize, wc: &WorkCompletion) -> Res<()>;
}

// Each method out of line, so that the bench counts their instructions
// per message (`.ci/bench/guest`, part `halves`).
impl Queues for [&mut SendHalf<'_>; 2] {
    #[inline(never)]
    fn send(&mut self, q: usize, wr: SendWr<'static>) -> Res<()> {
        Ok(self[q].post_send([wr])?)
    }
    #[inline(never)]
    fn sent(&mut self, q: usize, wc: &WorkCompletion, back: &mut Vec<Chunk>) {
        self[q].reclaim_chunks(wc, back);
    }
    fn repost(&mut self, _: usize, _: &WorkCompletion) -> Res<()> {
        Err("a send half takes no receive".into())
    }
}

impl Queues for [&mut RecvHalf<'_>; 2] {
    fn send(&mut self, _: usize, _: SendWr<'static>) -> Res<()> {
        Err("a receive half takes no send".into())
    }
    fn sent(&mut self, _: usize, _: &WorkCompletion, _: &mut Vec<Chunk>) {}
    #[inline(never)]
    fn repost(&mut self, q: usize, wc: &WorkCompletion) -> Res<()> {
        let c = self[q].reclaim_one(wc).and_then(|d| d.into_chunk());
        Ok(self[q].post_recv_one(RecvWr::new(0).sge(c.ok_or("no receive")?))?)
    }
}

impl Queues for &[Mutex<QueuePair>; 2] {
    #[inline(never)]
    fn send(&mut self, q: usize, wr: SendWr<'static>) -> Res<()> {
        Ok(self[q].lock().map_err(|_| "poisoned")?.post_send([wr])?)
    }
    #[inline(never)]
    fn sent(&mut self, q: usize, wc: &WorkCompletion, back: &mut Vec<Chunk>) {
        if let Ok(mut qp) = self[q].lock() {
            qp.reclaim_chunks(wc, back);
        }
    }
    #[inline(never)]
    fn repost(&mut self, q: usize, wc: &WorkCompletion) -> Res<()> {
        let mut qp = self[q].lock().map_err(|_| "poisoned")?;
        let c = qp.reclaim_one(wc).and_then(|d| d.into_chunk());
        Ok(qp.post_recv_one(RecvWr::new(0).sge(c.ok_or("no receive")?))?)
    }
}

/// The send thread: posts each QP's sends while its peer has receives
/// posted and a buffer is free, reaps the send CQ.
fn send_loop(
    o: &Options,
    scq: &CompletionQueue,
    credits: &Credits,
    index: impl Fn(&WorkCompletion) -> usize,
    mut s: Sends,
    mut qs: impl Queues,
) -> Res<()> {
    let mut wcs = [WorkCompletion::default(); 16];
    let mut back = Vec::with_capacity(DEPTH as usize);
    while s.done < 2 * o.n {
        for q in 0..2 {
            // QP q's sends land in its peer's (q ^ 1) receives.
            let room = credits.0[q ^ 1].load(Ordering::Acquire);
            while s.sent[q] < o.n && s.sent[q] < room {
                let Some(c) = s.free[q].pop() else { break };
                qs.send(q, SendWr::new(s.sent[q], SendOp::Send).sge_len(c, o.size))?;
                s.sent[q] += 1;
            }
        }
        for wc in scq.poll(&mut wcs)?.iter() {
            if !wc.is_success() {
                return Err(format!("send failed: {wc:?}").into());
            }
            let q = index(wc);
            qs.sent(q, wc, &mut back);
            s.done += 1;
            s.free[q].append(&mut back);
        }
    }
    Ok(())
}

/// The receive thread: reaps the receive CQ and posts each buffer again
/// on its QP at once, raising that QP's credits.
fn recv_loop(
    o: &Options,
    rcq: &CompletionQueue,
    credits: &Credits,
    index: impl Fn(&WorkCompletion) -> usize,
    mut qs: impl Queues,
) -> Res<()> {
    let mut wcs = [WorkCompletion::default(); 16];
    let mut got = 0;
    while got < 2 * o.n {
        for wc in rcq.poll(&mut wcs)?.iter() {
            if !wc.is_success() {
                return Err(format!("receive failed: {wc:?}").into());
            }
            let q = index(wc);
            qs.repost(q, wc)?;
            credits.0[q].fetch_add(1, Ordering::Release);
            got += 1;
        }
    }
    Ok(())
}

fn run(o: &Options) -> Res<()> {
    let ctx = match &o.device {
        Some(d) => Context::open(d)?,
        None => Context::open_first()?,
    };
    let port = ctx.query_port(o.port)?;
    let gid = match o.gid_index {
        Some(i) => ctx.query_gid(o.port, i.into())?,
        None => Gid::ZERO,
    };
    let opts = ConnectOptions {
        port: o.port,
        gid_index: o.gid_index,
        path_mtu: Some(port.active_mtu),
        ..Default::default()
    };
    let pd = ctx.alloc_pd()?;
    let scq = ctx.create_cq(2 * DEPTH)?;
    let rcq = ctx.create_cq(2 * DEPTH)?;
    let caps = QpCaps {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        ..QpCaps::default()
    };
    let init = QpInitAttr::new(QpType::Rc, &scq, &rcq).caps(caps);
    let mut qps = [pd.create_qp(&init)?, pd.create_qp(&init)?];
    let psn = Psn::new(0)?;
    for i in 0..2 {
        let peer = Endpoint {
            lid: port.lid,
            qpn: qps[i ^ 1].qp_num(),
            psn,
            gid,
        };
        qps[i].connect(&opts, psn, &peer)?;
    }
    let mut bufs = pd.alloc_chunks(4 * DEPTH as usize, o.size, AccessFlags::LOCAL_WRITE)?;
    let mut take = || bufs.split_off(bufs.len() - DEPTH as usize);
    let sends = Sends {
        free: [take(), take()],
        sent: [0; 2],
        done: 0,
    };
    let qp_nums = [qps[0].qp_num(), qps[1].qp_num()];
    let index = move |wc: &WorkCompletion| usize::from(wc.qp_num() == qp_nums[1]);
    for (qp, recvs) in qps.iter_mut().zip([take(), take()]) {
        qp.post_recv(recvs.into_iter().map(|c| RecvWr::new(0).sge(c)))?;
    }
    let credits = &Credits([AtomicU64::new(DEPTH.into()), AtomicU64::new(DEPTH.into())]);
    let (scq, rcq) = (&scq, &rcq);
    let start = Instant::now();
    let path = if o.mutex {
        let locked = &qps.map(Mutex::new);
        std::thread::scope(|s| -> Res<()> {
            let tx = s.spawn(move || send_loop(o, scq, credits, index, sends, locked));
            recv_loop(o, rcq, credits, index, locked)?;
            tx.join().map_err(|_| "the send thread panicked")?
        })?;
        "mutex"
    } else {
        let [a, b] = &mut qps;
        let ((mut ta, mut ra), (mut tb, mut rb)) = (a.split(), b.split());
        std::thread::scope(|s| -> Res<()> {
            let tx: [&mut SendHalf<'_>; 2] = [&mut ta, &mut tb];
            let tx = s.spawn(move || send_loop(o, scq, credits, index, sends, tx));
            let rx: [&mut RecvHalf<'_>; 2] = [&mut ra, &mut rb];
            recv_loop(o, rcq, credits, index, rx)?;
            tx.join().map_err(|_| "the send thread panicked")?
        })?;
        "halves"
    };
    let secs = start.elapsed().as_secs_f64();
    println!(
        "perf_halves: path={path} messages={} seconds={secs:.6}",
        2 * o.n
    );
    Ok(())
}

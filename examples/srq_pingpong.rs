//! A port of rdma-core's `ibv_srq_pingpong`: ping-pong SENDs over several RC
//! queue pairs (16 by default) that all receive through one shared receive
//! queue. It speaks the C program's TCP exchange (256 endpoint records each
//! way, unused ones zero), so either side can be the C program.
//!
//! ```text
//! srq_pingpong [OPTIONS]          start a server and wait for a connection
//! srq_pingpong [OPTIONS] <host>   connect to the server at <host>
//!
//!   -p, --port=<port>      listen on/connect to TCP port <port> (default 18515)
//!   -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
//!   -i, --ib-port=<port>   use port <port> of the IB device (default 1)
//!   -s, --size=<size>      size of message to exchange (default 4096)
//!   -m, --mtu=<size>       path MTU (default 1024)
//!   -q, --num-qp=<num>     number of QPs to use (default 16, at most 255)
//!   -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
//!   -n, --iters=<iters>    number of exchanges (counted over all QPs, as in C; default 1000)
//!   -l, --sl=<sl>          service level value
//!   -e, --events           sleep on CQ events (default poll)
//!   -g, --gid-idx=<idx>    local port GID index (needed on RoCE)
//!   -o, --odp              accepted, but not available in this port
//!   -c, --chk              validate received buffer
//!   -N, --new_send         post the sends through the ibv_wr_* API (an extension)
//! ```
//!
//! `-N` is an extension of this port: rdma-core 44's `ibv_srq_pingpong`
//! has no such option (its usage text, which this one otherwise follows,
//! lists none). As with `ibv_rc_pingpong -N`, the QPs are created with
//! `ibv_create_qp_ex` (`IBV_QP_EX_WITH_SEND`) and each SEND is posted as
//! `ibv_wr_start`, `ibv_wr_send` with its data, `ibv_wr_complete`. The
//! wire is the same, so the C program (without `-N`) can be the peer.
//!
//! On soft-RoCE: `cargo run --example srq_pingpong -- -d rxe0 -g 1` on one
//! side and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;
use std::time::Instant;

use pingpong::{opt, Checker, Config, OrFail, Program, Res, Tx, RECV_WRID, SEND_WRID};
use rdma_verbs::qp::{
    AckTimeout, Endpoint, MinRnrTimer, Psn, QpAttr, QpNum, RecvBuffers, RequestKind, RetryCount,
    RnrRetry, Taken,
};
use rdma_verbs::{
    AccessFlags, Gid, LinkLayer, QpCaps, QpInitAttr, QpState, QpType, QueuePair,
    SharedReceiveQueue, WorkCompletion,
};

/// Records exchanged each way, whatever `-q` says (as in C).
const MAX_QP: usize = 256;

const PROGRAM: Program = Program {
    opts: &[
        opt('p', "port", true),
        opt('d', "ib-dev", true),
        opt('i', "ib-port", true),
        opt('s', "size", true),
        opt('m', "mtu", true),
        opt('q', "num-qp", true),
        opt('r', "rx-depth", true),
        opt('n', "iters", true),
        opt('l', "sl", true),
        opt('e', "events", false),
        opt('o', "odp", false),
        opt('g', "gid-idx", true),
        opt('c', "chk", false),
        opt('N', "new_send", false),
    ],
    help: &[
        "  -p, --port=<port>      listen on/connect to port <port> (default 18515)",
        "  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)",
        "  -i, --ib-port=<port>   use port <port> of IB device (default 1)",
        "  -s, --size=<size>      size of message to exchange (default 4096)",
        "  -m, --mtu=<size>       path MTU (default 1024)",
        "  -q, --num-qp=<num>     number of QPs to use (default 16)",
        "  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)",
        "  -n, --iters=<iters>    number of exchanges per QP(default 1000)",
        "  -l, --sl=<sl>          service level value",
        "  -e, --events           sleep on CQ events (default poll)",
        "  -g, --gid-idx=<gid index> local port gid index",
        "  -o, --odp              use on demand paging (not available in this port)",
        "  -c, --chk              validate received buffer",
        "  -N, --new_send            use new post send WR API (extension: not in ibv_srq_pingpong)",
    ],
    default_size: 4096,
};

fn main() -> ExitCode {
    quiet_pipe::install();
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: every QP to RTR and RTS against the peer's QP of the
/// same index. As in C, whether to use a GRH (and to which GID) is decided
/// by the peer's first record.
fn connect(qps: &mut [QueuePair], cfg: &Config, me: &[Endpoint], dest: &[Endpoint]) -> Res<()> {
    for (i, qp) in qps.iter_mut().enumerate() {
        let rtr_fail = format!("Failed to modify QP[{i}] to RTR");
        let av = pingpong::peer_av(cfg, dest[i].lid, dest[0].gid, &rtr_fail)?;
        let rtr = QpAttr::new()
            .state(QpState::Rtr)
            .av(av)
            .path_mtu(cfg.mtu)
            .dest_qpn(dest[i].qpn)
            .rq_psn(dest[i].psn)
            .max_dest_rd_atomic(1)
            .min_rnr_timer(MinRnrTimer::new(12).or_fail("min_rnr_timer")?);
        qp.modify(&rtr).or_fail(&rtr_fail)?;
        let rts = QpAttr::new()
            .state(QpState::Rts)
            .timeout(AckTimeout::new(14).or_fail("timeout")?)
            .retry_cnt(RetryCount::new(7).or_fail("retry_cnt")?)
            .rnr_retry(RnrRetry::new(7).or_fail("rnr_retry")?)
            .sq_psn(me[i].psn)
            .max_rd_atomic(1);
        qp.modify(&rts)
            .or_fail(&format!("Failed to modify QP[{i}] to RTS"))?;
    }
    Ok(())
}

/// `pp_post_recv(ctx, n)` on the SRQ: every free buffer of the pool (the
/// C program posts `rx_depth` less those outstanding, the same number);
/// how many were posted.
fn post_recvs(srq: &SharedReceiveQueue, bufs: &mut RecvBuffers) -> usize {
    bufs.post_srq(srq).unwrap_or_else(|e| e.posted)
}

/// The request a completion `wc` of QP `i` (`None`: not one of ours) ends,
/// taken back: its `wr_id` (0 for none). A send's chunk goes back to its
/// [`Tx`]; a receive of the pool is read in place for `-c` and its buffer
/// is free again at once.
fn take_back(
    qps: &mut [QueuePair],
    txs: &mut [Tx],
    bufs: &mut RecvBuffers,
    check: &mut Checker,
    i: Option<usize>,
    wc: &WorkCompletion,
    size: usize,
) -> Res<u64> {
    let Some(i) = i else { return Ok(0) };
    if wc.request_kind() == Some(RequestKind::Send) {
        return Ok(if txs[i].take_back(&mut qps[i], wc) {
            SEND_WRID
        } else {
            0
        });
    }
    Ok(match bufs.take(&mut qps[i], wc) {
        Taken::Mine(msg) => {
            check.received_in(&msg, 0, size)?;
            RECV_WRID
        }
        Taken::Other(done) => done.wr_id,
        Taken::Nothing => 0,
    })
}

fn run(cfg: Config) -> Res<()> {
    if let Some(&f) = cfg.flags.first() {
        return Err(pingpong::unsupported("srq_pingpong", f));
    }
    let (num_qp, rx_depth, size) = (cfg.num_qp, cfg.rx_depth, cfg.size);
    if size < 1 {
        return Err("size must be at least 1".into());
    }
    if num_qp > rx_depth {
        return Err(format!(
            "rx_depth {rx_depth} is too small for {num_qp} QPs -- must have at least one receive per QP."
        ));
    }
    if num_qp >= MAX_QP {
        return Err(format!("num_qp {num_qp} must be less than {}", MAX_QP - 1));
    }
    let num_wc = num_qp + rx_depth;
    let mut rng = pingpong::Rand48::from_pid_and_time();

    // pp_init_ctx
    let ctx = pingpong::open_device(cfg.ib_devname.as_deref())?;
    let channel = pingpong::create_channel(&ctx, cfg.use_event)?;
    let pd = ctx.alloc_pd().or_fail("Couldn't allocate PD")?;
    let mut bufs = RecvBuffers::new(&pd, rx_depth, size).or_fail("Couldn't register MR")?;
    let mut send_bufs =
        pingpong::alloc_buffers(&pd, num_qp, size, 0, pingpong::Odp::Off)?.into_iter();
    let cq = pingpong::create_cq(&ctx, rx_depth + num_qp, channel.as_ref())?;
    let srq = pd
        .create_srq(rx_depth as u32, 1, 0)
        .or_fail("Couldn't create SRQ")?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(num_qp);
    let mut inline = false;
    for i in 0..num_qp {
        let qp = pd
            .create_qp(&pingpong::send_ops(
                QpInitAttr::new(QpType::Rc, &cq, &cq).srq(&srq).caps(caps),
                cfg.new_send,
            ))
            .or_fail(&format!("Couldn't create QP[{i}]"))?;
        inline |= qp.caps().max_inline_data as usize >= size;
        qps.push(qp);
    }
    for (i, qp) in qps.iter_mut().enumerate() {
        qp.modify(
            &QpAttr::new()
                .state(QpState::Init)
                .pkey_index(0)
                .port(cfg.ib_port)
                .access_flags(AccessFlags::empty()),
        )
        .or_fail(&format!("Failed to modify QP[{i}] to INIT"))?;
    }

    // RC sends without -N from a template each (see `Tx`).
    let mut txs = Vec::with_capacity(num_qp);
    for qp in &qps {
        txs.push(Tx::new(
            qp,
            send_bufs.next(),
            size,
            QpType::Rc,
            cfg.new_send,
        )?);
    }
    let mut routs = post_recvs(&srq, &mut bufs);
    if routs < rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }
    if channel.is_some() {
        cq.req_notify(false)
            .or_fail("Couldn't request CQ notification")?;
    }

    let portinfo = ctx
        .query_port(cfg.ib_port)
        .or_fail("Couldn't get port info")?;
    let unused = Endpoint {
        lid: 0,
        qpn: QpNum::default(),
        psn: Psn::default(),
        gid: Gid::ZERO,
    };
    let mut my_dest = vec![unused; MAX_QP];
    for (i, qp) in qps.iter().enumerate() {
        if portinfo.link_layer != LinkLayer::Ethernet && portinfo.lid == 0 {
            return Err("Couldn't get local LID".into());
        }
        let gid = match cfg.gidx {
            Some(g) => ctx
                .query_gid(cfg.ib_port, g.into())
                .or_fail(&format!("Could not get local gid for gid index {g}"))?,
            None => Gid::ZERO,
        };
        my_dest[i] = Endpoint {
            lid: portinfo.lid,
            qpn: qp.qp_num(),
            psn: rng.psn(),
            gid,
        };
        pingpong::print_local(&my_dest[i], ", ");
    }

    let rem_dest = match &cfg.servername {
        Some(host) => pingpong::client_exch_dest(host, cfg.port, &my_dest)?,
        None => pingpong::server_exch_dest(cfg.port, &my_dest, |rem| {
            connect(&mut qps, &cfg, &my_dest, rem)
        })?,
    };
    for r in &rem_dest[..num_qp] {
        pingpong::print_remote(r);
    }
    let client = cfg.servername.is_some();
    if client {
        connect(&mut qps, &cfg, &my_dest, &rem_dest)?;
    }

    let mut check = Checker::new(cfg.validate);
    let mut pending = vec![RECV_WRID; num_qp];
    if client {
        for (i, qp) in qps.iter_mut().enumerate() {
            txs[i].stamp(qp, size, &check)?;
            txs[i].post(qp, size, inline, None, &check)?;
            pending[i] = SEND_WRID | RECV_WRID;
        }
    }

    let start = Instant::now();
    let mut wcs = vec![WorkCompletion::default(); num_wc];
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    while rcnt < cfg.iters || scnt < cfg.iters {
        let got = pingpong::next_completions(&cq, channel.as_ref(), &mut wcs)?;
        for wc in got {
            let qp_ind = qps.iter().position(|q| q.qp_num() == wc.qp_num());
            let wr_id = take_back(&mut qps, &mut txs, &mut bufs, &mut check, qp_ind, wc, size)?;
            pingpong::check_status(wc, wr_id)?;
            let i = qp_ind.ok_or_else(|| format!("Couldn't find QPN {:06x}", wc.qp_num()))?;
            match wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= num_qp {
                        routs += post_recvs(&srq, &mut bufs);
                        if routs < rx_depth {
                            return Err(format!("Couldn't post receive ({routs})"));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending[i] &= !wr_id;
            if scnt < cfg.iters && pending[i] == 0 {
                txs[i].post(&mut qps[i], size, inline, None, &check)?;
                pending[i] = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();

    pingpong::print_results(size, cfg.iters, elapsed);
    if !client {
        check.report();
    }
    Ok(())
}

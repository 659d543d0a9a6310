//! A port of rdma-core's `ibv_rc_pingpong`: ping-pong SENDs over a reliable
//! connected (RC) queue pair. It speaks the C program's TCP exchange, so
//! either side can be the C program.
//!
//! ```text
//! rc_pingpong [OPTIONS]          start a server and wait for a connection
//! rc_pingpong [OPTIONS] <host>   connect to the server at <host>
//!
//!   -p, --port=<port>      listen on/connect to TCP port <port> (default 18515)
//!   -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
//!   -i, --ib-port=<port>   use port <port> of the IB device (default 1)
//!   -s, --size=<size>      size of message to exchange (default 4096)
//!   -m, --mtu=<size>       path MTU (default 1024)
//!   -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
//!   -n, --iters=<iters>    number of exchanges (default 1000)
//!   -l, --sl=<sl>          service level value
//!   -e, --events           sleep on CQ events (default poll)
//!   -g, --gid-idx=<idx>    local port GID index (needed on RoCE)
//!   -c, --chk              validate received buffer
//!   -N, --new_send         post the sends through the ibv_wr_* API
//!   -t, --ts               get CQE with timestamp
//!   -o, --odp              use on demand paging
//!   -P, --prefetch         prefetch an ODP MR
//!   -O, -j, -U             accepted, but not available in this port
//! ```
//!
//! `-o` registers the buffers with `IBV_ACCESS_ON_DEMAND` once the device
//! reports on-demand paging with RC sends and receives (`odp_caps` of
//! `ibv_query_device_ex`), as the C program does; `-P` then prefetches
//! them for writing (`ibv_advise_mr`, `IBV_ADVISE_MR_FLAG_FLUSH`), and a
//! failed prefetch is reported and the run goes on. On rxe the crate
//! refuses on-demand regions (`Unsupported`: see `rdma_verbs::mr`'s ODP
//! section), so `-o` ends there with that reason. `-O` (implicit ODP, one
//! region over the whole address space) is not offered by the crate.
//!
//! `-N` creates the QP with `ibv_create_qp_ex` (`IBV_QP_EX_WITH_SEND`) and
//! posts each SEND as `ibv_wr_start`, `ibv_wr_send` with its data,
//! `ibv_wr_complete` ([`rdma_verbs::QueuePair::start_batch`]), as the C
//! program does; the output is the same either way.
//!
//! `-t` reads the device's completion timestamps, as the C program does.
//! The CQ is an extended CQ ([`rdma_verbs::CompletionQueueEx`], created
//! with `ibv_create_cq_ex` and `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` alone),
//! polled with `ibv_start_poll`, one `ibv_next_poll` and `ibv_end_poll`
//! per round; the clock cycles between consecutive receive completions
//! (`ibv_wc_read_completion_ts`, across a wrap of the clock at the device's
//! `completion_timestamp_mask`) are printed after the results:
//!
//! ```text
//! Max receive completion clock cycles = <max>
//! Min receive completion clock cycles = <min>
//! Average receive completion clock cycles = <average, 6 decimals>
//! ```
//!
//! On a device without completion timestamps (`completion_timestamp_mask`
//! 0, as on rxe) it fails as the C program does: "The device isn't
//! completion timestamp capable", exit 1. With `-e`, a CQ found empty after
//! an event makes the port wait for the next event (as without `-t`),
//! where `ibv_rc_pingpong -t -e` fails with "poll CQ failed 2".
//!
//! On soft-RoCE: `cargo run --example rc_pingpong -- -d rxe0 -g 1` on one
//! side and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;

use pingpong::{opt, Config, Odp, OrFail, Program, Res};
use rdma_verbs::qp::{AckTimeout, Endpoint, MinRnrTimer, QpAttr, RetryCount, RnrRetry};
use rdma_verbs::{QpState, QpType, QueuePair};

const PROGRAM: Program = Program {
    opts: &[
        opt('p', "port", true),
        opt('d', "ib-dev", true),
        opt('i', "ib-port", true),
        opt('s', "size", true),
        opt('m', "mtu", true),
        opt('r', "rx-depth", true),
        opt('n', "iters", true),
        opt('l', "sl", true),
        opt('e', "events", false),
        opt('g', "gid-idx", true),
        opt('o', "odp", false),
        opt('O', "iodp", false),
        opt('P', "prefetch", false),
        opt('t', "ts", false),
        opt('c', "chk", false),
        opt('j', "dm", false),
        opt('N', "new_send", false),
        opt('U', "", false),
    ],
    help: &[
        "  -p, --port=<port>      listen on/connect to port <port> (default 18515)",
        "  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)",
        "  -i, --ib-port=<port>   use port <port> of IB device (default 1)",
        "  -s, --size=<size>      size of message to exchange (default 4096)",
        "  -m, --mtu=<size>       path MTU (default 1024)",
        "  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)",
        "  -n, --iters=<iters>    number of exchanges (default 1000)",
        "  -l, --sl=<sl>          service level value",
        "  -e, --events           sleep on CQ events (default poll)",
        "  -g, --gid-idx=<gid index> local port gid index",
        "  -o, --odp              use on demand paging",
        "  -O, --iodp             use implicit on demand paging (not available in this port)",
        "  -P, --prefetch         prefetch an ODP MR",
        "  -t, --ts               get CQE with timestamp",
        "  -c, --chk              validate received buffer",
        "  -j, --dm               use device memory (not available in this port)",
        "  -N, --new_send            use new post send WR API",
    ],
    default_size: 4096,
};

fn main() -> ExitCode {
    quiet_pipe::install();
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: INIT -> RTR -> RTS against the peer's endpoint, with
/// the C program's attributes. A GRH is used when the peer sent a GID.
fn connect(qp: &mut QueuePair, cfg: &Config, me: Endpoint, dest: &Endpoint) -> Res<()> {
    let av = pingpong::peer_av(cfg, dest.lid, dest.gid, "Failed to modify QP to RTR")?;
    let rtr = QpAttr::new()
        .state(QpState::Rtr)
        .av(av)
        .path_mtu(cfg.mtu)
        .dest_qpn(dest.qpn)
        .rq_psn(dest.psn)
        .max_dest_rd_atomic(1)
        .min_rnr_timer(MinRnrTimer::new(12).or_fail("min_rnr_timer")?);
    qp.modify(&rtr).or_fail("Failed to modify QP to RTR")?;
    let rts = QpAttr::new()
        .state(QpState::Rts)
        .timeout(AckTimeout::new(14).or_fail("timeout")?)
        .retry_cnt(RetryCount::new(7).or_fail("retry_cnt")?)
        .rnr_retry(RnrRetry::new(7).or_fail("rnr_retry")?)
        .sq_psn(me.psn)
        .max_rd_atomic(1);
    qp.modify(&rts).or_fail("Failed to modify QP to RTS")
}

fn run(mut cfg: Config) -> Res<()> {
    let has = |c| cfg.flags.contains(&c);
    if (has('o') || has('O')) && has('j') {
        return Err("DM memory region can't be on demand".into());
    }
    if !(has('o') || has('O')) && has('P') {
        return Err("prefetch is valid only with on-demand memory region".into());
    }
    if has('o') && !has('O') {
        cfg.odp = Odp::On { prefetch: has('P') };
        cfg.flags.retain(|&f| f != 'o' && f != 'P');
    }
    if let Some(&f) = cfg.flags.first() {
        return Err(pingpong::unsupported("rc_pingpong", f));
    }
    pingpong::run_connected(cfg, QpType::Rc, connect)
}

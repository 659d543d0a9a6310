//! A port of rdma-core's `ibv_uc_pingpong`: ping-pong SENDs over an
//! unreliable connected (UC) queue pair. It speaks the C program's TCP
//! exchange, so either side can be the C program.
//!
//! ```text
//! uc_pingpong [OPTIONS]          start a server and wait for a connection
//! uc_pingpong [OPTIONS] <host>   connect to the server at <host>
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
//!   -N, --new_send         post the sends through the ibv_wr_* API (an extension)
//! ```
//!
//! `-N` is an extension of this port: rdma-core 44's `ibv_uc_pingpong`
//! has no such option (its usage text, which this one otherwise follows,
//! lists none). As with `ibv_rc_pingpong -N`, the QP is created with
//! `ibv_create_qp_ex` (`IBV_QP_EX_WITH_SEND`) and each SEND is posted as
//! `ibv_wr_start`, `ibv_wr_send` with its data, `ibv_wr_complete`. The
//! wire is the same, so the C program (without `-N`) can be the peer.
//!
//! On soft-RoCE: `cargo run --example uc_pingpong -- -d rxe0 -g 1` on one
//! side and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;

use pingpong::{opt, Config, OrFail, Program, Res};
use rdma_verbs::qp::{Endpoint, QpAttr};
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
        opt('c', "chk", false),
        opt('N', "new_send", false),
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
        "  -c, --chk              validate received buffer",
        "  -N, --new_send            use new post send WR API (extension: not in ibv_uc_pingpong)",
    ],
    default_size: 4096,
};

fn main() -> ExitCode {
    quiet_pipe::install();
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: INIT -> RTR -> RTS against the peer's endpoint, with
/// the C program's attributes (UC: no RC timers or rd_atomic). A GRH is used
/// when the peer sent a GID.
fn connect(qp: &mut QueuePair, cfg: &Config, me: Endpoint, dest: &Endpoint) -> Res<()> {
    let av = pingpong::peer_av(cfg, dest.lid, dest.gid, "Failed to modify QP to RTR")?;
    let rtr = QpAttr::new()
        .state(QpState::Rtr)
        .av(av)
        .path_mtu(cfg.mtu)
        .dest_qpn(dest.qpn)
        .rq_psn(dest.psn);
    qp.modify(&rtr).or_fail("Failed to modify QP to RTR")?;
    let rts = QpAttr::new().state(QpState::Rts).sq_psn(me.psn);
    qp.modify(&rts).or_fail("Failed to modify QP to RTS")
}

fn run(cfg: Config) -> Res<()> {
    pingpong::run_connected(cfg, QpType::Uc, connect)
}

//! A port of rdma-core's `ibv_ud_pingpong`: ping-pong SENDs over an
//! unreliable datagram (UD) queue pair, addressed through an address handle.
//! It speaks the C program's TCP exchange, so either side can be the C
//! program.
//!
//! ```text
//! ud_pingpong [OPTIONS]          start a server and wait for a connection
//! ud_pingpong [OPTIONS] <host>   connect to the server at <host>
//!
//!   -p, --port=<port>      listen on/connect to TCP port <port> (default 18515)
//!   -d, --ib-dev=<dev>     use IB device <dev> (default first device found)
//!   -i, --ib-port=<port>   use port <port> of the IB device (default 1)
//!   -s, --size=<size>      size of message to exchange (default 1024, at most the port's MTU)
//!   -r, --rx-depth=<dep>   number of receives to post at a time (default 500)
//!   -n, --iters=<iters>    number of exchanges (default 1000)
//!   -l, --sl=<SL>          send messages with service level <SL> (default 0)
//!   -e, --events           sleep on CQ events (default poll)
//!   -g, --gid-idx=<idx>    local port GID index (needed on RoCE)
//!   -c, --chk              validate received buffer
//!   -N, --new_send         post the sends through the ibv_wr_* API (an extension)
//! ```
//!
//! `-N` is an extension of this port: rdma-core 44's `ibv_ud_pingpong`
//! has no such option (its usage text, which this one otherwise follows,
//! lists none). As with `ibv_rc_pingpong -N`, the QP is created with
//! `ibv_create_qp_ex` (`IBV_QP_EX_WITH_SEND`) and each SEND is posted as
//! `ibv_wr_start`, `ibv_wr_send` and `ibv_wr_set_ud_addr` with its data,
//! `ibv_wr_complete`. The wire is the same, so the C program (without
//! `-N`) can be the peer.
//!
//! Every receive buffer has 40 bytes in front for the GRH, as in C. On
//! soft-RoCE: `cargo run --example ud_pingpong -- -d rxe0 -g 1` on one side
//! and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;

use pingpong::{opt, Config, OrFail, Program, Res, SingleQp, UdDest, GRH_LEN, UD_QKEY};
use rdma_verbs::qp::{Endpoint, QpAttr};
use rdma_verbs::{Gid, QpState, QpType};

const PROGRAM: Program = Program {
    opts: &[
        opt('p', "port", true),
        opt('d', "ib-dev", true),
        opt('i', "ib-port", true),
        opt('s', "size", true),
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
        "  -s, --size=<size>      size of message to exchange (default 1024)",
        "  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)",
        "  -n, --iters=<iters>    number of exchanges (default 1000)",
        "  -l, --sl=<SL>          send messages with service level <SL> (default 0)",
        "  -e, --events           sleep on CQ events (default poll)",
        "  -g, --gid-idx=<gid index> local port gid index",
        "  -c, --chk              validate received buffer",
        "  -N, --new_send            use new post send WR API (extension: not in ibv_ud_pingpong)",
    ],
    default_size: 1024,
};

fn main() -> ExitCode {
    quiet_pipe::install();
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: RTR, RTS with our PSN, then the address handle for the
/// peer (with a GRH when the peer sent a GID).
fn connect(pp: &mut SingleQp, cfg: &Config, me: Endpoint, dest: &Endpoint) -> Res<()> {
    pp.qp
        .modify(&QpAttr::new().state(QpState::Rtr))
        .or_fail("Failed to modify QP to RTR")?;
    pp.qp
        .modify(&QpAttr::new().state(QpState::Rts).sq_psn(me.psn))
        .or_fail("Failed to modify QP to RTS")?;
    let av = pingpong::peer_av(cfg, dest.lid, dest.gid, "Failed to create AH")?;
    let ah = pp.qp.pd().create_ah(&av).or_fail("Failed to create AH")?;
    pp.ud = Some(UdDest { ah, qpn: dest.qpn });
    Ok(())
}

fn run(cfg: Config) -> Res<()> {
    let mut rng = pingpong::Rand48::from_pid_and_time();

    // pp_init_ctx
    let ctx = pingpong::open_device(cfg.ib_devname.as_deref())?;
    let port_info = ctx.query_port(cfg.ib_port).or_fail(&format!(
        "Unable to query port info for port {}",
        cfg.ib_port
    ))?;
    let mtu = port_info.active_mtu.bytes() as usize;
    if cfg.size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})"));
    }
    let init = QpAttr::new()
        .state(QpState::Init)
        .pkey_index(0)
        .port(cfg.ib_port)
        .qkey(UD_QKEY);
    let mut pp = SingleQp::init(&ctx, &cfg, QpType::Ud, init, GRH_LEN)?;

    let portinfo = ctx
        .query_port(cfg.ib_port)
        .or_fail("Couldn't get port info")?;
    let gid = match cfg.gidx {
        Some(g) => ctx
            .query_gid(cfg.ib_port, g.into())
            .or_fail(&format!("Could not get local gid for gid index {g}"))?,
        None => Gid::ZERO,
    };
    let my_dest = Endpoint {
        lid: portinfo.lid,
        qpn: pp.qp.qp_num(),
        psn: rng.psn(),
        gid,
    };
    // ibv_ud_pingpong prints ": GID" here (and ", GID" for the remote).
    pingpong::print_local(&my_dest, ": ");

    let rem_dest = match &cfg.servername {
        Some(host) => pingpong::client_exch_dest(host, cfg.port, &[my_dest])?,
        None => pingpong::server_exch_dest(cfg.port, &[my_dest], |rem| {
            connect(&mut pp, &cfg, my_dest, &rem[0])
        })?,
    }[0];
    pingpong::print_remote(&rem_dest);
    if cfg.servername.is_some() {
        connect(&mut pp, &cfg, my_dest, &rem_dest)?;
    }

    let elapsed = pp.run(cfg.iters, cfg.servername.is_some())?;
    pingpong::print_results(cfg.size, cfg.iters, elapsed);
    if cfg.servername.is_none() {
        pp.check.report();
    }
    Ok(())
}

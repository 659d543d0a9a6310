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
//! ```
//!
//! On soft-RoCE: `cargo run --example uc_pingpong -- -d rxe0 -g 1` on one
//! side and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;

use std::process::ExitCode;

use pingpong::{opt, Config, OrFail, Program, Res, SingleQp};
use rdma_verbs::qp::{AddressVector, Endpoint, GlobalRoute, QpAttr, QpNum};
use rdma_verbs::{AccessFlags, Gid, LinkLayer, QpCaps, QpInitAttr, QpState, QpType, QueuePair};

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
    ],
    default_size: 4096,
};

fn main() -> ExitCode {
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: INIT -> RTR -> RTS against the peer's endpoint, with
/// the C program's attributes (UC: no RC timers or rd_atomic). A GRH is used
/// when the peer sent a GID.
fn connect(qp: &mut QueuePair, cfg: &Config, me: Endpoint, dest: &Endpoint) -> Res<()> {
    let mut av = AddressVector::new(cfg.ib_port)
        .dlid(dest.lid)
        .sl(cfg.sl)
        .or_fail("Failed to modify QP to RTR")?;
    if dest.gid.interface_id() != 0 {
        let sgid = cfg.gidx.ok_or(
            "Failed to modify QP to RTR (the peer sent a GID but no local GID index was given: use -g)",
        )?;
        av = av.global(GlobalRoute::new(dest.gid, sgid).hop_limit(1));
    }
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
    let mut rng = pingpong::Rand48::from_pid_and_time();

    // pp_init_ctx
    let ctx = pingpong::open_device(cfg.ib_devname.as_deref())?;
    let channel = pingpong::create_channel(&ctx, cfg.use_event)?;
    let pd = ctx.alloc_pd().or_fail("Couldn't allocate PD")?;
    let recv_pool = pingpong::alloc_buffers(&pd, cfg.rx_depth, cfg.size, 0x7b)?;
    let send_buf = pingpong::alloc_buffers(&pd, 1, cfg.size, 0x7b)?.pop();
    let cq = pingpong::create_cq(&ctx, cfg.rx_depth + 1, channel.as_ref())?;
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: cfg.rx_depth as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qp = pd
        .create_qp(&QpInitAttr::new(QpType::Uc, &cq, &cq).caps(caps))
        .or_fail("Couldn't create QP")?;
    let inline = qp.caps().max_inline_data as usize >= cfg.size;
    qp.modify(
        &QpAttr::new()
            .state(QpState::Init)
            .pkey_index(0)
            .port(cfg.ib_port)
            .access_flags(AccessFlags::empty()),
    )
    .or_fail("Failed to modify QP to INIT")?;

    let mut pp = SingleQp {
        qp,
        cq,
        channel,
        recv_pool,
        routs: 0,
        send_buf,
        size: cfg.size,
        rx_depth: cfg.rx_depth,
        inline,
        recv_offset: 0,
        ud: None,
        check: pingpong::Checker::new(cfg.validate),
    };
    pp.post_initial_recvs()?;
    if pp.channel.is_some() {
        pp.cq
            .req_notify(false)
            .or_fail("Couldn't request CQ notification")?;
    }

    let portinfo = ctx
        .query_port(cfg.ib_port)
        .or_fail("Couldn't get port info")?;
    if portinfo.link_layer != LinkLayer::Ethernet && portinfo.lid == 0 {
        return Err("Couldn't get local LID".into());
    }
    let gid = match cfg.gidx {
        Some(g) => ctx
            .query_gid(cfg.ib_port, g.into())
            .or_fail(&format!("can't read sgid of index {g}"))?,
        None => Gid::ZERO,
    };
    let my_dest = Endpoint {
        lid: portinfo.lid,
        qpn: QpNum::new(pp.qp.qp_num()).or_fail("bad QP number")?,
        psn: rng.psn(),
        gid,
    };
    pingpong::print_local(&my_dest, ", ");

    let rem_dest = match &cfg.servername {
        Some(host) => pingpong::client_exch_dest(host, cfg.port, &[my_dest])?,
        None => pingpong::server_exch_dest(cfg.port, &[my_dest], |rem| {
            connect(&mut pp.qp, &cfg, my_dest, &rem[0])
        })?,
    }[0];
    pingpong::print_remote(&rem_dest);
    if cfg.servername.is_some() {
        connect(&mut pp.qp, &cfg, my_dest, &rem_dest)?;
    }

    let elapsed = pp.run(cfg.iters, cfg.servername.is_some())?;
    pingpong::print_results(cfg.size, cfg.iters, elapsed);
    if cfg.servername.is_none() {
        pp.check.report();
    }
    Ok(())
}

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
//! ```
//!
//! Every receive buffer has 40 bytes in front for the GRH, as in C. On
//! soft-RoCE: `cargo run --example ud_pingpong -- -d rxe0 -g 1` on one side
//! and `... -d rxe0 -g 1 127.0.0.1` on the other.

#![forbid(unsafe_code)]

#[path = "common/pingpong.rs"]
mod pingpong;

use std::process::ExitCode;

use pingpong::{opt, Config, OrFail, Program, Res, SingleQp, UdDest, GRH_LEN, UD_QKEY};
use rdma_verbs::qp::{AddressVector, Endpoint, GlobalRoute, QpAttr, QpNum};
use rdma_verbs::{Gid, ProtectionDomain, QpCaps, QpInitAttr, QpState, QpType};

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
    ],
    default_size: 1024,
};

fn main() -> ExitCode {
    pingpong::main_with(&PROGRAM, run)
}

/// `pp_connect_ctx`: RTR, RTS with our PSN, then the address handle for the
/// peer (with a GRH when the peer sent a GID).
fn connect(
    pp: &mut SingleQp,
    pd: &ProtectionDomain,
    cfg: &Config,
    me: Endpoint,
    dest: &Endpoint,
) -> Res<()> {
    pp.qp
        .modify(&QpAttr::new().state(QpState::Rtr))
        .or_fail("Failed to modify QP to RTR")?;
    pp.qp
        .modify(&QpAttr::new().state(QpState::Rts).sq_psn(me.psn))
        .or_fail("Failed to modify QP to RTS")?;
    let mut av = AddressVector::new(cfg.ib_port)
        .dlid(dest.lid)
        .sl(cfg.sl)
        .or_fail("Failed to create AH")?;
    if dest.gid.interface_id() != 0 {
        let sgid = cfg.gidx.ok_or(
            "Failed to create AH (the peer sent a GID but no local GID index was given: use -g)",
        )?;
        av = av.global(GlobalRoute::new(dest.gid, sgid).hop_limit(1));
    }
    let ah = pd.create_ah(&av).or_fail("Failed to create AH")?;
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
    let channel = pingpong::create_channel(&ctx, cfg.use_event)?;
    let pd = ctx.alloc_pd().or_fail("Couldn't allocate PD")?;
    let recv_pool = pingpong::alloc_buffers(&pd, cfg.rx_depth, cfg.size + GRH_LEN, 0x7b)?;
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
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq).caps(caps))
        .or_fail("Couldn't create QP")?;
    let inline = qp.caps().max_inline_data as usize >= cfg.size;
    qp.modify(
        &QpAttr::new()
            .state(QpState::Init)
            .pkey_index(0)
            .port(cfg.ib_port)
            .qkey(UD_QKEY),
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
        recv_offset: GRH_LEN,
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
    let gid = match cfg.gidx {
        Some(g) => ctx
            .query_gid(cfg.ib_port, g.into())
            .or_fail(&format!("Could not get local gid for gid index {g}"))?,
        None => Gid::ZERO,
    };
    let my_dest = Endpoint {
        lid: portinfo.lid,
        qpn: QpNum::new(pp.qp.qp_num()).or_fail("bad QP number")?,
        psn: rng.psn(),
        gid,
    };
    // ibv_ud_pingpong prints ": GID" here (and ", GID" for the remote).
    pingpong::print_local(&my_dest, ": ");

    let rem_dest = match &cfg.servername {
        Some(host) => pingpong::client_exch_dest(host, cfg.port, &[my_dest])?,
        None => pingpong::server_exch_dest(cfg.port, &[my_dest], |rem| {
            connect(&mut pp, &pd, &cfg, my_dest, &rem[0])
        })?,
    }[0];
    pingpong::print_remote(&rem_dest);
    if cfg.servername.is_some() {
        connect(&mut pp, &pd, &cfg, my_dest, &rem_dest)?;
    }

    let elapsed = pp.run(cfg.iters, cfg.servername.is_some())?;
    pingpong::print_results(cfg.size, cfg.iters, elapsed);
    if cfg.servername.is_none() {
        pp.check.report();
    }
    Ok(())
}

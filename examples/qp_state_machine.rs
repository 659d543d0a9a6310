//! Walks RC, UC and UD queue pairs through every state they can reach on a
//! device, printing what `ibv_query_qp` reports at each step.
//!
//! ```text
//! cargo run --example qp_state_machine [-- [-d DEVICE] [-i PORT] [-g GID_INDEX]]
//! ```
//! Each connected QP is connected to itself (loopback), so one device is
//! enough. The typed builders are used throughout; the last step shows the
//! validator refusing a modify before it reaches the device.

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/time.rs"]
mod time;

use std::process::ExitCode;
use std::time::Duration;

use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Context, Result};

/// The options, below [`USAGE`] in `--help`.
const OPTIONS: &str = concat!(
    "  -d, --ib-dev DEVICE   the device (default: the first)\n",
    "  -i, --ib-port PORT    its port (default 1)\n",
    "  -g, --gid-idx INDEX   the source GID index (default: on RoCE the first RoCE v2 GID, IPv4-mapped if any)\n",
    "  -h, --help            this text",
);

const USAGE: &str = "usage: qp_state_machine [-d DEVICE] [-i PORT] [-g GID_INDEX]";

struct Options {
    /// `-h`/`--help`: print the usage and the options, and exit.
    help: bool,
    device: Option<String>,
    port: u8,
    gid_index: Option<u8>,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        help: false,
        device: None,
        port: 1,
        gid_index: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "-d" | "--ib-dev" => o.device = Some(value()?),
            "-i" | "--ib-port" => o.port = value()?.parse().map_err(|_| "bad port")?,
            "-g" | "--gid-idx" => {
                o.gid_index = Some(value()?.parse().map_err(|_| "bad GID index")?)
            }
            "-h" | "--help" => o.help = true,
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
            eprintln!("qp_state_machine: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if opts.help {
        println!("{USAGE}\n{OPTIONS}");
        return ExitCode::SUCCESS;
    }
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qp_state_machine: {e}");
            ExitCode::FAILURE
        }
    }
}

fn show(label: &str, qp: &QueuePair) -> Result<()> {
    let (a, _) = qp.query()?;
    print!("  {label:<28} query_qp: {:<5}", a.state.short_name());
    match qp.qp_type() {
        rdma_verbs::QpType::Ud => print!(
            " port {} qkey {:#x} sq_psn {}",
            a.port_num, a.qkey.0, a.sq_psn
        ),
        t => {
            print!(" port {} access {:?}", a.port_num, a.access);
            if a.state != QpState::Reset && a.state != QpState::Init {
                print!(
                    " mtu {} dest_qpn {:#x} rq_psn {} sq_psn {}",
                    a.path_mtu.map_or(0, |m| m.bytes()),
                    a.dest_qp_num.get(),
                    a.rq_psn,
                    a.sq_psn
                );
                if t == rdma_verbs::QpType::Rc {
                    print!(
                        " timeout {} retry {} rnr_retry {} rd_atomic {}/{}",
                        a.timeout.get(),
                        a.retry_cnt.get(),
                        a.rnr_retry.get(),
                        a.max_rd_atomic,
                        a.max_dest_rd_atomic
                    );
                }
            }
        }
    }
    println!();
    Ok(())
}

/// How long to wait for a send queue to drain: 10 s, stretched by
/// `RDMA_VERBS_TIME_SCALE` on a slow machine.
fn drain_timeout() -> Duration {
    time::scaled(Duration::from_secs(10))
}

fn run(o: &Options) -> Result<()> {
    let ctx = match &o.device {
        Some(name) => Context::open(name)?,
        None => Context::open_first()?,
    };
    let port = ctx.query_port(o.port)?;
    println!(
        "{} port {}: {}, {} link, active MTU {}",
        ctx.name(),
        o.port,
        port.state.c_name().trim_start_matches("IBV_PORT_"),
        if port.is_roce() {
            "Ethernet (RoCE)"
        } else {
            "InfiniBand"
        },
        port.active_mtu.bytes()
    );
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let conn = ConnectOptions {
        port: o.port,
        gid_index: o.gid_index,
        ..Default::default()
    };
    let psn = Psn::new(0x1234)?;

    // RC, typed, connected to itself.
    let mut rc = Qp::<Rc>::new(&pd, &cq, &cq, QpCaps::default())?;
    println!("RC QP {:#x}", rc.qp_num());
    let me = rc.local_endpoint(&conn, psn)?;
    println!("  endpoint (pingpong wire form): {me}");
    let mut av = AddressVector::new(o.port).dlid(me.lid);
    if !me.gid.is_zero() {
        let index = ctx
            .gid_table()?
            .into_iter()
            .find(|e| e.gid == me.gid && e.port == u32::from(o.port))
            .map_or(0, |e| e.index as u8);
        av = av.global(GlobalRoute::new(me.gid, index));
    }
    show("created", &rc)?;
    rc.apply(ResetToInit::<Rc>::new(
        0,
        o.port,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    ))?;
    show("RESET->INIT", &rc)?;
    rc.apply(InitToInit::<Rc>::new().access_flags(AccessFlags::REMOTE_WRITE))?;
    show("INIT->INIT (access)", &rc)?;
    rc.apply(InitToRtr::<Rc>::new(
        av,
        port.active_mtu,
        me.qpn,
        me.psn,
        1,
        MinRnrTimer::new(12)?,
    ))?;
    show("INIT->RTR", &rc)?;
    rc.apply(RtrToRts::<Rc>::new(
        AckTimeout::new(14)?,
        RetryCount::new(7)?,
        RnrRetry::INFINITE,
        psn,
        1,
    ))?;
    show("RTR->RTS", &rc)?;
    rc.apply(RtsToRts::<Rc>::new().min_rnr_timer(MinRnrTimer::new(14)?))?;
    show("RTS->RTS (min_rnr_timer)", &rc)?;
    rc.enter_sqd(RtsToSqd::<Rc>::new(), drain_timeout())?;
    show("RTS->SQD (drained)", &rc)?;
    rc.apply(SqdToSqd::<Rc>::new().timeout(AckTimeout::new(18)?))?;
    show("SQD->SQD (timeout)", &rc)?;
    rc.apply(SqdToRts::<Rc>::new())?;
    show("SQD->RTS", &rc)?;
    rc.apply(ToErr::new())?;
    show("RTS->ERR", &rc)?;
    rc.apply(ToReset::new())?;
    show("ERR->RESET", &rc)?;
    rc.apply(ResetToInit::<Rc>::new(0, o.port, AccessFlags::empty()))?;
    show("RESET->INIT again", &rc)?;
    let refused = rc.modify(&QpAttr::new().state(QpState::Rts));
    println!(
        "  INIT->RTS (dynamic)          refused before the call: {}",
        refused.unwrap_err()
    );

    // UC through the one-call helper (connected to itself: loopback), UD
    // through its own bring-up (a datagram QP has no peer), then the other
    // states.
    for t in [rdma_verbs::QpType::Uc, rdma_verbs::QpType::Ud] {
        let mut qp = pd.create_qp(&rdma_verbs::QpInitAttr::new(t, &cq, &cq))?;
        println!("{} QP {:#x}", t.short_name(), qp.qp_num());
        show("created", &qp)?;
        if t == rdma_verbs::QpType::Ud {
            qp.bring_up_ud(conn.port, conn.qkey, psn)?;
        } else {
            let me = qp.local_endpoint(&conn, psn)?;
            qp.connect(&conn, psn, &me)?;
        }
        show("RESET->INIT->RTR->RTS", &qp)?;
        qp.modify(&QpAttr::new().state(QpState::Sqd))?;
        qp.wait_sq_drained(drain_timeout())?;
        show("RTS->SQD (drained)", &qp)?;
        qp.modify(&QpAttr::new().state(QpState::Rts))?;
        show("SQD->RTS", &qp)?;
        qp.modify(&QpAttr::new().state(QpState::Err))?;
        show("RTS->ERR", &qp)?;
        qp.modify(&QpAttr::new().state(QpState::Reset))?;
        show("ERR->RESET", &qp)?;
    }
    Ok(())
}

//! Lists RDMA devices, their ports, GIDs and main limits, like `ibv_devinfo`.
//!
//! ```text
//! cargo run --example devinfo [-- [-d DEVICE] [-i PORT] [-v] [-l]]
//! ```
//! `-l` lists device names only; `-v` adds every device limit.

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;

use std::process::ExitCode;

use rdma_verbs::{Context, DeviceList, GidType, LinkLayer, Result};

struct Options {
    device: Option<String>,
    port: Option<u8>,
    verbose: bool,
    list_only: bool,
}

fn usage() -> ExitCode {
    eprintln!("usage: devinfo [-d DEVICE] [-i PORT] [-v] [-l]");
    ExitCode::from(2)
}

fn parse() -> std::result::Result<Options, ExitCode> {
    let mut o = Options {
        device: None,
        port: None,
        verbose: false,
        list_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-d" | "--ib-dev" => o.device = Some(args.next().ok_or_else(usage)?),
            "-i" | "--ib-port" => {
                o.port = Some(args.next().and_then(|p| p.parse().ok()).ok_or_else(usage)?)
            }
            "-v" | "--verbose" => o.verbose = true,
            "-l" | "--list" => o.list_only = true,
            _ => return Err(usage()),
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    quiet_pipe::install();
    let opts = match parse() {
        Ok(o) => o,
        Err(code) => return code,
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devinfo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Options) -> Result<()> {
    let list = DeviceList::new()?;
    if list.is_empty() {
        return Err(rdma_verbs::Error::NoDevices);
    }
    if opts.list_only {
        println!(
            "{} HCA{} found:",
            list.len(),
            if list.len() == 1 { "" } else { "s" }
        );
        for d in list.iter() {
            println!("\t{}", d.name());
        }
        return Ok(());
    }
    if opts.verbose {
        print_library();
    }
    let devices: Vec<_> = match &opts.device {
        Some(name) => vec![list.find(name)?],
        None => list.iter().collect(),
    };
    for dev in devices {
        let ctx = dev.open()?;
        print_device(&ctx, dev.transport_type(), opts)?;
    }
    Ok(())
}

/// `-v`: the libibverbs this process runs with and the rdma-core release
/// the crate was built against (they differ when a build against a prefix
/// runs without `LD_LIBRARY_PATH` at the prefix's library).
fn print_library() {
    let release = |r: Option<u32>| r.map_or_else(|| "unknown".to_owned(), |r| r.to_string());
    let built = release(rdma_verbs::sys::RDMA_CORE_RELEASE);
    match rdma_verbs::sys::loaded_libibverbs() {
        Some(lib) => {
            println!(
                "libibverbs:	{} (rdma-core {}; built against rdma-core {built})",
                lib.path.display(),
                release(lib.release)
            );
            if lib.release.is_some() && lib.release != rdma_verbs::sys::RDMA_CORE_RELEASE {
                println!("	(not the release of the headers this program was built with)");
            }
        }
        None => println!("libibverbs:	not found (built against rdma-core {built})"),
    }
}

fn print_device(ctx: &Context, transport: rdma_verbs::TransportType, opts: &Options) -> Result<()> {
    let a = ctx.attr();
    println!("hca_id:\t{}", ctx.name());
    let transport_name = match transport {
        rdma_verbs::TransportType::Ib => "InfiniBand",
        rdma_verbs::TransportType::Iwarp => "iWARP",
        other => other.c_name().trim_start_matches("IBV_TRANSPORT_"),
    };
    println!(
        "\ttransport:\t\t\t{transport_name} ({})",
        transport.as_raw()
    );
    println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    println!("\tnode_guid:\t\t\t{}", a.node_guid);
    println!("\tsys_image_guid:\t\t\t{}", a.sys_image_guid);
    println!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    println!("\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    println!("\tmax_sge:\t\t\t{}", a.max_sge);
    println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
    println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
    println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
    println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    println!(
        "\tatomic_cap:\t\t\t{} ({})",
        a.atomic_cap.c_name().trim_start_matches("IBV_"),
        a.atomic_cap.as_raw()
    );
    if opts.verbose {
        println!("\tdevice_cap_flags:\t\t{:?}", a.capabilities);
        println!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
        println!("\tmax_res_rd_atom:\t\t{}", a.max_res_rd_atom);
        println!("\tmax_mw:\t\t\t\t{}", a.max_mw);
        println!("\tmax_ah:\t\t\t\t{}", a.max_ah);
        println!("\tmax_srq:\t\t\t{}", a.max_srq);
        println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
        println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
        println!("\tmax_pkeys:\t\t\t{}", a.max_pkeys);
        println!("\tlocal_ca_ack_delay:\t\t{}", a.local_ca_ack_delay);
        println!(
            "\tcompletion_timestamp_mask:\t{:#x}",
            a.completion_timestamp_mask
        );
        println!("\thca_core_clock:\t\t\t{} kHz", a.hca_core_clock_khz);
        println!(
            "\tpacket_pacing:\t\t\t{}..={} kbps",
            a.packet_pacing.rate_limit_min_kbps, a.packet_pacing.rate_limit_max_kbps
        );
    }
    let gids = ctx.gid_table()?;
    for port in ctx.ports() {
        if opts.port.is_some_and(|p| p != port) {
            continue;
        }
        let p = ctx.query_port(port)?;
        println!("\t\tport:\t{port}");
        println!(
            "\t\t\tstate:\t\t\t{} ({})",
            p.state.c_name().trim_start_matches("IBV_"),
            p.state.as_raw()
        );
        println!(
            "\t\t\tmax_mtu:\t\t{} ({})",
            p.max_mtu.bytes(),
            p.max_mtu.as_raw()
        );
        println!(
            "\t\t\tactive_mtu:\t\t{} ({})",
            p.active_mtu.bytes(),
            p.active_mtu.as_raw()
        );
        println!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
        println!("\t\t\tport_lid:\t\t{}", p.lid);
        println!("\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
        let layer = match p.link_layer {
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::InfiniBand | LinkLayer::Unspecified => "InfiniBand",
        };
        println!("\t\t\tlink_layer:\t\t{layer}");
        println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        println!("\t\t\tgrh_required:\t\t{}", p.grh_required());
        if opts.verbose {
            println!("\t\t\tport_cap_flags:\t\t{:?}", p.port_cap_flags);
            println!("\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
        }
        for e in gids.iter().filter(|e| e.port == u32::from(port)) {
            let kind = match e.gid_type {
                Some(GidType::Ib) => "IB",
                Some(GidType::RoceV1) => "RoCE v1",
                Some(GidType::RoceV2) => "RoCE v2",
                None => "unknown type",
            };
            println!("\t\t\tGID[{:>3}]:\t\t{}, {kind}", e.index, e.gid);
        }
    }
    println!();
    Ok(())
}

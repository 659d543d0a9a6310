//! What is printed: perftest's header, table lines in perftest's column
//! order, and the machine-readable `perf-result:` lines.

use rdma_verbs::qp::Endpoint;
use rdma_verbs::LinkLayer;

use crate::opts::{AtomicType, Opts, Test, Verb};
use crate::run::Outcome;
use crate::setup::Conn;

pub const DASHES: &str =
    "---------------------------------------------------------------------------------------";

fn title(o: &Opts) -> String {
    match (o.test.verb(), o.atomic) {
        (Verb::Atomic, AtomicType::CmpAndSwap) => {
            o.test.title().replace("FETCH_AND_ADD", "CMP_AND_SWAP")
        }
        _ => o.test.title().to_owned(),
    }
}

fn gid_text(ep: &Endpoint) -> String {
    ep.gid
        .0
        .iter()
        .map(|b| format!("{b:02}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn address(which: &str, ep: &Endpoint, rdma: Option<(u32, u64)>) {
    let extra = rdma.map_or(String::new(), |(rkey, addr)| {
        format!(" RKey {rkey:#08x} VAddr {addr:#016x}")
    });
    println!(
        " {which} address: LID {:04x} QPN {:#06x} PSN {:#08x}{extra}",
        ep.lid,
        ep.qpn.get(),
        ep.psn.get()
    );
    println!(" GID: {}", gid_text(ep));
}

pub fn header(o: &Opts, c: &Conn) {
    let client = o.server.is_some();
    println!("{DASHES}");
    println!("                    {}", title(o));
    println!(
        " Dual-port       : OFF\t\tDevice         : {}",
        c.ctx.name()
    );
    println!(" Number of qps   : {}\t\tTransport type : IB", o.qps);
    println!(" Connection type : RC\t\tUsing SRQ      : OFF");
    if o.test.is_lat() {
        if o.test.verb() == Verb::Send && !client {
            println!(" RX depth        : {}", o.rx_depth);
        } else {
            println!(" TX depth        : {}", o.tx_depth);
        }
    } else {
        println!(" TX depth        : {}", o.tx_depth);
        println!(" CQ Moderation   : {}", o.cq_mod);
        println!(" Post List       : {}", o.post_list);
        if o.test.verb() == Verb::Send {
            println!(" RX depth        : {}", o.rx_depth);
        }
    }
    if matches!(o.test.verb(), Verb::Read | Verb::Atomic) {
        println!(" Outstand reads  : {}", c.rd_atomic);
    }
    println!(" Mtu             : {}[B]", c.mtu);
    let link = match c.link {
        LinkLayer::Ethernet => "Ethernet",
        LinkLayer::InfiniBand | LinkLayer::Unspecified => "IB",
    };
    println!(" Link type       : {link}");
    if let Some(g) = c.gid_index {
        println!(" GID index       : {g}");
    }
    println!(
        " Max inline data : {}[B]",
        if o.inline_size == 0 { 0 } else { c.max_inline }
    );
    println!(" Data ex. method : Ethernet");
    println!(
        " Events          : {}",
        match (o.events, o.async_wait) {
            (_, true) => "ON (tokio)",
            (true, false) => "ON",
            (false, false) => "OFF",
        }
    );
    println!(" rdma-verbs path : {}", o.path.name());
    println!("{DASHES}");
    let rdma = o.test.verb() != Verb::Send;
    for (i, ep) in c.local_eps.iter().enumerate() {
        address(
            "local",
            ep,
            rdma.then(|| (c.target.rkey(), c.target.addr())),
        );
        let r = c.remote.get(i);
        if let Some(rep) = c.remote_eps.get(i) {
            address("remote", rep, r.filter(|_| rdma).map(|r| (r.rkey, r.addr)));
        }
    }
    println!("{DASHES}");
}

pub fn table_header(test: Test) {
    if test.is_lat() {
        println!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ");
    } else {
        println!(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        );
    }
}

/// The `p`-quantile of sorted samples (the smallest sample that at least
/// a fraction `p` of them do not exceed).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let k = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[k - 1]
}

pub fn lat_line(size: usize, iters: u64, out: &Outcome) {
    let mut s = out.samples.clone();
    s.sort_by(f64::total_cmp);
    let n = s.len().max(1) as f64;
    let avg = s.iter().sum::<f64>() / n;
    let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
    let (min, max) = (
        s.first().copied().unwrap_or(0.0),
        s.last().copied().unwrap_or(0.0),
    );
    let typical = s.get(s.len() / 2).copied().unwrap_or(0.0);
    println!(
        " {:<7} {:<10}    {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2}\t\t{:<7.2}",
        size,
        iters,
        min,
        max,
        typical,
        avg,
        var.sqrt(),
        quantile(&s, 0.99),
        quantile(&s, 0.999)
    );
}

pub fn bw_line(size: usize, iters: u64, out: &Outcome) {
    let secs = out.elapsed.as_secs_f64();
    let mb = (1u64 << 20) as f64;
    let avg = if secs > 0.0 {
        (out.ops as f64 * size as f64) / secs / mb
    } else {
        0.0
    };
    let peak = (out.peak_ops_per_sec * size as f64 / mb).max(avg);
    let mpps = if secs > 0.0 {
        out.ops as f64 / secs / 1e6
    } else {
        0.0
    };
    println!(
        " {:<10} {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        size, iters, peak, avg, mpps
    );
}

pub fn result_line(o: &Opts, size: usize, out: &Outcome) -> String {
    format!(
        "perf-result: test={} path={} size={} iters={} ops={} polls={} empty_polls={} usec={}",
        o.test.name(),
        o.path.name(),
        size,
        o.iters,
        out.ops,
        out.polls,
        out.empty_polls,
        out.elapsed.as_micros()
    )
}

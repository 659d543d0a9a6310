//! A port of rdma-core's `mckey` (librdmacm's examples, rdma-core 44):
//! multicast over unreliable datagrams through the RDMA connection
//! manager. Receivers and senders join the group `-m` (through the CM,
//! which on RoCE maps an IP multicast address to a multicast GID), wait
//! 3 seconds, then senders send `-C` datagrams to the group and receivers
//! wait for `-C` datagrams each.
//!
//! ```text
//! mckey -m multicast_address [-b bind_address] [-C count] [-S size] [...]       receiver
//! mckey -m multicast_address -s [-b bind_address] [-C count] [-S size] [...]    sender
//!
//!   -m multicast_address      the group (a name or an address)
//!   -M unmapped_address       an AF_IB group GID, in place of -m; needs -b
//!   -s                        send (default: receive)
//!   -b bind_address           local address to join from
//!   -c connections            members (ids, QPs) to join with (default 1)
//!   -C message_count          datagrams per member (default 10)
//!   -S message_size           bytes per datagram (default 100)
//!   -p port_space             0x111 UDP (default), 0x2 IPoIB
//!   -o                        join as a send-only full member
//!   -l                        join without multicast loopback
//! ```
//!
//! Either side can be the C program: the datagrams are the C program's
//! (SEND with immediate data, to QP 0xffffff with the group's Q_Key), and
//! so are the output, the exit status (the C program's `return status`,
//! modulo 256; note that it is the result of leaving the group) and the
//! handling of bad options. Start receivers first (a sender sends 3 s
//! after it joined), with the same `-C` as the senders and a `-S` at least
//! theirs: a receiver waits until it has all its datagrams. On soft-RoCE:
//! `cargo run --example mckey -- -m 239.1.1.1 -b 10.99.0.1` then
//! `cargo run --example mckey -- -m 239.1.1.1 -b 10.99.0.1 -s`.
//!
//! Differences from C, where the crate cannot do what C does: `-l` needs a
//! QP created with `IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`, which the crate's
//! `QpInitAttr` cannot ask for: it fails as it does in C on a device without
//! it (soft-RoCE), `mckey: unable to create QP: Operation not supported`.
//! `-M` needs an AF_IB address, which `std::net::SocketAddr` cannot hold:
//! the join fails (`mckey: failure joining: Address family not supported by
//! protocol`), as C's fails on RoCE (with the kernel's error 524).

#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/ud_cm.rs"]
mod ud_cm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_verbs::cm::{CmEvent, CmEventKind, EventChannel, McJoin, PortSpace};
use rdma_verbs::Gid;
use ud_cm::{
    atoi, errno_of, exit, inet_ntop6, lookup, perror, say, strtol, GaiError, Getopt, Got, Node,
    Test,
};

/// Address resolution time-out.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);
/// The pause after joining ("give the SM a chance to configure switches").
const SETTLE: Duration = Duration::from_secs(3);

/// The command line.
struct Opts {
    dst: Option<String>,
    unmapped: bool,
    sender: bool,
    src: Option<String>,
    connections: i32,
    count: i32,
    size: i32,
    port_space: u32,
    send_only: bool,
    no_loopback: bool,
}

fn usage(prog: &str) -> ! {
    say(format_args!("usage: {prog}"));
    for line in [
        "\t-m multicast_address",
        "\t[-M unmapped_multicast_address]",
        "\t replaces -m and requires -b",
        "\t[-s(ender)]",
        "\t[-b bind_address]",
        "\t[-c connections]",
        "\t[-C message_count]",
        "\t[-S message_size]",
        "\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]",
        "\t[-o join as a send-only full-member]",
        "\t[-l join without multicast loopback]",
    ] {
        say(line);
    }
    exit(1)
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        dst: None,
        unmapped: false,
        sender: false,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        port_space: PortSpace::Udp.as_raw(),
        send_only: false,
        no_loopback: false,
    };
    let prog = args.first().map_or("mckey", String::as_str);
    for got in Getopt::new(args, "m:M:sb:c:C:S:p:ol") {
        let Got::Opt(c, arg) = got else { usage(prog) };
        let arg = arg.unwrap_or_default();
        match c {
            'm' => o.dst = Some(arg),
            'M' => (o.unmapped, o.dst) = (true, Some(arg)),
            's' => o.sender = true,
            'b' => o.src = Some(arg),
            'c' => o.connections = atoi(&arg),
            'C' => o.count = atoi(&arg),
            'S' => o.size = atoi(&arg),
            'p' => o.port_space = strtol(&arg, 0) as u32,
            'o' => o.send_only = true,
            'l' => o.no_loopback = true,
            _ => usage(prog),
        }
    }
    o
}

/// The program's state: the C program's globals.
struct Mckey {
    o: Opts,
    t: Test,
    ch: Arc<EventChannel>,
    nodes: Vec<Node>,
    src: Option<SocketAddr>,
    /// The group (`None` for an unmapped `-M` group, which cannot be held).
    dst: Option<SocketAddr>,
}

fn main() {
    quiet_pipe::install();
    let args = ud_cm::args();
    let o = parse(&args);
    if o.unmapped && o.src.is_none() {
        say("unmapped multicast address requires binding to source address");
        exit(1)
    }
    let Some(ch) = ud_cm::create_first_event_channel() else {
        exit(1)
    };
    // alloc_nodes
    let Some(mut nodes) = ud_cm::alloc_nodes(o.connections) else {
        say("mckey: unable to allocate memory for test nodes");
        exit(1)
    };
    ud_cm::create_ids(&ch, &mut nodes, o.port_space);
    let t = Test::new("mckey", o.count, o.size, o.connections);
    let mut m = Mckey {
        o,
        t,
        ch: Arc::new(ch),
        nodes,
        src: None,
        dst: None,
    };
    let ret = m.run();
    say("test complete");
    for node in m.nodes.drain(..) {
        node.destroy();
    }
    drop(m);
    say(format_args!("return status {ret}"));
    exit(ret)
}

/// `getaddrinfo(name, NULL, NULL)`, saying why not.
fn get_addr(name: Option<&str>) -> Result<SocketAddr, i32> {
    name.map_or(Err(GaiError::code(-2)), |n| lookup(n, 0, false))
        .map_err(|g| {
            say(format_args!(
                "getaddrinfo failed ({}) - invalid hostname or IP address",
                g.text
            ));
            g.code
        })
}

impl Mckey {
    fn run(&mut self) -> i32 {
        say(format_args!(
            "mckey: starting {}",
            if self.o.sender { "client" } else { "server" }
        ));
        if let Some(src) = &self.o.src {
            match get_addr(Some(src)) {
                Ok(a) => self.src = Some(a),
                Err(code) => return code,
            }
        }
        if !self.o.unmapped {
            match get_addr(self.o.dst.as_deref()) {
                Ok(a) => self.dst = Some(a),
                Err(code) => return code,
            }
        }
        say("mckey: joining");
        for i in 0..self.nodes.len() {
            let Some(id) = &self.nodes[i].id else {
                continue;
            };
            if let Some(src) = self.src {
                if let Err(e) = id.bind(src) {
                    perror("mckey: addr bind failure", errno_of(&e));
                    self.t.connects_left -= 1;
                    return -1;
                }
            }
            let (ret, errno) = match self.dst {
                // With -M the id is bound to its device: join at once.
                None => (self.addr_handler(i), libc::EINVAL),
                Some(dst) => match id.resolve_addr(self.src, dst, RESOLVE_TIMEOUT) {
                    Ok(()) => (0, 0),
                    Err(e) => (-1, errno_of(&e)),
                },
            };
            if ret != 0 {
                perror("mckey: resolve addr failure", errno);
                self.t.connects_left -= 1;
                return ret;
            }
        }
        let mut ret = self.connect_events();
        if ret == 0 {
            self.start_cm_thread();
            std::thread::sleep(SETTLE);
            ret = self.transfer();
        }
        // Every node leaves the group; the last result is the program's.
        for node in &self.nodes {
            let Some(id) = &node.id else { continue };
            ret = match self.dst.map(|dst| id.leave_multicast(dst)) {
                Some(Ok(())) => 0,
                // librdmacm's answer for a group the id has not joined.
                _ => {
                    perror("mckey: failure leaving", libc::EADDRNOTAVAIL);
                    -1
                }
            };
        }
        ret
    }

    fn transfer(&mut self) -> i32 {
        if self.t.count == 0 {
            return 0;
        }
        if self.o.sender {
            say("initiating data transfers");
            for i in 0..self.nodes.len() {
                let ret = self.t.post_sends(&mut self.nodes[i], false);
                if ret != 0 {
                    return ret;
                }
            }
        } else {
            say("receiving data transfers");
            let ret = self.t.poll_cqs(&mut self.nodes, false);
            if ret != 0 {
                return ret;
            }
        }
        say("data transfers complete");
        0
    }

    /// Reports the CM events that come after joining, as C's `cma_thread`.
    fn start_cm_thread(&self) {
        let ch = Arc::clone(&self.ch);
        // As in C, a thread that cannot be started is not reported.
        let _ = std::thread::Builder::new().spawn(move || loop {
            match ch.get_event() {
                Ok(ev) => {
                    if matches!(
                        ev.kind(),
                        CmEventKind::MulticastError | CmEventKind::AddrChange
                    ) {
                        say(format_args!(
                            "mckey: event: {}, status: {}",
                            ev.kind().c_name(),
                            ev.status()
                        ));
                    }
                }
                Err(e) => {
                    perror("rdma_get_cm_event", errno_of(&e));
                    break;
                }
            }
        });
    }

    /// Handles CM events until every node joined or failed, or a handler
    /// fails.
    fn connect_events(&mut self) -> i32 {
        let mut ret = 0;
        while self.t.connects_left > 0 && ret == 0 {
            ret = match self.ch.get_event() {
                Ok(ev) => self.cma_handler(&ev),
                Err(_) => -1,
            };
        }
        ret
    }

    fn cma_handler(&mut self, ev: &CmEvent) -> i32 {
        let node = self
            .nodes
            .iter()
            .position(|n| n.id.as_ref().is_some_and(|id| ev.is_for(id)));
        match ev.kind() {
            CmEventKind::AddrResolved => node.map_or(0, |i| self.addr_handler(i)),
            CmEventKind::MulticastJoin => node.map_or(0, |i| self.join_handler(i, ev)),
            CmEventKind::AddrError | CmEventKind::RouteError | CmEventKind::MulticastError => {
                self.t.event_error(ev)
            }
            _ => 0,
        }
    }

    /// The group's address is resolved: the node's resources, receives
    /// (receivers), and the join.
    fn addr_handler(&mut self, i: usize) -> i32 {
        let node = &mut self.nodes[i];
        let mut ret = self.t.verify_params(node);
        if ret == 0 {
            ret = self.t.init_node(node, self.o.no_loopback);
        }
        if ret == 0 && !self.o.sender {
            ret = self.t.post_recvs(node);
        }
        if ret == 0 {
            let joined = match (&node.id, self.dst) {
                (Some(id), Some(dst)) if self.o.send_only => id
                    .join_multicast_with(dst, McJoin::SendOnlyFullMember)
                    .map_err(|e| errno_of(&e)),
                (Some(id), Some(dst)) => id.join_multicast(dst).map_err(|e| errno_of(&e)),
                // An AF_IB group (-M) cannot be named.
                _ => Err(libc::EAFNOSUPPORT),
            };
            if let Err(errno) = joined {
                perror("mckey: failure joining", errno);
                ret = -1;
            }
        }
        if ret != 0 {
            self.t.connects_left -= 1;
        }
        ret
    }

    /// Joined: where the group's datagrams go.
    fn join_handler(&mut self, i: usize, ev: &CmEvent) -> i32 {
        let node = &mut self.nodes[i];
        let Some(ud) = ev.ud_info() else {
            return 0;
        };
        let dgid = ud.av.grh().map_or(Gid::ZERO, |g| g.dgid());
        say(format_args!(
            "mckey: joined dgid: {} mlid 0x{:x} sl {}",
            inet_ntop6(&dgid),
            ud.av.dest_lid(),
            ud.av.service_level()
        ));
        node.remote_qpn = ud.qp_num.get();
        node.remote_qkey = ud.qkey;
        self.t.connects_left -= 1;
        match node.pd.as_ref().and_then(|pd| pd.create_ah(&ud.av).ok()) {
            Some(ah) => {
                node.ah = Some(ah);
                node.connected = true;
                0
            }
            None => {
                say("mckey: failure creating address handle");
                -1
            }
        }
    }
}

//! A port of rdma-core's `udaddy` (librdmacm's examples, rdma-core 44):
//! unreliable datagrams between a client and a server that find each other
//! through the RDMA connection manager. The client resolves the server's
//! IP address, and its connect request (a SIDR request, in the UDP port
//! space on port 7174) brings back the server's QP number and Q_Key; then
//! the client sends `-C` datagrams and the server answers each.
//!
//! ```text
//! udaddy [-b bind_address] [-c connections] [-C count] [-S size]       server
//! udaddy -s server_address [-b bind_address] [-c connections] [...]    client
//!
//!   -s server_address   run as the client of this server (else: the server)
//!   -b bind_address     local address to use (server: to listen on)
//!   -f address_format   name (default), ip (numeric only), gid
//!   -P port_space       udp (default) or ipoib
//!   -c connections      connections to make or accept (default 1)
//!   -C message_count    datagrams each way per connection (default 10)
//!   -S message_size     bytes per datagram (default 100)
//!   -t type_of_service  type of service of the client's connections
//!   -p port_space       port space by number: 0x111 UDP, 0x2 IPoIB
//! ```
//!
//! Either side can be the C program: the messages are the C program's
//! (SEND with immediate data, the immediate being the sender's QP number,
//! from which the server learns where to reply), and so are the output,
//! the exit status (the C program's `return status`, modulo 256) and the
//! handling of bad options. Both sides must use the same `-c`, `-C` and
//! `-S`: the server replies with datagrams of its own size, and a datagram
//! larger than the receiver's buffers completes in error, which the
//! programs count like any other completion (as C does). On soft-RoCE:
//! `cargo run --example udaddy` on one side and
//! `cargo run --example udaddy -- -s 10.99.0.1` on the other.
//!
//! The server learns the client's address from the first datagram: from
//! the GRH (on RoCE: the IP header) in front of it, with
//! `ProtectionDomain::create_ah_from_wc` (`ibv_create_ah_from_wc`).
//!
//! Difference from C, where the crate cannot do what C does:
//! `-f gid` (AF_IB addresses, which `std::net::SocketAddr` cannot hold)
//! fails as a lookup in an unsupported family does
//! (`udaddy: getaddrinfo error: ai_family not supported`; from rdma-core 52
//! `rdma_getaddrinfo error: ...`, as that release's C program words it).

#![forbid(unsafe_code)]

#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "common/ud_cm.rs"]
mod ud_cm;

use std::net::SocketAddr;
use std::time::Duration;

use rdma_verbs::cm::{CmEvent, CmEventKind, ConnParam, EventChannel, PortSpace};
use ud_cm::{
    atoi, errno_of, exit, lookup, perror, prefix_is, say, strtol, strtoul, warn, wildcard,
    GaiError, Getopt, Got, Node, Test,
};

/// The port, which no option changes.
const PORT: u16 = 7174;
/// Address and route resolution time-outs.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);

/// The command line.
struct Opts {
    dst: Option<String>,
    src: Option<String>,
    connections: i32,
    count: i32,
    size: i32,
    tos: Option<u8>,
    port_space: u32,
    numeric: bool,
    gid: bool,
}

fn usage(prog: &str) -> ! {
    say(format_args!("usage: {prog}"));
    for line in [
        "\t[-s server_address]",
        "\t[-b bind_address]",
        "\t[-f address_format]",
        "\t    name, ip, ipv6, or gid",
        "\t[-P port_space]",
        "\t    udp or ipoib",
        "\t[-c connections]",
        "\t[-C message_count]",
        "\t[-S message_size]",
        "\t[-t type_of_service]",
        "\t[-p port_space - 0x111 for UDP (default), 0x2 for IPOIB]",
    ] {
        say(line);
    }
    exit(1)
}

fn parse(args: &[String]) -> Opts {
    let mut o = Opts {
        dst: None,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        tos: None,
        port_space: PortSpace::Udp.as_raw(),
        numeric: false,
        gid: false,
    };
    let prog = args.first().map_or("udaddy", String::as_str);
    for got in Getopt::new(args, "s:b:c:C:S:t:p:P:f:") {
        let Got::Opt(c, Some(arg)) = got else {
            usage(prog)
        };
        match c {
            's' => o.dst = Some(arg),
            'b' => o.src = Some(arg),
            'c' => o.connections = atoi(&arg),
            'C' => o.count = atoi(&arg),
            'S' => o.size = atoi(&arg),
            't' => o.tos = Some(strtoul(&arg, 0) as u8),
            'p' => o.port_space = strtol(&arg, 0) as u32,
            'f' if prefix_is("ip", &arg, 2) => (o.numeric, o.gid) = (true, false),
            'f' if prefix_is("gid", &arg, 3) => (o.numeric, o.gid) = (true, true),
            'f' if prefix_is("name", &arg, 4) => {}
            'f' => warn("Warning: unknown address format"),
            'P' if prefix_is("ipoib", &arg, 5) => o.port_space = PortSpace::Ipoib.as_raw(),
            'P' if prefix_is("udp", &arg, 3) => {}
            'P' => warn("Warning: unknown port space format"),
            _ => usage(prog),
        }
    }
    o
}

/// The program's state: the C program's globals.
struct Udaddy {
    o: Opts,
    t: Test,
    ch: EventChannel,
    nodes: Vec<Node>,
    /// The next node a connection request takes (server).
    conn_index: usize,
}

fn main() {
    quiet_pipe::install();
    let args = ud_cm::args();
    let o = parse(&args);
    let Some(ch) = ud_cm::create_first_event_channel() else {
        exit(1)
    };
    // alloc_nodes
    let Some(mut nodes) = ud_cm::alloc_nodes(o.connections) else {
        say("udaddy: unable to allocate memory for test nodes");
        exit(1)
    };
    if o.dst.is_some() {
        ud_cm::create_ids(&ch, &mut nodes, o.port_space);
    }
    let t = Test::new("udaddy", o.count, o.size, o.connections);
    let mut u = Udaddy {
        o,
        t,
        ch,
        nodes,
        conn_index: 0,
    };
    let ret = if u.o.dst.is_some() {
        u.run_client()
    } else {
        u.run_server()
    };
    say("test complete");
    for node in u.nodes.drain(..) {
        node.destroy();
    }
    drop(u);
    say(format_args!("return status {ret}"));
    exit(ret)
}

impl Udaddy {
    /// `get_rdma_addr` for the client: the source (`-b`, any port) and the
    /// server's address on port 7174.
    fn client_addrs(&self) -> Result<(Option<SocketAddr>, SocketAddr), GaiError> {
        if self.o.gid {
            return Err(GaiError::code(-6));
        }
        let src = match &self.o.src {
            Some(s) => Some(lookup(s, 0, self.o.numeric)?),
            None => None,
        };
        let dst = lookup(self.o.dst.as_deref().unwrap_or(""), PORT, self.o.numeric)?;
        Ok((src, dst))
    }

    /// `get_rdma_addr` for the server: `-b`, or the wildcard address, on
    /// port 7174.
    fn server_addr(&self) -> Result<SocketAddr, GaiError> {
        if self.o.gid {
            return Err(GaiError::code(-6));
        }
        match &self.o.src {
            Some(s) => lookup(s, PORT, self.o.numeric),
            None => Ok(wildcard(PORT)),
        }
    }

    fn run_client(&mut self) -> i32 {
        say("udaddy: starting client");
        let (src, dst) = match self.client_addrs() {
            Ok(a) => a,
            Err(g) => {
                say(format_args!("{}: {}", getaddrinfo_error(), g.text));
                return g.code;
            }
        };
        say("udaddy: connecting");
        for node in &self.nodes {
            let Some(id) = &node.id else { continue };
            if let Err(e) = id.resolve_addr(src, dst, RESOLVE_TIMEOUT) {
                perror("udaddy: failure getting addr", errno_of(&e));
                self.t.connects_left -= 1;
                return -1;
            }
        }
        let ret = self.connect_events();
        if ret != 0 {
            return ret;
        }
        if self.t.count != 0 {
            say("initiating data transfers");
            for i in 0..self.nodes.len() {
                let ret = self.t.post_sends(&mut self.nodes[i], false);
                if ret != 0 {
                    return ret;
                }
            }
            say("receiving data transfers");
            let ret = self.t.poll_cqs(&mut self.nodes, false);
            if ret != 0 {
                return ret;
            }
            say("data transfers complete");
        }
        0
    }

    fn run_server(&mut self) -> i32 {
        say("udaddy: starting server");
        let listen = match PortSpace::from_raw(self.o.port_space)
            .ok_or(libc::EINVAL)
            .and_then(|ps| self.ch.create_id(ps).map_err(|e| errno_of(&e)))
        {
            Ok(id) => id,
            Err(errno) => {
                perror("udaddy: listen request failed", errno);
                return -1;
            }
        };
        let addr = match self.server_addr() {
            Ok(a) => a,
            Err(g) => {
                say(format_args!("udaddy: getrdmaaddr error: {}", g.text));
                return g.code;
            }
        };
        if let Err(e) = listen.bind(addr) {
            perror("udaddy: bind address failed", errno_of(&e));
            return -1;
        }
        if let Err(e) = listen.listen(0) {
            perror("udaddy: failure trying to listen", errno_of(&e));
            return -1;
        }
        // As in C, a failed request only shows in the output.
        self.connect_events();
        let mut ret = 0;
        if self.t.count != 0 {
            say("receiving data transfers");
            ret = self.t.poll_cqs(&mut self.nodes, true);
            if ret != 0 {
                return ret;
            }
            say("sending replies");
            for i in 0..self.nodes.len() {
                ret = self.t.post_sends(&mut self.nodes[i], true);
                if ret != 0 {
                    return ret;
                }
            }
            ret = self.t.poll_cqs(&mut self.nodes, true);
            if ret != 0 {
                return ret;
            }
            say("data transfers complete");
        }
        drop(listen);
        ret
    }

    /// Handles CM events until every node is connected or has failed, or
    /// a handler fails.
    fn connect_events(&mut self) -> i32 {
        let mut ret = 0;
        while self.t.connects_left > 0 && ret == 0 {
            ret = match self.ch.get_event() {
                Ok(ev) => self.cma_handler(ev),
                Err(_) => -1,
            };
        }
        ret
    }

    /// The node whose id the event is for.
    fn node_of(&self, ev: &CmEvent) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.id.as_ref().is_some_and(|id| ev.is_for(id)))
    }

    fn cma_handler(&mut self, ev: CmEvent) -> i32 {
        match ev.kind() {
            CmEventKind::AddrResolved => self.node_of(&ev).map_or(0, |i| self.addr_handler(i)),
            CmEventKind::RouteResolved => self.node_of(&ev).map_or(0, |i| self.route_handler(i)),
            CmEventKind::ConnectRequest => self.connect_handler(ev),
            CmEventKind::Established => self
                .node_of(&ev)
                .map_or(0, |i| self.resolved_handler(i, &ev)),
            CmEventKind::AddrError
            | CmEventKind::RouteError
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => self.t.event_error(&ev),
            _ => 0,
        }
    }

    fn addr_handler(&mut self, i: usize) -> i32 {
        let Some(id) = &self.nodes[i].id else {
            return 0;
        };
        if let Some(tos) = self.o.tos {
            if let Err(e) = id.set_tos(tos) {
                perror("udaddy: set TOS option failed", errno_of(&e));
            }
        }
        if let Err(e) = id.resolve_route(RESOLVE_TIMEOUT) {
            perror("udaddy: resolve route failed", errno_of(&e));
            self.t.connects_left -= 1;
            return -1;
        }
        0
    }

    /// Route resolved: the node's resources, its receives, and the SIDR
    /// request.
    fn route_handler(&mut self, i: usize) -> i32 {
        let node = &mut self.nodes[i];
        let mut ret = self.t.verify_params(node);
        if ret == 0 {
            ret = self.t.init_node(node, false);
        }
        if ret == 0 {
            ret = self.t.post_recvs(node);
        }
        if ret == 0 {
            if let Some(id) = &node.id {
                if let Err(e) = id.connect(&ConnParam::new()) {
                    perror("udaddy: failure connecting", errno_of(&e));
                    ret = -1;
                }
            }
        }
        if ret != 0 {
            self.t.connects_left -= 1;
        }
        ret
    }

    /// A connection request (server): the next node takes it and accepts,
    /// or it is rejected.
    fn connect_handler(&mut self, mut ev: CmEvent) -> i32 {
        let Some(id) = ev.take_request() else {
            return 0;
        };
        if self.conn_index == self.nodes.len() {
            say("udaddy: failing connection request");
            let _ = id.reject(&[]);
            return -libc::ENOMEM;
        }
        let node = &mut self.nodes[self.conn_index];
        self.conn_index += 1;
        node.id = Some(id);
        let mut ret = self.t.verify_params(node);
        if ret == 0 {
            ret = self.t.init_node(node, false);
        }
        if ret == 0 {
            ret = self.t.post_recvs(node);
        }
        if ret == 0 {
            // The SIDR reply carries the id's QP number and Q_Key.
            let accepted = node.id.as_ref().map(|id| id.accept(&ConnParam::new()));
            if let Some(Err(e)) = accepted {
                perror("udaddy: failure accepting", errno_of(&e));
                ret = -1;
            }
        }
        if ret == 0 {
            node.connected = true;
            self.t.connects_left -= 1;
            return 0;
        }
        // The node gives the id up; the request is rejected.
        let failed = std::mem::take(node);
        self.t.connects_left -= 1;
        say("udaddy: failing connection request");
        if let Some(id) = &failed.id {
            let _ = id.reject(&[]);
        }
        failed.destroy();
        ret
    }

    /// The server's reply to the SIDR request: where to send.
    fn resolved_handler(&mut self, i: usize, ev: &CmEvent) -> i32 {
        let node = &mut self.nodes[i];
        let ah = ev.ud_info().and_then(|ud| {
            node.remote_qpn = ud.qp_num.get();
            node.remote_qkey = ud.qkey;
            node.pd.as_ref()?.create_ah(&ud.av).ok()
        });
        self.t.connects_left -= 1;
        match ah {
            Some(ah) => {
                node.ah = Some(ah);
                node.connected = true;
                0
            }
            None => {
                say("udaddy: failure creating address handle");
                -1
            }
        }
    }
}

/// How the C program of the rdma-core this runs with words a failed
/// address lookup: rdma-core 52 moved it into the examples' shared helper
/// (`librdmacm/examples/common.c`, "rdma_getaddrinfo error"); before, udaddy
/// said "udaddy: getaddrinfo error".
fn getaddrinfo_error() -> &'static str {
    let release = rdma_verbs::sys::loaded_libibverbs().and_then(|l| l.release);
    if release.is_some_and(|r| r >= 52) {
        "rdma_getaddrinfo error"
    } else {
        "udaddy: getaddrinfo error"
    }
}

//! A port of rdma-core's `rping` (librdmacm's example, as in rdma-core 44):
//! RDMA READ/WRITE ping-pong over a connection made by the connection
//! manager. It is wire-compatible with the C program in both roles and
//! takes the same options, prints the same lines on stdout and stderr and
//! ends with the same exit statuses, so scripts written for `rping` work
//! with it.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//!     -c          client side
//!     -I          Source address to bind to for client.
//!     -s          server side.  To bind to any address with IPv6 use -a ::0
//!     -v          display ping data to stdout
//!     -V          validate ping data
//!     -d          debug printfs
//!     -S size     ping data size (23 to 65535, default 64)
//!     -C count    ping count times (client; default 0: forever)
//!     -a addr     address
//!     -p port     port (default 7174)
//!     -P          persistent server mode allowing multiple connections
//!     -q          use self-created, self-modified QP
//! ```
//!
//! On soft-RoCE at 10.99.0.1: `rping -s -a 10.99.0.1 -v` on one side and
//! `rping -c -a 10.99.0.1 -v -V -C 10` on the other (either may be the C
//! program). The server's `-S` must be at least the client's.
//!
//! # What happens
//!
//! The client resolves the server's address and route, creates its QP on
//! the CM id ([`CmId::create_qp`](rdma_verbs::cm::CmId::create_qp)) and
//! connects. For every ping it fills its source buffer with
//! `rdma-ping-N: ` and a run of letters, and SENDs the buffer's address,
//! rkey and length (`struct rping_rdma_info`: 16 bytes, all big-endian);
//! the server RDMA READs it, SENDs a 16-byte "go ahead", the client
//! advertises its sink buffer the same way, the server RDMA WRITEs the
//! string back into it and says "go ahead" again. `-V` compares the two
//! buffers, `-v` prints the string (`ping data: ...` on the client,
//! `server ping data: ...` on the server). After `-C` pings the client
//! disconnects; the server then prints `server DISCONNECT EVENT...` and
//! `wait for RDMA_READ_ADV state 10` to stderr and exits 0, as the C
//! server does.
//!
//! With `-q` the program creates its QP itself (`ProtectionDomain::create_qp`),
//! moves it with the attributes [`CmId::init_qp_attr`](rdma_verbs::cm::CmId::init_qp_attr)
//! reads from the CM through the crate's validated `QueuePair::modify`,
//! and names it in the connection parameters
//! ([`ConnParam::qp_num`](rdma_verbs::cm::ConnParam::qp_num)); the client
//! then finishes with [`CmId::establish`](rdma_verbs::cm::CmId::establish)
//! after the CONNECT_RESPONSE event. Nothing changes on the wire.
//!
//! # Differences from the C program that scripts cannot see
//!
//! * The `%p` values of the `-d` lines are object addresses of this
//!   program (CM ids: their [`CmId::key`](rdma_verbs::cm::CmId::key)),
//!   not the C library's pointers; the C values differ per run anyway.
//! * Events and completions are handled by the thread that waits for them
//!   rather than by separate CM and CQ threads, so the `-d` lines of the
//!   completions come in an order of their own (the C program's vary
//!   from run to run).
//! * A peer's disconnect request is answered at once by the thread that
//!   reads the CM events, rather than by the main thread after it woke:
//!   a C client ends without waiting for that answer, and prints its
//!   `client DISCONNECT EVENT...` line only if it came in time.
//! * A client advertising more bytes than the server's `-S` makes the C
//!   server's RDMA READ fail on the device (`cq completion failed status
//!   4`). The crate refuses to post that READ at all, so this server
//!   reports it with the same line and ends the same way.
//! * Rust programs ignore SIGPIPE: when the reader of stdout goes away
//!   (`rping ... | head -1`), the C program is killed by the signal at its
//!   next write, this one carries on (its writes fail silently).
//! * A CM error event (REJECTED, ...) makes the C program's CM thread exit
//!   at once with status 255, racing the main thread's messages; here the
//!   main thread prints its messages first, then the program exits 255.

#![forbid(unsafe_code)]

/// A line on stdout, buffered as C's stdio would (see `out`).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))
    };
}

/// A `-d` line (C's `DEBUG_LOG`).
macro_rules! debug_log {
    ($($arg:tt)*) => {
        if $crate::out::debug() {
            outln!($($arg)*)
        }
    };
}

#[path = "rping/cb.rs"]
mod cb;
#[path = "rping/client.rs"]
mod client;
#[path = "rping/conn.rs"]
mod conn;
#[path = "common/gai.rs"]
mod gai;
#[path = "rping/opts.rs"]
mod opts;
#[path = "rping/out.rs"]
mod out;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "rping/server.rs"]
mod server;
#[path = "common/time.rs"]
mod time;

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};

use rdma_verbs::cm::{EventChannel, PortSpace};

fn main() {
    quiet_pipe::install();
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let o = match opts::parse(&args) {
        Ok(o) => o,
        Err(status) => out::exit(status),
    };

    // create_first_event_channel()
    let ch = match EventChannel::new() {
        Ok(ch) => ch,
        Err(e) => {
            let errno = e.errno().unwrap_or(libc::EINVAL);
            if errno == libc::ENODEV {
                eprintln!("No RDMA devices were detected");
            } else {
                out::perror("failed to create RDMA CM event channel", &e);
            }
            out::exit(errno);
        }
    };
    let id = match ch.create_id(PortSpace::Tcp) {
        Ok(id) => Arc::new(id),
        Err(e) => {
            out::perror("rdma_create_id", &e);
            out::exit(-1);
        }
    };
    debug_log!("created cm_id {:#x}", id.key());

    let routes: cb::Routes = Arc::new(Mutex::new(HashMap::new()));
    let (tx, rx) = mpsc::channel();
    // The client's id is a connection; the listener is not.
    let conn = (!o.server).then(|| id.clone());
    cb::route(&routes, id.key(), tx.clone(), conn);
    cb::spawn_cm_thread(ch.clone(), routes.clone());

    let ret = match (o.server, o.persistent) {
        (true, true) => server::run_persistent_server(&o, &id, rx, &routes),
        (true, false) => server::run_server(&o, &id, rx, tx, &routes),
        (false, _) => client::run_client(&o, &id, rx, tx),
    };

    debug_log!("destroy cm_id {:#x}", id.key());
    cb::unroute(&routes, id.key());
    drop(id);
    out::exit(ret);
}

//! A perftest-shaped benchmark (`ib_send_lat`, `ib_write_bw`, ...) over RC
//! queue pairs, on the crate's safe data path or, with `--raw`, on its raw
//! one, so that the cost of safety is one flag away; with `--ex`, the safe
//! path's requests go through an extended QP's `ibv_wr_*` batch.
//!
//! ```text
//! perf TEST [OPTIONS]          start a server and wait for a connection
//! perf TEST [OPTIONS] HOST     connect to the server at HOST and run TEST
//!
//! TEST: send_lat send_bw write_lat write_bw read_lat read_bw atomic_lat atomic_bw
//!
//!   -d, --ib-dev=DEV          RDMA device (default: the first one)
//!   -i, --ib-port=N           port of the device (default 1)
//!   -x, --gid-index=N         local GID index (default: none on IB, 0 on Ethernet)
//!   -p, --port=N              TCP port (default 18515)
//!   -s, --size=BYTES          message size (default 2 for lat, 65536 for bw; atomics: 8)
//!   -a, --all                 every size 2, 4, ... 2^23
//!   -n, --iters=N             iterations (default 1000 for lat, 5000 for bw)
//!   -t, --tx-depth=N          send queue depth (default 1 for lat, 128 for bw)
//!   -l, --post_list=N         requests per post call (bw, default 1)
//!   -Q, --cq-mod=N            one signalled completion every N requests (bw,
//!                             default 100, at most tx-depth)
//!   -I, --inline_size=N       send/write sizes up to N go inline (default 0)
//!   -q, --qp=N                number of QPs, round robin (bw, default 1)
//!   -e, --events              sleep on CQ events instead of busy polling
//!                             (refused for write_lat, which polls memory)
//!       --async               sleep on CQ events through tokio instead: an
//!                             `AsyncCq` whose waits run on a current-thread
//!                             runtime (refused for write_lat)
//!   -A, --atomic_type=TYPE    CMP_AND_SWAP or FETCH_AND_ADD (default FETCH_AND_ADD)
//!   -r, --rx-depth=N          receives kept posted (send tests, default 512, at most iters)
//!       --raw                 the raw path (sys structs, post_send_raw/post_recv_raw)
//!       --ex                  the safe path through an extended QP's batch
//!                             (start_batch, post, complete; -l requests per batch)
//!   -F, --CPU-freq            accepted and ignored
//! ```
//!
//! Both ends must be given the same TEST and options (they compare them
//! over TCP). On soft-RoCE: `perf send_lat -d rxe0 -x 1` on one side,
//! `perf send_lat -d rxe0 -x 1 127.0.0.1` on the other.
//!
//! # What is measured
//!
//! * `send_lat`, `write_lat`: ping-pong; each sample is half the time
//!   between two consecutive posts of the client (a round trip; the clock
//!   is read right after each post, off the round trip's path). write_lat
//!   sees the peer's write arrive by polling the last byte of its own
//!   region (with `MemoryRegion::read` on the safe path).
//! * `read_lat`, `atomic_lat`: one operation, wait for its completion; each
//!   sample is a whole operation.
//! * `*_bw`: up to tx-depth requests outstanding per QP, `-l` per post
//!   call, one signalled completion per `-Q` (and the last), 16 work
//!   completions per poll; average = bytes / time, peak = the best rate
//!   over any stretch of at least a tenth of the operations, MB = 2^20.
//!   The server is passive, except in send_bw, where it counts receives.
//!
//! After its table the client prints one line per size,
//! `perf-result: test=T path=safe|raw|ex size=S iters=N ops=O polls=P
//! empty_polls=E usec=U`: O is the operations completed (iterations times
//! QPs), P the `ibv_poll_cq` calls of the timed part and E those that
//! found nothing, U the timed part in microseconds. The timed loops are
//! functions of their own (`timed_client_lat`, `timed_client_bw`, ...), so
//! `valgrind --tool=callgrind --toggle-collect='*timed_*'` counts them alone.
//!
//! # The three paths
//!
//! All run the same loops (`perf/run.rs`, generic over `perf/path.rs`'s
//! `DataPath`). The safe path (`perf/safe.rs`, no `unsafe`) posts
//! `SendWr`/`RecvWr` and gets owned `Chunk`s back with `reclaim_chunks`
//! (one call per completion, however many unsignalled requests it ends);
//! sends and writes (but write_lat's) name one read-only `SharedChunk`;
//! the raw path (`perf/raw.rs`) builds `sys::ibv_send_wr`/`ibv_recv_wr`
//! chains once per size and posts them with `post_send_raw`/`post_recv_raw`.
//! The `--ex` path (`perf/ex.rs`) is the safe path with one difference:
//! its QPs (both ends') are created with `QpInitAttr::send_ops` naming
//! the test's one operation (`ibv_create_qp_ex`), and each post call is
//! one batch: `qp.start_batch()`, `batch.post(SendWr ...)` per request,
//! `batch.complete()` (`ibv_wr_start`, `ibv_wr_send`/`_rdma_write`/...,
//! `ibv_wr_complete`); the same `SendWr`s, buffers and `reclaim_chunks`.
//! Receives are posted with `post_recv` as on the safe path. Either end
//! may run any path: the wire is the same.
//! Reads, atomics and receives get a buffer per outstanding request
//! (the raw path gives every request its own), so memory is capped at
//! 128 MiB per QP for sends and for receives (fewer buffers for very large
//! messages, with a note on stderr). Neither path allocates per post in
//! steady state, whatever the chain length (a note on stderr says if the
//! timed part allocated).
//!
//! The timed loops allocate nothing per iteration: a counting global
//! allocator checks it, and a run that did allocate says so on stderr
//! (`perf: note: size S: N heap allocations in the timed part`). Measured
//! on rxe: 0 on the raw path, the safe path and the `--ex` path, with and
//! without `-e`: the crate builds the raw requests of chains of up to eight
//! on the stack, and makes a batch's room with the QP.
//!
//! Every wait has a deadline scaled by `RDMA_VERBS_TIME_SCALE`.
//!
//! Only `perf/raw.rs` (and the counting allocator) may use `unsafe`.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[path = "common/pingpong.rs"]
mod pingpong;
#[path = "common/time.rs"]
mod time;

#[path = "perf/allocs.rs"]
#[allow(unsafe_code)]
mod allocs;
#[path = "perf/ex.rs"]
mod ex;
#[path = "perf/opts.rs"]
mod opts;
#[path = "perf/path.rs"]
mod path;
#[path = "common/quiet_pipe.rs"]
mod quiet_pipe;
#[path = "perf/raw.rs"]
#[allow(unsafe_code)]
mod raw;
#[path = "perf/report.rs"]
mod report;
#[path = "perf/run.rs"]
mod run;
#[path = "perf/safe.rs"]
mod safe;
#[path = "perf/setup.rs"]
mod setup;
#[path = "perf/wait.rs"]
mod wait;

use std::process::ExitCode;

use opts::{Opts, PathKind, Test};
use path::{DataPath, Plan};
use pingpong::Res;
use run::Runner;
use setup::Ctrl;

#[global_allocator]
static ALLOC: allocs::Counting = allocs::Counting;

fn main() -> ExitCode {
    quiet_pipe::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match opts::parse(&args) {
        Ok(o) => o,
        Err(msg) if msg.is_empty() => {
            println!("{}", opts::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            // getopt's messages already start with the program's name.
            let msg = msg.strip_prefix("perf: ").unwrap_or(&msg);
            eprintln!("perf: {msg}");
            eprintln!("{}", opts::USAGE);
            return ExitCode::FAILURE;
        }
    };
    wait::start_watchdog();
    match session(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("perf: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn session(o: &Opts) -> Res<()> {
    let mut ctrl = match &o.server {
        Some(host) => setup::dial(host, o.tcp_port)?,
        None => setup::accept(o.tcp_port)?,
    };
    let conn = match setup::connect(o, &mut ctrl) {
        Ok(c) => c,
        Err(e) => {
            let _ = ctrl.send(&format!("ERR {e}"));
            return Err(e);
        }
    };
    report::header(o, &conn);
    let max_inline = conn.max_inline;
    let res = match o.path {
        PathKind::Raw => sizes(o, &mut ctrl, raw::RawPath::new(conn), max_inline),
        PathKind::Safe => sizes(
            o,
            &mut ctrl,
            safe::SafePath::<safe::Basic>::new(conn),
            max_inline,
        ),
        PathKind::Ex => sizes(o, &mut ctrl, ex::ExPath::new(conn), max_inline),
    };
    if let Err(e) = &res {
        let _ = ctrl.send(&format!("ERR {e}"));
    }
    res
}

/// Runs every size, as client or server.
fn sizes<P: DataPath>(o: &Opts, ctrl: &mut Ctrl, mut path: P, max_inline: u32) -> Res<()> {
    let mut runner = Runner::new(o.qps);
    let mut results = Vec::new();
    let client = o.server.is_some();
    let prints = client || matches!(o.test, Test::SendLat | Test::WriteLat | Test::SendBw);
    if prints {
        report::table_header(o.test);
    }
    let hs = wait::handshake_limit();
    for &size in &o.sizes {
        let plan = Plan::new(o, size, max_inline);
        if client {
            path.prepare(&plan)?;
            if o.test == Test::WriteLat {
                path.clear_inbox()?;
            }
            runner.start(&mut path, &plan)?;
            ctrl.send(&format!("SIZE {size}"))?;
            ctrl.expect("READY", hs)?;
            let out = runner.client(&mut path, &plan)?;
            ctrl.send(&format!("DONE {}", out.ops))?;
            ctrl.expect("DONE", wait::run_limit())?;
            path.finish()?;
            print_line(o, size, &out);
            note_allocs(size, &out);
            results.push(report::result_line(o, size, &out));
        } else {
            let got = ctrl.expect("SIZE ", wait::run_limit())?;
            if got.parse::<usize>().ok() != Some(size) {
                return Err(format!(
                    "protocol error: the client runs size {got}, the server expected {size}"
                ));
            }
            path.prepare(&plan)?;
            if o.test == Test::WriteLat {
                path.clear_inbox()?;
            }
            runner.start(&mut path, &plan)?;
            ctrl.send("READY")?;
            let out = if o.test.server_active() {
                Some(runner.server(&mut path, &plan)?)
            } else {
                None
            };
            ctrl.expect("DONE", wait::run_limit())?;
            ctrl.send(&format!("DONE {}", out.as_ref().map_or(0, |x| x.ops)))?;
            path.finish()?;
            if let Some(out) = out {
                print_line(o, size, &out);
                note_allocs(size, &out);
            }
        }
    }
    if client {
        ctrl.send("BYE")?;
    } else {
        ctrl.expect("BYE", hs)?;
    }
    if prints {
        println!("{}", report::DASHES);
    }
    for r in results {
        println!("{r}");
    }
    Ok(())
}

fn print_line(o: &Opts, size: usize, out: &run::Outcome) {
    if o.test.is_lat() {
        report::lat_line(size, o.iters, out);
    } else {
        report::bw_line(size, o.iters, out);
    }
}

fn note_allocs(size: usize, out: &run::Outcome) {
    if out.allocs > 0 {
        eprintln!(
            "perf: note: size {size}: {} heap allocations in the timed part",
            out.allocs
        );
    }
}

//! What the timed loops need from a data path. The loops (`run.rs`) are
//! written once and compiled for each path, so the safe and the raw run
//! differ only in what is behind this trait.

use rdma_verbs::qp::RemoteAddr;

use crate::opts::{AtomicType, Opts, Test, Verb};
use crate::pingpong::Res;

/// Memory for sources and receives is capped at this many bytes per QP
/// each (a deep queue of 8 MiB messages would not fit the VM otherwise).
pub const MEM_BUDGET: usize = 128 << 20;

/// Work completions per `ibv_poll_cq` call.
pub const POLL_BATCH: usize = 16;

/// Receives posted per call at most.
pub const RECV_CHAIN: usize = 8;

/// What one size's run uses: sizes, depths and the operation.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub test: Test,
    pub size: usize,
    /// Requests a QP may have outstanding (tx-depth, or fewer if memory is capped).
    pub tx_depth: usize,
    /// Receive buffers per QP.
    pub rx_bufs: usize,
    pub cq_mod: u64,
    pub post_list: usize,
    pub inline: bool,
    pub atomic: AtomicType,
    pub events: bool,
    pub iters: u64,
    /// `--recv-buffers`.
    pub recv_buffers: bool,
}

impl Plan {
    pub fn new(o: &Opts, size: usize, max_inline: u32) -> Plan {
        let client = o.server.is_some();
        let verb = o.test.verb();
        let cap = (MEM_BUDGET / size.max(1)).max(1);
        let mut tx_depth = o.tx_depth.min(cap).max(o.post_list.min(cap));
        if verb == Verb::Read || verb == Verb::Atomic {
            tx_depth = tx_depth.max(1);
        }
        // Receives: both ends of send_lat, the server of send_bw.
        let rx_bufs = if verb == Verb::Send && (o.test == Test::SendLat || !client) {
            o.rx_depth.min(cap).max(1)
        } else {
            0
        };
        if tx_depth < o.tx_depth || (rx_bufs > 0 && rx_bufs < o.rx_depth) {
            eprintln!(
                "perf: note: size {size}: {tx_depth} send buffers and {rx_bufs} receive buffers per QP ({} MiB cap)",
                MEM_BUDGET >> 20
            );
        }
        let inline = matches!(verb, Verb::Send | Verb::Write)
            && size <= o.inline_size
            && size <= max_inline as usize;
        // A multiple of the post list, so that a full window always holds
        // a signalled request (whole chains are posted; with a cq-mod that
        // is not a multiple, the queue could fill with unsignalled ones).
        let post_list = o.post_list.min(tx_depth).max(1);
        let cq_mod = o.cq_mod.min(tx_depth).max(1);
        let cq_mod = (cq_mod - cq_mod % post_list).max(post_list);
        Plan {
            test: o.test,
            size,
            tx_depth,
            rx_bufs,
            cq_mod: cq_mod as u64,
            post_list,
            inline,
            atomic: o.atomic,
            events: o.events,
            iters: o.iters,
            recv_buffers: o.recv_buffers,
        }
    }

    /// Whether request `seq` (1-based, per QP) asks for a completion: one in
    /// `cq_mod`, and the last.
    #[inline]
    pub fn signaled(&self, seq: u64) -> bool {
        self.test.is_lat() || seq % self.cq_mod == 0 || seq == self.iters
    }
}

/// What completions did, as both paths count it.
#[derive(Debug, Default, Clone)]
pub struct Progress {
    /// Per QP: send-queue requests known to be finished.
    pub sends_done: Vec<u64>,
    /// Per QP: receives completed.
    pub recvs_done: Vec<u64>,
    /// `ibv_poll_cq` calls.
    pub polls: u64,
    /// Of which returned nothing.
    pub empty_polls: u64,
}

impl Progress {
    pub fn new(qps: usize) -> Self {
        Progress {
            sends_done: vec![0; qps],
            recvs_done: vec![0; qps],
            polls: 0,
            empty_polls: 0,
        }
    }

    pub fn reset(&mut self) {
        self.sends_done.iter_mut().for_each(|x| *x = 0);
        self.recvs_done.iter_mut().for_each(|x| *x = 0);
        self.polls = 0;
        self.empty_polls = 0;
    }
}

/// The operation of a test, as the posting code needs it.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Send,
    Write(RemoteAddr),
    Read(RemoteAddr),
    FetchAdd(RemoteAddr),
    CmpSwap(RemoteAddr),
}

impl Op {
    pub fn of(plan: &Plan, remote: RemoteAddr) -> Op {
        match (plan.test.verb(), plan.atomic) {
            (Verb::Send, _) => Op::Send,
            (Verb::Write, _) => Op::Write(remote),
            (Verb::Read, _) => Op::Read(remote),
            (Verb::Atomic, AtomicType::FetchAndAdd) => Op::FetchAdd(remote),
            (Verb::Atomic, AtomicType::CmpAndSwap) => Op::CmpSwap(remote),
        }
    }
}

/// A data path: the safe API or the raw one.
pub trait DataPath {
    /// Allocates this size's buffers (outside the timed part).
    fn prepare(&mut self, plan: &Plan) -> Res<()>;

    /// Posts `n` requests on QP `q` with sequence numbers `first..first+n`
    /// (1-based), in one post call.
    fn post(&mut self, q: usize, first: u64, n: usize) -> Res<()>;

    /// Receives that can be posted on QP `q` now (free buffers).
    fn free_recvs(&self, q: usize) -> usize;

    /// Posts `n <= min(free_recvs, RECV_CHAIN)` receives on QP `q` in one call.
    fn post_recvs(&mut self, q: usize, n: usize) -> Res<()>;

    /// Polls the CQ once (a batch of up to [`POLL_BATCH`]) and accounts
    /// what completed into `p`; returns how many completions it got. A
    /// failed completion is an error.
    fn poll(&mut self, p: &mut Progress) -> Res<usize>;

    /// Blocks until the CQ has a completion event (`-e`), then re-arms it.
    fn wait_event(&mut self) -> Res<()>;

    /// write_lat: puts `v` in the last byte of the next write's source.
    fn stamp(&mut self, v: u8) -> Res<()>;

    /// write_lat: the last byte of this end's target region for this size.
    fn inbox_last(&self) -> Res<u8>;

    /// write_lat: clears that byte before the size starts.
    fn clear_inbox(&mut self) -> Res<()>;

    /// After a size finished cleanly (nothing outstanding): frees its buffers.
    fn finish(&mut self) -> Res<()>;
}

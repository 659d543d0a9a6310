//! The safe path: chunks of registered regions, moved into the QP by
//! `post_send`/`post_recv` and handed back by `reclaim_chunks`; sends and
//! writes name one `SharedChunk`, as C names one buffer, through a
//! `SendTemplate` on the basic path (write_lat's template owns its source,
//! which `template_source_mut` writes between rounds).
//!
//! How a post call's requests reach the QP is a type parameter
//! ([`Submit`]): [`Basic`] (`post_send`, one chain per call) here, and
//! `ex::Batched` (an extended QP's `ibv_wr_*` batch) for `--ex`; the
//! requests, the buffers and the reclaim are the same.
#![forbid(unsafe_code)]

use std::marker::PhantomData;

use rdma_verbs::qp::{
    QpNum, RecvBuffers, RecvWr, RequestKind, SendOp, SendTemplate, SendWr, Taken,
};
use rdma_verbs::{AccessFlags, Chunk, QueuePair, SharedChunk, WorkCompletion};

use crate::opts::Test;
use crate::path::{DataPath, Op, Plan, Progress, POLL_BATCH};
use crate::pingpong::{OrFail, Res};
use crate::setup::Conn;

/// Receives' `wr_id`s have this bit; sends' are their sequence numbers.
const RECV: u64 = 1 << 63;

/// One QP's buffers for sends and writes (sources) and for reads and
/// atomics (landing places): one chunk per outstanding request.
struct Buffers {
    pool: Vec<Chunk>,
    /// The one source of every SEND and RDMA WRITE (not write_lat's).
    shared: Option<SharedChunk>,
    /// The bytes of inline sends and writes (copied by the provider).
    inline: Vec<u8>,
    /// `shared`'s requests, checked once (the basic path).
    template: Option<SendTemplate>,
}

impl Buffers {
    /// The source of the next SEND or RDMA WRITE. One owned chunk per
    /// outstanding request for now; a read-only buffer shared by many
    /// outstanding requests will take its place when the crate has one.
    fn source(&mut self) -> Option<Chunk> {
        self.pool.pop()
    }

    /// Where the next RDMA READ or atomic lands (the device writes it, so
    /// it stays an owned chunk).
    fn landing(&mut self) -> Option<Chunk> {
        self.pool.pop()
    }

    /// The chunk [`source`](Self::source) hands out next, to write into.
    fn next_source_mut(&mut self) -> Option<&mut Chunk> {
        self.pool.last_mut()
    }

    fn give_back(&mut self, c: Chunk) {
        self.pool.push(c);
    }
}

/// A refused post call: the message, and the chunks of the requests that
/// did not reach the QP (to put back in their pool).
pub type Refused = (String, Vec<Chunk>);

/// How one post call's requests reach the QP.
pub trait Submit {
    /// Posts `wrs`, in order, in one call (one chain or one batch).
    fn submit<'a, I: IntoIterator<Item = SendWr<'a>>>(
        qp: &mut QueuePair,
        wrs: I,
    ) -> Result<(), Refused>;

    /// Whether a stream from one shared source goes through a
    /// [`SendTemplate`] (`QueuePair::post_template`) rather than one
    /// `SendWr` per request.
    const TEMPLATES: bool = false;
}

/// `QueuePair::post_send`: the requests as one chain.
pub struct Basic;

impl Submit for Basic {
    const TEMPLATES: bool = true;

    #[inline]
    fn submit<'a, I: IntoIterator<Item = SendWr<'a>>>(
        qp: &mut QueuePair,
        wrs: I,
    ) -> Result<(), Refused> {
        qp.post_send(wrs)
            .map_err(|e| (format!("Couldn't post send: {e}"), e.returned))
    }
}

pub struct SafePath<S: Submit = Basic> {
    submit: PhantomData<S>,
    conn: Conn,
    plan: Option<Plan>,
    ops: Vec<Op>,
    bufs: Vec<Buffers>,
    recv_pool: Vec<Vec<Chunk>>,
    /// `--recv-buffers`: per QP, its queue-owned receive buffers (then
    /// `recv_pool` stays empty).
    recv_bufs: Vec<RecvBuffers>,
    rx_bufs: usize,
    wcs: [WorkCompletion; POLL_BATCH],
    qpns: Vec<QpNum>,
}

impl<S: Submit> SafePath<S> {
    pub fn new(conn: Conn) -> Self {
        let qpns = conn.qps.iter().map(|q| q.qp_num()).collect();
        SafePath {
            submit: PhantomData,
            conn,
            plan: None,
            ops: Vec::new(),
            bufs: Vec::new(),
            recv_pool: Vec::new(),
            recv_bufs: Vec::new(),
            rx_bufs: 0,
            wcs: [WorkCompletion::default(); POLL_BATCH],
            qpns,
        }
    }

    fn plan(&self) -> Res<Plan> {
        self.plan.ok_or_else(|| "internal: no size prepared".into())
    }
}

/// `wr` signalled or not, as the plan says for request `seq`.
fn mark<'a>(plan: &Plan, wr: SendWr<'a>, seq: u64) -> SendWr<'a> {
    if plan.signaled(seq) {
        wr
    } else {
        wr.unsignaled()
    }
}

fn send_op(op: Op) -> SendOp {
    match op {
        Op::Send => SendOp::Send,
        Op::Write(r) => SendOp::RdmaWrite(r),
        Op::Read(r) => SendOp::RdmaRead(r),
        Op::FetchAdd(r) => SendOp::FetchAdd { remote: r, add: 1 },
        Op::CmpSwap(r) => SendOp::CompareSwap {
            remote: r,
            compare: 0,
            swap: 0,
        },
    }
}

/// The message of a failed completion.
pub fn wc_error(wc: &WorkCompletion) -> String {
    let status = match wc.status() {
        Ok(s) => format!("{s:?} ({})", s.message()),
        Err(raw) => format!("status {raw}"),
    };
    format!(
        "completion with error: {status}, vendor error {:#x}, QP {:#x}",
        wc.vendor_err(),
        wc.qp_num()
    )
}

impl<S: Submit> SafePath<S> {
    /// What a poll that found `n` completions does with them (a function of
    /// its own, so that callgrind prices it apart from the empty polls of a
    /// busy wait: see `.ci/bench/guest`).
    #[inline(never)]
    fn completions(&mut self, n: usize, p: &mut Progress) -> Res<()> {
        for i in 0..n {
            let wc = &self.wcs[i];
            let q = self
                .qpns
                .iter()
                .position(|&n| n == wc.qp_num())
                .ok_or_else(|| format!("completion for unknown QP {:#x}", wc.qp_num()))?;
            if !wc.is_success() {
                return Err(wc_error(wc));
            }
            // One call per completion: a signalled send hands back its
            // whole run of unsignalled ones (their owned chunks only;
            // shared sources are just let go).
            let qp = &mut self.conn.qps[q];
            if wc.request_kind() != Some(RequestKind::Send) {
                if let Some(bufs) = self.recv_bufs.get_mut(q) {
                    p.recvs_done[q] += take_recv(bufs, qp, wc)?;
                    continue;
                }
                p.recvs_done[q] += qp.reclaim_chunks(wc, &mut self.recv_pool[q]) as u64;
            } else {
                p.sends_done[q] += qp.reclaim_chunks(wc, &mut self.bufs[q].pool) as u64;
            }
        }
        Ok(())
    }
}

/// A receive of `--recv-buffers`: the bytes are lent until the end of
/// this call (inline in `completions`, as a program writes the match in
/// its loop: 13 instructions per operation fewer than out of line, and
/// the chunk path's completions 8 fewer).
#[inline(always)]
fn take_recv(bufs: &mut RecvBuffers, qp: &mut QueuePair, wc: &WorkCompletion) -> Res<u64> {
    match bufs.take(qp, wc) {
        Taken::Mine(msg) => Ok(u64::from(msg.is_success())),
        Taken::Other(c) => Err(format!("a receive not of the pool: {c:?}")),
        Taken::Nothing => Ok(0),
    }
}

impl<S: Submit> DataPath for SafePath<S> {
    fn prepare(&mut self, plan: &Plan) -> Res<()> {
        let len = plan.size;
        self.bufs.clear();
        self.recv_pool.clear();
        self.recv_bufs.clear();
        self.ops.clear();
        let access = AccessFlags::LOCAL_WRITE;
        for q in 0..self.conn.qps.len() {
            let mut pool = self
                .conn
                .pd
                .alloc_chunks(plan.tx_depth, len, access)
                .or_fail("Couldn't register the send buffers")?;
            for c in &mut pool {
                c.as_mut_slice().fill(0);
            }
            let op = Op::of(plan, self.conn.remote[q]);
            // write_lat writes its source between rounds: through the
            // template (whose handle is then the only one), or owned
            // chunks where there is no template.
            let own_source = plan.test == Test::WriteLat;
            let shared = match op {
                Op::Send | Op::Write(_) if !own_source || (S::TEMPLATES && !plan.inline) => {
                    pool.pop().map(SharedChunk::new)
                }
                _ => None,
            };
            let mut template = match &shared {
                Some(src) if S::TEMPLATES && !plan.inline => Some(
                    self.conn.qps[q]
                        .send_template(send_op(op), Some((src, len)))
                        .or_fail("Couldn't make the send template")?,
                ),
                _ => None,
            };
            let shared = if own_source {
                drop(shared);
                if let Some(t) = &mut template {
                    self.conn.qps[q]
                        .template_source_mut(t)
                        .or_fail("Couldn't write the template's source")?;
                }
                None
            } else {
                shared
            };
            self.bufs.push(Buffers {
                pool,
                shared,
                inline: vec![0; len],
                template,
            });
            if plan.recv_buffers && plan.rx_bufs > 0 {
                self.recv_bufs.push(
                    RecvBuffers::new(&self.conn.pd, plan.rx_bufs, len)
                        .or_fail("Couldn't register the receive buffers")?,
                );
            }
            let rx = if plan.rx_bufs > 0 && !plan.recv_buffers {
                self.conn
                    .pd
                    .alloc_chunks(plan.rx_bufs, len, access)
                    .or_fail("Couldn't register the receive buffers")?
            } else {
                Vec::new()
            };
            self.recv_pool.push(rx);
            self.ops.push(Op::of(plan, self.conn.remote[q]));
        }
        self.rx_bufs = plan.rx_bufs;
        self.plan = Some(*plan);
        Ok(())
    }

    #[inline(never)]
    fn post(&mut self, q: usize, first: u64, n: usize) -> Res<()> {
        // Borrowed, not copied (as the raw path reads its plan).
        let plan = self.plan.as_ref().ok_or("internal: no size prepared")?;
        let bufs = &mut self.bufs[q];
        let qp = &mut self.conn.qps[q];
        // A template (never with inline data) holds its operation.
        if let Some(t) = &bufs.template {
            // One request per call (the latency tests, and a rate test
            // keeping its queue full): no iterator, no chain.
            if n == 1 {
                return qp
                    .post_template_one(t, first, plan.signaled(first))
                    .map_err(|e| format!("Couldn't post send: {e}"));
            }
            return qp
                .post_template(
                    t,
                    (first..first + n as u64).map(|seq| (seq, plan.signaled(seq))),
                )
                .map_err(|e| format!("Couldn't post send: {e}"));
        }
        let op = send_op(self.ops[q]);
        if plan.inline {
            let data = &bufs.inline[..plan.size];
            return S::submit(
                qp,
                (0..n as u64).map(|i| {
                    let seq = first + i;
                    mark(plan, SendWr::new(seq, op).inline(data), seq)
                }),
            )
            .map_err(|(msg, _)| msg);
        }
        if let Some(src) = &bufs.shared {
            return S::submit(
                qp,
                (0..n as u64).map(|i| {
                    let seq = first + i;
                    mark(plan, SendWr::new(seq, op).sge_shared(src, plan.size), seq)
                }),
            )
            .map_err(|(msg, _)| msg);
        }
        if bufs.pool.len() < n {
            return Err(format!(
                "internal: {n} requests but {} free buffers",
                bufs.pool.len()
            ));
        }
        let landing = matches!(
            op,
            SendOp::RdmaRead(_) | SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }
        );
        let res = S::submit(
            qp,
            (0..n as u64).map(|i| {
                let seq = first + i;
                let chunk = if landing {
                    bufs.landing()
                } else {
                    bufs.source()
                };
                let wr = SendWr::new(seq, op);
                let wr = match chunk {
                    Some(c) => wr.sge_len(c, plan.size),
                    None => wr,
                };
                mark(plan, wr, seq)
            }),
        );
        res.map_err(|(msg, returned)| {
            for c in returned {
                bufs.give_back(c);
            }
            msg
        })
    }

    fn free_recvs(&self, q: usize) -> usize {
        match self.recv_bufs.get(q) {
            Some(bufs) => bufs.free(),
            None => self.recv_pool.get(q).map_or(0, Vec::len),
        }
    }

    #[inline(never)]
    fn post_recvs(&mut self, q: usize, n: usize) -> Res<()> {
        if let Some(bufs) = self.recv_bufs.get_mut(q) {
            return bufs
                .post_up_to(&mut self.conn.qps[q], n)
                .map(|_| ())
                .map_err(|e| format!("Couldn't post receive: {e}"));
        }
        let pool = &mut self.recv_pool[q];
        if n == 1 {
            // The latency loops' one repost: no iterator, no chain.
            let Some(c) = pool.pop() else { return Ok(()) };
            return self.conn.qps[q]
                .post_recv_one(RecvWr::new(RECV).sge(c))
                .map_err(|e| {
                    let msg = format!("Couldn't post receive: {e}");
                    pool.extend(e.returned);
                    msg
                });
        }
        let n = n.min(pool.len()) as u64;
        // The newest free chunks first, popped one at a time (no `Drain`
        // to keep and close).
        let res = self.conn.qps[q]
            .post_recv((0..n).map_while(|i| pool.pop().map(|c| RecvWr::new(RECV | i).sge(c))));
        res.map_err(|e| {
            let msg = format!("Couldn't post receive: {e}");
            pool.extend(e.returned);
            msg
        })
    }

    fn poll(&mut self, p: &mut Progress) -> Res<usize> {
        let n = self.conn.poll(&mut self.wcs, p)?;
        if n > 0 {
            self.completions(n, p)?;
        }
        Ok(n)
    }

    fn wait_event(&mut self) -> Res<()> {
        self.conn.wait_event()
    }

    fn stamp(&mut self, v: u8) -> Res<()> {
        let plan = self.plan()?;
        let last = plan.size - 1;
        let bufs = &mut self.bufs[0];
        if plan.inline {
            bufs.inline[last] = v;
            return Ok(());
        }
        if let Some(t) = &mut bufs.template {
            self.conn.qps[0]
                .template_source_mut(t)
                .or_fail("Couldn't write the template's source")?[last] = v;
            return Ok(());
        }
        let c = bufs
            .next_source_mut()
            .ok_or("internal: no free source buffer to stamp")?;
        c.as_mut_slice()[last] = v;
        Ok(())
    }

    fn inbox_last(&self) -> Res<u8> {
        let last = self.plan()?.size - 1;
        let mut b = [0u8; 1];
        self.conn
            .target
            .read(last, &mut b)
            .or_fail("reading the target region")?;
        Ok(b[0])
    }

    fn clear_inbox(&mut self) -> Res<()> {
        let last = self.plan()?.size - 1;
        self.conn
            .target
            .write(last, &[0])
            .or_fail("clearing the target region")
    }

    fn finish(&mut self) -> Res<()> {
        if self.rx_bufs > 0 {
            for q in 0..self.conn.qps.len() {
                let back = self.free_recvs(q);
                if back != self.rx_bufs {
                    return Err(format!(
                        "internal: QP {q} has {back} of {} receive buffers back",
                        self.rx_bufs
                    ));
                }
            }
        }
        self.recv_bufs.clear();
        self.bufs.clear();
        self.recv_pool.clear();
        Ok(())
    }
}

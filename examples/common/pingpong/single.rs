//! The single-QP loop of `ibv_rc_pingpong`, `ibv_uc_pingpong` and
//! `ibv_ud_pingpong` ([`SingleQp`]), and the sends and receives it (and
//! `srq_pingpong`) posts: [`Tx`], [`Rx`].

use std::time::{Duration, Instant};

use rdma_verbs::qp::{QpAttr, RecvBuffers, RequestKind, SendOp, SendTemplate, Taken};
use rdma_verbs::{
    Chunk, CompletionChannel, CompletionQueue, CompletionQueueEx, Context, OdpGeneralCaps,
    OdpTransportCaps, QpCaps, QpInitAttr, QpType, QueuePair, SharedChunk, WorkCompletion,
};

use super::{
    alloc_buffers, check_status, create_channel, create_cq, create_cq_ts, next_completions,
    post_recvs, post_send, reclaim, send_ops, status_result, timestamp_mask, wait_cq_event,
    Checker, Config, Odp, OrFail, Res, TsFields, TsStats, UdDest, RECV_WRID, SEND_WRID,
};

/// The extended CQ of `ibv_rc_pingpong -t` and the statistics of its
/// receive completions' timestamps.
pub struct Timestamps {
    /// The CQ, created with [`create_cq_ts`].
    pub cq: CompletionQueueEx<TsFields>,
    /// What the receive completions' timestamps gave.
    pub stats: TsStats,
}

/// Where the ping-pong loop is: the completions still awaited before the
/// next send (`RECV_WRID | SEND_WRID` bits, the C `pending`) and those
/// counted.
struct Progress {
    iters: u32,
    pending: u64,
    scnt: u32,
    rcnt: u32,
}

impl Progress {
    /// The C loop's condition, negated: `iters` of each counted.
    fn done(&self) -> bool {
        self.rcnt >= self.iters && self.scnt >= self.iters
    }
}

/// Where a [`SingleQp`]'s receives land.
pub enum Rx {
    /// Buffers owned by the receive queue ([`RecvBuffers`]): posted by the
    /// pool, each completion taken back with [`RecvBuffers::take`] (its
    /// bytes read in place, the buffer free again at once). The loop on a
    /// basic CQ.
    Pool(RecvBuffers),
    /// Chunks moved into each receive and handed back by
    /// `QueuePair::reclaim` (those not posted here): with `-t`, whose
    /// completions come from an extended CQ, and with `-r 0`.
    Chunks(Vec<Chunk>),
}

/// Where a [`SingleQp`]'s sends come from.
pub enum Tx {
    /// RC and UC without `-N`: a [`SendTemplate`] over the one send
    /// buffer, checked once when the QP is made; each send is posted with
    /// its `wr_id` alone (`QueuePair::post_template_one`), from the
    /// registered buffer (where the C program copies a message that fits
    /// `max_inline_data` into the request, the template sends it from the
    /// buffer: the same bytes on the wire). `-c` writes the buffer between
    /// sends (`QueuePair::template_source_mut`).
    Template(SendTemplate),
    /// The send buffer while no send is outstanding, moved into each send
    /// and back at its completion (inline when it fits): UD sends, which
    /// each name their destination, and `-N` batches.
    Chunk(Option<Chunk>),
}

impl Tx {
    /// The sends of `qp` (of `qp_type`, with `-N` or not) from `buf`, a
    /// buffer of at least `size` bytes: a template where one serves (RC
    /// and UC without `-N`), else the chunk.
    pub fn new(
        qp: &QueuePair,
        buf: Option<Chunk>,
        size: usize,
        qp_type: QpType,
        new_send: bool,
    ) -> Res<Self> {
        match buf {
            Some(buf) if qp_type != QpType::Ud && !new_send => {
                let src = SharedChunk::new(buf);
                let t = qp
                    .send_template(SendOp::Send, Some((&src, size)))
                    .or_fail("Couldn't post send")?;
                // The template's handle is the only one: `-c` writes it.
                drop(src);
                Ok(Tx::Template(t))
            }
            buf => Ok(Tx::Chunk(buf)),
        }
    }

    /// `pp_post_send`: one signalled SEND of `size` bytes on `qp` (with
    /// `-c`, the last payload received first; `inline` and `ud` for the
    /// chunk's send, see [`post_send`]).
    pub fn post(
        &mut self,
        qp: &mut QueuePair,
        size: usize,
        inline: bool,
        ud: Option<&UdDest>,
        check: &Checker,
    ) -> Res<()> {
        match self {
            Tx::Template(t) => {
                if check.fills() {
                    let buf = qp
                        .template_source_mut(t)
                        .map_err(|e| format!("Couldn't post send ({e})"))?;
                    check.fill(&mut buf[..size]);
                }
                qp.post_template_one(t, SEND_WRID, true)
                    .map_err(|e| format!("Couldn't post send ({e})"))
            }
            Tx::Chunk(buf) => post_send(qp, buf, size, inline, ud, check),
        }
    }

    /// The client's first payload marked for `-c` (before the first send).
    pub fn stamp(&mut self, qp: &mut QueuePair, size: usize, check: &Checker) -> Res<()> {
        if !check.stamps() {
            return Ok(());
        }
        let buf = match self {
            Tx::Template(t) => qp
                .template_source_mut(t)
                .map_err(|e| format!("Couldn't post send ({e})"))?,
            Tx::Chunk(Some(b)) => b.as_mut_slice(),
            Tx::Chunk(None) => return Ok(()),
        };
        check.stamp(&mut buf[..size]);
        Ok(())
    }

    /// Takes back the send a send completion `wc` of `qp` ends (its chunk,
    /// for [`Tx::Chunk`]); whether it ended one.
    #[inline(always)]
    pub fn take_back(&mut self, qp: &mut QueuePair, wc: &WorkCompletion) -> bool {
        let mut spare = None;
        let back = match self {
            Tx::Chunk(buf) => buf,
            Tx::Template(_) => &mut spare,
        };
        qp.reclaim_chunks(wc, &mut SendBack(back)) > 0
    }
}

/// One QP pinging the peer: what `ibv_rc_pingpong`, `ibv_uc_pingpong` and
/// `ibv_ud_pingpong` run once connected.
pub struct SingleQp {
    /// The QP.
    pub qp: QueuePair,
    /// Its CQ (sends and receives). With `-t` the handle of the extended CQ
    /// in [`ts`](Self::ts) (for events and the QP; it cannot be polled).
    pub cq: CompletionQueue,
    /// The completion channel with `-e`.
    pub channel: Option<CompletionChannel>,
    /// The receive buffers.
    pub rx: Rx,
    /// Receives outstanding (`routs`).
    pub routs: usize,
    /// The send buffer.
    pub tx: Tx,
    /// Message size.
    pub size: usize,
    /// Receives to keep posted.
    pub rx_depth: usize,
    /// Send inline (the QP's `max_inline_data` covers `size`).
    pub inline: bool,
    /// Where the payload starts in a receive buffer (40 on UD, after the GRH).
    pub recv_offset: usize,
    /// The destination of UD sends.
    pub ud: Option<UdDest>,
    /// The `-c` check.
    pub check: Checker,
    /// With `-t` (rc_pingpong): the extended CQ that [`run`](Self::run)
    /// polls, and the timestamp statistics.
    pub ts: Option<Timestamps>,
}

impl SingleQp {
    /// The rest of `pp_init_ctx` once the device is open: PD, buffers (each
    /// receive buffer `recv_offset` bytes longer than `size`), CQ (with a
    /// channel under `-e`; with `-t` an extended CQ with completion
    /// timestamps, once the device is found to have them), a QP of
    /// `qp_type` moved to INIT with `init`, the initial receives, and the
    /// first notification request.
    pub fn init(
        ctx: &Context,
        cfg: &Config,
        qp_type: QpType,
        init: QpAttr,
        recv_offset: usize,
    ) -> Res<Self> {
        let channel = create_channel(ctx, cfg.use_event)?;
        let pd = ctx.alloc_pd().or_fail("Couldn't allocate PD")?;
        let ts_mask = if cfg.timestamps {
            Some(timestamp_mask(ctx)?)
        } else {
            None
        };
        if cfg.odp != Odp::Off {
            check_odp(ctx)?;
        }
        let send_buf = alloc_buffers(&pd, 1, cfg.size, 0x7b, cfg.odp)?.pop();
        let rx = if ts_mask.is_none() && cfg.rx_depth > 0 && cfg.odp == Odp::Off {
            Rx::Pool(
                RecvBuffers::new(&pd, cfg.rx_depth, cfg.size + recv_offset)
                    .or_fail("Couldn't register MR")?,
            )
        } else {
            Rx::Chunks(alloc_buffers(
                &pd,
                cfg.rx_depth,
                cfg.size + recv_offset,
                0x7b,
                cfg.odp,
            )?)
        };
        let (cq, ts) = match ts_mask {
            None => (create_cq(ctx, cfg.rx_depth + 1, channel.as_ref())?, None),
            Some(mask) => {
                let cq_ex = create_cq_ts(ctx, cfg.rx_depth + 1, channel.as_ref())?;
                let cq = cq_ex.as_cq().clone();
                let ts = Timestamps {
                    cq: cq_ex,
                    stats: TsStats::new(mask),
                };
                (cq, Some(ts))
            }
        };
        let caps = QpCaps {
            max_send_wr: 1,
            max_recv_wr: cfg.rx_depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut qp = pd
            .create_qp(&send_ops(
                QpInitAttr::new(qp_type, &cq, &cq).caps(caps),
                cfg.new_send,
            ))
            .or_fail("Couldn't create QP")?;
        let inline = qp.caps().max_inline_data as usize >= cfg.size;
        qp.modify(&init).or_fail("Failed to modify QP to INIT")?;
        let tx = Tx::new(&qp, send_buf, cfg.size, qp_type, cfg.new_send)?;
        let mut pp = SingleQp {
            qp,
            cq,
            channel,
            rx,
            routs: 0,
            tx,
            size: cfg.size,
            rx_depth: cfg.rx_depth,
            inline,
            recv_offset,
            ud: None,
            check: Checker::new(cfg.validate),
            ts,
        };
        pp.post_initial_recvs()?;
        if pp.channel.is_some() {
            pp.cq
                .req_notify(false)
                .or_fail("Couldn't request CQ notification")?;
        }
        Ok(pp)
    }

    /// `pp_post_recv(ctx, n)`: up to `n` receives; how many were posted.
    pub fn post_recvs(&mut self, n: usize) -> usize {
        let qp = &mut self.qp;
        match &mut self.rx {
            Rx::Pool(bufs) => bufs.post_up_to(qp, n).unwrap_or_else(|e| e.posted),
            Rx::Chunks(pool) => post_recvs(pool, n, |wrs| qp.post_recv(wrs)),
        }
    }

    /// Posts the initial `rx_depth` receives.
    pub fn post_initial_recvs(&mut self) -> Res<()> {
        self.routs = self.post_recvs(self.rx_depth);
        if self.routs < self.rx_depth {
            return Err(format!("Couldn't post receive ({})", self.routs));
        }
        Ok(())
    }

    /// `pp_post_send(ctx)`.
    pub fn post_send(&mut self) -> Res<()> {
        self.tx.post(
            &mut self.qp,
            self.size,
            self.inline,
            self.ud.as_ref(),
            &self.check,
        )
    }

    /// The ping-pong loop: the client sends first; each side sends again
    /// once its previous send and a receive have completed, until `iters`
    /// of each. Returns the time it took. With `-t` the completions come
    /// from the extended CQ ([`poll_ts`](Self::poll_ts)), else from the CQ
    /// ([`poll_basic`](Self::poll_basic)).
    pub fn run(&mut self, iters: u32, client: bool) -> Res<Duration> {
        let mut p = Progress {
            iters,
            pending: RECV_WRID,
            scnt: 0,
            rcnt: 0,
        };
        if client {
            self.tx.stamp(&mut self.qp, self.size, &self.check)?;
            self.post_send()?;
            p.pending |= SEND_WRID;
        }
        let start = Instant::now();
        match self.ts.take() {
            None => self.poll_basic(&mut p)?,
            Some(mut ts) => {
                let res = self.poll_ts(&mut ts, &mut p);
                self.ts = Some(ts);
                res?
            }
        }
        Ok(start.elapsed())
    }

    /// The C loop with a CQ: `ibv_poll_cq` for up to two completions (with
    /// `-e` after an event; without, until it finds one), each handled.
    fn poll_basic(&mut self, p: &mut Progress) -> Res<()> {
        let mut wcs = [WorkCompletion::default(); 2];
        while !p.done() {
            let got = next_completions(&self.cq, self.channel.as_ref(), &mut wcs)?;
            for wc in got {
                let wr_id = self.take_back(wc)?;
                check_status(wc, wr_id)?;
                self.completed(p, wr_id)?;
            }
        }
        Ok(())
    }

    /// The C loop with `-t`: with `-e`, an event and the CQ re-armed; then
    /// `ibv_start_poll` (again and again while the CQ is empty, without
    /// `-e`), the completion it found, one `ibv_next_poll` and the
    /// completion it found if any, `ibv_end_poll` (the batch dropped, also
    /// on an error). Each completion's buffer comes back through
    /// `QueuePair::reclaim`; each successful receive's
    /// `ibv_wc_read_completion_ts` goes into the statistics.
    ///
    /// One difference: with `-e`, a CQ found empty after an event (the
    /// completion that raised it was taken by the batch before) means
    /// waiting for the next event here, as `ibv_poll_cq` finding nothing
    /// does in the loop without `-t`; `ibv_rc_pingpong -t -e` exits with
    /// "poll CQ failed 2" (`ENOENT`) then.
    fn poll_ts(&mut self, ts: &mut Timestamps, p: &mut Progress) -> Res<()> {
        while !p.done() {
            if let Some(ch) = &self.channel {
                wait_cq_event(&self.cq, ch)?;
            }
            let batch = loop {
                match ts.cq.start_poll().or_fail("poll CQ failed")? {
                    Some(b) => break Some(b),
                    None if self.channel.is_some() => break None,
                    None => {}
                }
            };
            let Some(mut batch) = batch else {
                continue;
            };
            for _ in 0..2 {
                let Some(wc) = batch.next().or_fail("poll CQ failed")? else {
                    break;
                };
                let (wr_id, chunk) = reclaim(&mut self.qp, &wc);
                status_result(wc.status(), wc.vendor_err(), wr_id)?;
                if wr_id == RECV_WRID {
                    ts.stats.record(wc.completion_ts());
                }
                self.put_back(wr_id, chunk)?;
                self.completed(p, wr_id)?;
            }
        }
        Ok(())
    }

    /// The request a completion of the basic CQ ends, taken back: its
    /// `wr_id` (0 when it ends none of the QP's). A send's chunk goes back
    /// to [`Tx::Chunk`]; a receive of the pool is read in place (`-c`) and
    /// its buffer is free again at once.
    #[inline(always)]
    fn take_back(&mut self, wc: &WorkCompletion) -> Res<u64> {
        if wc.request_kind() == Some(RequestKind::Send) {
            return Ok(if self.tx.take_back(&mut self.qp, wc) {
                SEND_WRID
            } else {
                0
            });
        }
        let Rx::Pool(bufs) = &mut self.rx else {
            let (wr_id, chunk) = reclaim(&mut self.qp, wc);
            self.put_back(wr_id, chunk)?;
            return Ok(wr_id);
        };
        let done = match bufs.take(&mut self.qp, wc) {
            Taken::Mine(msg) => {
                self.check.received_in(&msg, self.recv_offset, self.size)?;
                return Ok(RECV_WRID);
            }
            Taken::Other(done) => done,
            Taken::Nothing => return Ok(0),
        };
        let wr_id = done.wr_id;
        self.put_back(wr_id, done.into_chunk())?;
        Ok(wr_id)
    }

    /// A chunk a completion handed back (`QueuePair::reclaim`): the send
    /// buffer, or a receive buffer, read for `-c` and kept to post again.
    fn put_back(&mut self, wr_id: u64, chunk: Option<Chunk>) -> Res<()> {
        match (wr_id, chunk) {
            (SEND_WRID, Some(c)) => {
                if let Tx::Chunk(buf) = &mut self.tx {
                    *buf = Some(c);
                }
            }
            (RECV_WRID, Some(c)) => {
                let off = self.recv_offset;
                self.check.received(&c.as_slice()[off..off + self.size]);
                if let Rx::Chunks(pool) = &mut self.rx {
                    pool.push(c);
                }
            }
            (RECV_WRID, None) if matches!(self.rx, Rx::Chunks(_)) => {
                return Err("receive completion without its buffer".into())
            }
            _ => {}
        }
        Ok(())
    }

    /// `parse_single_wc` after the status check, once the request was
    /// taken back: a send or a receive completed; receives are reposted
    /// when one or none is left, and the next send goes out once both the
    /// previous send and a receive are done.
    #[inline(always)]
    fn completed(&mut self, p: &mut Progress, wr_id: u64) -> Res<()> {
        match wr_id {
            SEND_WRID => p.scnt += 1,
            RECV_WRID => {
                self.routs -= 1;
                if self.routs <= 1 {
                    self.refill()?;
                }
                p.rcnt += 1;
            }
            other => return Err(format!("Completion for unknown wr_id {other}")),
        }
        p.pending &= !wr_id;
        if p.scnt < p.iters && p.pending == 0 {
            self.post_send()?;
            p.pending = RECV_WRID | SEND_WRID;
        }
        Ok(())
    }

    /// Posts receives up to `rx_depth` again (one call per `rx_depth - 1`
    /// receives).
    #[cold]
    fn refill(&mut self) -> Res<()> {
        self.routs += self.post_recvs(self.rx_depth - self.routs);
        if self.routs < self.rx_depth {
            return Err(format!("Couldn't post receive ({})", self.routs));
        }
        Ok(())
    }
}

/// Where a send's chunk goes back (`QueuePair::reclaim_chunks` extends it).
struct SendBack<'a>(&'a mut Option<Chunk>);

impl Extend<Chunk> for SendBack<'_> {
    fn extend<I: IntoIterator<Item = Chunk>>(&mut self, chunks: I) {
        for c in chunks {
            *self.0 = Some(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_done() {
        let mut p = Progress {
            iters: 2,
            pending: RECV_WRID,
            scnt: 2,
            rcnt: 1,
        };
        assert!(!p.done());
        p.rcnt = 2;
        assert!(p.done());
        p.scnt = 1;
        assert!(!p.done());
        let none = Progress {
            iters: 0,
            pending: RECV_WRID,
            scnt: 0,
            rcnt: 0,
        };
        assert!(none.done());
    }
}

/// `-o`'s check in `pp_init_ctx`: the device has on-demand paging, with RC
/// sends and receives.
fn check_odp(ctx: &Context) -> Res<()> {
    let odp = ctx.attr().odp;
    let rc = OdpTransportCaps::SEND | OdpTransportCaps::RECV;
    if !odp.general.contains(OdpGeneralCaps::SUPPORT) || !odp.rc.contains(rc) {
        return Err(
            "The device isn't ODP capable or does not support RC send and receive with ODP".into(),
        );
    }
    Ok(())
}

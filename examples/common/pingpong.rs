//! What the four pingpong examples share: command-line parsing in the manner
//! of `getopt_long` (in `pingpong/cli.rs`), the TCP exchange of endpoint records (client and server
//! roles), the printed lines, the PSN generator, buffer handling, and (in
//! `pingpong/single.rs`) the completion-polling loop of the single-QP
//! programs with the sends and receives it posts.
//!
//! Each example includes this file with
//! `#[path = "common/pingpong.rs"] mod pingpong;` and uses the parts it needs.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdma_verbs::cq_ex::{Fields, Off, On};
use rdma_verbs::qp::{
    AddressVector, Completion, Endpoint, GlobalRoute, PostError, Psn, QKey, QpAttr, QpNum, RecvWr,
    SendOp, SendOpsFlags, SendWr, WrBatch,
};
use rdma_verbs::{
    AccessFlags, AddressHandle, Chunk, CompletionChannel, CompletionQueue, CompletionQueueEx,
    Context, DeviceList, Gid, LinkLayer, MrAdvice, ProtectionDomain, QpInitAttr, QpState, QpType,
    QueuePair, WcStatus, WorkCompletion,
};

#[path = "pingpong/cli.rs"]
mod cli;
pub use cli::*;

#[path = "pingpong/single.rs"]
mod single;
// Not every example names both.
#[allow(unused_imports)]
pub use single::{SingleQp, Tx};

#[cfg(test)]
#[path = "pingpong/tests.rs"]
mod tests;

/// `wr_id` of receives, as in the C examples.
pub const RECV_WRID: u64 = 1;
/// `wr_id` of sends, as in the C examples.
pub const SEND_WRID: u64 = 2;
/// The Q_Key of `ibv_ud_pingpong`.
pub const UD_QKEY: QKey = QKey(0x1111_1111);
/// Bytes of GRH in front of every UD receive.
pub const GRH_LEN: usize = 40;

/// What the examples' fallible steps return: the message to print.
pub type Res<T> = Result<T, String>;

/// Adds the C program's message in front of a library error.
pub trait OrFail<T> {
    /// `Err(e)` becomes `Err("msg (e)")`.
    fn or_fail(self, msg: &str) -> Res<T>;
}

impl<T, E: Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, msg: &str) -> Res<T> {
        self.map_err(|e| format!("{msg} ({e})"))
    }
}

// ---------------------------------------------------------------------------
// Randomness, page size
// ---------------------------------------------------------------------------

/// The `drand48` family's generator, seeded as the C examples seed it
/// (`srand48(getpid() * time(NULL))`), so PSNs are `lrand48() & 0xffffff`.
pub struct Rand48(u64);

impl Rand48 {
    const MASK: u64 = (1 << 48) - 1;

    /// Seeded with the process id times the current time.
    pub fn from_pid_and_time() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self::seeded(u64::from(std::process::id()).wrapping_mul(now))
    }

    /// `srand48(seed)`: the low 32 bits of the seed, then 0x330e.
    pub fn seeded(seed: u64) -> Self {
        Rand48(((seed & 0xffff_ffff) << 16) | 0x330e)
    }

    /// `lrand48()`: 31 random bits.
    pub fn lrand48(&mut self) -> u32 {
        self.0 = 0x5_DEEC_E66D_u64.wrapping_mul(self.0).wrapping_add(0xb) & Self::MASK;
        (self.0 >> 17) as u32
    }

    /// A first PSN, `lrand48() & 0xffffff`.
    pub fn psn(&mut self) -> Psn {
        Psn::truncate(self.lrand48())
    }
}

// ---------------------------------------------------------------------------
// Device setup
// ---------------------------------------------------------------------------

/// Opens the device named `-d`, or the first one, with the C messages.
pub fn open_device(name: Option<&str>) -> Res<Context> {
    let list = DeviceList::new().or_fail("Failed to get IB devices list")?;
    let dev = match name {
        None => list.get(0).ok_or("No IB devices found")?,
        Some(n) => list
            .iter()
            .find(|d| d.name() == n)
            .ok_or_else(|| format!("IB device {n} not found"))?,
    };
    dev.open()
        .or_fail(&format!("Couldn't get context for {}", dev.name()))
}

/// A completion channel when `-e` was given.
pub fn create_channel(ctx: &Context, use_event: bool) -> Res<Option<CompletionChannel>> {
    if !use_event {
        return Ok(None);
    }
    CompletionChannel::new(ctx)
        .map(Some)
        .or_fail("Couldn't create completion channel")
}

/// A CQ of `cqe` entries, on the channel if there is one.
pub fn create_cq(
    ctx: &Context,
    cqe: usize,
    channel: Option<&CompletionChannel>,
) -> Res<CompletionQueue> {
    let cqe = u32::try_from(cqe).map_err(|_| "Couldn't create CQ (too many entries)")?;
    match channel {
        Some(ch) => ctx.create_cq_with_channel(cqe, ch, 0),
        None => ctx.create_cq(cqe),
    }
    .or_fail("Couldn't create CQ")
}

/// The completion fields of `ibv_rc_pingpong -t`'s CQ: the completion
/// timestamp alone (`wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
pub type TsFields = Fields<Off, Off, Off, Off, Off, Off, Off, On, Off, Off, Off>;

/// The CQ of `-t`, as `ibv_rc_pingpong -t` creates it: `ibv_create_cq_ex`
/// with `cqe` entries, the channel if there is one, completion vector 0 and
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` as its only field.
pub fn create_cq_ts(
    ctx: &Context,
    cqe: usize,
    channel: Option<&CompletionChannel>,
) -> Res<CompletionQueueEx<TsFields>> {
    let cqe = u32::try_from(cqe).map_err(|_| "Couldn't create CQ (too many entries)")?;
    let builder = ctx.create_cq_ex(cqe).completion_timestamp();
    match channel {
        Some(ch) => builder.channel(ch, 0),
        None => builder,
    }
    .build()
    .or_fail("Couldn't create CQ")
}

/// `count` registered chunks of `len` bytes, each filled with `fill`: one
/// region, on demand under `-o` and prefetched for writing under `-P`
/// (rc_pingpong), as the C program registers its buffer.
pub fn alloc_buffers(
    pd: &ProtectionDomain,
    count: usize,
    len: usize,
    fill: u8,
    odp: Odp,
) -> Res<Vec<Chunk>> {
    if len == 0 {
        return Err("Couldn't allocate work buf (size 0)".into());
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    let total = count
        .checked_mul(len)
        .ok_or("Couldn't allocate work buf (too large)")?;
    let access = match odp {
        Odp::Off => AccessFlags::LOCAL_WRITE,
        Odp::On { .. } => AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND,
    };
    let region = pd.register(total, access).or_fail("Couldn't register MR")?;
    if let Odp::On { prefetch: true } = odp {
        // As the C program: a failed prefetch is reported, not fatal.
        if let Err(e) = region.prefetch(MrAdvice::PrefetchWrite, 0..total) {
            eprintln!("Couldn't prefetch MR({e}). Continue anyway");
        }
    }
    let mut chunks = region.into_chunks(len).or_fail("Couldn't register MR")?;
    for c in &mut chunks {
        c.as_mut_slice().fill(fill);
    }
    Ok(chunks)
}

// ---------------------------------------------------------------------------
// The TCP exchange
// ---------------------------------------------------------------------------

/// "done" with its NUL: what the client sends after reading the server's records.
const DONE: &[u8; 5] = b"done\0";

fn parse_record(msg: &[u8]) -> Res<Endpoint> {
    Endpoint::from_wire(msg).or_fail("Couldn't parse remote address")
}

/// The client side: connect to `host:port`, send our records, read as many
/// of the server's, send "done".
pub fn client_exch_dest(host: &str, port: u16, mine: &[Endpoint]) -> Res<Vec<Endpoint>> {
    let addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {host}:{port}"))?;
    let mut sock = addrs
        .into_iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| format!("Couldn't connect to {host}:{port}"))?;
    for ep in mine {
        sock.write_all(&ep.to_wire())
            .or_fail("Couldn't send local address")?;
    }
    let mut remote = Vec::with_capacity(mine.len());
    for i in 0..mine.len() {
        let mut msg = [0u8; Endpoint::WIRE_LEN];
        sock.read_exact(&mut msg)
            .map_err(|e| format!("client read: {e}\nCouldn't read/write remote address [{i}]"))?;
        remote.push(parse_record(&msg)?);
    }
    sock.write_all(DONE)
        .map_err(|e| format!("client write: {e}\nCouldn't read/write remote address"))?;
    Ok(remote)
}

/// The server side: wait for one client on `port`, read its records, run
/// `connect` on them (RTR and RTS, before answering, as the C servers do),
/// send our records, wait for "done".
pub fn server_exch_dest(
    port: u16,
    mine: &[Endpoint],
    connect: impl FnOnce(&[Endpoint]) -> Res<()>,
) -> Res<Vec<Endpoint>> {
    // Like getaddrinfo(NULL, port, AI_PASSIVE): IPv4 first, then IPv6.
    let listener = TcpListener::bind(("0.0.0.0", port))
        .or_else(|_| TcpListener::bind(("::", port)))
        .map_err(|e| format!("Couldn't listen to port {port} ({e})"))?;
    let (mut sock, _) = listener.accept().or_fail("accept() failed")?;
    drop(listener);
    let mut remote = Vec::with_capacity(mine.len());
    for i in 0..mine.len() {
        let mut msg = [0u8; Endpoint::WIRE_LEN];
        sock.read_exact(&mut msg).map_err(|e| {
            format!(
                "server read: {e}\nCouldn't read remote address [{i}] ({} bytes expected)",
                Endpoint::WIRE_LEN
            )
        })?;
        remote.push(parse_record(&msg)?);
    }
    connect(&remote).map_err(|e| format!("{e}\nCouldn't connect to remote QP"))?;
    for ep in mine {
        sock.write_all(&ep.to_wire())
            .or_fail("Couldn't send local address")?;
    }
    let mut done = [0u8; DONE.len()];
    sock.read_exact(&mut done)
        .or_fail("Couldn't send/recv local address")?;
    Ok(remote)
}

// ---------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------

/// `  local address:  LID 0x..., QPN 0x..., PSN 0x..., GID ...`; `sep` is
/// what stands before "GID" (`", "`, or `": "` in ibv_ud_pingpong).
pub fn print_local(ep: &Endpoint, sep: &str) {
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep}GID {}",
        ep.lid,
        ep.qpn.get(),
        ep.psn.get(),
        ep.gid
    );
}

/// `  remote address: LID 0x..., QPN 0x..., PSN 0x..., GID ...`.
pub fn print_remote(ep: &Endpoint) {
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        ep.lid,
        ep.qpn.get(),
        ep.psn.get(),
        ep.gid
    );
}

/// The two result lines, computed as the C programs compute them (a
/// `float` count of microseconds).
pub fn print_results(size: usize, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_micros() as f32;
    let bytes = size as i64 * i64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        f64::from(usec) / 1_000_000.,
        bytes as f64 * 8. / f64::from(usec)
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        f64::from(usec) / 1_000_000.,
        f64::from(usec / iters as f32)
    );
}

// ---------------------------------------------------------------------------
// Completion timestamps (-t, rc_pingpong)
// ---------------------------------------------------------------------------

/// The `-t` check of `ibv_rc_pingpong`'s `pp_init_ctx` (made once the PD is
/// allocated, as there): the device's `completion_timestamp_mask`, or the C
/// program's message when it is 0 (no completion timestamps, as on rxe).
pub fn timestamp_mask(ctx: &Context) -> Res<u64> {
    let attr = ctx
        .query_device()
        .or_fail("Couldn't query device for its features")?;
    match attr.completion_timestamp_mask {
        0 => Err("The device isn't completion timestamp capable".into()),
        mask => Ok(mask),
    }
}

/// `struct ts_params` of `ibv_rc_pingpong -t`: the clock cycles between
/// consecutive receive completions.
#[derive(Debug, Clone)]
pub struct TsStats {
    /// The device's `completion_timestamp_mask` (where the clock wraps).
    mask: u64,
    max: u64,
    min: u64,
    total: u64,
    prev: u64,
    have_prev: bool,
    iters: u32,
}

impl TsStats {
    /// Empty statistics for a clock that wraps at `mask`, initialised as the
    /// C program does (the minimum starts at 0xffffffff).
    pub fn new(mask: u64) -> Self {
        TsStats {
            mask,
            max: 0,
            min: 0xffff_ffff,
            total: 0,
            prev: 0,
            have_prev: false,
            iters: 0,
        }
    }

    /// A receive completed at `ts`: the delta to the previous one (across
    /// one wrap of the clock) goes into the statistics.
    pub fn record(&mut self, ts: u64) {
        if self.have_prev {
            let delta = if ts >= self.prev {
                ts - self.prev
            } else {
                // The clock wrapped: the C program's arithmetic, which
                // wraps in u64 too.
                self.mask
                    .wrapping_sub(self.prev)
                    .wrapping_add(ts)
                    .wrapping_add(1)
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total = self.total.wrapping_add(delta);
            self.iters += 1;
        }
        self.prev = ts;
        self.have_prev = true;
    }

    /// The lines the C program prints after the results (none when no
    /// delta was measured).
    pub fn lines(&self) -> Vec<String> {
        if self.iters == 0 {
            return Vec::new();
        }
        vec![
            format!("Max receive completion clock cycles = {}", self.max),
            format!("Min receive completion clock cycles = {}", self.min),
            format!(
                "Average receive completion clock cycles = {:.6}",
                self.total as f64 / f64::from(self.iters)
            ),
        ]
    }
}

// ---------------------------------------------------------------------------
// Buffer contents (-c)
// ---------------------------------------------------------------------------

/// The `-c` check. The C programs send and receive through one buffer, so a
/// peer sends back what it last received; with `-c` this keeps that echo
/// (the client's pattern travels back and forth) and checks, at the end,
/// the last message received: the first byte of every page must be 0.
pub struct Checker {
    on: bool,
    page: usize,
    echo: Option<Vec<u8>>,
    last_bad: Vec<usize>,
}

impl Checker {
    /// A checker, active when `on` (`-c`).
    pub fn new(on: bool) -> Self {
        Checker {
            on,
            page: rdma_verbs::page_size(),
            echo: None,
            last_bad: Vec::new(),
        }
    }

    /// The client's pattern: the first byte of each page set to 0.
    pub fn stamp(&self, payload: &mut [u8]) {
        if self.on {
            for b in payload.iter_mut().step_by(self.page) {
                *b = 0;
            }
        }
    }

    /// Whether [`stamp`](Self::stamp) writes anything (`-c`).
    pub fn stamps(&self) -> bool {
        self.on
    }

    /// Whether [`fill`](Self::fill) writes anything (`-c`, once a payload
    /// came).
    pub fn fills(&self) -> bool {
        self.on && self.echo.is_some()
    }

    /// Notes a received payload: what to send back, and which pages are bad.
    #[inline]
    pub fn received(&mut self, payload: &[u8]) {
        if self.on {
            self.note(payload);
        }
    }

    /// A receive of a [`RecvBuffers`](rdma_verbs::qp::RecvBuffers) pool,
    /// read in place with `-c`: a successful one's payload (`size` bytes
    /// from `off`, past a UD receive's GRH) is noted as
    /// [`received`](Self::received) notes it; a failed one brings no
    /// bytes. Without `-c` the bytes are not looked at, as the C loop does
    /// not look at them.
    #[inline]
    pub fn received_in(
        &mut self,
        msg: &rdma_verbs::qp::Received<'_>,
        off: usize,
        size: usize,
    ) -> Res<()> {
        if !self.on || !msg.is_success() {
            return Ok(());
        }
        let payload = msg
            .get(off..off + size)
            .ok_or_else(|| short_receive(msg.len(), off + size))?;
        self.note(payload);
        Ok(())
    }

    /// [`received`](Self::received) with `-c`.
    fn note(&mut self, payload: &[u8]) {
        self.last_bad = (0..payload.len())
            .step_by(self.page)
            .filter(|&i| payload[i] != 0)
            .map(|i| i / self.page)
            .collect();
        match &mut self.echo {
            Some(e) => e.copy_from_slice(payload),
            None => self.echo = Some(payload.to_vec()),
        }
    }

    /// Puts the last received payload into an outgoing one.
    pub fn fill(&self, payload: &mut [u8]) {
        if let (true, Some(e)) = (self.on, &self.echo) {
            payload.copy_from_slice(e);
        }
    }

    /// The server's final check: `invalid data in page N` for each bad page.
    pub fn report(&self) {
        if self.on {
            for p in &self.last_bad {
                println!("invalid data in page {p}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Posting and polling
// ---------------------------------------------------------------------------

/// Posts up to `n` receives with chunks from `pool` through `post`
/// (a QP's or an SRQ's `post_recv`); returns how many were posted, like the
/// C `pp_post_recv`. Chunks of receives not posted go back to the pool.
pub fn post_recvs(
    pool: &mut Vec<Chunk>,
    n: usize,
    post: impl FnOnce(Vec<RecvWr>) -> Result<(), PostError>,
) -> usize {
    let n = n.min(pool.len());
    if n == 0 {
        return 0;
    }
    let wrs: Vec<RecvWr> = pool
        .drain(pool.len() - n..)
        .map(|c| RecvWr::new(RECV_WRID).sge(c))
        .collect();
    match post(wrs) {
        Ok(()) => n,
        Err(e) => {
            pool.extend(e.returned);
            e.posted
        }
    }
}

/// Where a UD send goes.
pub struct UdDest {
    /// The address handle.
    pub ah: AddressHandle,
    /// The remote QP number.
    pub qpn: QpNum,
}

/// `pp_post_send`: one signalled SEND of `size` bytes from `buf` (inline when
/// the QP can take it), to `ud` on a UD QP. The chunk comes back with the
/// send's completion (or stays in `buf` for inline sends).
///
/// A QP created with `send_ops` (`-N`) posts it as `ibv_rc_pingpong -N`
/// does, through the `ibv_wr_*` API: `ibv_wr_start`, `ibv_wr_send` (with
/// `ibv_wr_set_ud_addr` on UD) and the data, `ibv_wr_complete`; any other
/// through `ibv_post_send`. Either way the request is the same [`SendWr`].
pub fn post_send(
    qp: &mut QueuePair,
    buf: &mut Option<Chunk>,
    size: usize,
    inline: bool,
    ud: Option<&UdDest>,
    check: &Checker,
) -> Res<()> {
    let mut chunk = buf
        .take()
        .ok_or("Couldn't post send (the send buffer is still in use)")?;
    check.fill(&mut chunk.as_mut_slice()[..size]);
    fn dest<'a>(wr: SendWr<'a>, ud: Option<&UdDest>) -> SendWr<'a> {
        match ud {
            Some(d) => wr.ud(&d.ah, d.qpn, UD_QKEY),
            None => wr,
        }
    }
    // With -N the batch is opened first, so that a refusal there leaves the
    // chunk with us.
    let poster = match qp.send_ops() {
        Some(_) => match qp.start_batch() {
            Ok(b) => Poster::Batch(b),
            Err(e) => {
                *buf = Some(chunk);
                return Err(format!("Couldn't post send ({e})"));
            }
        },
        None => Poster::Basic(qp),
    };
    if inline {
        // The data is copied into the request: the chunk stays ours.
        let wr = SendWr::new(SEND_WRID, SendOp::Send).inline(&chunk.as_slice()[..size]);
        let res = poster.post(dest(wr, ud));
        *buf = Some(chunk);
        return res.map_err(|e| e.error).or_fail("Couldn't post send");
    }
    let wr = SendWr::new(SEND_WRID, SendOp::Send).sge_len(chunk, size);
    poster.post(dest(wr, ud)).map_err(|mut e| {
        // A refused request gives its chunk back; one in doubt (a failed
        // ibv_wr_complete or ibv_post_send) keeps it until its completion.
        *buf = e.returned.pop();
        format!("Couldn't post send ({})", e.error)
    })
}

/// Where [`post_send`] posts: a batch opened on an extended QP (`-N`), or
/// the QP's `ibv_post_send`.
enum Poster<'q> {
    Batch(WrBatch<'q>),
    Basic(&'q mut QueuePair),
}

impl Poster<'_> {
    /// Posts `wr`: into the batch, which is then completed (a request the
    /// batch refuses is handed back in the error, and the batch, dropped,
    /// is aborted: nothing reaches the device); or with `ibv_post_send`.
    fn post(self, wr: SendWr<'_>) -> Result<(), PostError> {
        match self {
            Poster::Batch(mut batch) => {
                batch.post(wr)?;
                batch.complete()
            }
            Poster::Basic(qp) => qp.post_send([wr]),
        }
    }
}

/// `attr` for `-N` (`new_send`): created with `ibv_create_qp_ex` and
/// `send_ops_flags = IBV_QP_EX_WITH_SEND`, as `ibv_rc_pingpong -N` creates
/// its QP; [`post_send`] then posts through the `ibv_wr_*` API.
pub fn send_ops(attr: QpInitAttr<'_>, new_send: bool) -> QpInitAttr<'_> {
    if new_send {
        attr.send_ops(SendOpsFlags::SEND)
    } else {
        attr
    }
}

/// The top of the C loop with `-e`: one event from `channel`
/// (`ibv_get_cq_event`), which must be for `cq`, and the CQ re-armed
/// (`ibv_req_notify_cq`).
pub fn wait_cq_event(cq: &CompletionQueue, channel: &CompletionChannel) -> Res<()> {
    let event = channel.get_event().or_fail("Failed to get cq_event")?;
    if !event.is_for(cq) {
        return Err("CQ event for unknown CQ".into());
    }
    cq.req_notify(false)
        .or_fail("Couldn't request CQ notification")
}

/// Waits for completions as the C loop does: with a channel, one event (the
/// CQ is re-armed) and one poll, which may find nothing; without, polls
/// until something is there.
pub fn next_completions<'a>(
    cq: &CompletionQueue,
    channel: Option<&CompletionChannel>,
    wcs: &'a mut [WorkCompletion],
) -> Res<&'a [WorkCompletion]> {
    if let Some(ch) = channel {
        wait_cq_event(cq, ch)?;
        let n = cq.poll(wcs).or_fail("poll CQ failed")?.len();
        return Ok(&wcs[..n]);
    }
    loop {
        let n = cq.poll(&mut *wcs).or_fail("poll CQ failed")?.len();
        if n > 0 {
            return Ok(&wcs[..n]);
        }
    }
}

/// The request a completion (of a CQ or an extended CQ) ends, and its
/// buffer: `(wr_id, chunk)`, with `wr_id` 0 when the completion is not one
/// of `qp`'s outstanding requests.
pub fn reclaim<C: Completion>(qp: &mut QueuePair, wc: &C) -> (u64, Option<Chunk>) {
    let mut out = (0, None);
    qp.reclaim(wc, |done| {
        if done.signaled {
            out.0 = done.wr_id;
            out.1 = done.into_chunk();
        }
    });
    out
}

/// `Err` with the C message for a failed completion.
pub fn check_status(wc: &WorkCompletion, wr_id: u64) -> Res<()> {
    status_result(wc.status(), wc.vendor_err(), wr_id)
}

/// `Ok` for a successful completion, else `Err` with the C message: `Failed
/// status <ibv_wc_status_str> (<status>) for wr_id <wr_id>` and the vendor
/// error. For a [`WorkCompletion`] or an extended CQ's completion alike.
pub fn status_result(status: Result<WcStatus, u32>, vendor_err: u32, wr_id: u64) -> Res<()> {
    let (name, raw) = match status {
        Ok(WcStatus::Success) => return Ok(()),
        Ok(s) => (s.message(), s.as_raw()),
        Err(raw) => ("unknown", raw),
    };
    Err(format!(
        "Failed status {name} ({raw}) for wr_id {wr_id} (vendor error 0x{vendor_err:x})"
    ))
}

/// A receive shorter than the payload it should hold.
#[cold]
fn short_receive(got: usize, want: usize) -> String {
    format!("a receive of {got} bytes, not {want}")
}

/// The address vector to a peer at `lid` (and `gid`), as `pp_connect_ctx`
/// builds it: a GRH (hop limit 1) when the peer sent a GID, which needs
/// `-g`. `fail` is the C program's message for this step.
pub fn peer_av(cfg: &Config, lid: u16, gid: Gid, fail: &str) -> Res<AddressVector> {
    let mut av = AddressVector::new(cfg.ib_port)
        .dlid(lid)
        .sl(cfg.sl)
        .or_fail(fail)?;
    if gid.interface_id() != 0 {
        let sgid = cfg.gidx.ok_or_else(|| {
            format!("{fail} (the peer sent a GID but no local GID index was given: use -g)")
        })?;
        av = av.global(GlobalRoute::new(gid, sgid).hop_limit(1));
    }
    Ok(av)
}

/// Signature of a program's `pp_connect_ctx`.
pub type ConnectFn = fn(&mut QueuePair, &Config, Endpoint, &Endpoint) -> Res<()>;

/// What `ibv_rc_pingpong` and `ibv_uc_pingpong` do once their options are
/// checked: set up one QP of `qp_type`, exchange endpoints, connect with
/// `connect`, ping-pong and print the results.
pub fn run_connected(cfg: Config, qp_type: QpType, connect: ConnectFn) -> Res<()> {
    let mut rng = Rand48::from_pid_and_time();

    // pp_init_ctx
    let ctx = open_device(cfg.ib_devname.as_deref())?;
    let init = QpAttr::new()
        .state(QpState::Init)
        .pkey_index(0)
        .port(cfg.ib_port)
        .access_flags(AccessFlags::empty());
    let mut pp = SingleQp::init(&ctx, &cfg, qp_type, init, 0)?;

    let portinfo = ctx
        .query_port(cfg.ib_port)
        .or_fail("Couldn't get port info")?;
    if portinfo.link_layer != LinkLayer::Ethernet && portinfo.lid == 0 {
        return Err("Couldn't get local LID".into());
    }
    let gid = match cfg.gidx {
        Some(g) => ctx
            .query_gid(cfg.ib_port, g.into())
            .or_fail(&format!("can't read sgid of index {g}"))?,
        None => Gid::ZERO,
    };
    let my_dest = Endpoint {
        lid: portinfo.lid,
        qpn: pp.qp.qp_num(),
        psn: rng.psn(),
        gid,
    };
    print_local(&my_dest, ", ");

    let rem_dest = match &cfg.servername {
        Some(host) => client_exch_dest(host, cfg.port, &[my_dest])?,
        None => server_exch_dest(cfg.port, &[my_dest], |rem| {
            connect(&mut pp.qp, &cfg, my_dest, &rem[0])
        })?,
    }[0];
    print_remote(&rem_dest);
    if cfg.servername.is_some() {
        connect(&mut pp.qp, &cfg, my_dest, &rem_dest)?;
    }

    let elapsed = pp.run(cfg.iters, cfg.servername.is_some())?;
    print_results(cfg.size, cfg.iters, elapsed);
    if let Some(ts) = &pp.ts {
        for line in ts.stats.lines() {
            println!("{line}");
        }
    }
    if cfg.servername.is_none() {
        pp.check.report();
    }
    Ok(())
}

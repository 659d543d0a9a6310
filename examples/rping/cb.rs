//! The control block (C's `struct rping_cb`): the state the CM events and
//! completions move, and the "semaphore" the ping loops wait on.
//!
//! The C program has a CM thread and a CQ thread that handle events and
//! completions, set `cb->state` and post a semaphore; the main thread
//! waits on the semaphore and then checks the state (`wait for
//! RDMA_READ_ADV state 10` when it is not the expected one). Here the two
//! threads only read: the CM thread takes each event off the channel and
//! the CQ thread each batch of completions, and both pass them as a
//! [`Msg`] to the thread that runs the connection. That thread handles
//! them inside [`Cb::wait`], exactly as the C handlers would (same state
//! changes, same printed lines, same semaphore posts), so the waits end
//! on the same states, and the QP and its buffers stay with one owner.
//! (The one thing the CM thread does itself is answer a peer's
//! disconnect; see [`spawn_cm_thread`].)

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rdma_verbs::cm::{CmEventKind, CmId, EventChannel};
use rdma_verbs::qp::RecvWr;
use rdma_verbs::{
    Chunk, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, WcOpcode,
    WcStatus, WorkCompletion,
};

use crate::out;

/// The states of the C program (`enum test_state`), with its numbers,
/// which its messages print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Idle = 1,
    ConnectRequest,
    AddrResolved,
    RouteResolved,
    Connected,
    RdmaReadAdv,
    RdmaReadComplete,
    RdmaWriteAdv,
    RdmaWriteComplete,
    Disconnected,
    Error,
}

impl State {
    /// The name of the C program's enum value, without its `rping`-less
    /// prefix (`RDMA_READ_ADV`).
    pub fn c_name(self) -> &'static str {
        match self {
            State::Idle => "IDLE",
            State::ConnectRequest => "CONNECT_REQUEST",
            State::AddrResolved => "ADDR_RESOLVED",
            State::RouteResolved => "ROUTE_RESOLVED",
            State::Connected => "CONNECTED",
            State::RdmaReadAdv => "RDMA_READ_ADV",
            State::RdmaReadComplete => "RDMA_READ_COMPLETE",
            State::RdmaWriteAdv => "RDMA_WRITE_ADV",
            State::RdmaWriteComplete => "RDMA_WRITE_COMPLETE",
            State::Disconnected => "DISCONNECTED",
            State::Error => "ERROR",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", *self as i32)
    }
}

/// `wr_id`s of the requests.
pub const WR_RECV: u64 = 1;
pub const WR_SEND: u64 = 2;
pub const WR_RDMA: u64 = 3;

/// The 16-byte `struct rping_rdma_info`: all fields big-endian.
pub const INFO_LEN: usize = 16;

/// What the CM and CQ threads hand to a connection's thread.
pub enum Msg {
    /// A CM event (acknowledged already): its kind and status, the id it
    /// is for (for a connection request: the new id's key) and a
    /// connection request's new id.
    Cm {
        kind: CmEventKind,
        status: i32,
        id_key: u64,
        request: Option<CmId>,
    },
    /// One poll's worth of completions.
    Wcs(Vec<WorkCompletion>),
}

/// Where the events of an id go: the thread that handles them, and the id
/// itself for a connection, which the CM thread disconnects when the peer
/// does (see [`spawn_cm_thread`]).
pub struct Route {
    tx: Sender<Msg>,
    conn: Option<Arc<CmId>>,
}

/// Which thread gets the events of which id, by [`CmId::key`] (the C
/// program finds its control block through `cma_id->context`).
pub type Routes = Arc<Mutex<HashMap<u64, Route>>>;

/// Sends the events of the id `key` to `tx`; `conn`: the id of a
/// connection, to be answered when the peer disconnects.
pub fn route(routes: &Routes, key: u64, tx: Sender<Msg>, conn: Option<Arc<CmId>>) {
    routes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, Route { tx, conn });
}

pub fn unroute(routes: &Routes, key: u64) {
    routes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&key);
}

/// The CM thread: reads every event of the channel and passes it on.
/// Events for ids nobody waits for any more are dropped (acknowledged); a
/// dropped connection request's new id is destroyed, which rejects it.
///
/// When the peer disconnects, the CM thread answers at once
/// (`rdma_disconnect`, which sends the DREP) before passing the event on.
/// The C program answers from its main thread after the event has woken
/// it, which is soon enough for a C peer that disconnected to see its own
/// DISCONNECTED event before it ends; a thread more between the event and
/// the answer loses that race now and then. The connection's thread
/// disconnects again as the C program does (for `-q`, after moving its QP
/// to ERR), which then changes nothing.
pub fn spawn_cm_thread(ch: EventChannel, routes: Routes) {
    thread::spawn(move || loop {
        let mut ev = match ch.get_event() {
            Ok(ev) => ev,
            Err(e) => {
                out::perror("rdma_get_cm_event", &e);
                out::exit(out::ret_of(&e));
            }
        };
        let request = ev.take_request();
        let kind = ev.kind();
        let msg = Msg::Cm {
            kind,
            status: ev.status(),
            id_key: request.as_ref().map_or(ev.id_key(), CmId::key),
            request,
        };
        let to = ev.id_key();
        drop(ev);
        let route = routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&to)
            .map(|r| (r.tx.clone(), r.conn.clone()));
        if let Some((tx, conn)) = route {
            if kind == CmEventKind::Disconnected {
                if let Some(id) = conn {
                    let _ = id.disconnect();
                }
            }
            let _ = tx.send(msg);
        }
    });
}

/// The CQ thread: waits on the completion channel, re-arms, polls the CQ
/// empty and passes the completions on. Like the C thread it ends after a
/// failed completion (a flushed one at the latest, when the QP goes to
/// ERR at disconnect).
///
/// Successful send completions wake nobody in the C program (its handler
/// only prints a debug line), so they are held back here and passed on
/// with the next completion that matters: the connection's thread then
/// wakes as often as the C main thread does.
pub fn spawn_cq_thread(cc: CompletionChannel, cq: CompletionQueue, tx: Sender<Msg>) {
    thread::spawn(move || {
        debug_log!("cq_thread started.");
        let mut wcs = [WorkCompletion::default(); 16];
        let mut held: Vec<WorkCompletion> = Vec::new();
        loop {
            match cc.get_event() {
                Ok(ev) if ev.is_for(&cq) => {}
                Ok(_) => {
                    eprintln!("Unknown CQ!");
                    return;
                }
                Err(_) => {
                    eprintln!("Failed to get cq event!");
                    return;
                }
            }
            if cq.req_notify(false).is_err() {
                eprintln!("Failed to set notify!");
                return;
            }
            let mut failed = false;
            loop {
                let got = match cq.poll(&mut wcs) {
                    Ok(got) if !got.is_empty() => got,
                    Ok(_) => break,
                    Err(e) => {
                        eprintln!("poll error {}", out::ret_of(&e));
                        return;
                    }
                };
                failed |= got.iter().any(|wc| !wc.is_success());
                held.extend_from_slice(got);
                let quiet = held
                    .iter()
                    .all(|wc| wc.is_success() && wc.opcode() == Ok(WcOpcode::Send));
                if !quiet && tx.send(Msg::Wcs(std::mem::take(&mut held))).is_err() {
                    return;
                }
            }
            if failed {
                return;
            }
        }
    });
}

/// A connection's verbs objects and buffers.
pub struct Conn {
    pub pd: ProtectionDomain,
    pub cc: CompletionChannel,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    /// The receive buffer (16 bytes), while not posted.
    pub recv: Option<Chunk>,
    /// Send buffers (16 bytes each) not posted.
    pub sends: Vec<Chunk>,
    /// Server: its RDMA buffer (`-S` bytes), the READ target and WRITE
    /// source, while not posted.
    pub rdma: Option<Chunk>,
    /// Client: `start_buf`, which the server READs.
    pub start: Option<MemoryRegion>,
    /// Client: `rdma_buf`, the sink the server WRITEs.
    pub sink: Option<MemoryRegion>,
}

/// The peer's buffer, from its last `rping_rdma_info`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Remote {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

/// The control block of one connection (or of the listener).
pub struct Cb<'a> {
    pub server: bool,
    pub state: State,
    /// The semaphore's count: posts not yet waited for.
    posts: u32,
    rx: Receiver<Msg>,
    /// `cb->cm_id`: the listener or the client's id; events of other ids
    /// are the "child"'s in the debug lines.
    parent_key: u64,
    /// Client: the id whose route is resolved when its address is.
    resolving: Option<&'a CmId>,
    /// Connection requests taken off the listener, oldest first.
    pub requests: VecDeque<CmId>,
    pub conn: Option<Conn>,
    pub remote: Remote,
    /// The C program's CQ thread has stopped (a failed completion): later
    /// completions are reclaimed but not acted on.
    pub cq_dead: bool,
    /// Our CQ thread has stopped (it passed on a failed completion).
    cq_thread_done: bool,
    /// A DISCONNECTED event was handled.
    pub disconnected: bool,
}

impl<'a> Cb<'a> {
    pub fn new(server: bool, rx: Receiver<Msg>, parent_key: u64) -> Self {
        Cb {
            server,
            state: State::Idle,
            posts: 0,
            rx,
            parent_key,
            resolving: None,
            requests: VecDeque::new(),
            conn: None,
            remote: Remote::default(),
            cq_dead: false,
            cq_thread_done: false,
            disconnected: false,
        }
    }

    /// Client: resolve the route of `id` once its address is resolved.
    pub fn resolving(mut self, id: &'a CmId) -> Self {
        self.resolving = Some(id);
        self
    }

    /// `sem_post`.
    pub fn post(&mut self) {
        self.posts += 1;
    }

    /// [`wait`](Self::wait) for `want`; any other state is the C
    /// program's `wait for WANT state N` line and -1.
    pub fn wait_for(&mut self, want: State) -> Result<(), i32> {
        let state = self.wait();
        if state == want {
            return Ok(());
        }
        eprintln!("wait for {} state {state}", want.c_name());
        Err(-1)
    }

    /// [`wait`](Self::wait) for a connection request and take its new id;
    /// anything else is the C program's `wait for CONNECT_REQUEST state N`
    /// line and -1.
    pub fn wait_request(&mut self) -> Result<CmId, i32> {
        let state = self.wait();
        match self
            .requests
            .pop_front()
            .filter(|_| state == State::ConnectRequest)
        {
            Some(child) => Ok(child),
            None => {
                eprintln!("wait for CONNECT_REQUEST state {state}");
                Err(-1)
            }
        }
    }

    /// `sem_wait`, then the state: handles events and completions until
    /// one of them posts.
    pub fn wait(&mut self) -> State {
        while self.posts == 0 {
            match self.rx.recv() {
                Ok(msg) => self.handle(msg),
                // Cannot happen while the CM thread's routes hold a sender.
                Err(_) => return State::Error,
            }
        }
        self.posts -= 1;
        self.state
    }

    /// Handles what arrives until `done` holds or `limit` has passed.
    pub fn drain_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) {
        let end = Instant::now() + limit;
        while !done(self) {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(msg) => self.handle(msg),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Whether the CQ thread has nothing more to pass on: it stopped (after
    /// the flushed receive, normally), or there is no receive posted whose
    /// completion would bring the send completions it holds back.
    pub fn cq_quiet(&self) -> bool {
        self.cq_thread_done
            || self
                .conn
                .as_ref()
                .is_none_or(|c| c.qp.outstanding_recvs() == 0)
    }

    /// Takes a send buffer, handling events until one is back if all are
    /// posted (the sends of this protocol complete long before that).
    pub fn send_chunk(&mut self) -> Option<Chunk> {
        loop {
            if let Some(c) = self.conn.as_mut()?.sends.pop() {
                return Some(c);
            }
            if self.cq_quiet() {
                return None;
            }
            match self.rx.recv() {
                Ok(msg) => self.handle(msg),
                Err(_) => return None,
            }
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Cm {
                kind,
                status,
                id_key,
                request,
            } => self.cm_event(kind, status, id_key, request),
            Msg::Wcs(wcs) => {
                for wc in &wcs {
                    self.completion(wc);
                }
            }
        }
    }

    /// `rping_cma_event_handler`.
    fn cm_event(&mut self, kind: CmEventKind, status: i32, id_key: u64, request: Option<CmId>) {
        let who = if kind != CmEventKind::ConnectRequest && id_key == self.parent_key {
            "parent"
        } else {
            "child"
        };
        debug_log!(
            "cma_event type {} cma_id {id_key:#x} ({who})",
            kind.c_name()
        );
        match kind {
            CmEventKind::AddrResolved => {
                self.state = State::AddrResolved;
                if let Some(id) = self.resolving {
                    if let Err(e) = id.resolve_route(Duration::from_millis(2000)) {
                        self.state = State::Error;
                        out::perror("rdma_resolve_route", &e);
                        self.post();
                    }
                }
            }
            CmEventKind::RouteResolved => {
                self.state = State::RouteResolved;
                self.post();
            }
            CmEventKind::ConnectRequest => {
                self.state = State::ConnectRequest;
                debug_log!("child cma {id_key:#x}");
                self.requests.extend(request);
                self.post();
            }
            CmEventKind::ConnectResponse => {
                debug_log!("CONNECT_RESPONSE");
                self.state = State::Connected;
                self.post();
            }
            CmEventKind::Established => {
                debug_log!("ESTABLISHED");
                // The server wakes up when the first receive completes.
                if !self.server {
                    self.state = State::Connected;
                }
                self.post();
            }
            CmEventKind::AddrError
            | CmEventKind::RouteError
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => {
                eprintln!("cma event {}, error {status}", kind.c_name());
                self.post();
                out::set_fatal();
            }
            CmEventKind::Disconnected => {
                eprintln!(
                    "{} DISCONNECT EVENT...",
                    if self.server { "server" } else { "client" }
                );
                self.disconnected = true;
                self.state = State::Disconnected;
                self.post();
            }
            CmEventKind::DeviceRemoval => {
                eprintln!("cma detected device removal!!!!");
                self.state = State::Error;
                self.post();
                out::set_fatal();
            }
            other => eprintln!("unhandled event: {}, ignoring", other.c_name()),
        }
    }

    /// `rping_cq_event_handler` for one completion.
    fn completion(&mut self, wc: &WorkCompletion) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let Conn {
            qp,
            recv,
            sends,
            rdma,
            ..
        } = conn;
        // Each finished request's buffer goes back to its place.
        qp.reclaim(wc, |done| {
            let id = done.wr_id;
            match (id, done.into_chunk()) {
                (WR_RECV, Some(c)) => *recv = Some(c),
                (WR_SEND, Some(c)) => sends.push(c),
                (_, Some(c)) => *rdma = Some(c),
                (_, None) => {}
            }
        });
        if !wc.is_success() {
            self.cq_thread_done = true;
        }
        if self.cq_dead {
            return;
        }
        match wc.status() {
            Ok(WcStatus::Success) => {}
            Ok(WcStatus::WrFlushErr) => return,
            status => {
                let raw = status.map_or_else(|raw| raw, WcStatus::as_raw);
                eprintln!("cq completion failed status {raw}");
                self.fail_cq();
                return;
            }
        }
        match wc.opcode() {
            Ok(WcOpcode::Send) => debug_log!("send completion"),
            Ok(WcOpcode::RdmaWrite) => {
                debug_log!("rdma write completion");
                self.state = State::RdmaWriteComplete;
                self.post();
            }
            Ok(WcOpcode::RdmaRead) => {
                debug_log!("rdma read completion");
                self.state = State::RdmaReadComplete;
                self.post();
            }
            Ok(WcOpcode::Recv) => {
                debug_log!("recv completion");
                if wc.byte_len() as usize != INFO_LEN {
                    eprintln!("Received bogus data, size {}", wc.byte_len());
                    eprintln!("recv wc error: -1");
                    self.fail_cq();
                    return;
                }
                if self.server {
                    self.server_recv();
                } else {
                    self.client_recv();
                }
                if let Err(errno) = self.post_recv() {
                    eprintln!("post recv error: {errno}");
                    self.fail_cq();
                    return;
                }
                self.post();
            }
            _ => {
                debug_log!("unknown!!!!! completion");
                self.fail_cq();
            }
        }
    }

    /// The C CQ handler's error path: state ERROR, a post, and its thread
    /// ends.
    pub fn fail_cq(&mut self) {
        self.state = State::Error;
        self.post();
        self.cq_dead = true;
    }

    /// Posts the receive buffer; the errno on failure.
    pub fn post_recv(&mut self) -> Result<(), i32> {
        let conn = self.conn.as_mut().ok_or(-1)?;
        let chunk = conn.recv.take().ok_or(-1)?;
        conn.qp
            .post_recv([RecvWr::new(WR_RECV).sge(chunk)])
            .map_err(|mut e| {
                conn.recv = e.returned.pop();
                out::ret_of(&e.error)
            })
    }

    /// `server_recv`: the client's advertisement.
    fn server_recv(&mut self) {
        let Some(buf) = self.conn.as_ref().and_then(|c| c.recv.as_ref()) else {
            return;
        };
        let b = &buf.as_slice()[..INFO_LEN];
        self.remote = Remote {
            addr: u64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            rkey: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        };
        debug_log!(
            "Received rkey {:x} addr {:x} len {} from peer",
            self.remote.rkey,
            self.remote.addr,
            self.remote.len as i32
        );
        self.state = if (self.state as i32) <= State::Connected as i32
            || self.state == State::RdmaWriteComplete
        {
            State::RdmaReadAdv
        } else {
            State::RdmaWriteAdv
        };
    }

    /// `client_recv`: the server's go-ahead.
    fn client_recv(&mut self) {
        self.state = if self.state == State::RdmaReadAdv {
            State::RdmaWriteAdv
        } else {
            State::RdmaWriteComplete
        };
    }
}

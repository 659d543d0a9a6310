//! Faults across the two hosts with the connection manager: a link that
//! goes down under a CM connection, the peer's device removed and added
//! back, and a peer that never answers. The helpers connect RC QPs
//! through librdmacm for these tests and for [`super::peer`].

use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::Error;

use super::{deadline, line, run, rxe0_active, tcp, wait_until, Rc, Side};
use std::io::Write;

/// An RC listener on this VM's address and `port`.
pub fn listen(ch: &EventChannel, side: &Side, port: u16) -> Result<CmId, Failed> {
    let l = ch.create_id(PortSpace::Tcp)?;
    l.set_reuse_addr(true)?;
    l.bind(SocketAddr::new(side.me.parse::<IpAddr>()?, port))?;
    l.listen(8)?;
    Ok(l)
}

/// What both sides ask of the QP the CM sets up: an ACK timeout of about
/// 16 ms (`set_ack_timeout(12)` on the client) and 2 retries, so that a
/// dead peer fails a send within a second; RNR retries without end.
fn param() -> ConnParam<'static> {
    ConnParam::new().retry_count(2).rnr_retry_count(7)
}

/// Takes the next connection request on `ch` (within `wait`): an RC QP
/// on its id, 64 receives posted, accepted and established.
pub fn accept(ch: &EventChannel, wait: Duration) -> Result<(CmId, Rc), Failed> {
    accept_request(ch, ch.expect(CmEventKind::ConnectRequest, wait)?)
}

/// Accepts the connection request `ev` as [`accept`] does.
fn accept_request(ch: &EventChannel, mut ev: CmEvent) -> Result<(CmId, Rc), Failed> {
    let id = ev
        .take_request()
        .ok_or("a connection request without its id")?;
    drop(ev);
    let mut rc = Rc::on(id.context()?, |pd, attr| Ok(id.create_qp(pd, attr)?))?;
    rc.post_recvs(64)?;
    id.accept(&param())?;
    ch.expect(CmEventKind::Established, deadline())?;
    Ok((id, rc))
}

/// Connects an RC QP through the CM to the peer's `port`, on a channel of
/// its own (so that late events of an earlier connection stay apart). A
/// refused or unanswered attempt is tried again with a new id until the
/// deadline: the peer may not listen yet, or its device may be coming back.
pub fn connect(side: &Side, port: u16) -> Result<(EventChannel, CmId, Rc), Failed> {
    let to = SocketAddr::new(side.peer.parse::<IpAddr>()?, port);
    let end = Instant::now() + deadline() * 3;
    let mut tries = 0;
    loop {
        tries += 1;
        let ch = EventChannel::new()?;
        let id = ch.create_id(PortSpace::Tcp)?;
        id.resolve_addr(None, to, Duration::from_secs(2))?;
        ch.expect(CmEventKind::AddrResolved, deadline())?;
        id.resolve_route(Duration::from_secs(2))?;
        ch.expect(CmEventKind::RouteResolved, deadline())?;
        id.set_ack_timeout(12)?;
        let rc = Rc::on(id.context()?, |pd, attr| Ok(id.create_qp(pd, attr)?))?;
        id.connect(&param())?;
        match ch.expect(CmEventKind::Established, deadline()) {
            Ok(_) => return Ok((ch, id, rc)),
            Err(e) if Instant::now() < end => {
                eprintln!("hosts: connect to {to} (try {tries}): {e}; trying again");
                std::thread::sleep(Duration::from_millis(300));
            }
            Err(e) => return Err(format!("cannot connect to {to} in {tries} tries: {e}").into()),
        }
    }
}

/// Disconnects a connected id, waits for this side's `Disconnected` (the
/// peer's answer, or the CM giving up), resets.
pub fn close(ch: &EventChannel, id: &CmId, rc: &mut Rc) -> Result<(), Failed> {
    id.disconnect()?;
    ch.expect(CmEventKind::Disconnected, deadline() * 2)?;
    rc.reset()
}

/// The next event on `ch` that is not a late one of an earlier
/// connection (`Disconnected`, `TimewaitExit` for an id other than `id`),
/// within `wait`: it must be `kind`.
fn next_event(
    ch: &EventChannel,
    kind: CmEventKind,
    id: &CmId,
    wait: Duration,
) -> Result<CmEvent, Failed> {
    let end = Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let ev = ch
            .get_event_timeout(left)?
            .ok_or_else(|| format!("no {kind} within {wait:?}"))?;
        let late = matches!(
            ev.kind(),
            CmEventKind::Disconnected | CmEventKind::TimewaitExit
        ) && !ev.is_for(id);
        if late {
            continue;
        }
        ensure!(ev.kind() == kind, "waited for {kind}, got {}", ev.kind());
        return Ok(ev);
    }
}

/// Link down under a CM connection: the client's sends fail (retry
/// exceeded, the rest flushed); once the link is up it disconnects (the
/// DREQ reaches the server, which answers), both sides see `Disconnected`
/// and reset their QPs (every chunk back), and the client connects again
/// through the CM (a new id, a new QP); 20 sends go through. (Disconnecting
/// while the port is down fails at once, `Disconnected` with `-ETIMEDOUT`,
/// and on this kernel's rxe left the client's later connections without
/// an answer: see the testing guide.) A server that gets the new request
/// before any `Disconnected` ends the stale connection itself.
pub fn link_down_disconnect_then_reconnect(side: &Side) -> Result<(), Failed> {
    const PORT: u16 = 18_610;
    if side.server {
        let ch = EventChannel::new()?;
        let _l = listen(&ch, side, PORT)?;
        let (id, mut rc) = accept(&ch, deadline() * 3)?;
        rc.reap(20)?;
        let mut how = "the new request ended the stale connection";
        let end = Instant::now() + deadline() * 3;
        let req = loop {
            let left = end.saturating_duration_since(Instant::now());
            let ev = ch
                .get_event_timeout(left)?
                .ok_or("neither Disconnected nor a new request")?;
            match ev.kind() {
                CmEventKind::Disconnected if ev.is_for(&id) => {
                    drop(ev);
                    id.disconnect()?; // the DREP
                    how = "Disconnected, answered";
                }
                CmEventKind::ConnectRequest => break ev,
                k => return Err(format!("{k} while the client reconnects").into()),
            }
        };
        let _ = id.disconnect(); // a stale connection: the server ends it
        rc.reset()?;
        let (id2, mut rc2) = accept_request(&ch, req)?;
        rc2.reap(20)?;
        drop(next_event(
            &ch,
            CmEventKind::Disconnected,
            &id2,
            deadline() * 2,
        )?);
        id2.disconnect()?;
        rc2.reset()?;
        rc2.carry(rc.counts());
        return rc2.report(side, "CM link down", how);
    }
    let (ch, id, mut rc) = connect(side, PORT)?;
    rc.sends_across_a_link_flap(&side.netdev)?;
    close(&ch, &id, &mut rc)?;
    drop((id, ch));
    let (ch2, id2, mut rc2) = connect(side, PORT)?;
    rc2.post_sends(20)?;
    ensure!(rc2.reap(20)? == 20, "sends failed after the reconnect");
    close(&ch2, &id2, &mut rc2)?;
    rc2.carry(rc.counts());
    rc2.report(
        side,
        "CM link down",
        "10 sends failed on the dead link, Disconnected once it was back",
    )
}

/// The client streams sends; the server's device is removed under the
/// connection (`rdma link delete rxe0`). rxe cannot take a device from a
/// process (no `disassociate_ucontext`), and librdmacm keeps its context
/// of a device open while the process lives, so the removal waits for
/// every process that used the CM on it to exit: the receiving peer is a
/// child process (role `removal`), which takes the CM's `DeviceRemoval`,
/// resets its QP (every receive back), reports and exits; the removal
/// ends; rxe0 is added back and a new child listens. The client's sends
/// fail (retry exceeded), it resets and connects again (its REQ is
/// answered once the server is back), and 20 sends go through.
pub fn peer_device_removed_and_readded(side: &Side) -> Result<(), Failed> {
    use super::peer::{Peer, REMOVAL_PORT};
    if !side.server {
        return super::peer::survivor(side, REMOVAL_PORT, "device removed");
    }
    let mut away = Away::new(side);
    let first = Peer::spawn("removal")?;
    let got = first.received(100)?;
    away.start()?;
    let (p1, r1) = first.counts()?;
    away.removed()?;
    away.back()?;
    let (p2, r2) = Peer::spawn("sink_removal")?.counts()?;
    let (posted, returned) = (p1 + p2, r1 + r2);
    eprintln!(
        "hosts: device removed (server): rxe0 removed after {got} receives and added back; \
         the peers posted {posted} chunks, {returned} came back ({p1}/{r1} before, {p2}/{r2} after)"
    );
    ensure!(
        posted == returned,
        "posted {posted} chunks, {returned} came back"
    );
    Ok(())
}

/// rxe0 taken away on this VM (`rdma link delete rxe0`, run in the
/// background: rxe lets it finish only once every user has let go of the
/// device) and added back: by [`back`](Self::back), or, if a test fails
/// first, when dropped (declare it before the verbs objects, so that they
/// are gone by then).
struct Away {
    netdev: String,
    delete: Option<Child>,
    started: bool,
    back: bool,
}

impl Away {
    fn new(side: &Side) -> Away {
        Away {
            netdev: side.netdev.clone(),
            delete: None,
            started: false,
            back: false,
        }
    }

    fn start(&mut self) -> Result<(), Failed> {
        self.delete = Some(
            Command::new("rdma")
                .args(["link", "delete", "rxe0"])
                .spawn()?,
        );
        self.started = true;
        Ok(())
    }

    /// Waits (within the deadline) for the removal to end.
    fn removed(&mut self) -> Result<(), Failed> {
        let Some(delete) = self.delete.as_mut() else {
            return Ok(());
        };
        let mut st = None;
        wait_until(
            "rdma link delete rxe0 (something still holds rxe0?)",
            || {
                st = delete.try_wait()?;
                Ok(st.is_some())
            },
        )?;
        self.delete = None;
        let st = st.ok_or("no exit status")?;
        ensure!(st.success(), "rdma link delete rxe0: {st}");
        Ok(())
    }

    /// Adds rxe0 back and waits for its port.
    fn back(&mut self) -> Result<(), Failed> {
        self.removed()?;
        self.back = true;
        run(Command::new("rdma").args([
            "link",
            "add",
            "rxe0",
            "type",
            "rxe",
            "netdev",
            &self.netdev,
        ]))?;
        rxe0_active()
    }
}

impl Drop for Away {
    fn drop(&mut self) {
        if self.started && !self.back {
            if let Err(e) = self.back() {
                eprintln!("hosts: could not add rxe0 back: {e:?}");
            }
        }
    }
}

/// The CM's timeouts, typed: an address nobody on the link has
/// (`AddrError`, `-ETIMEDOUT`), and a host that answers ARP but whose RDMA
/// is gone (the server removes rxe0 meanwhile): the connect's REQs go
/// unanswered until the CM gives up (`Unreachable`, `-ETIMEDOUT`). The
/// client's QP had 8 receives posted: they come back.
pub fn silent_peer_cm_timeouts_are_typed(side: &Side) -> Result<(), Failed> {
    let mut tcp = tcp(side, 18_640)?;
    if side.server {
        let mut away = Away::new(side);
        away.start()?;
        away.removed()?;
        tcp.write_all(b"SILENT\n")?;
        let done = line(&mut tcp);
        away.back()?;
        ensure!(done? == "DONE", "the client did not finish");
        eprintln!(
            "hosts: silent peer (server): rxe0 removed while the client connected, added back"
        );
        return Ok(());
    }
    // The typed error, and what it is as an io::Error: (typed, message).
    let timed_out = |e: Error, event: &str| {
        let typed = matches!(&e, Error::CmEvent { got, status, .. }
            if *got == event && *status == -libc::ETIMEDOUT);
        let msg = e.to_string();
        (
            typed && std::io::Error::from(e).kind() == std::io::ErrorKind::TimedOut,
            msg,
        )
    };
    // Nobody has 10.77.0.99.
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    let start = Instant::now();
    id.resolve_addr(None, "10.77.0.99:18640".parse()?, Duration::from_secs(1))?;
    let e = ch
        .expect(CmEventKind::AddrResolved, deadline())
        .err()
        .ok_or("10.77.0.99 resolved")?;
    let (typed, e) = timed_out(e, "RDMA_CM_EVENT_ADDR_ERROR");
    ensure!(typed, "resolving nobody's address: {e}");
    let addr_wait = start.elapsed();
    drop((id, ch));
    ensure!(
        line(&mut tcp)? == "SILENT",
        "the server did not remove rxe0"
    );
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    id.resolve_addr(
        None,
        SocketAddr::new(side.peer.parse::<IpAddr>()?, 18_640),
        Duration::from_secs(2),
    )?;
    ch.expect(CmEventKind::AddrResolved, deadline())?;
    id.resolve_route(Duration::from_secs(2))?;
    ch.expect(CmEventKind::RouteResolved, deadline())?;
    let mut rc = Rc::on(id.context()?, |pd, attr| Ok(id.create_qp(pd, attr)?))?;
    rc.post_recvs(8)?;
    let start = Instant::now();
    id.connect(&param())?;
    // The CM resends its REQ until it gives up: 102 s in a quiet run.
    let e = ch
        .expect(CmEventKind::Established, deadline() * 9)
        .err()
        .ok_or("connected to a host without RDMA")?;
    let req_wait = start.elapsed();
    let (typed, e) = timed_out(e, "RDMA_CM_EVENT_UNREACHABLE");
    ensure!(typed, "connecting to a silent host: {e}");
    rc.reset()?;
    tcp.write_all(b"DONE\n")?;
    let what = format!(
        "AddrError -ETIMEDOUT after {addr_wait:.1?}, Unreachable -ETIMEDOUT after {req_wait:.1?} ({e})"
    );
    rc.report(side, "silent peer", &what)
}

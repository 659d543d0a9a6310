//! The connection manager (librdmacm) on the test device: every event kind
//! rxe produces, both ways of handling QPs, the known QP state against
//! `query_qp` after each event, and the checks made before any call.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::qp::{QKey, QpNum, RecvWr, SendOp, SendOpsFlags, SendWr};
use rdma_verbs::{
    AccessFlags, CompletionQueue, Context, Error, ProtectionDomain, QpInitAttr, QpState, QpType,
    QueuePair,
};

use crate::common::{cm_addr, deadline, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    connect_accept_disconnect_with_cm_qps,
    server_disconnects_first,
    reject_with_private_data,
    connect_to_a_port_nobody_listens_on,
    unreachable_address_times_out,
    own_qps_moved_with_init_qp_attr,
    uc_own_qps_on_a_tcp_id,
    ud_connect_and_datagram,
    ud_connect_to_nobody_is_unreachable,
    multicast_join_send_leave,
    checks_before_any_call,
    held_event_keeps_its_id,
    untaken_request_is_rejected,
    non_blocking_reads,
    extended_cm_qps_post_batches,
];

fn t() -> Duration {
    deadline()
}

/// A listener on `ip`, any free port, and that port's address.
pub fn listener(
    ch: &EventChannel,
    ip: IpAddr,
    ps: PortSpace,
) -> Result<(CmId, SocketAddr), Failed> {
    let l = ch.create_id(ps)?;
    l.bind(SocketAddr::new(ip, 0))?;
    l.listen(128)?;
    let addr = l.local_addr().ok_or("listener has no local address")?;
    ensure!(addr.port() != 0, "listener bound to port 0: {addr}");
    Ok((l, addr))
}

/// A client id with address and route resolved to `to`.
pub fn resolved(ch: &EventChannel, to: SocketAddr, ps: PortSpace) -> Result<CmId, Failed> {
    let id = ch.create_id(ps)?;
    id.resolve_addr(None, to, Duration::from_secs(2))?;
    expect_for(ch, CmEventKind::AddrResolved, &id)?;
    id.resolve_route(Duration::from_secs(2))?;
    expect_for(ch, CmEventKind::RouteResolved, &id)?;
    Ok(id)
}

/// A listener on its own channel, and a client id with its route resolved
/// to it on another.
struct Setup {
    sch: EventChannel,
    cch: EventChannel,
    listener: CmId,
    client: CmId,
}

fn setup(env: &Env, ps: PortSpace) -> Result<Setup, Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    let (listener, addr) = listener(&sch, ip, ps)?;
    let client = resolved(&cch, addr, ps)?;
    Ok(Setup {
        sch,
        cch,
        listener,
        client,
    })
}

/// [`setup`], then a client QP and a connect with default parameters, up
/// to the listener's connection request.
fn requested(env: &Env) -> Result<(Setup, Side, CmEvent), Failed> {
    let k = setup(env, PortSpace::Tcp)?;
    let c = cm_qp(&k.client, QpType::Rc)?;
    k.client.connect(&ConnParam::new())?;
    let req = expect_for(&k.sch, CmEventKind::ConnectRequest, &k.listener)?;
    Ok((k, c, req))
}

fn expect_for(ch: &EventChannel, kind: CmEventKind, id: &CmId) -> Result<CmEvent, Failed> {
    let ev = ch.expect(kind, t())?;
    ensure!(ev.is_for(id), "{kind} for another id");
    Ok(ev)
}

/// The QP's known state equals what the device says.
fn state_is(qp: &QueuePair, want: QpState, when: &str) -> Result<(), Failed> {
    let device = qp.query_state()?;
    ensure!(
        qp.state() == want && device == want,
        "{when}: known state {}, device {}, expected {}",
        qp.state(),
        device,
        want
    );
    Ok(())
}

struct Side {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn cm_qp(id: &CmId, t: QpType) -> Result<Side, Failed> {
    cm_qp_ops(id, t, None)
}

/// A CM QP, extended (`rdma_create_qp_ex`) when `ops` is given.
fn cm_qp_ops(id: &CmId, t: QpType, ops: Option<SendOpsFlags>) -> Result<Side, Failed> {
    let ctx = id.context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let attr = QpInitAttr::new(t, &cq, &cq);
    let qp = id.create_qp(
        &pd,
        &match ops {
            Some(ops) => attr.send_ops(ops),
            None => attr,
        },
    )?;
    ensure!(qp.send_ops() == ops, "send_ops {:?}", qp.send_ops());
    Ok(Side { pd, cq, qp })
}

/// A QP of the program's own (not the CM's) on `ctx`.
fn own_qp(ctx: &Context, t: QpType) -> Result<Side, Failed> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq))?;
    Ok(Side { pd, cq, qp })
}

/// Client and server connected through the CM with CM QPs; returns
/// (server channel, client channel, listener, server id, client id, sides).
struct Conn {
    sch: EventChannel,
    cch: EventChannel,
    _listener: CmId,
    server: CmId,
    client: CmId,
    s: Side,
    c: Side,
}

fn connected(env: &Env) -> Result<Conn, Failed> {
    connected_ops(env, None)
}

/// [`connected`], the QPs extended with `ops` if given.
fn connected_ops(env: &Env, ops: Option<SendOpsFlags>) -> Result<Conn, Failed> {
    let Setup {
        sch,
        cch,
        listener,
        client,
    } = setup(env, PortSpace::Tcp)?;
    let c = cm_qp_ops(&client, QpType::Rc, ops)?;
    state_is(&c.qp, QpState::Init, "client QP after rdma_create_qp")?;
    client.connect(
        &ConnParam::new()
            .private_data(b"hello")
            .responder_resources(1)
            .initiator_depth(1),
    )?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &listener)?;
    ensure!(
        req.private_data().starts_with(b"hello"),
        "request private data {:?}",
        req.private_data()
    );
    let info = req
        .conn_info()
        .ok_or("no connection parameters in the request")?;
    ensure!(
        info.qp_num == c.qp.qp_num(),
        "request names QP {:#x}, client has {:#x}",
        info.qp_num,
        c.qp.qp_num()
    );
    let server = req.take_request().ok_or("no new id in the request")?;
    ensure!(
        req.take_request().is_none(),
        "the new id was handed out twice"
    );
    drop(req);
    let s = cm_qp_ops(&server, QpType::Rc, ops)?;
    state_is(&s.qp, QpState::Init, "server QP after rdma_create_qp")?;
    server.accept(&ConnParam::new().responder_resources(1).initiator_depth(1))?;
    state_is(&s.qp, QpState::Rts, "server QP after rdma_accept")?;
    expect_for(&cch, CmEventKind::Established, &client)?;
    state_is(&c.qp, QpState::Rts, "client QP after ESTABLISHED")?;
    expect_for(&sch, CmEventKind::Established, &server)?;
    Ok(Conn {
        sch,
        cch,
        _listener: listener,
        server,
        client,
        s,
        c,
    })
}

/// One message from `from` to `to` through the connection.
fn ping(from: &mut Side, to: &mut Side, msg: &[u8]) -> Result<(), Failed> {
    let mut bufs = from.pd.alloc_chunks(1, 256, AccessFlags::LOCAL_WRITE)?;
    let mut out = bufs.pop().ok_or("no chunk")?;
    out.as_mut_slice()[..msg.len()].copy_from_slice(msg);
    let inb = to.pd.alloc_chunks(1, 256, AccessFlags::LOCAL_WRITE)?;
    to.qp
        .post_recv(inb.into_iter().map(|c| RecvWr::new(1).sge(c)))?;
    from.qp
        .post_send([SendWr::new(2, SendOp::Send).sge_len(out, msg.len())])?;
    let wc = poll_n(&to.cq, 1)?.pop().ok_or("no receive")?;
    ensure!(wc.is_success(), "receive {:?}", wc.status());
    let mut got = Vec::new();
    to.qp.reclaim(&wc, |d| {
        got.extend(
            d.chunks()
                .map(|c| c.as_slice()[..wc.byte_len() as usize].to_vec()),
        )
    });
    ensure!(got == vec![msg.to_vec()], "received {got:?}");
    let wc = poll_n(&from.cq, 1)?.pop().ok_or("no send completion")?;
    ensure!(wc.is_success(), "send {:?}", wc.status());
    from.qp.reclaim(&wc, |d| drop(d.into_chunk()));
    Ok(())
}

fn connect_accept_disconnect_with_cm_qps(env: &Env) -> Result<(), Failed> {
    let mut k = connected(env)?;
    ping(&mut k.c, &mut k.s, b"client to server")?;
    ping(&mut k.s, &mut k.c, b"server to client")?;
    k.client.disconnect()?;
    state_is(&k.c.qp, QpState::Err, "client QP after rdma_disconnect")?;
    expect_for(&k.sch, CmEventKind::Disconnected, &k.server)?;
    k.server.disconnect()?;
    state_is(&k.s.qp, QpState::Err, "server QP after its rdma_disconnect")?;
    expect_for(&k.cch, CmEventKind::Disconnected, &k.client)?;
    // Time-wait ends with an event of its own on rxe: wait for it (it can
    // take the CM's time-wait, a few seconds).
    let ev = k.cch.get_event_timeout(t())?;
    if let Some(ev) = &ev {
        ensure!(
            ev.kind() == CmEventKind::TimewaitExit && ev.is_for(&k.client),
            "after DISCONNECTED: {ev:?}"
        );
    }
    eprintln!(
        "cm: TIMEWAIT_EXIT {}",
        if ev.is_some() { "seen" } else { "not seen" }
    );
    Ok(())
}

fn server_disconnects_first(env: &Env) -> Result<(), Failed> {
    let k = connected(env)?;
    k.server.disconnect()?;
    state_is(&k.s.qp, QpState::Err, "server QP after rdma_disconnect")?;
    expect_for(&k.cch, CmEventKind::Disconnected, &k.client)?;
    // The peer's DREQ does not move the client's QP: the CM leaves that to
    // the program, and the known state says so.
    state_is(&k.c.qp, QpState::Rts, "client QP after DISCONNECTED")?;
    k.client.disconnect()?;
    state_is(&k.c.qp, QpState::Err, "client QP after its rdma_disconnect")?;
    expect_for(&k.sch, CmEventKind::Disconnected, &k.server)?;
    // Drop order: ids before QPs, the reverse of `connected`'s other tests.
    drop(k.server);
    drop(k.client);
    drop(k.s.qp);
    drop(k.c.qp);
    Ok(())
}

fn reject_with_private_data(env: &Env) -> Result<(), Failed> {
    let (k, c, mut req) = requested(env)?;
    let (cch, client) = (&k.cch, &k.client);
    let server = req.take_request().ok_or("no new id")?;
    ensure!(
        matches!(
            server.reject(&[7u8; 149]),
            Err(Error::InvalidArgument { .. })
        ),
        "149 bytes of reject private data accepted"
    );
    server.reject(b"busy, try later")?;
    let ev = cch
        .get_event_timeout(t())?
        .ok_or("no event after the reject")?;
    ensure!(
        ev.kind() == CmEventKind::Rejected && ev.is_for(client),
        "got {ev:?}"
    );
    ensure!(
        ev.private_data().starts_with(b"busy, try later"),
        "reject private data {:?}",
        ev.private_data()
    );
    ensure!(
        ev.status() == 28,
        "reject reason {} (28: consumer reject)",
        ev.status()
    );
    state_is(&c.qp, QpState::Err, "client QP after REJECTED")?;
    Ok(())
}

fn connect_to_a_port_nobody_listens_on(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    // A port that was listened on and is free again.
    let (l, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    l.close()?;
    let client = resolved(&cch, addr, PortSpace::Tcp)?;
    let c = cm_qp(&client, QpType::Rc)?;
    client.connect(&ConnParam::new())?;
    let err = cch.expect(CmEventKind::Established, t()).unwrap_err();
    let Error::CmEvent { got, status, .. } = &err else {
        return Err(format!("expected a CM event error, got {err}").into());
    };
    ensure!(
        *got == "RDMA_CM_EVENT_REJECTED" || *got == "RDMA_CM_EVENT_UNREACHABLE",
        "{err}"
    );
    if *got == "RDMA_CM_EVENT_REJECTED" {
        // The reason is named, and what it means said (reject reason 8).
        ensure!(
            err.to_string().contains("nobody is listening on that port"),
            "{err}"
        );
    }
    eprintln!("cm: connect to {addr} without listener: {err} (status {status})");
    state_is(&c.qp, QpState::Err, "client QP after the failed connect")?;
    Ok(())
}

fn unreachable_address_times_out(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let IpAddr::V4(v4) = ip else {
        return Err("the test needs an IPv4 address".into());
    };
    // A host of the test port's subnet that nobody has: ARP goes unanswered.
    let o = v4.octets();
    let nobody = SocketAddr::new(IpAddr::from([o[0], o[1], o[2], o[3] ^ 0x77]), 7471);
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    id.resolve_addr(None, nobody, Duration::from_millis(500))?;
    let err = ch.expect(CmEventKind::AddrResolved, t()).unwrap_err();
    match &err {
        Error::CmEvent { got, status, .. } => {
            ensure!(*got == "RDMA_CM_EVENT_ADDR_ERROR", "{err}");
            ensure!(*status < 0, "status {status}");
            ensure!(err.errno().is_some(), "no errno in {err}");
        }
        other => return Err(format!("expected ADDR_ERROR, got {other}").into()),
    }
    eprintln!("cm: resolving {nobody}: {err}");
    // Nothing to route to.
    ensure!(
        matches!(
            id.resolve_route(Duration::from_secs(1)),
            Err(Error::InvalidArgument { .. }) | Err(Error::Verb { .. })
        ),
        "route resolution accepted after a failed address resolution"
    );
    Ok(())
}

fn own_qps_moved_with_init_qp_attr(env: &Env) -> Result<(), Failed> {
    let Setup {
        sch,
        cch,
        listener,
        client,
    } = setup(env, PortSpace::Tcp)?;
    let cctx = client.context()?;
    let mut c = own_qp(&cctx, QpType::Rc)?;
    c.qp.modify(&client.init_qp_attr(QpState::Init)?)?;
    state_is(&c.qp, QpState::Init, "own client QP")?;
    // The CM has no RTR attributes before the connection exists.
    ensure!(
        client.connect(&ConnParam::new()).is_err(),
        "connect without a QP accepted"
    );
    client.connect(&ConnParam::new().qp_num(c.qp.qp_num()))?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &listener)?;
    let server = req.take_request().ok_or("no new id")?;
    drop(req);
    let mut s = own_qp(&server.context()?, QpType::Rc)?;
    for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
        let attr = server.init_qp_attr(st)?;
        s.qp.modify(&attr)?;
        state_is(&s.qp, st, "own server QP")?;
    }
    server.accept(&ConnParam::new().qp_num(s.qp.qp_num()))?;
    let ev = expect_for(&cch, CmEventKind::ConnectResponse, &client)?;
    let info = ev.conn_info().ok_or("no parameters in the response")?;
    ensure!(
        info.qp_num == s.qp.qp_num(),
        "response names QP {:#x}",
        info.qp_num
    );
    drop(ev);
    for st in [QpState::Rtr, QpState::Rts] {
        c.qp.modify(&client.init_qp_attr(st)?)?;
        state_is(&c.qp, st, "own client QP")?;
    }
    client.establish()?;
    expect_for(&sch, CmEventKind::Established, &server)?;
    ping(&mut c, &mut s, b"own QPs")?;
    // An id without a CM QP: the CM leaves the QP alone on disconnect.
    client.disconnect()?;
    state_is(&c.qp, QpState::Rts, "own client QP after rdma_disconnect")?;
    expect_for(&sch, CmEventKind::Disconnected, &server)?;
    Ok(())
}

fn uc_own_qps_on_a_tcp_id(env: &Env) -> Result<(), Failed> {
    let Setup {
        sch,
        cch,
        listener,
        client,
    } = setup(env, PortSpace::Tcp)?;
    let mut c = own_qp(&client.context()?, QpType::Uc)?;
    // The CM's RC attributes as they are: the validator names what UC refuses.
    let init = client.init_qp_attr(QpState::Init)?;
    c.qp.modify(&init)?;
    let e = c.qp.modify(&client.init_qp_attr(QpState::Rtr)?);
    ensure!(
        e.is_err(),
        "UC RTR with the CM's RC attributes accepted before connecting"
    );
    client.connect(&ConnParam::new().qp_num(c.qp.qp_num()))?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &listener)?;
    let server = req.take_request().ok_or("no new id")?;
    drop(req);
    let mut s = own_qp(&server.context()?, QpType::Uc)?;
    let rtr = server.init_qp_attr(QpState::Rtr)?;
    s.qp.modify(&server.init_qp_attr_for(&s.qp, QpState::Init)?)?;
    let refused = s.qp.modify(&rtr).unwrap_err().to_string();
    ensure!(
        refused.contains("UC INIT->RTR") && refused.contains("IBV_QP_MAX_DEST_RD_ATOMIC"),
        "{refused}"
    );
    for st in [QpState::Rtr, QpState::Rts] {
        s.qp.modify(&server.init_qp_attr_for(&s.qp, st)?)?;
        state_is(&s.qp, st, "own UC server QP")?;
    }
    server.accept(&ConnParam::new().qp_num(s.qp.qp_num()))?;
    expect_for(&cch, CmEventKind::ConnectResponse, &client)?;
    for st in [QpState::Rtr, QpState::Rts] {
        c.qp.modify(&client.init_qp_attr_for(&c.qp, st)?)?;
        state_is(&c.qp, st, "own UC client QP")?;
    }
    client.establish()?;
    expect_for(&sch, CmEventKind::Established, &server)?;
    ping(&mut c, &mut s, b"UC over the CM")?;
    ping(&mut s, &mut c, b"and back")?;
    Ok(())
}

fn ud_connect_and_datagram(env: &Env) -> Result<(), Failed> {
    let Setup {
        sch,
        cch,
        listener,
        client,
    } = setup(env, PortSpace::Udp)?;
    let mut c = cm_qp(&client, QpType::Ud)?;
    state_is(&c.qp, QpState::Rts, "UD client QP after rdma_create_qp")?;
    ensure!(
        client
            .create_qp(&c.pd, &QpInitAttr::new(QpType::Ud, &c.cq, &c.cq))
            .is_err(),
        "a second QP on one id accepted"
    );
    client.connect(&ConnParam::new().private_data(&[1u8; 180]))?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &listener)?;
    ensure!(
        req.private_data().starts_with(&[1u8; 180]),
        "SIDR private data"
    );
    let peer = req.ud_info().ok_or("no UD parameters in the request")?;
    let server = req.take_request().ok_or("no new id")?;
    drop(req);
    let mut s = cm_qp(&server, QpType::Ud)?;
    server.accept(&ConnParam::new())?;
    let ev = expect_for(&cch, CmEventKind::Established, &client)?;
    let ud = ev.ud_info().ok_or("no UD parameters")?;
    ensure!(
        ud.qp_num == s.qp.qp_num(),
        "peer QP {:#x} != {:#x}",
        ud.qp_num,
        s.qp.qp_num()
    );
    ensure!(ud.qkey == rdma_verbs::cm::UDP_QKEY, "qkey {:#x}", ud.qkey);
    let _ = peer;
    // One datagram client -> server.
    let ah = c.pd.create_ah(&ud.av)?;
    let inb = s.pd.alloc_chunks(1, 256 + 40, AccessFlags::LOCAL_WRITE)?;
    s.qp.post_recv(inb.into_iter().map(|b| RecvWr::new(1).sge(b)))?;
    let mut out =
        c.pd.alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
            .pop()
            .ok_or("no chunk")?;
    out.as_mut_slice()[..8].copy_from_slice(b"datagram");
    c.qp.post_send([SendWr::new(3, SendOp::Send)
        .ud(&ah, ud.qp_num, QKey(ud.qkey))
        .sge_len(out, 8)])?;
    let wc = poll_n(&s.cq, 1)?.pop().ok_or("no receive")?;
    ensure!(wc.is_success() && wc.byte_len() == 48, "receive {wc:?}");
    let mut got = Vec::new();
    s.qp.reclaim(&wc, |d| got.extend(d.chunks()));
    let inbox = got.pop().ok_or("no receive buffer back")?;
    ensure!(
        &inbox.as_slice()[40..48] == b"datagram",
        "got {:?}",
        &inbox.as_slice()[..48]
    );
    let sent = poll_n(&c.cq, 1)?.pop().ok_or("no send completion")?;
    c.qp.reclaim(&sent, |d| drop(d.into_chunk()));
    // The server answers the sender found in the GRH (ibv_init_ah_from_wc),
    // without the CM's help.
    let ctx = server.context()?;
    let short = ctx.reply_av(server.port_num(), &wc, &inbox.as_slice()[..39]);
    ensure!(
        matches!(short, Err(Error::InvalidArgument { .. })),
        "a 39-byte GRH: {short:?}"
    );
    let back =
        s.pd.create_ah_from_wc(server.port_num(), &wc, inbox.as_slice())?;
    let inb = c.pd.alloc_chunks(1, 256 + 40, AccessFlags::LOCAL_WRITE)?;
    c.qp.post_recv(inb.into_iter().map(|b| RecvWr::new(4).sge(b)))?;
    let mut reply = inbox;
    reply.as_mut_slice()[..5].copy_from_slice(b"reply");
    s.qp.post_send([SendWr::new(5, SendOp::Send)
        .ud(&back, wc.src_qp(), QKey(ud.qkey))
        .sge_len(reply, 5)])?;
    let wc = poll_n(&c.cq, 1)?.pop().ok_or("no reply")?;
    ensure!(wc.is_success() && wc.byte_len() == 45, "reply {wc:?}");
    let mut got = Vec::new();
    c.qp.reclaim(&wc, |d| {
        got.extend(d.chunks().map(|c| c.as_slice()[40..45].to_vec()))
    });
    ensure!(got == vec![b"reply".to_vec()], "got {got:?}");
    Ok(())
}

fn ud_connect_to_nobody_is_unreachable(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    // A UDP port that was listened on and is free again.
    let (l, addr) = listener(&sch, ip, PortSpace::Udp)?;
    l.close()?;
    let client = resolved(&cch, addr, PortSpace::Udp)?;
    let c = cm_qp(&client, QpType::Ud)?;
    client.connect(&ConnParam::new())?;
    // The SIDR request finds no service: an UNREACHABLE event whose status
    // is the SIDR reply's status (1: no such service id).
    let err = cch.expect(CmEventKind::Established, t()).unwrap_err();
    match &err {
        Error::CmEvent { got, status, .. } => {
            ensure!(*got == "RDMA_CM_EVENT_UNREACHABLE", "{err}");
            ensure!(*status != 0, "status 0 in {err}");
            let m = err.to_string();
            ensure!(
                m.contains("IB_SIDR_UNSUPPORTED: nobody is listening"),
                "{m}"
            );
        }
        other => return Err(format!("expected UNREACHABLE, got {other}").into()),
    }
    eprintln!("cm: SIDR to {addr} without listener: {err}");
    // A UD QP is not moved by the CM's failure: still RTS.
    state_is(&c.qp, QpState::Rts, "UD client QP after UNREACHABLE")?;
    Ok(())
}

fn multicast_join_send_leave(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let group: SocketAddr = "239.1.2.3:0".parse().unwrap();
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Udp)?;
    id.bind(SocketAddr::new(ip, 0))?;
    let mut side = cm_qp(&id, QpType::Ud)?;
    id.join_multicast(group)?;
    ensure!(id.join_multicast(group).is_err(), "joined {group} twice");
    let ev = expect_for(&ch, CmEventKind::MulticastJoin, &id)?;
    let ud = ev.ud_info().ok_or("no UD parameters in the join")?;
    ensure!(
        ev.private_data().is_empty(),
        "multicast_join_send_leave event shows its context as data"
    );
    // Leaving while the join event is held would hang in librdmacm: refused.
    ensure!(
        matches!(
            id.leave_multicast(group),
            Err(Error::InvalidArgument { .. })
        ),
        "leave accepted while the join event is held"
    );
    drop(ev);
    // The QP is attached: a datagram to the group comes back to it.
    let ah = side.pd.create_ah(&ud.av)?;
    let inb = side
        .pd
        .alloc_chunks(1, 256 + 40, AccessFlags::LOCAL_WRITE)?;
    side.qp
        .post_recv(inb.into_iter().map(|b| RecvWr::new(1).sge(b)))?;
    let mut out = side
        .pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("no chunk")?;
    out.as_mut_slice()[..5].copy_from_slice(b"group");
    side.qp.post_send([SendWr::new(2, SendOp::Send)
        .ud(&ah, ud.qp_num, QKey(ud.qkey))
        .sge_len(out, 5)])?;
    let wcs = poll_n(&side.cq, 2)?;
    ensure!(wcs.iter().all(|w| w.is_success()), "{wcs:?}");
    for wc in &wcs {
        side.qp.reclaim(wc, |d| drop(d.into_chunk()));
    }
    id.leave_multicast(group)?;
    ensure!(id.leave_multicast(group).is_err(), "left {group} twice");
    // A group still joined when the id goes is left by the id's drop (with
    // the QP detached first), before the QP is destroyed.
    let other: SocketAddr = "239.1.2.4:0".parse().unwrap();
    id.join_multicast(other)?;
    drop(expect_for(&ch, CmEventKind::MulticastJoin, &id)?);
    drop(id);
    drop(side);
    Ok(())
}

fn checks_before_any_call(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    let (_listener, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    // An id with no device yet.
    let fresh = cch.create_id(PortSpace::Tcp)?;
    for (what, r) in [
        ("context", fresh.context().map(drop)),
        ("resolve_route", fresh.resolve_route(Duration::from_secs(1))),
        ("connect", fresh.connect(&ConnParam::new())),
    ] {
        ensure!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what} on an unbound id: {r:?}"
        );
    }
    // Options: checked, then set.
    let e = fresh.set_ack_timeout(32);
    ensure!(
        matches!(e, Err(Error::OutOfRange { .. })),
        "ACK timeout 32: {e:?}"
    );
    fresh.set_ack_timeout(14)?;
    fresh.set_tos(32)?;
    fresh.set_reuse_addr(true)?;
    let client = resolved(&cch, addr, PortSpace::Tcp)?;
    // A PD of a context the crate opened itself is not the id's.
    let own_pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(4)?;
    let e = client
        .create_qp(&own_pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))
        .unwrap_err();
    ensure!(e.to_string().contains("CmId::context()"), "{e}");
    // A UD QP on a TCP id.
    let ctx = client.context()?;
    ensure!(
        ctx.name() == env.ctx.name(),
        "the id is on {}, not {}",
        ctx.name(),
        env.ctx.name()
    );
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4)?;
    let e = client
        .create_qp(&pd, &QpInitAttr::new(QpType::Ud, &cq, &cq))
        .unwrap_err();
    ensure!(e.to_string().contains("takes RC QPs"), "{e}");
    let _qp = client.create_qp(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let limit = ctx.attr().max_qp_rd_atom;
    for (what, p) in [
        (
            "57 bytes of private data",
            ConnParam::new().private_data(&[0; 57]),
        ),
        ("retry_count 8", ConnParam::new().retry_count(8)),
        ("rnr_retry_count 9", ConnParam::new().rnr_retry_count(9)),
        (
            "responder_resources above max_qp_rd_atom",
            ConnParam::new().responder_resources((limit + 1).min(254) as u8),
        ),
        (
            "qp_num with a CM QP",
            ConnParam::new().qp_num(QpNum::new(5)?),
        ),
    ] {
        let r = client.connect(&p);
        ensure!(
            matches!(
                r,
                Err(Error::InvalidArgument { .. } | Error::OutOfRange { .. })
            ),
            "{what}: {r:?}"
        );
    }
    // None of them reached the listener.
    ensure!(
        sch.get_event_timeout(Duration::from_millis(300))?.is_none(),
        "a refused connect reached the listener"
    );
    Ok(())
}

fn held_event_keeps_its_id(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    let (l, addr) = listener(&ch, ip, PortSpace::Tcp)?;
    let client = ch.create_id(PortSpace::Tcp)?;
    client.resolve_addr(None, addr, Duration::from_secs(2))?;
    let ev = expect_for(&ch, CmEventKind::AddrResolved, &client)?;
    // close() while its event is held: refused, no hang; the id goes when
    // the event does.
    let key = client.key();
    let e = client.close().unwrap_err();
    ensure!(matches!(e, Error::InUse { users: 1, .. }), "{e}");
    ensure!(ev.id_key() == key, "event of another id");
    drop(ev);
    l.close()?;
    Ok(())
}

fn untaken_request_is_rejected(env: &Env) -> Result<(), Failed> {
    // Everything of `requested` lives to the end (a `..` pattern would drop
    // the client id at once, and its answer with it).
    let (k, c, req) = requested(env)?;
    // Dropped without taking the new id: the kernel rejects.
    drop(req);
    let ev = k
        .cch
        .get_event_timeout(t())?
        .ok_or("no answer to the dropped request")?;
    ensure!(
        matches!(ev.kind(), CmEventKind::Rejected | CmEventKind::Unreachable),
        "after a dropped request: {ev:?}"
    );
    state_is(&c.qp, QpState::Err, "client QP after the reject")?;
    Ok(())
}

fn non_blocking_reads(env: &Env) -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    ensure!(ch.try_get_event()?.is_none(), "an event on a fresh channel");
    let start = std::time::Instant::now();
    ensure!(
        ch.get_event_timeout(Duration::from_millis(200))?.is_none(),
        "an event on a fresh channel"
    );
    ensure!(
        start.elapsed() >= Duration::from_millis(200),
        "the wait returned after {:?}",
        start.elapsed()
    );
    let (_l, addr) = listener(&ch, ip, PortSpace::Tcp)?;
    let id = ch.create_id(PortSpace::Tcp)?;
    id.resolve_addr(None, addr, Duration::from_secs(2))?;
    // poll(2) on the channel's descriptor says when the event is there.
    let mut pfd = libc::pollfd {
        fd: ch.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(t().as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for an open descriptor.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    ensure!(n == 1, "poll returned {n}");
    let ev = ch.try_get_event()?.ok_or("poll said readable, no event")?;
    ensure!(ev.kind() == CmEventKind::AddrResolved, "{ev:?}");
    Ok(())
}

/// Extended CM QPs (`rdma_create_qp_ex` with send_ops): the CM moves them
/// as it moves basic ones, and they post through `ibv_wr_*` batches and
/// `post_send` alike. An operation RC cannot post is refused before any
/// call, leaving the id without a QP.
fn extended_cm_qps_post_batches(env: &Env) -> Result<(), Failed> {
    // Refused before any call: TSO (not offered) on a TCP id's RC QP, and
    // an RDMA read on a UDP id's UD QP.
    let k = setup(env, PortSpace::Tcp)?;
    let ctx = k.client.context()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(8)?);
    let bad = QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(SendOpsFlags::TSO);
    let e = k
        .client
        .create_qp(&pd, &bad)
        .err()
        .ok_or("TSO send_ops accepted")?;
    ensure!(
        matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("rdma_create_qp_ex"),
        "{e}"
    );
    let ud = ch_ud_refusal(env)?;
    ensure!(ud.contains("UD QPs cannot post"), "{ud}");
    drop(k);

    let ops = SendOpsFlags::SEND | SendOpsFlags::SEND_WITH_IMM;
    let mut k = connected_ops(env, Some(ops))?;
    // A batch of two sends, client to server.
    let inb = k.s.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    k.s.qp
        .post_recv(inb.into_iter().map(|c| RecvWr::new(1).sge(c)))?;
    let mut out = k.c.pd.alloc_chunks(2, 64, AccessFlags::LOCAL_WRITE)?;
    out[0].as_mut_slice()[..5].copy_from_slice(b"first");
    out[1].as_mut_slice()[..6].copy_from_slice(b"second");
    let (b, a) = (out.pop().ok_or("chunk")?, out.pop().ok_or("chunk")?);
    let mut batch = k.c.qp.start_batch()?;
    batch.post(SendWr::new(10, SendOp::Send).sge_len(a, 5).unsignaled())?;
    batch.post(SendWr::new(11, SendOp::SendWithImm(0x1234)).sge_len(b, 6))?;
    batch.complete()?;
    let wcs = poll_n(&k.s.cq, 2)?;
    let mut got = Vec::new();
    for wc in &wcs {
        ensure!(wc.is_success(), "receive {:?}", wc.status());
        let len = wc.byte_len() as usize;
        let imm = wc.imm_data();
        k.s.qp.reclaim(wc, |d| {
            got.extend(d.chunks().map(|c| (c.as_slice()[..len].to_vec(), imm)))
        });
    }
    ensure!(
        got == vec![
            (b"first".to_vec(), None),
            (b"second".to_vec(), Some(0x1234))
        ],
        "received {got:?}"
    );
    let wc = poll_n(&k.c.cq, 1)?.pop().ok_or("no send completion")?;
    let mut ids = Vec::new();
    k.c.qp.reclaim(&wc, |d| ids.push(d.wr_id));
    ensure!(ids == [10, 11], "the batch's completion ended {ids:?}");
    // The basic path on the same QPs, both ways.
    ping(&mut k.s, &mut k.c, b"server to client")?;
    ping(&mut k.c, &mut k.s, b"client to server")?;
    k.client.disconnect()?;
    state_is(
        &k.c.qp,
        QpState::Err,
        "extended client QP after rdma_disconnect",
    )?;
    expect_for(&k.sch, CmEventKind::Disconnected, &k.server)?;
    Ok(())
}

/// The refusal of an RDMA read on a UDP id's extended QP.
fn ch_ud_refusal(env: &Env) -> Result<String, Failed> {
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Udp)?;
    id.bind(SocketAddr::new(cm_addr(env)?, 0))?;
    let ctx = id.context()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(8)?);
    let attr = QpInitAttr::new(QpType::Ud, &cq, &cq).send_ops(SendOpsFlags::RDMA_READ);
    let e = id
        .create_qp(&pd, &attr)
        .err()
        .ok_or("RDMA_READ on UD accepted")?;
    // The refusal left the id without a QP: a basic one can follow.
    let qp = id.create_qp(&pd, &QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    ensure!(qp.send_ops().is_none(), "a basic QP with send_ops");
    Ok(e.to_string())
}

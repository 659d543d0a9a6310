//! The connection manager (librdmacm) on the test device: every event kind
//! rxe produces, both ways of handling QPs, the known QP state against
//! `query_qp` after each event, and the checks made before any call.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::qp::{QpNum, RecvWr, SendOp, SendOpsFlags, SendWr};
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
    checks_before_any_call,
    held_event_keeps_its_id,
    untaken_request_is_rejected,
    non_blocking_reads,
];

pub(crate) fn t() -> Duration {
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
pub(crate) struct Setup {
    pub(crate) sch: EventChannel,
    pub(crate) cch: EventChannel,
    pub(crate) listener: CmId,
    pub(crate) client: CmId,
}

pub(crate) fn setup(env: &Env, ps: PortSpace) -> Result<Setup, Failed> {
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

pub(crate) fn expect_for(
    ch: &EventChannel,
    kind: CmEventKind,
    id: &CmId,
) -> Result<CmEvent, Failed> {
    let ev = ch.expect(kind, t())?;
    ensure!(ev.is_for(id), "{kind} for another id");
    Ok(ev)
}

/// The QP's known state equals what the device says.
pub(crate) fn state_is(qp: &QueuePair, want: QpState, when: &str) -> Result<(), Failed> {
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

pub(crate) struct Side {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
}

pub(crate) fn cm_qp(id: &CmId, t: QpType) -> Result<Side, Failed> {
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
pub(crate) fn own_qp(ctx: &Context, t: QpType) -> Result<Side, Failed> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq))?;
    Ok(Side { pd, cq, qp })
}

/// Client and server connected through the CM with CM QPs; returns
/// (server channel, client channel, listener, server id, client id, sides).
pub(crate) struct Conn {
    pub(crate) sch: EventChannel,
    pub(crate) cch: EventChannel,
    pub(crate) _listener: CmId,
    pub(crate) server: CmId,
    pub(crate) client: CmId,
    pub(crate) s: Side,
    pub(crate) c: Side,
}

fn connected(env: &Env) -> Result<Conn, Failed> {
    connected_ops(env, None)
}

/// [`connected`], the QPs extended with `ops` if given.
pub(crate) fn connected_ops(env: &Env, ops: Option<SendOpsFlags>) -> Result<Conn, Failed> {
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
pub(crate) fn ping(from: &mut Side, to: &mut Side, msg: &[u8]) -> Result<(), Failed> {
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

/// The refusal of an RDMA read on a UDP id's extended QP.
pub(crate) fn ch_ud_refusal(env: &Env) -> Result<String, Failed> {
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

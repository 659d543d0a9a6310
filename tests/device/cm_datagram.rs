//! The connection manager for datagrams, against the real device: UD ids
//! (`RDMA_PS_UDP`) resolving and sending to a peer, a peer nobody answers
//! for, and a multicast group joined, sent to and left (connected ids are
//! `cm.rs`'s).

use super::cm::{cm_qp, expect_for, listener, resolved, setup, state_is, t, Setup};
use crate::common::{cm_addr, poll_n, Env, Test};
use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, ConnParam, EventChannel, PortSpace};
use rdma_verbs::qp::{QKey, RecvWr, SendOp, SendWr};
use rdma_verbs::{AccessFlags, Error, QpInitAttr, QpState, QpType};
use std::net::SocketAddr;

pub const TESTS: &[Test] = tests![
    ud_connect_and_datagram,
    ud_connect_to_nobody_is_unreachable,
    multicast_join_send_leave,
];

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

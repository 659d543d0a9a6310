//! QPs of the program's own on a CM id: moved with `rdma_init_qp_attr`'s
//! attributes through the validated `modify`, a UC QP on a TCP id, and
//! extended QPs made on an id posting batches (the CM's own QPs are
//! `cm.rs`'s).

use super::cm::{ch_ud_refusal, connected_ops, expect_for, own_qp, ping, setup, state_is, Setup};
use crate::common::{poll_n, Env, Test};
use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, ConnParam, PortSpace};
use rdma_verbs::qp::{RecvWr, SendOp, SendOpsFlags, SendWr};
use rdma_verbs::{AccessFlags, Error, QpInitAttr, QpState, QpType};

pub const TESTS: &[Test] = tests![
    own_qps_moved_with_init_qp_attr,
    uc_own_qps_on_a_tcp_id,
    extended_cm_qps_post_batches,
];

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

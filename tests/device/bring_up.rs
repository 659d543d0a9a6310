//! UD and RAW_PACKET bring-up without a peer: `QueuePair::bring_up_ud`,
//! `bring_up_raw_packet`, and `bring_up` on `Qp<Ud>`.

use libtest_mimic::Failed;
use rdma_verbs::qp::{
    AddressVector, GlobalRoute, ModifyError, Psn, QKey, Qp, RecvWr, SendOp, SendWr, Ud,
};
use rdma_verbs::{AccessFlags, Error, QpCaps, QpInitAttr, QpState, QpType, WorkCompletion};

use crate::common::{deadline, Env, Test};

pub const TESTS: &[Test] = tests![
    ud_reaches_rts_with_its_attributes,
    refused_on_other_types_and_states,
    datagram_between_brought_up_qps_names_its_sender,
];

fn ud_reaches_rts_with_its_attributes(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let psn = Psn::new(0x12_3456)?;
    let qkey = QKey(0x4242_4242);

    let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    qp.bring_up_ud(env.port, qkey, psn)?;
    ensure!(qp.state() == QpState::Rts, "known state {:?}", qp.state());
    let (a, _) = qp.query()?;
    ensure!(
        a.state == QpState::Rts
            && a.qkey == qkey
            && a.port_num == env.port
            && a.pkey_index == 0
            && a.sq_psn == psn,
        "attributes read back {a:?}"
    );

    // The typed path: the same three steps through Qp::apply.
    let mut ud = Qp::<Ud>::new(&pd, &cq, &cq, QpCaps::default())?;
    ud.bring_up(env.port, QKey::PINGPONG, Psn::new(7)?)?;
    let (a, _) = ud.query()?;
    ensure!(
        a.state == QpState::Rts && a.qkey == QKey::PINGPONG && a.sq_psn == Psn::new(7)?,
        "typed attributes {a:?}"
    );
    // A second bring-up is refused by the typed path's from-state check.
    match ud.bring_up(env.port, QKey::PINGPONG, Psn::new(7)?) {
        Err(Error::Modify(ModifyError::UnexpectedState { known, .. })) => {
            ensure!(known == QpState::Rts, "known {known:?}")
        }
        other => return Err(format!("typed bring-up from RTS: {other:?}").into()),
    }
    Ok(())
}

fn refused_on_other_types_and_states(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    for t in [QpType::Rc, QpType::Uc] {
        let mut qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq))?;
        match qp.bring_up_ud(env.port, QKey::PINGPONG, Psn::new(1)?) {
            Err(e @ Error::WrongQpType { .. }) => {
                let want = format!(
                    "QueuePair::bring_up_ud takes UD QPs; this QP is {}",
                    t.short_name()
                );
                ensure!(e.to_string() == want, "message {e}");
            }
            other => return Err(format!("bring_up_ud on {t:?}: {other:?}").into()),
        }
        ensure!(
            matches!(
                qp.bring_up_raw_packet(env.port),
                Err(Error::WrongQpType {
                    takes: "RAW_PACKET",
                    ..
                })
            ),
            "bring_up_raw_packet on {t:?} accepted"
        );
        // Nothing reached the device.
        ensure!(
            qp.query_state()? == QpState::Reset,
            "{t:?} left RESET after a refusal"
        );
    }

    let mut ud = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    ensure!(
        matches!(
            ud.bring_up_raw_packet(env.port),
            Err(Error::WrongQpType {
                qp_type: QpType::Ud,
                ..
            })
        ),
        "bring_up_raw_packet on UD accepted"
    );
    // A port the device does not have: refused by modify's checks, before
    // the first step reaches the device.
    let bad_port = env.ctx.ports().end().saturating_add(1);
    ensure!(
        ud.bring_up_ud(bad_port, QKey::PINGPONG, Psn::new(1)?)
            .is_err(),
        "port {bad_port} accepted"
    );
    ensure!(ud.query_state()? == QpState::Reset, "left RESET");
    // Up once, then a second time: refused, as the QP is not in RESET.
    ud.bring_up_ud(env.port, QKey::PINGPONG, Psn::new(1)?)?;
    match ud.bring_up_ud(env.port, QKey::PINGPONG, Psn::new(1)?) {
        Err(e @ Error::Modify(ModifyError::UnexpectedState { .. })) => ensure!(
            e.to_string()
                == "QueuePair::bring_up_ud starts from RESET but the QP is known to be in RTS",
            "message {e}"
        ),
        other => return Err(format!("second bring-up: {other:?}").into()),
    }
    // After RESET it comes up again.
    ud.reset()?;
    ud.bring_up_ud(env.port, QKey::PINGPONG, Psn::new(2)?)?;
    ensure!(ud.query_state()? == QpState::Rts, "not RTS after a reset");
    Ok(())
}

/// Two UD QPs brought up on their own exchange a datagram; the receive's
/// `src_qp` is the sender's [`QpNum`].
fn datagram_between_brought_up_qps_names_its_sender(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let qkey = QKey(0x0bad_cafe);
    let mut tx = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    let mut rx = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    tx.bring_up_ud(env.port, qkey, Psn::new(10)?)?;
    rx.bring_up_ud(env.port, qkey, Psn::new(20)?)?;

    let port = env.ctx.query_port(env.port)?;
    let mut av = AddressVector::new(env.port).dlid(port.lid);
    if port.grh_required() {
        let (gid, index) = crate::common::port_gid(env)?;
        av = av.global(GlobalRoute::new(gid, index));
    }
    let ah = pd.create_ah(&av)?;
    let mut inbox = pd.alloc_chunks(1, 40 + 64, AccessFlags::LOCAL_WRITE)?;
    rx.post_recv([RecvWr::new(1).sge(inbox.pop().ok_or("no chunk")?)])?;
    let rx_num = rx.qp_num();
    tx.post_send([SendWr::new(2, SendOp::Send)
        .inline(b"hello")
        .ud(&ah, rx_num, qkey)])?;

    let end = std::time::Instant::now() + deadline();
    let mut wcs = [WorkCompletion::default(); 4];
    let (mut sent, mut got) = (false, false);
    while !(sent && got) {
        ensure!(std::time::Instant::now() < end, "no completions in time");
        for wc in cq.poll(&mut wcs)? {
            ensure!(wc.is_success(), "{wc:?}");
            if wc.qp_num() == rx.qp_num() {
                ensure!(
                    wc.src_qp() == tx.qp_num(),
                    "src_qp {}, sender {:#x}",
                    wc.src_qp(),
                    tx.qp_num()
                );
                got = true;
                rx.reclaim(wc, drop);
            } else {
                sent = true;
                tx.reclaim(wc, drop);
            }
        }
    }
    Ok(())
}

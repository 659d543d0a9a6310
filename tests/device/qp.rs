//! Queue pair creation and query.

use libtest_mimic::Failed;
use rdma_verbs::{Context, Error, QpCaps, QpInitAttr, QpState, QpType, QueuePair};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    create_rc_uc_ud_in_reset,
    caps_are_at_least_what_was_asked,
    caps_beyond_device_limits,
    cq_of_another_context,
    separate_send_and_recv_cqs,
    raw_packet,
    xrc_needs_create_qp_ex,
    children_keep_parents_alive,
];

fn create_rc_uc_ud_in_reset(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let mut nums = Vec::new();
    for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for sig_all in [false, true] {
            let qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq).sq_sig_all(sig_all))?;
            ensure!(qp.qp_type() == t, "type {:?}", qp.qp_type());
            ensure!(qp.qp_num().get() != 0, "QP number 0");
            ensure!(
                !nums.contains(&qp.qp_num()),
                "QP number {} reused",
                qp.qp_num()
            );
            nums.push(qp.qp_num());
            let (attr, init) = qp.query()?;
            ensure!(
                attr.state == QpState::Reset,
                "{t:?} new QP is {:?}",
                attr.state
            );
            ensure!(qp.query_state()? == QpState::Reset, "query_state");
            ensure!(init.qp_type == t, "init qp_type {:?}", init.qp_type);
            ensure!(
                init.sq_sig_all == sig_all,
                "{t:?} sq_sig_all {} != {sig_all}",
                init.sq_sig_all
            );
            ensure!(
                init.cap.max_send_wr >= 16 && init.cap.max_recv_wr >= 16,
                "init caps {:?}",
                init.cap
            );
        }
    }
    Ok(())
}

fn caps_are_at_least_what_was_asked(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(256)?;
    let asked = QpCaps {
        max_send_wr: 100,
        max_recv_wr: 50,
        max_send_sge: 2,
        max_recv_sge: 3,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(asked))?;
    let got = qp.caps();
    ensure!(
        got.max_send_wr >= 100
            && got.max_recv_wr >= 50
            && got.max_send_sge >= 2
            && got.max_recv_sge >= 3
            && got.max_inline_data >= 64,
        "asked {asked:?}, got {got:?}"
    );
    Ok(())
}

fn caps_beyond_device_limits(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let dev = env.ctx.attr();
    let cases = [
        (
            "max_send_wr",
            QpCaps {
                max_send_wr: dev.max_qp_wr + 1,
                ..QpCaps::default()
            },
        ),
        (
            "max_recv_wr",
            QpCaps {
                max_recv_wr: dev.max_qp_wr + 1,
                ..QpCaps::default()
            },
        ),
        (
            "max_send_sge",
            QpCaps {
                max_send_sge: dev.max_sge + 1,
                ..QpCaps::default()
            },
        ),
        (
            "max_recv_sge",
            QpCaps {
                max_recv_sge: dev.max_sge + 1,
                ..QpCaps::default()
            },
        ),
    ];
    for (field, caps) in cases {
        match pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps)) {
            Err(Error::InvalidArgument {
                verb: "ibv_create_qp",
                reason,
            }) => {
                ensure!(reason.contains(field), "{field}: reason {reason}")
            }
            other => return Err(format!("{field}: expected InvalidArgument, got {other:?}").into()),
        }
    }
    Ok(())
}

fn cq_of_another_context(env: &Env) -> Result<(), Failed> {
    let other = Context::open(env.ctx.name())?;
    let pd = env.ctx.alloc_pd()?;
    let ours = env.ctx.create_cq(16)?;
    let theirs = other.create_cq(16)?;
    match pd.create_qp(&QpInitAttr::new(QpType::Rc, &ours, &theirs)) {
        Err(Error::InvalidArgument { reason, .. }) => {
            ensure!(reason.contains("recv_cq"), "reason {reason}")
        }
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    Ok(())
}

fn separate_send_and_recv_cqs(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let scq = env.ctx.create_cq(16)?;
    let rcq = env.ctx.create_cq(16)?;
    let qp = QueuePair::new(&pd, &QpInitAttr::new(QpType::Ud, &scq, &rcq))?;
    ensure!(qp.query_state()? == QpState::Reset, "not RESET");
    drop((scq, rcq, pd));
    ensure!(
        qp.query_state()? == QpState::Reset,
        "QP broken after dropping its parents' handles"
    );
    Ok(())
}

fn raw_packet(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    match pd.create_qp(&QpInitAttr::new(QpType::RawPacket, &cq, &cq)) {
        Err(e @ Error::Unsupported { .. }) => {
            let msg = e.to_string();
            ensure!(msg.contains("RAW_PACKET"), "message {msg}");
            ensure!(msg.contains(env.ctx.name()), "message {msg}");
            eprintln!("raw_packet: {msg}");
        }
        Ok(qp) => {
            // Devices with raw Ethernet support (mlx5 with CAP_NET_RAW).
            ensure!(
                !env.ctx.name().starts_with("rxe"),
                "rxe created a RAW_PACKET QP"
            );
            ensure!(qp.query_state()? == QpState::Reset, "raw QP not in RESET");
        }
        Err(e) => {
            ensure!(
                e.errno() == Some(libc::EPERM) && !env.ctx.name().starts_with("rxe"),
                "unexpected error {e}"
            );
        }
    }
    Ok(())
}

fn xrc_needs_create_qp_ex(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    for t in [QpType::XrcSend, QpType::XrcRecv, QpType::Driver] {
        ensure!(
            matches!(
                pd.create_qp(&QpInitAttr::new(t, &cq, &cq)),
                Err(Error::InvalidArgument {
                    verb: "ibv_create_qp",
                    ..
                })
            ),
            "{t:?} not refused"
        );
    }
    Ok(())
}

fn children_keep_parents_alive(env: &Env) -> Result<(), Failed> {
    // Every handle but the QP's own is dropped first, context included.
    let ctx = Context::open(env.ctx.name())?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    drop(ctx);
    drop(pd);
    drop(cq);
    ensure!(qp.query_state()? == QpState::Reset, "QP unusable");
    let mr = qp
        .pd()
        .register(4096, rdma_verbs::AccessFlags::LOCAL_WRITE)?;
    ensure!(mr.len() == 4096, "MR from the QP's PD");
    qp.close()?;
    drop(mr);
    Ok(())
}

//! `ibv_modify_qp` through the validator, the typed builders and the raw
//! path, against the real kernel.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, CompletionQueue, Error, Mtu, ProtectionDomain, QpInitAttr};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    typed_chains_with_exactly_the_required_attributes,
    each_missing_required_attribute_is_refused_twice,
    kernel_refusal_changes_nothing,
    sqd_round_trips,
    err_and_reset_recovery,
    resync_sees_changes_behind_our_back,
    connect_helper_and_endpoints,
    typed_apply_checks_the_from_state,
    leaving_sqd_while_draining_is_refused_until_drained,
];

pub(crate) struct Setup {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    /// GID index for the GRH (RoCE), and the GID behind it.
    pub(crate) gid_index: u8,
    pub(crate) gid: rdma_verbs::Gid,
    pub(crate) mtu: Mtu,
}

pub(crate) fn setup(env: &Env) -> Result<Setup, Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let opts = ConnectOptions::default();
    // Let the connect helper's choice of GID serve every test.
    let probe = pd.create_qp(&QpInitAttr::new(rdma_verbs::QpType::Ud, &cq, &cq))?;
    let ep = probe.local_endpoint(&opts, Psn::new(0)?)?;
    let table = env.ctx.gid_table()?;
    let gid_index = table
        .iter()
        .find(|e| e.gid == ep.gid && e.port == u32::from(env.port))
        .map(|e| e.index as u8)
        .unwrap_or(0);
    let mtu = env.ctx.query_port(env.port)?.active_mtu;
    Ok(Setup {
        pd,
        cq,
        gid_index,
        gid: ep.gid,
        mtu,
    })
}

pub(crate) fn av(env: &Env, s: &Setup) -> AddressVector {
    AddressVector::new(env.port).global(GlobalRoute::new(s.gid, s.gid_index))
}

pub(crate) fn state_of(qp: &QueuePair) -> Result<QpState, Failed> {
    Ok(qp.query_state()?)
}

/// RC/UC/UD through RESET->INIT->RTR->RTS with exactly the constructor
/// arguments, reading every attribute back.
fn typed_chains_with_exactly_the_required_attributes(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let psn = Psn::new(0x12_3456)?;
    let rq_psn = Psn::new(0x65_4321)?;

    // UD
    let mut ud = Qp::<Ud>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    ud.apply(ResetToInit::<Ud>::new(0, env.port, QKey(0x1111_1111)))?;
    let (a, _) = ud.query()?;
    ensure!(a.state == QpState::Init, "UD INIT: {:?}", a.state);
    ensure!(
        a.qkey == QKey(0x1111_1111) && a.port_num == env.port && a.pkey_index == 0,
        "UD INIT attrs {a:?}"
    );
    ud.apply(InitToRtr::<Ud>::new())?;
    ensure!(state_of(&ud)? == QpState::Rtr, "UD RTR");
    ud.apply(RtrToRts::<Ud>::new(psn))?;
    let (a, _) = ud.query()?;
    ensure!(
        a.state == QpState::Rts && a.sq_psn == psn,
        "UD RTS attrs {a:?}"
    );
    ensure!(ud.state() == QpState::Rts, "known state {:?}", ud.state());

    // UC, connected to itself.
    let mut uc = Qp::<Uc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let me = uc.qp_num();
    uc.apply(ResetToInit::<Uc>::new(
        0,
        env.port,
        AccessFlags::REMOTE_WRITE,
    ))?;
    let (a, _) = uc.query()?;
    ensure!(
        a.state == QpState::Init && a.access == AccessFlags::REMOTE_WRITE,
        "UC INIT attrs {a:?}"
    );
    uc.apply(InitToRtr::<Uc>::new(av(env, &s), s.mtu, me, rq_psn))?;
    let (a, _) = uc.query()?;
    ensure!(a.state == QpState::Rtr, "UC RTR: {:?}", a.state);
    ensure!(
        a.path_mtu == Some(s.mtu) && a.dest_qp_num == me && a.rq_psn == rq_psn,
        "UC RTR attrs {a:?}"
    );
    let grh = a.av.grh().ok_or("UC AV reads back without a GRH")?;
    ensure!(
        grh.dgid() == s.gid && grh.sgid_index() == s.gid_index,
        "UC AV {:?}",
        a.av
    );
    uc.apply(RtrToRts::<Uc>::new(psn))?;
    let (a, _) = uc.query()?;
    ensure!(
        a.state == QpState::Rts && a.sq_psn == psn,
        "UC RTS attrs {a:?}"
    );

    // RC, connected to itself.
    let mut rc = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let me = rc.qp_num();
    let access = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    rc.apply(ResetToInit::<Rc>::new(0, env.port, access))?;
    ensure!(rc.query()?.0.access == access, "RC access");
    let mrt = MinRnrTimer::new(12)?;
    rc.apply(InitToRtr::<Rc>::new(av(env, &s), s.mtu, me, rq_psn, 4, mrt))?;
    let (a, _) = rc.query()?;
    ensure!(a.state == QpState::Rtr, "RC RTR: {:?}", a.state);
    ensure!(
        a.path_mtu == Some(s.mtu)
            && a.dest_qp_num == me
            && a.rq_psn == rq_psn
            && a.min_rnr_timer == mrt,
        "RC RTR attrs {a:?}"
    );
    ensure!(
        a.max_dest_rd_atomic == 4,
        "RC max_dest_rd_atomic {}",
        a.max_dest_rd_atomic
    );
    let (t, r) = (AckTimeout::new(14)?, RetryCount::new(6)?);
    rc.apply(RtrToRts::<Rc>::new(t, r, RnrRetry::new(5)?, psn, 2))?;
    let (a, _) = rc.query()?;
    ensure!(a.state == QpState::Rts, "RC RTS: {:?}", a.state);
    ensure!(
        a.timeout == t
            && a.retry_cnt == r
            && a.rnr_retry.get() == 5
            && a.sq_psn == psn
            && a.max_rd_atomic == 2,
        "RC RTS attrs {a:?}"
    );
    Ok(())
}

type Step = (QpAttrMask, fn(QpAttr, &Ctx) -> QpAttr);

struct Ctx {
    port: u8,
    av: AddressVector,
    mtu: Mtu,
    qpn: QpNum,
}

fn steps(t: rdma_verbs::QpType) -> Vec<(QpState, Vec<Step>)> {
    use QpAttrMask as M;
    let init_common: Vec<Step> = vec![
        (M::PKEY_INDEX, |a, _| a.pkey_index(0)),
        (M::PORT, |a, c| a.port(c.port)),
    ];
    let psn: fn(QpAttr, &Ctx) -> QpAttr = |a, _| a.sq_psn(Psn::new(1).unwrap());
    match t {
        rdma_verbs::QpType::Ud => vec![
            (
                QpState::Init,
                [init_common, vec![(M::QKEY, |a, _| a.qkey(QKey(7)))]].concat(),
            ),
            (QpState::Rtr, vec![]),
            (QpState::Rts, vec![(M::SQ_PSN, psn)]),
        ],
        _ => {
            let init = [
                init_common,
                vec![(M::ACCESS_FLAGS, |a: QpAttr, _: &Ctx| {
                    a.access_flags(AccessFlags::empty())
                })],
            ]
            .concat();
            let mut rtr: Vec<Step> = vec![
                (M::AV, |a, c| a.av(c.av)),
                (M::PATH_MTU, |a, c| a.path_mtu(c.mtu)),
                (M::DEST_QPN, |a, c| a.dest_qpn(c.qpn)),
                (M::RQ_PSN, |a, _| a.rq_psn(Psn::new(2).unwrap())),
            ];
            let mut rts: Vec<Step> = vec![(M::SQ_PSN, psn)];
            if t == rdma_verbs::QpType::Rc {
                rtr.push((M::MAX_DEST_RD_ATOMIC, |a, _| a.max_dest_rd_atomic(1)));
                rtr.push((M::MIN_RNR_TIMER, |a, _| {
                    a.min_rnr_timer(MinRnrTimer::new(12).unwrap())
                }));
                rts.push((M::TIMEOUT, |a, _| a.timeout(AckTimeout::new(14).unwrap())));
                rts.push((M::RETRY_CNT, |a, _| {
                    a.retry_cnt(RetryCount::new(7).unwrap())
                }));
                rts.push((M::RNR_RETRY, |a, _| a.rnr_retry(RnrRetry::INFINITE)));
                rts.push((M::MAX_QP_RD_ATOMIC, |a, _| a.max_rd_atomic(1)));
            }
            vec![
                (QpState::Init, init),
                (QpState::Rtr, rtr),
                (QpState::Rts, rts),
            ]
        }
    }
}

/// For every step of every chain and every required attribute: leaving it
/// out is refused by the validator (no call: the error is `Error::Modify`,
/// and the QP has not moved), and the kernel refuses it too when forced
/// through `modify_unchecked`. Then the full step succeeds with exactly the
/// required attributes.
fn each_missing_required_attribute_is_refused_twice(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let mut cases = 0;
    for t in [
        rdma_verbs::QpType::Ud,
        rdma_verbs::QpType::Uc,
        rdma_verbs::QpType::Rc,
    ] {
        let mut qp = s.pd.create_qp(&QpInitAttr::new(t, &s.cq, &s.cq))?;
        let c = Ctx {
            port: env.port,
            av: av(env, &s),
            mtu: s.mtu,
            qpn: qp.qp_num(),
        };
        for (to, required) in steps(t) {
            let from = qp.state();
            let rule = transition_rule(t, from, to).ok_or("no rule")?;
            let full_mask: QpAttrMask = required
                .iter()
                .map(|r| r.0)
                .fold(QpAttrMask::empty(), |a, b| a | b);
            ensure!(
                full_mask == rule.required,
                "{t:?} {from:?}->{to:?}: test steps {full_mask} != table {}",
                rule.required
            );
            for skip in 0..required.len() {
                let attr = required
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != skip)
                    .fold(QpAttr::new().state(to), |a, (_, (_, f))| f(a, &c));
                let left_out = required[skip].0;
                match qp.modify(&attr) {
                    Err(Error::Modify(ModifyError::Attributes {
                        missing, forbidden, ..
                    })) => {
                        ensure!(
                            missing == left_out && forbidden.is_empty(),
                            "{t:?} {from:?}->{to:?} without {left_out}: missing {missing}"
                        )
                    }
                    other => {
                        return Err(format!(
                            "{t:?} {from:?}->{to:?} without {left_out}: validator gave {other:?}"
                        )
                        .into())
                    }
                }
                ensure!(
                    qp.state() == from && state_of(&qp)? == from,
                    "moved after a validator refusal"
                );
                match qp.modify_unchecked(&attr) {
                    Err(Error::Verb {
                        verb: "ibv_modify_qp",
                        errno,
                    }) => {
                        ensure!(
                            errno == libc::EINVAL,
                            "{t:?} {from:?}->{to:?} without {left_out}: errno {errno}"
                        )
                    }
                    other => {
                        return Err(format!(
                            "{t:?} {from:?}->{to:?} without {left_out}: kernel gave {other:?}"
                        )
                        .into())
                    }
                }
                ensure!(
                    qp.state() == from && state_of(&qp)? == from,
                    "moved after a kernel refusal"
                );
                cases += 1;
            }
            let full = required
                .iter()
                .fold(QpAttr::new().state(to), |a, (_, f)| f(a, &c));
            qp.modify(&full)?;
            ensure!(state_of(&qp)? == to, "{t:?} did not reach {to:?}");
        }
    }
    ensure!(cases == 26, "{cases} cases (UD 4 + UC 8 + RC 14 expected)");
    eprintln!(
        "modify: {cases} left-out required attributes refused by the validator and by the kernel"
    );
    Ok(())
}

/// A modify the kernel refuses (an AV naming an unused GID table entry,
/// which the validator refuses first, sent unchecked) changes neither the
/// QP nor its known state.
fn kernel_refusal_changes_nothing(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let unused = crate::common::empty_gid_index(env, 256)? as u8;
    let mut qp = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    qp.apply(ResetToInit::<Rc>::new(0, env.port, AccessFlags::empty()))?;
    let before = qp.query()?.0;
    let bad_av = AddressVector::new(env.port).global(GlobalRoute::new(s.gid, unused));
    let me = qp.qp_num();
    let rtr =
        InitToRtr::<Rc>::new(bad_av, s.mtu, me, Psn::new(5)?, 1, MinRnrTimer::new(12)?).into_attr();
    // The validator refuses the empty entry itself now ...
    match qp.modify(&rtr) {
        Err(Error::Modify(ModifyError::Value { reason, .. })) if reason.contains("empty") => {}
        other => {
            return Err(format!("validator: expected an empty-GID refusal, got {other:?}").into())
        }
    }
    // ... and the kernel, asked directly, refuses it too (ENODATA).
    match qp.modify_unchecked(&rtr) {
        Err(Error::Verb {
            verb: "ibv_modify_qp",
            errno,
        }) => eprintln!("modify: kernel refused sgid_index {unused} with errno {errno}"),
        other => return Err(format!("expected a kernel refusal, got {other:?}").into()),
    }
    let after = qp.query()?.0;
    ensure!(qp.state() == QpState::Init, "known state {:?}", qp.state());
    ensure!(
        after == before,
        "attributes changed:\nbefore {before:?}\nafter  {after:?}"
    );
    Ok(())
}

/// Brings an RC QP connected to itself to RTS.
fn rc_at_rts(env: &Env, s: &Setup) -> Result<Qp<Rc>, Failed> {
    let mut qp = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let me = qp.local_endpoint(
        &ConnectOptions {
            port: env.port,
            gid_index: Some(s.gid_index),
            ..Default::default()
        },
        Psn::new(9)?,
    )?;
    qp.connect(
        &ConnectOptions {
            port: env.port,
            gid_index: Some(s.gid_index),
            ..Default::default()
        },
        Psn::new(9)?,
        &me,
    )?;
    ensure!(qp.state() == QpState::Rts, "not RTS");
    Ok(qp)
}

/// SQD->RTS once the send queue has drained.
fn sqd_to_rts<T: Transport>(qp: &mut Qp<T>) -> Result<(), Failed>
where
    SqdToRts<T>: Modify<T> + Default,
{
    qp.wait_sq_drained(crate::common::deadline())?;
    Ok(qp.apply(SqdToRts::<T>::default())?)
}

fn sqd_round_trips(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let mut rc = rc_at_rts(env, &s)?;
    rc.enter_sqd(
        RtsToSqd::<Rc>::new().en_sqd_async_notify(false),
        crate::common::deadline(),
    )?;
    ensure!(state_of(&rc)? == QpState::Sqd, "RC not SQD");
    let t = AckTimeout::new(18)?;
    rc.apply(
        SqdToSqd::<Rc>::new()
            .timeout(t)
            .retry_cnt(RetryCount::new(3)?),
    )?;
    let (a, _) = rc.query()?;
    ensure!(
        a.state == QpState::Sqd && a.timeout == t && a.retry_cnt.get() == 3,
        "RC SQD->SQD attrs {a:?}"
    );
    sqd_to_rts(&mut rc)?;
    ensure!(state_of(&rc)? == QpState::Rts, "RC not back in RTS");

    let mut ud = Qp::<Ud>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let ud_ep = ud.local_endpoint(&ConnectOptions::default(), Psn::new(1)?)?;
    ud.connect(&ConnectOptions::default(), Psn::new(1)?, &ud_ep)?;
    ud.enter_sqd(RtsToSqd::<Ud>::new(), crate::common::deadline())?;
    ud.apply(SqdToSqd::<Ud>::new().qkey(QKey(0x4242)))?;
    ensure!(
        ud.query()?.0.qkey == QKey(0x4242),
        "UD qkey not changed in SQD"
    );
    sqd_to_rts(&mut ud)?;
    ensure!(state_of(&ud)? == QpState::Rts, "UD not back in RTS");
    Ok(())
}

fn err_and_reset_recovery(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let mut rc = rc_at_rts(env, &s)?;
    rc.apply(ToErr::new())?;
    ensure!(state_of(&rc)? == QpState::Err, "not ERR");
    rc.apply(ToErr::new())?; // ERR->ERR is legal
    rc.apply(ToReset::new())?;
    ensure!(state_of(&rc)? == QpState::Reset, "not RESET");
    ensure!(rc.port().is_none(), "port kept after RESET");
    // and all the way up again
    let opts = ConnectOptions {
        port: env.port,
        gid_index: Some(s.gid_index),
        ..Default::default()
    };
    let me = rc.local_endpoint(&opts, Psn::new(3)?)?;
    rc.connect(&opts, Psn::new(3)?, &me)?;
    ensure!(state_of(&rc)? == QpState::Rts, "not RTS again");
    // RESET->ERR is not a transition: go through INIT.
    rc.apply(ToReset::new())?;
    match rc.apply(ToErr::new()) {
        Err(Error::Modify(ModifyError::IllegalTransition { .. })) => {}
        other => return Err(format!("RESET->ERR: {other:?}").into()),
    }
    Ok(())
}

fn resync_sees_changes_behind_our_back(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let mut rc = rc_at_rts(env, &s)?;
    let mut attr = rdma_verbs::sys::ibv_qp_attr {
        qp_state: rdma_verbs::sys::ibv_qp_state::IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the QP is live; a plain state change through the raw API,
    // standing in for the device moving the QP on its own.
    let rc_code = unsafe {
        rdma_verbs::sys::ibv_modify_qp(
            rc.as_raw(),
            &mut attr,
            rdma_verbs::sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
        )
    };
    ensure!(rc_code == 0, "raw modify failed: {rc_code}");
    ensure!(rc.state() == QpState::Rts, "known state moved by itself");
    // The validator judges from the stale state: RTS->SQD is legal from RTS...
    ensure!(rc.resync()? == QpState::Err, "resync did not see ERR");
    ensure!(rc.state() == QpState::Err, "known state not updated");
    // ... and from ERR it is not.
    ensure!(
        matches!(rc.apply(RtsToSqd::<Rc>::new()), Err(Error::Modify(_))),
        "RTS->SQD accepted from ERR"
    );
    Ok(())
}

/// An RC QP connected to itself, at RTR with `max_dest_rd_atomic`.
pub(crate) fn rc_at_rtr(env: &Env, s: &Setup, max_dest_rd_atomic: u8) -> Result<Qp<Rc>, Failed> {
    let mut rc = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    rc.apply(ResetToInit::<Rc>::new(0, env.port, AccessFlags::empty()))?;
    let me = rc.qp_num();
    rc.apply(InitToRtr::<Rc>::new(
        av(env, s),
        s.mtu,
        me,
        Psn::new(0)?,
        max_dest_rd_atomic,
        MinRnrTimer::new(12)?,
    ))?;
    Ok(rc)
}

/// Two RC QPs connected to each other with the one-call helper, exchanging
/// endpoints in the pingpong text form.
fn connect_helper_and_endpoints(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    for t in [
        rdma_verbs::QpType::Rc,
        rdma_verbs::QpType::Uc,
        rdma_verbs::QpType::Ud,
    ] {
        let mut a = s.pd.create_qp(&QpInitAttr::new(t, &s.cq, &s.cq))?;
        let mut b = s.pd.create_qp(&QpInitAttr::new(t, &s.cq, &s.cq))?;
        let opts = ConnectOptions {
            port: env.port,
            ..Default::default()
        };
        let (pa, pb) = (Psn::new(0x111)?, Psn::new(0x222)?);
        let wire_a = a.local_endpoint(&opts, pa)?.to_wire();
        let wire_b = b.local_endpoint(&opts, pb)?.to_wire();
        let (ea, eb) = (Endpoint::from_wire(&wire_a)?, Endpoint::from_wire(&wire_b)?);
        ensure!(ea.qpn == a.qp_num() && ea.psn == pa, "endpoint {ea}");
        if env.ctx.query_port(env.port)?.grh_required() {
            ensure!(!ea.gid.is_zero(), "no GID chosen on a GRH port");
        }
        a.connect(&opts, pa, &eb)?;
        b.connect(&opts, pb, &ea)?;
        for (qp, peer, rq) in [(&a, &b, pb), (&b, &a, pa)] {
            let (attr, _) = qp.query()?;
            ensure!(attr.state == QpState::Rts, "{t:?} not RTS");
            if t != rdma_verbs::QpType::Ud {
                ensure!(
                    attr.dest_qp_num == peer.qp_num() && attr.rq_psn == rq,
                    "{t:?} connected wrong: {attr:?}"
                );
                ensure!(
                    attr.path_mtu == Some(s.mtu),
                    "{t:?} path MTU {:?}",
                    attr.path_mtu
                );
            }
        }
        ensure!(
            matches!(
                a.connect(&opts, pa, &eb),
                Err(Error::InvalidArgument { .. })
            ),
            "connect from RTS accepted"
        );
    }
    Ok(())
}

/// `Qp::apply` refuses a builder whose from-state is not the known state,
/// and (the table part skipped) an `IBV_QP_CUR_STATE` naming another state;
/// `from_dynamic` refuses the wrong transport.
fn typed_apply_checks_the_from_state(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let mut ud = Qp::<Ud>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    match ud.apply(RtrToRts::<Ud>::new(Psn::new(0)?)) {
        Err(e @ Error::Modify(ModifyError::UnexpectedState { .. })) => {
            ensure!(
                e.to_string() == "RtrToRts starts from RTR but the QP is known to be in RESET",
                "{e}"
            )
        }
        other => return Err(format!("{other:?}").into()),
    }
    let dynamic = ud.into_dynamic();
    let (back, e) = match Qp::<Rc>::from_dynamic(dynamic) {
        Err(pair) => pair,
        Ok(_) => return Err("a UD QP became a Qp<Rc>".into()),
    };
    ensure!(e.to_string().contains("UD, not RC"), "{e}");
    let mut ud = Qp::<Ud>::from_dynamic(back).map_err(|(_, e)| e)?;
    ensure!(ud.state() == QpState::Reset, "state");
    // The typed path skips the table, not IBV_QP_CUR_STATE: one that names
    // another state than the known one is refused, and nothing changes.
    ud.apply(ResetToInit::<Ud>::new(0, env.port, QKey(0x1111)))?;
    ud.apply(InitToRtr::<Ud>::new())?;
    let lying = RtrToRts::<Ud>::new(Psn::new(0)?).cur_state(QpState::Init);
    match ud.apply(lying) {
        Err(Error::Modify(ModifyError::CurStateMismatch { known, given })) => ensure!(
            known == QpState::Rtr && given == QpState::Init,
            "{known:?} {given:?}"
        ),
        other => return Err(format!("a lying cur_state: {other:?}").into()),
    }
    ensure!(
        state_of(&ud)? == QpState::Rtr,
        "the refused modify moved the QP"
    );
    ud.apply(RtrToRts::<Ud>::new(Psn::new(0)?).cur_state(QpState::Rtr))?;
    ensure!(state_of(&ud)? == QpState::Rts, "not in RTS");
    Ok(())
}

/// An RC QP whose peer does not answer yet keeps its send queue draining
/// in SQD (rxe sends at most a window of packets unacknowledged, so a 1 MB
/// write stays partly unsent): every move out of SQD but to ERR is refused
/// by the crate with a typed error (and by the kernel with EINVAL), and
/// `wait_sq_drained` times out; once the peer comes up and answers a
/// retransmission, the drain ends, the wait returns and SQD->RTS goes
/// through.
fn leaving_sqd_while_draining_is_refused_until_drained(env: &Env) -> Result<(), Failed> {
    use std::time::{Duration, Instant};
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let mut a = pd.create_qp(&QpInitAttr::new(rdma_verbs::QpType::Rc, &cq, &cq))?;
    let mut b = pd.create_qp(&QpInitAttr::new(rdma_verbs::QpType::Rc, &cq, &cq))?;
    let region = pd.register(
        1 << 20,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let src = pd
        .alloc_chunks(1, 1 << 20, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("no chunk")?;
    let o = ConnectOptions {
        port: env.port,
        access: AccessFlags::REMOTE_WRITE,
        // About 4.3 s to the first retransmission, 7 of them. rxe counts the
        // queue drained once it rewinds the message for its retry (the
        // rewound message is "posted" again, and SQD starts nothing new):
        // the checks below, which take milliseconds, must come before that
        // even on a busy machine.
        timeout: AckTimeout::new(20)?,
        ..Default::default()
    };
    let (ea, eb) = (
        a.local_endpoint(&o, Psn::new(1)?)?,
        b.local_endpoint(&o, Psn::new(2)?)?,
    );
    a.connect(&o, ea.psn, &eb)?; // b stays in RESET: it drops a's packets
    let remote = RemoteAddr {
        addr: region.addr(),
        rkey: region.rkey(),
    };
    a.post_send([SendWr::new(1, SendOp::RdmaWrite(remote)).sge(src)])?;
    // rxe on newer kernels sends from a work queue, not within
    // ibv_post_send: a message not yet started when SQD arrives is not
    // part of the drain, which then ends at once (seen on 7.2). Go to SQD
    // once the first packets are out: the send PSN has moved.
    let start = Instant::now();
    while a.query()?.0.sq_psn == ea.psn {
        ensure!(
            start.elapsed() < crate::common::deadline(),
            "the write did not start"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    a.modify(&QpAttr::new().state(QpState::Sqd))?;
    ensure!(a.query()?.0.sq_draining, "the send queue is not draining");
    for to in [QpState::Rts, QpState::Sqd, QpState::Reset] {
        match a.modify(&QpAttr::new().state(to)) {
            Err(Error::Modify(e @ ModifyError::SqDraining { .. })) => {
                let text = e.to_string();
                let head = format!(
                    "RC SQD->{} refused: the send queue is still draining",
                    to.short_name()
                );
                ensure!(
                    text.starts_with(&head) && text.contains("wait_sq_drained"),
                    "message: {text}"
                );
            }
            other => return Err(format!("SQD->{to:?} while draining: {other:?}").into()),
        }
    }
    // The kernel agrees (rxe: EINVAL), and nothing moved.
    match a.modify_unchecked(&QpAttr::new().state(QpState::Rts)) {
        Err(Error::Verb { errno, .. }) => {
            eprintln!("modify: the kernel refused SQD->RTS while draining with errno {errno}")
        }
        other => return Err(format!("kernel SQD->RTS while draining: {other:?}").into()),
    }
    ensure!(state_of(&a)? == QpState::Sqd, "the QP left SQD");
    match a.wait_sq_drained(Duration::from_millis(200)) {
        Err(Error::Timeout { .. }) => {}
        other => return Err(format!("wait while the peer is down: {other:?}").into()),
    }
    // b comes up; a's next retransmission timeout ends the drain (rxe
    // rewinds the message and, in SQD, sends it again only after RTS).
    b.connect(&o, eb.psn, &ea)?;
    let start = Instant::now();
    a.wait_sq_drained(crate::common::deadline())?;
    eprintln!(
        "modify: the drain ended {:?} after the peer came up",
        start.elapsed()
    );
    a.modify(&QpAttr::new().state(QpState::Rts))?;
    ensure!(state_of(&a)? == QpState::Rts, "not back in RTS");
    // rxe leaves the requester idle after SQD->RTS until the next post
    // rings the doorbell: a second, small write does.
    let kick = pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .ok_or("no chunk")?;
    a.post_send([SendWr::new(2, SendOp::RdmaWrite(remote)).sge(kick)])?;
    let wc = match crate::common::poll_n(&cq, 2) {
        Ok(w) if w.iter().all(|c| c.is_success()) => w[1],
        Ok(w) => return Err(format!("writes failed: {w:?}").into()),
        Err(e) => {
            let (qa, qb) = (a.query()?.0, b.query()?.0);
            return Err(format!(
                "{e:?}; a: {:?} sq_psn {:?} draining {}; b: {:?} rq_psn {:?}",
                qa.state, qa.sq_psn, qa.sq_draining, qb.state, qb.rq_psn
            )
            .into());
        }
    };
    ensure!(wc.is_success(), "{wc:?}");
    ensure!(
        a.reclaim(&wc, |_| ()) == 2,
        "the writes' chunks did not come back"
    );
    // Waiting outside SQD is refused.
    ensure!(
        matches!(
            a.wait_sq_drained(Duration::ZERO),
            Err(Error::InvalidArgument { .. })
        ),
        "wait_sq_drained accepted a QP in RTS"
    );
    Ok(())
}

//! The values `QueuePair::modify` checks before `ibv_modify_qp` (ports,
//! table indexes, MTU, rd_atomic limits, GIDs), and the words of its
//! refusals, against the real kernel (the transitions are `modify.rs`'s).

use super::modify::{av, rc_at_rtr, setup, state_of};
use crate::common::{Env, Test};
use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Error};

pub const TESTS: &[Test] = tests![
    value_checks_against_device_and_port,
    rd_atomic_rounding_on_rxe,
    gid_entries_must_exist_and_fit_the_destination,
    refusal_messages,
];

/// Ports, table indexes, MTU and the GRH on RoCE, checked against the
/// device and the port before the call.
fn value_checks_against_device_and_port(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let port = env.ctx.query_port(env.port)?;
    let dev = env.ctx.attr().clone();
    let value_err = |r: rdma_verbs::Result<()>,
                     flag: QpAttrMask,
                     what: &str|
     -> Result<(), Failed> {
        match r {
            Err(Error::Modify(ModifyError::Value { attr, reason, .. })) if attr == flag => {
                eprintln!("modify: {what}: {reason}");
                Ok(())
            }
            other => Err(format!("{what}: expected a {flag} value error, got {other:?}").into()),
        }
    };
    let mut rc = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let beyond = *env.ctx.ports().end() + 1;
    value_err(
        rc.apply(ResetToInit::<Rc>::new(0, beyond, AccessFlags::empty())),
        QpAttrMask::PORT,
        "missing port",
    )?;
    value_err(
        rc.apply(ResetToInit::<Rc>::new(
            port.pkey_tbl_len,
            env.port,
            AccessFlags::empty(),
        )),
        QpAttrMask::PKEY_INDEX,
        "P_Key index past the table",
    )?;
    ensure!(rc.state() == QpState::Reset, "moved");
    rc.apply(ResetToInit::<Rc>::new(0, env.port, AccessFlags::empty()))?;
    let me = rc.qp_num();
    let mrt = MinRnrTimer::new(12)?;
    if port.grh_required() {
        value_err(
            rc.apply(InitToRtr::<Rc>::new(
                AddressVector::new(env.port),
                s.mtu,
                me,
                Psn::new(0)?,
                1,
                mrt,
            )),
            QpAttrMask::AV,
            "AV without GRH on a GRH port",
        )?;
    }
    if port.gid_tbl_len <= 255 {
        let bad =
            AddressVector::new(env.port).global(GlobalRoute::new(s.gid, port.gid_tbl_len as u8));
        value_err(
            rc.apply(InitToRtr::<Rc>::new(bad, s.mtu, me, Psn::new(0)?, 1, mrt)),
            QpAttrMask::AV,
            "sgid_index past the table",
        )?;
    }
    if dev.max_qp_rd_atom < 255 {
        let n = (dev.max_qp_rd_atom + 1) as u8;
        value_err(
            rc.apply(InitToRtr::<Rc>::new(
                av(env, &s),
                s.mtu,
                me,
                Psn::new(0)?,
                n,
                mrt,
            )),
            QpAttrMask::MAX_DEST_RD_ATOMIC,
            "max_dest_rd_atomic above the device limit",
        )?;
    }
    let alt = AltPath {
        av: av(env, &s),
        pkey_index: 0,
        port: env.port,
        timeout: AckTimeout::new(14)?,
    };
    if port.is_roce() {
        value_err(
            rc.apply(
                InitToRtr::<Rc>::new(av(env, &s), s.mtu, me, Psn::new(0)?, 1, mrt).alt_path(alt),
            ),
            QpAttrMask::ALT_PATH,
            "alternate path on RoCE",
        )?;
    }
    if !dev
        .capabilities
        .contains(rdma_verbs::DeviceCapFlags::RESIZE_MAX_WR)
    {
        // Two reasons: the device cannot resize, and no INIT->INIT rule
        // takes CAP; both are reported.
        match rc.modify(&QpAttr::new().cap(QpCaps::default())) {
            Err(Error::Modify(ModifyError::Several(all))) => {
                ensure!(
                    matches!(&all[..], [ModifyError::Value { attr, .. }, ModifyError::AttributeOnly { .. }] if *attr == QpAttrMask::CAP),
                    "CAP without RESIZE_MAX_WR: {all:?}"
                );
            }
            other => return Err(format!("CAP without RESIZE_MAX_WR: {other:?}").into()),
        }
    }
    ensure!(
        rc.state() == QpState::Init && state_of(&rc)? == QpState::Init,
        "moved"
    );
    if dev.max_qp_init_rd_atom < 255 {
        rc.apply(InitToRtr::<Rc>::new(
            av(env, &s),
            s.mtu,
            me,
            Psn::new(0)?,
            1,
            mrt,
        ))?;
        let n = (dev.max_qp_init_rd_atom + 1) as u8;
        value_err(
            rc.apply(RtrToRts::<Rc>::new(
                AckTimeout::new(14)?,
                RetryCount::new(7)?,
                RnrRetry::INFINITE,
                Psn::new(0)?,
                n,
            )),
            QpAttrMask::MAX_QP_RD_ATOMIC,
            "max_rd_atomic above the device limit",
        )?;
    }
    Ok(())
}

/// rxe rounds rd_atomic counts up to a power of two (documented on
/// `QpAttributes`): 12 reads back as 16.
fn rd_atomic_rounding_on_rxe(env: &Env) -> Result<(), Failed> {
    if !env.ctx.name().starts_with("rxe") {
        eprintln!(
            "modify: rd_atomic rounding is an rxe behaviour; {} checked for >= only",
            env.ctx.name()
        );
    }
    let s = setup(env)?;
    let mut rc = rc_at_rtr(env, &s, 12)?;
    rc.apply(RtrToRts::<Rc>::new(
        AckTimeout::new(14)?,
        RetryCount::new(7)?,
        RnrRetry::INFINITE,
        Psn::new(0)?,
        12,
    ))?;
    let (a, _) = rc.query()?;
    ensure!(a.max_dest_rd_atomic >= 12 && a.max_rd_atomic >= 12, "{a:?}");
    if env.ctx.name().starts_with("rxe") {
        ensure!(
            a.max_dest_rd_atomic == 16 && a.max_rd_atomic == 16,
            "rxe read back {} / {}",
            a.max_rd_atomic,
            a.max_dest_rd_atomic
        );
    }
    Ok(())
}

/// The source GID of a GRH must be a used entry (the kernel: ENODATA) and,
/// for RoCE v2, of the destination's family (the kernel: EINVAL). Each is
/// refused by the validator with a message naming the index, and the
/// kernel, asked directly, refuses the same modify.
fn gid_entries_must_exist_and_fit_the_destination(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let table: Vec<rdma_verbs::GidEntry> = env
        .ctx
        .gid_table()?
        .into_iter()
        .filter(|e| e.port == u32::from(env.port))
        .collect();
    let refused_both = |sgid: u8, dgid: rdma_verbs::Gid, needle: &str| -> Result<String, Failed> {
        let mut qp = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
        qp.apply(ResetToInit::<Rc>::new(0, env.port, AccessFlags::empty()))?;
        let me = qp.qp_num();
        let av = AddressVector::new(env.port).global(GlobalRoute::new(dgid, sgid));
        let rtr =
            InitToRtr::<Rc>::new(av, s.mtu, me, Psn::new(1)?, 1, MinRnrTimer::new(12)?).into_attr();
        let text = match qp.modify(&rtr) {
            Err(Error::Modify(e @ ModifyError::Value { .. })) => e.to_string(),
            other => return Err(format!("sgid {sgid} -> {dgid}: validator gave {other:?}").into()),
        };
        ensure!(
            text.contains(&format!("sgid_index {sgid}")) && text.contains(needle),
            "message lacks the index or {needle:?}: {text}"
        );
        match qp.modify_unchecked(&rtr) {
            Err(Error::Verb { errno, .. }) => {
                eprintln!("modify: {text}\n        (the kernel: errno {errno})")
            }
            other => {
                return Err(format!(
                    "the kernel accepted what the validator refused: {other:?} ({text})"
                )
                .into())
            }
        }
        ensure!(qp.state() == QpState::Init, "moved");
        Ok(text)
    };
    // An empty entry.
    let empty = crate::common::empty_gid_index(env, 256)? as u8;
    refused_both(empty, s.gid, "empty")?;
    // A RoCE v2 IPv6 source with an IPv4-mapped destination, and the reverse.
    let v2 = |v4: bool| {
        table.iter().find(|e| {
            e.gid_type == Some(rdma_verbs::GidType::RoceV2)
                && e.gid.as_ipv6().to_ipv4_mapped().is_some() == v4
        })
    };
    match (v2(false), v2(true)) {
        (Some(v6), Some(v4)) => {
            refused_both(v6.index as u8, v4.gid, "IPv4 dgid")?;
            refused_both(v4.index as u8, v6.gid, "IPv6 dgid")?;
        }
        _ => eprintln!(
            "modify: {} has no RoCE v2 GIDs of both families; family check not exercised",
            env.ctx.name()
        ),
    }
    Ok(())
}

/// The messages of the refusals `modify` makes (a missing attribute, a
/// forbidden one, a bad value), on a real device.
fn refusal_messages(env: &Env) -> Result<(), Failed> {
    let s = setup(env)?;
    let text = |r: rdma_verbs::Result<()>| -> Result<String, Failed> {
        match r {
            Err(e @ Error::Modify(_)) => Ok(e.to_string()),
            other => Err(format!("expected a refusal, got {other:?}").into()),
        }
    };
    let mut rc = rc_at_rtr(env, &s, 1)?;
    // An empty mask in RTR: an attribute-only modify the kernel refuses.
    let t = text(rc.modify(&QpAttr::new()))?;
    ensure!(
        t == "RC attribute-only modify in RTR (no IBV_QP_STATE) is refused by the kernel whatever \
              it carries: there is no RTR->RTR rule for RC; set IBV_QP_STATE to change state",
        "{t}"
    );
    // The kernel: 6.1's and 6.12's rxe refuse it too; 7.2's rxe no longer
    // checks an attribute-only modify against the table and takes it, and
    // then it must have changed nothing.
    match rc.modify_unchecked(&QpAttr::new()) {
        Err(Error::Verb { .. }) => {}
        Ok(()) => {
            let st = rc.query_state()?;
            ensure!(st == QpState::Rtr, "an empty mask moved the QP to {st:?}");
        }
        Err(e) => return Err(format!("an empty mask in RTR: {e}").into()),
    }
    // CAP on a device that cannot resize, together with a missing
    // attribute: both reasons.
    if !env
        .ctx
        .attr()
        .capabilities
        .contains(rdma_verbs::DeviceCapFlags::RESIZE_MAX_WR)
    {
        let t = text(rc.modify(&QpAttr::new().state(QpState::Rts).cap(QpCaps::default())))?;
        ensure!(
            t.contains("IBV_DEVICE_RESIZE_MAX_WR") && t.contains("; and RC RTR->RTS is missing"),
            "not every reason: {t}"
        );
    }
    // CUR_STATE that is not the known state: the message names resync().
    let t = text(
        rc.modify(
            &QpAttr::new()
                .state(QpState::Rts)
                .cur_state(QpState::Init)
                .sq_psn(Psn::new(0)?),
        ),
    )?;
    ensure!(t.contains("QueuePair::resync()"), "{t}");
    // A P_Key index past the table, counted right.
    let len = env.ctx.query_port(env.port)?.pkey_tbl_len;
    let mut fresh = Qp::<Rc>::new(&s.pd, &s.cq, &s.cq, QpCaps::default())?;
    let t = text(fresh.apply(ResetToInit::<Rc>::new(len, env.port, AccessFlags::empty())))?;
    let want = if len == 1 {
        "table of 1 entry".to_owned()
    } else {
        format!("table of {len} entries")
    };
    ensure!(t.contains(&want), "{t}");
    Ok(())
}

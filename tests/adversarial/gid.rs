//! An empty (unused) entry of a port's GID
//! table. `query_gid` used to return `Ok(::)` for it and `local_endpoint`
//! with such a `gid_index` announced a zero GID; both must be errors that
//! name the index and the port.

use libtest_mimic::Failed;
use rdma_verbs::qp::{ConnectOptions, Psn};
use rdma_verbs::{Error, QpInitAttr, QpState, QpType};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    query_gid_of_an_empty_entry_is_an_error,
    local_endpoint_with_an_empty_gid_index_fails,
];

/// Checks that `result` is the empty-entry error of `verb` for `index`.
fn is_empty_entry_error<T: std::fmt::Debug>(
    env: &Env,
    what: &str,
    result: Result<T, Error>,
    verb: &str,
    index: u32,
) -> Result<(), Failed> {
    match result {
        Err(Error::InvalidArgument { verb: v, reason }) => {
            ensure!(v == verb, "{what}: verb {v}, expected {verb}");
            ensure!(
                reason.contains(&format!("GID index {index} "))
                    && reason.contains(&format!("port {}", env.port))
                    && reason.contains("empty"),
                "{what}: reason does not name GID index {index}, port {} and the empty entry: {reason}",
                env.port
            );
            Ok(())
        }
        other => Err(format!(
            "{what}: GID index {index} of port {} is empty, expected InvalidArgument, got {other:?}",
            env.port
        )
        .into()),
    }
}

fn query_gid_of_an_empty_entry_is_an_error(env: &Env) -> Result<(), Failed> {
    let index = crate::common::empty_gid_index(env, u32::MAX)?;
    is_empty_entry_error(
        env,
        "query_gid",
        env.ctx.query_gid(env.port, index),
        "ibv_query_gid",
        index,
    )?;
    is_empty_entry_error(
        env,
        "query_gid_entry",
        env.ctx.query_gid_entry(env.port, index),
        "ibv_query_gid_ex",
        index,
    )?;
    // The used entries still read back, and none of them is zero.
    for e in env.ctx.gid_table()? {
        if e.port == u32::from(env.port) {
            let gid = env.ctx.query_gid(env.port, e.index)?;
            ensure!(
                gid == e.gid && !gid.is_zero(),
                "GID[{}]: query_gid {gid}, table {}",
                e.index,
                e.gid
            );
        }
    }
    Ok(())
}

fn local_endpoint_with_an_empty_gid_index_fails(env: &Env) -> Result<(), Failed> {
    // ConnectOptions::gid_index is a u8.
    let index = crate::common::empty_gid_index(env, 256)?;
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    for t in [QpType::Rc, QpType::Uc] {
        let mut qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq))?;
        let bad = ConnectOptions {
            port: env.port,
            gid_index: Some(index as u8),
            ..Default::default()
        };
        is_empty_entry_error(
            env,
            "local_endpoint",
            qp.local_endpoint(&bad, Psn::new(1)?),
            "ibv_query_gid",
            index,
        )?;
        // The same options with the default GID choice give a real endpoint...
        let good = ConnectOptions {
            gid_index: None,
            ..bad
        };
        let me = qp.local_endpoint(&good, Psn::new(1)?)?;
        let grh = env.ctx.query_port(env.port)?.grh_required();
        ensure!(
            !grh || !me.gid.is_zero(),
            "{t:?}: the default GID choice gave a zero GID on a port that needs a GRH"
        );
        // ...and connecting with the empty index is refused before the QP
        // leaves RESET.
        is_empty_entry_error(
            env,
            "connect",
            qp.connect(&bad, Psn::new(1)?, &me),
            "ibv_query_gid",
            index,
        )?;
        ensure!(
            qp.state() == QpState::Reset && qp.query_state()? == QpState::Reset,
            "{t:?}: a refused connect moved the QP to {:?}",
            qp.query_state()?
        );
    }
    Ok(())
}

//! Devices, contexts, device/port/GID queries.

use libtest_mimic::Failed;
use rdma_verbs::{
    Context, DeviceList, Error, GidType, LinkLayer, NodeType, PortState, TransportType,
};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    open_by_name_and_first,
    device_list_describes_the_device,
    query_device,
    query_port,
    invalid_port_is_refused,
    gid_table,
    gid_index_out_of_range,
    pkey,
    close_reports_in_use,
];

fn open_by_name_and_first(env: &Env) -> Result<(), Failed> {
    let name = env.ctx.name();
    let again = Context::open(name)?;
    ensure!(
        again.name() == name,
        "opened {} asking for {name}",
        again.name()
    );
    let first = Context::open_first()?;
    ensure!(!first.name().is_empty(), "first device has no name");
    match Context::open("no-such-rdma-device") {
        Err(Error::DeviceNotFound(n)) => ensure!(n == "no-such-rdma-device", "wrong name {n}"),
        other => return Err(format!("expected DeviceNotFound, got {other:?}").into()),
    }
    Ok(())
}

fn device_list_describes_the_device(env: &Env) -> Result<(), Failed> {
    let list = DeviceList::new()?;
    ensure!(
        !list.is_empty(),
        "device list is empty although {} is open",
        env.ctx.name()
    );
    let dev = list.find(env.ctx.name())?;
    ensure!(
        dev.node_type() == NodeType::Ca,
        "node type {:?}",
        dev.node_type()
    );
    ensure!(
        dev.transport_type() == TransportType::Ib,
        "transport {:?}",
        dev.transport_type()
    );
    ensure!(
        dev.node_guid() == env.ctx.attr().node_guid,
        "device list GUID {} != device attr GUID {}",
        dev.node_guid(),
        env.ctx.attr().node_guid
    );
    ensure!(dev.index().is_some(), "no kernel index");
    // A context opened from the list outlives the list.
    let ctx = dev.open()?;
    drop(list);
    ctx.query_port(env.port)?;
    Ok(())
}

fn query_device(env: &Env) -> Result<(), Failed> {
    let a = env.ctx.query_device()?;
    ensure!(
        &a == env.ctx.attr(),
        "fresh query differs from the cached one"
    );
    ensure!(a.phys_port_cnt >= 1, "phys_port_cnt {}", a.phys_port_cnt);
    ensure!(
        a.max_qp > 0 && a.max_qp_wr > 0,
        "max_qp {} max_qp_wr {}",
        a.max_qp,
        a.max_qp_wr
    );
    ensure!(
        a.max_cq > 0 && a.max_cqe > 0,
        "max_cq {} max_cqe {}",
        a.max_cq,
        a.max_cqe
    );
    ensure!(
        a.max_pd > 0 && a.max_mr > 0,
        "max_pd {} max_mr {}",
        a.max_pd,
        a.max_mr
    );
    ensure!(a.max_sge > 0, "max_sge {}", a.max_sge);
    ensure!(a.max_mr_size > 0, "max_mr_size 0");
    ensure!(a.max_pkeys > 0, "max_pkeys 0");
    if env.ctx.name().starts_with("rxe") {
        // rxe_param.h: RXE_MAX_QP_RD_ATOM = 128, and no RESIZE_MAX_WR.
        ensure!(
            a.max_qp_rd_atom == 128,
            "rxe max_qp_rd_atom {}",
            a.max_qp_rd_atom
        );
        ensure!(
            !a.capabilities
                .contains(rdma_verbs::DeviceCapFlags::RESIZE_MAX_WR),
            "rxe claims RESIZE_MAX_WR"
        );
    }
    Ok(())
}

fn query_port(env: &Env) -> Result<(), Failed> {
    let p = env.ctx.query_port(env.port)?;
    ensure!(
        p.state == PortState::Active,
        "port {} is {:?}, not active",
        env.port,
        p.state
    );
    ensure!(
        p.active_mtu <= p.max_mtu,
        "active MTU {:?} above max {:?}",
        p.active_mtu,
        p.max_mtu
    );
    ensure!(p.gid_tbl_len > 0, "empty GID table");
    ensure!(p.pkey_tbl_len > 0, "empty P_Key table");
    ensure!(p.max_msg_sz > 0, "max_msg_sz 0");
    if p.link_layer == LinkLayer::Ethernet {
        ensure!(p.grh_required(), "RoCE port does not require a GRH");
        ensure!(p.lid == 0, "RoCE port has LID {}", p.lid);
    }
    ensure!(env.ctx.ports().contains(&env.port), "port not in ports()");
    Ok(())
}

fn invalid_port_is_refused(env: &Env) -> Result<(), Failed> {
    let beyond = *env.ctx.ports().end() + 1;
    for port in [0, beyond] {
        match env.ctx.query_port(port) {
            Err(Error::InvalidArgument {
                verb: "ibv_query_port",
                reason,
            }) => {
                ensure!(reason.contains(&format!("port {port}")), "reason: {reason}")
            }
            other => {
                return Err(format!("port {port}: expected InvalidArgument, got {other:?}").into())
            }
        }
    }
    Ok(())
}

fn gid_table(env: &Env) -> Result<(), Failed> {
    let port = env.ctx.query_port(env.port)?;
    let table = env.ctx.gid_table()?;
    let ours: Vec<_> = table
        .iter()
        .filter(|e| e.port == u32::from(env.port))
        .collect();
    ensure!(!ours.is_empty(), "no valid GIDs on port {}", env.port);
    for e in &ours {
        let gid = env.ctx.query_gid(env.port, e.index)?;
        ensure!(
            gid == e.gid,
            "GID[{}]: query_gid {gid} != table {}",
            e.index,
            e.gid
        );
        let entry = env.ctx.query_gid_entry(env.port, e.index)?;
        ensure!(
            entry == **e,
            "GID[{}]: entry {entry:?} != table {e:?}",
            e.index
        );
        ensure!(!e.gid.is_zero(), "valid entry {} is zero", e.index);
        match port.link_layer {
            LinkLayer::Ethernet => ensure!(
                matches!(e.gid_type, Some(GidType::RoceV1 | GidType::RoceV2)),
                "RoCE GID[{}] has type {:?}",
                e.index,
                e.gid_type
            ),
            _ => ensure!(
                e.gid_type == Some(GidType::Ib),
                "IB GID type {:?}",
                e.gid_type
            ),
        }
    }
    // GID 0 on RoCE and IB is the link-local one.
    let g0 = env.ctx.query_gid(env.port, 0)?;
    ensure!(
        g0.subnet_prefix() == 0xfe80_0000_0000_0000,
        "GID[0] {g0} is not fe80::/64"
    );
    Ok(())
}

fn gid_index_out_of_range(env: &Env) -> Result<(), Failed> {
    let len = env.ctx.query_port(env.port)?.gid_tbl_len;
    match env.ctx.query_gid(env.port, len) {
        Err(Error::InvalidArgument { reason, .. }) => {
            ensure!(reason.contains(&len.to_string()), "reason: {reason}")
        }
        other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
    }
    ensure!(
        matches!(
            env.ctx.query_gid_entry(env.port, len),
            Err(Error::InvalidArgument { .. })
        ),
        "query_gid_entry accepted index {len}"
    );
    Ok(())
}

fn pkey(env: &Env) -> Result<(), Failed> {
    let pkey = env.ctx.query_pkey(env.port, 0)?;
    ensure!(
        pkey & 0x7fff == 0x7fff,
        "P_Key[0] is {pkey:#06x}, not the default partition"
    );
    let len = env.ctx.query_port(env.port)?.pkey_tbl_len;
    ensure!(
        matches!(
            env.ctx.query_pkey(env.port, len),
            Err(Error::InvalidArgument { .. })
        ),
        "P_Key index {len} accepted"
    );
    Ok(())
}

fn close_reports_in_use(env: &Env) -> Result<(), Failed> {
    let ctx = Context::open(env.ctx.name())?;
    let pd = ctx.alloc_pd()?;
    match ctx.clone().close() {
        Err(Error::InUse {
            object, users, by, ..
        }) => {
            ensure!(object == "device context", "object {object}");
            ensure!(users >= 2, "users {users}");
            ensure!(
                by.count(rdma_verbs::UserKind::ProtectionDomain) == 1 && by.others() >= 1,
                "users named as {by}"
            );
        }
        other => return Err(format!("expected InUse, got {other:?}").into()),
    }
    pd.close()?;
    ctx.close()?;
    Ok(())
}

//! What a user new to the connection manager runs into: a route from an
//! address no RDMA device has, and a `RemoteBuf` sent in private data,
//! which arrives padded.

use std::net::SocketAddr;
use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, ConnParam, EventChannel, PortSpace};
use rdma_verbs::{AccessFlags, Error, QpInitAttr, QpType, RemoteBuf};

use crate::cm::{listener, resolved};
use crate::common::{cm_addr, deadline, Env, Test};

pub const TESTS: &[Test] = tests![
    loopback_route_names_the_rdma_addresses,
    remote_buf_sent_in_private_data_parses_padded,
];

/// 127.0.0.1 resolves (to the loopback device), and then the route fails
/// with ENODEV: the error names 127.0.0.1, says no RDMA device has it, and
/// lists the test device's address as one that would work.
fn loopback_route_names_the_rdma_addresses(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    let to: SocketAddr = "127.0.0.1:7471".parse()?;
    id.resolve_addr(None, to, Duration::from_secs(2))?;
    ch.expect(CmEventKind::AddrResolved, deadline())?;
    let err = match id.resolve_route(Duration::from_secs(2)) {
        Err(e) => e,
        Ok(()) => return Err("a route from 127.0.0.1 was resolved".into()),
    };
    let Error::NoRdmaAddress {
        addr,
        usable,
        errno,
        ..
    } = &err
    else {
        return Err(format!("expected Error::NoRdmaAddress, got {err:?}").into());
    };
    ensure!(*errno == libc::ENODEV, "errno {errno}");
    ensure!(addr.is_some_and(|a| a.is_loopback()), "address {addr:?}");
    let m = err.to_string();
    ensure!(
        m.contains("no RDMA device has the address 127.0.0.1"),
        "{m}"
    );
    let ours = format!("{ip} ({} port {})", env.ctx.name(), env.port);
    ensure!(usable.contains(&ours), "{ours} is not among {usable:?}");
    ensure!(m.contains(&ours), "{m}");
    eprintln!("cm_user: {m}");
    Ok(())
}

/// A client sends its region's wire record as the connect request's
/// private data; the server's event shows it padded with zeros to the
/// request's size, and `RemoteBuf::from_wire` takes it as it came.
fn remote_buf_sent_in_private_data_parses_padded(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    let (_listener, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    let client = resolved(&cch, addr, PortSpace::Tcp)?;
    let ctx = client.context()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(4)?);
    let _qp = client.create_qp(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mr = pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let sent = mr.remote_buf()?;
    client.connect(&ConnParam::new().private_data(&sent.to_wire()))?;
    let mut request = sch.expect(CmEventKind::ConnectRequest, deadline())?;
    let data = request.private_data();
    ensure!(
        data.len() > RemoteBuf::WIRE_LEN,
        "{} bytes of private data: no padding to check",
        data.len()
    );
    ensure!(RemoteBuf::from_wire(data)? == sent, "parsed another buffer");
    let server = request.take_request().ok_or("no request id")?;
    drop(request);
    server.reject(&[])?;
    ensure!(
        cch.expect(CmEventKind::Established, deadline()).is_err(),
        "the rejected client connected"
    );
    Ok(())
}

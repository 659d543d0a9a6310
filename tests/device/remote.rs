//! `RemoteBuf`: made from a region, sent as a wire record, used by a peer.

use libtest_mimic::Failed;
use rdma_verbs::qp::{SendOp, SendWr};
use rdma_verbs::{AccessFlags, Error, QpCaps, QpType, RemoteBuf, WcOpcode};

use crate::common::{pair, poll_n, reclaim_on, remote_region, Env, Test};

pub const TESTS: &[Test] = tests![
    remote_buf_needs_remote_access,
    peer_reads_and_writes_through_a_received_record,
];

fn remote_buf_needs_remote_access(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    for access in [
        AccessFlags::LOCAL_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
    ] {
        let mr = pd.register(64, access)?;
        match mr.remote_buf() {
            Err(e @ Error::InvalidArgument { .. }) => {
                ensure!(e.to_string().contains("REMOTE_READ"), "message {e}")
            }
            other => return Err(format!("{access:?}: {other:?}").into()),
        }
    }
    for access in [
        AccessFlags::REMOTE_READ,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    ] {
        let mr = pd.register(4096, access)?;
        let b = mr.remote_buf()?;
        ensure!(
            b == RemoteBuf {
                addr: mr.addr(),
                rkey: mr.rkey(),
                len: 4096
            },
            "{access:?}: {b:?}"
        );
        ensure!(b.at(4096, 1).is_err(), "one byte past the region accepted");
    }
    Ok(())
}

/// The server's region goes over "the wire" (to_wire / from_wire); the
/// client writes and reads at offsets `at` gives, and the bytes land
/// exactly there.
fn peer_reads_and_writes_through_a_received_record(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = pair(env, QpType::Rc, QpCaps::default(), access)?;
    let mut region = remote_region(&p.pd, 1024)?;
    region.write(0, &[0xee; 1024])?;
    let wire = region.remote_buf()?.to_wire();
    let got = RemoteBuf::from_wire(&wire)?;

    let mut bufs = p.pd.alloc_chunks(2, 16, AccessFlags::LOCAL_WRITE)?;
    let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
    src.as_mut_slice().copy_from_slice(b"sixteen bytes!!!");
    // The last 16 bytes of the region.
    let last = got.at(1024 - 16, 16)?;
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(last)).sge(src)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::RdmaWrite),
        "{wc:?}"
    );
    reclaim_on(&mut [&mut p.a], &wc);
    let mut landed = [0u8; 17];
    region.read(1024 - 17, &mut landed)?;
    ensure!(
        landed[0] == 0xee && &landed[1..] == b"sixteen bytes!!!",
        "landed {landed:?}"
    );
    p.a.post_send([SendWr::new(2, SendOp::RdmaRead(last)).sge(dst)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::RdmaRead),
        "{wc:?}"
    );
    let back = reclaim_on(&mut [&mut p.a], &wc);
    let dst = &back.first().ok_or("read chunk not returned")?.1;
    ensure!(
        dst.as_slice() == b"sixteen bytes!!!",
        "read {:?}",
        dst.as_slice()
    );
    // Past the end is refused before anything is posted.
    ensure!(got.at(1024 - 15, 16).is_err(), "past the end accepted");
    ensure!(p.a.outstanding_sends() == 0, "requests left");
    Ok(())
}

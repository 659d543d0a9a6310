//! Regions over buffers the program owns, attacked from safe code: every
//! refusal hands the buffer (or region) back unchanged; the buffer never
//! comes back while a chunk or a posted request names it, not even with a
//! chunk `mem::forget`-ed; re-registration is refused while posted;
//! zero-length, one-byte and misaligned buffers.

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Error, QpCaps, QpState, QpType, Refused};

use crate::common::{pair, poll_n, reclaim_on as reclaim, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    refusals_hand_the_buffer_back_unchanged,
    close_with_chunks_outstanding_or_forgotten,
    rereg_and_rejoin_refused_while_posted,
    zero_length_one_byte_and_misaligned_buffers,
];

fn rc_pair(env: &Env) -> Result<Pair, Failed> {
    pair(
        env,
        QpType::Rc,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
}

fn refused<T, R>(r: Result<T, Refused<R>>, what: &str) -> Result<(Error, R), Failed> {
    match r {
        Ok(_) => Err(format!("{what}: accepted").into()),
        Err(r) => Ok(r.into_parts()),
    }
}

/// Each refusal names what was wrong and hands back the very buffer (the
/// same allocation, same capacity), or the region, which still works.
fn refusals_hand_the_buffer_back_unchanged(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let empty = Vec::<u8>::with_capacity(100);
    let ptr = empty.as_ptr();
    let (e, back) = refused(
        pd.register_owned(empty, AccessFlags::LOCAL_WRITE),
        "empty Vec",
    )?;
    ensure!(
        matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("empty"),
        "{e}"
    );
    ensure!(
        back.as_ptr() == ptr && back.capacity() >= 100,
        "another Vec came back"
    );
    let (e, _) = refused(
        pd.register_owned(Box::<[u8]>::default(), AccessFlags::empty()),
        "empty Box",
    )?;
    ensure!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let (e, _) = refused(
        pd.register_owned(bytes::BytesMut::new(), AccessFlags::empty()),
        "empty BytesMut",
    )?;
    ensure!(matches!(e, Error::InvalidArgument { .. }), "{e}");

    let buf = vec![5u8; 4096];
    let ptr = buf.as_ptr();
    let (e, back) = refused(
        pd.register_owned(buf, AccessFlags::REMOTE_WRITE),
        "REMOTE_WRITE alone",
    )?;
    ensure!(e.to_string().contains("LOCAL_WRITE"), "{e}");
    ensure!(
        back.as_ptr() == ptr && back == vec![5u8; 4096],
        "the buffer came back changed"
    );

    // The same buffer again, now accepted; split refusals hand the region back.
    let mr = pd.register_owned(back, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let (e, mr) = refused(mr.split(1024), "split of a remote-writable region")?;
    ensure!(e.to_string().contains("REMOTE_WRITE"), "{e}");
    let buf = mr.into_inner()?;
    ensure!(
        buf.as_ptr() == ptr && buf == vec![5u8; 4096],
        "the buffer came back changed"
    );
    let mr = pd.register_owned(buf, AccessFlags::LOCAL_WRITE)?;
    let (e, mr) = refused(mr.split(0), "split(0)")?;
    ensure!(e.to_string().contains("chunk length 0"), "{e}");
    let (_region, chunks) = mr.split(4096)?;
    ensure!(
        chunks.len() == 1 && chunks[0].as_slice() == [5u8; 4096],
        "one whole chunk"
    );
    Ok(())
}

/// Chunks out: the buffer is refused (with the region back, still
/// registered and working); a forgotten chunk keeps it refused for good.
fn close_with_chunks_outstanding_or_forgotten(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let mr =
        p.pd.register_owned(vec![0u8; 4 * 256], AccessFlags::LOCAL_WRITE)?;
    let (region, mut chunks) = mr.split(256)?;
    let (e, region) = refused(region.into_inner(), "into_inner with 4 chunks out")?;
    ensure!(matches!(e, Error::InUse { users: 4, .. }), "{e}");
    // Still registered: a send from one chunk into another completes.
    let recv = chunks.pop().unwrap();
    let mut send = chunks.pop().unwrap();
    send.as_mut_slice()[..5].copy_from_slice(b"still");
    p.b.post_recv([RecvWr::new(1).sge(recv)])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(send, 5)])?;
    let mut back = Vec::new();
    for wc in poll_n(&p.cq, 2)? {
        ensure!(wc.is_success(), "after a refused into_inner: {wc:?}");
        back.extend(reclaim(&mut [&mut p.a, &mut p.b], &wc));
    }
    let recv = back.iter().find(|(id, _)| *id == 1).ok_or("no receive")?;
    ensure!(
        &recv.1.as_slice()[..5] == b"still",
        "the receive holds other bytes"
    );
    drop(back);
    // One chunk forgotten: refused now and every time after.
    std::mem::forget(chunks.pop().unwrap());
    drop(chunks);
    let (e, region) = refused(region.into_inner(), "into_inner with a chunk forgotten")?;
    ensure!(matches!(e, Error::InUse { users: 1, .. }), "{e}");
    let (_, region) = refused(region.rejoin(), "rejoin with a chunk forgotten")?;
    let (_, region) = refused(region.into_inner(), "into_inner again")?;
    ensure!(
        region.chunks_out() == 1,
        "chunks_out {}",
        region.chunks_out()
    );
    // Dropping the handle leaks the region with the forgotten chunk: the
    // memory is never freed under it.
    drop(region);
    Ok(())
}

/// A region whose chunk is posted cannot be rejoined (so not re-registered:
/// only a `MemoryRegion` has `rereg_*`); once RESET hands the receive back
/// and it is dropped, it can.
fn rereg_and_rejoin_refused_while_posted(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let mr =
        p.pd.register_owned(vec![1u8; 4096], AccessFlags::LOCAL_WRITE)?;
    let (region, mut chunks) = mr.split(4096)?;
    p.b.post_recv([RecvWr::new(1).sge(chunks.remove(0))])?;
    let (e, region) = refused(region.rejoin(), "rejoin with a receive posted")?;
    ensure!(matches!(e, Error::InUse { users: 1, .. }), "{e}");
    let (_, region) = refused(region.into_inner(), "into_inner with a receive posted")?;
    p.b.modify(&QpAttr::new().state(QpState::Reset))?;
    let released = p.b.take_released();
    ensure!(
        released.len() == 1,
        "RESET handed back {} requests",
        released.len()
    );
    ensure!(
        region.chunks_out() == 1,
        "the released request holds the chunk"
    );
    drop(released);
    let mut mr = region.rejoin()?;
    match mr.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ) {
        Ok(()) | Err(Error::Unsupported { .. }) => {}
        Err(e) => return Err(format!("rereg_access after the receive came back: {e}").into()),
    }
    let buf = mr.into_inner()?;
    ensure!(buf == vec![1u8; 4096], "the buffer changed");
    Ok(())
}

/// Zero-length buffers of every kind are refused; a one-byte buffer and
/// buffers at odd addresses (a `BytesMut` split at 1 and at 4095) work for
/// RDMA write and read at their very edges, and the bytes beside them
/// (another handle's) are never touched.
fn zero_length_one_byte_and_misaligned_buffers(env: &Env) -> Result<(), Failed> {
    let mut p = rc_pair(env)?;
    let (e, _) = refused(
        p.pd.register_owned(Vec::new(), AccessFlags::LOCAL_WRITE),
        "Vec::new()",
    )?;
    ensure!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;

    // One byte, read and written by the peer.
    let one = p.pd.register_owned(vec![0x7e], access)?;
    let mut probe = p.pd.alloc_chunks(1, 8, AccessFlags::LOCAL_WRITE)?.remove(0);
    let at = RemoteAddr {
        addr: one.addr(),
        rkey: one.rkey(),
    };
    p.a.post_send([SendWr::new(1, SendOp::RdmaRead(at)).sge_len(probe, 1)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.is_success(), "read of a 1-byte region: {wc:?}");
    probe = reclaim(&mut [&mut p.a], &wc).pop().ok_or("no chunk")?.1;
    ensure!(
        probe.as_slice()[0] == 0x7e,
        "read {:#x}",
        probe.as_slice()[0]
    );
    // Two bytes into a one-byte region: refused by the device, not written.
    p.a.post_send([SendWr::new(2, SendOp::RdmaWrite(at)).sge_len(probe, 2)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(
        !wc.is_success(),
        "a 2-byte write into a 1-byte region succeeded"
    );
    drop(reclaim(&mut [&mut p.a], &wc));
    ensure!(one.into_inner()? == vec![0x7e], "the byte changed");

    for split_at in [1usize, 4095] {
        misaligned(env, split_at)?;
    }
    Ok(())
}

/// A `BytesMut` split at `split_at`: its tail, at an odd address,
/// registered and written and read by the peer at its first and last
/// bytes; the head (the same allocation's other handle) untouched; the
/// two unsplit afterwards.
fn misaligned(env: &Env, split_at: usize) -> Result<(), Failed> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = rc_pair(env)?;
    let mut head = bytes::BytesMut::zeroed(3 * 4096);
    let tail = head.split_off(split_at);
    ensure!(
        tail.as_ptr() as usize % 2 == 1,
        "the tail is not at an odd address"
    );
    let len = tail.len();
    let mut mr = p.pd.register_owned(tail, access)?;
    // The other handle of the same allocation stays the program's.
    head.fill(0x11);
    mr.write(len - 3, b"end")?;
    let mut src =
        p.pd.alloc_chunks(1, 16, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    src.as_mut_slice().copy_from_slice(b"0123456789abcdef");
    let first = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey(),
    };
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(first)).sge(src)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.is_success(), "write at an odd address: {wc:?}");
    let src = reclaim(&mut [&mut p.a], &wc).pop().ok_or("no chunk")?.1;
    let last = RemoteAddr {
        addr: mr.addr() + len as u64 - 3,
        rkey: mr.rkey(),
    };
    p.a.post_send([SendWr::new(2, SendOp::RdmaRead(last)).sge_len(src, 3)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(wc.is_success(), "read of the last bytes: {wc:?}");
    let src = reclaim(&mut [&mut p.a], &wc).pop().ok_or("no chunk")?.1;
    ensure!(
        &src.as_slice()[..3] == b"end",
        "read back {:?}",
        &src.as_slice()[..3]
    );
    let mut edge = [0u8; 17];
    mr.read(0, &mut edge)?;
    ensure!(
        &edge[..16] == b"0123456789abcdef" && edge[16] == 0,
        "the write landed elsewhere: {edge:?}"
    );
    let tail = mr.into_inner()?;
    ensure!(
        head.iter().all(|&b| b == 0x11),
        "split {split_at}: the other handle's bytes changed"
    );
    head.unsplit(tail);
    ensure!(head.len() == 3 * 4096, "unsplit: {} bytes", head.len());
    ensure!(
        &head[split_at..split_at + 16] == b"0123456789abcdef",
        "split {split_at}: write not in the buffer"
    );
    ensure!(
        &head[3 * 4096 - 3..] == b"end",
        "split {split_at}: write() not in the buffer"
    );
    Ok(())
}

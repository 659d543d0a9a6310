//! The data path on a real device: every opcode, completion statuses,
//! immediate data, inline sends, several SGEs, chains, UD through an
//! address handle, SRQ, completion channels (how every chunk comes back,
//! unsignalled, flushed, reset or refused, is `chunks_back.rs`'s).

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, AsyncEvent, Chunk, CompletionChannel, QpInitAttr, QpState, QpType, SharedChunk,
    WcOpcode, WcStatus,
};

use crate::common::{opts, pair, poll_n, Env, Pair, Test};

pub const TESTS: &[Test] = tests![
    send_recv_imm_inline_in_one_chain,
    rdma_write_read_and_write_with_imm,
    atomics,
    several_sges_each_way,
    ud_through_an_address_handle,
    srq_receives_and_limit_event,
    completion_channel_events,
    one_shared_source_for_many_writes_and_sends,
];

use crate::common::reclaim_on as reclaim;

pub(crate) fn chunks(p: &Pair, n: usize, len: usize) -> Result<Vec<Chunk>, Failed> {
    Ok(p.pd.alloc_chunks(n, len, AccessFlags::LOCAL_WRITE)?)
}

fn send_recv_imm_inline_in_one_chain(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_inline_data: 64,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let mut bufs = chunks(&p, 5, 4096)?;
    let mut send2 = bufs.pop().unwrap();
    let mut send1 = bufs.pop().unwrap();
    send1.as_mut_slice()[..5].copy_from_slice(b"hello");
    send2.as_mut_slice()[..4].copy_from_slice(b"imm!");
    let recvs: Vec<RecvWr> = bufs
        .into_iter()
        .enumerate()
        .map(|(i, c)| RecvWr::new(10 + i as u64).sge(c))
        .collect();
    p.b.post_recv(recvs)?;
    ensure!(p.b.outstanding_recvs() == 3, "3 receives outstanding");
    p.a.post_send([
        SendWr::new(1, SendOp::Send).sge_len(send1, 5),
        SendWr::new(2, SendOp::SendWithImm(0xdead_beef)).sge_len(send2, 4),
        SendWr::new(3, SendOp::Send).inline(b"inline!"),
    ])?;
    ensure!(p.a.outstanding_sends() == 3, "3 sends outstanding");
    let wcs = poll_n(&p.cq, 6)?;
    let mut received = Vec::new();
    for wc in &wcs {
        ensure!(
            wc.status() == Ok(WcStatus::Success),
            "status {:?}",
            wc.status()
        );
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        if wc.qp_num() == p.b.qp_num() {
            ensure!(
                wc.opcode() == Ok(WcOpcode::Recv),
                "receive opcode {:?}",
                wc.opcode()
            );
            ensure!(back.len() == 1, "one chunk per receive");
            let (id, c) = &back[0];
            received.push((
                *id,
                wc.byte_len(),
                wc.imm_data(),
                c.as_slice()[..wc.byte_len() as usize].to_vec(),
            ));
        } else {
            ensure!(
                wc.opcode() == Ok(WcOpcode::Send),
                "send opcode {:?}",
                wc.opcode()
            );
        }
    }
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "requests left outstanding"
    );
    received.sort();
    ensure!(
        received
            == vec![
                (10, 5, None, b"hello".to_vec()),
                (11, 4, Some(0xdead_beef), b"imm!".to_vec()),
                (12, 7, None, b"inline!".to_vec()),
            ],
        "received {received:?}"
    );
    Ok(())
}

fn rdma_write_read_and_write_with_imm(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mut p = pair(env, QpType::Rc, QpCaps::default(), access)?;
    let mut region = crate::common::remote_region(&p.pd, 8192)?;
    region.write(0, &[0xee; 8192])?;
    let remote = RemoteAddr {
        addr: region.addr() + 100,
        rkey: region.rkey(),
    };
    let mut bufs = chunks(&p, 3, 1000)?;
    let (mut src, dst, note) = (bufs.remove(0), bufs.remove(0), bufs.remove(0));
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let pattern = src.as_slice().to_vec();
    p.a.post_send([SendWr::new(1, SendOp::RdmaWrite(remote)).sge(src)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::RdmaWrite),
        "write: {wc:?}"
    );
    let src = reclaim(&mut [&mut p.a], &wc)
        .pop()
        .ok_or("write chunk not returned")?
        .1;
    let mut landed = vec![0; 1000];
    region.read(100, &mut landed)?;
    ensure!(landed == pattern, "the write did not land");
    let mut edge = [0u8; 1];
    region.read(99, &mut edge)?;
    ensure!(edge[0] == 0xee, "the write spilled before its address");

    p.a.post_send([SendWr::new(2, SendOp::RdmaRead(remote)).sge(dst)])?;
    let wc = poll_n(&p.cq, 1)?[0];
    ensure!(
        wc.is_success() && wc.opcode() == Ok(WcOpcode::RdmaRead),
        "read: {wc:?}"
    );
    let dst = reclaim(&mut [&mut p.a], &wc)
        .pop()
        .ok_or("read chunk not returned")?
        .1;
    ensure!(
        dst.as_slice() == pattern.as_slice(),
        "the read brought back other bytes"
    );

    // A write with immediate consumes a receive at the peer.
    p.b.post_recv([RecvWr::new(7).sge(note)])?;
    p.a.post_send([
        SendWr::new(3, SendOp::RdmaWriteWithImm(remote, 0x1234_5678)).sge_len(src, 10),
    ])?;
    let wcs = poll_n(&p.cq, 2)?;
    let recv = wcs
        .iter()
        .find(|w| w.qp_num() == p.b.qp_num())
        .ok_or("no receive completion")?;
    ensure!(
        recv.is_success() && recv.opcode() == Ok(WcOpcode::RecvRdmaWithImm),
        "{recv:?}"
    );
    ensure!(
        recv.imm_data() == Some(0x1234_5678),
        "imm {:?}",
        recv.imm_data()
    );
    ensure!(recv.byte_len() == 10, "byte_len {}", recv.byte_len());
    for wc in &wcs {
        ensure!(
            !reclaim(&mut [&mut p.a, &mut p.b], wc).is_empty(),
            "nothing reclaimed for {wc:?}"
        );
    }
    Ok(())
}

fn atomics(env: &Env) -> Result<(), Failed> {
    if env.ctx.attr().atomic_cap == rdma_verbs::AtomicCap::None {
        eprintln!(
            "data: {} has no atomics; atomics not exercised",
            env.ctx.name()
        );
        return Ok(());
    }
    let access = AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mut p = pair(env, QpType::Rc, QpCaps::default(), access)?;
    let mut region = crate::common::remote_region(&p.pd, 64)?;
    region.write(8, &40u64.to_ne_bytes())?;
    let remote = RemoteAddr {
        addr: region.addr() + 8,
        rkey: region.rkey(),
    };
    let mut old =
        p.pd.alloc_chunks(1, 8, AccessFlags::LOCAL_WRITE)?
            .pop()
            .unwrap();
    let mut run = |op: SendOp, old_chunk: Chunk| -> Result<(u64, Chunk), Failed> {
        p.a.post_send([SendWr::new(9, op).sge(old_chunk)])?;
        let wc = poll_n(&p.cq, 1)?[0];
        ensure!(wc.is_success(), "{op:?}: {wc:?}");
        let c = reclaim(&mut [&mut p.a], &wc)
            .pop()
            .ok_or("atomic chunk not returned")?
            .1;
        Ok((u64::from_ne_bytes(c.as_slice().try_into()?), c))
    };
    // Compare-and-swap that fails (40 != 1), then one that succeeds.
    let (v, c) = run(
        SendOp::CompareSwap {
            remote,
            compare: 1,
            swap: 7,
        },
        old,
    )?;
    ensure!(v == 40, "cmp_and_swp returned {v}, expected the old 40");
    let (v, c) = run(
        SendOp::CompareSwap {
            remote,
            compare: 40,
            swap: 7,
        },
        c,
    )?;
    ensure!(v == 40, "cmp_and_swp returned {v}");
    let (v, c) = run(SendOp::FetchAdd { remote, add: 5 }, c)?;
    ensure!(v == 7, "fetch_and_add returned {v}, expected 7");
    old = c;
    let mut now = [0u8; 8];
    region.read(8, &mut now)?;
    ensure!(
        u64::from_ne_bytes(now) == 12,
        "the region holds {}, expected 12",
        u64::from_ne_bytes(now)
    );
    drop(old);
    Ok(())
}

fn several_sges_each_way(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_sge: 3,
        max_recv_sge: 2,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, AccessFlags::empty())?;
    let mut parts = chunks(&p, 3, 300)?;
    for (i, c) in parts.iter_mut().enumerate() {
        c.as_mut_slice().fill(b'a' + i as u8);
    }
    let mut wr = SendWr::new(1, SendOp::Send);
    for (c, len) in parts.into_iter().zip([100, 200, 300]) {
        wr = wr.sge_len(c, len);
    }
    let mut dst = chunks(&p, 2, 400)?;
    let (d2, d1) = (dst.pop().unwrap(), dst.pop().unwrap());
    p.b.post_recv([RecvWr::new(5).sge(d1).sge(d2)])?;
    p.a.post_send([wr])?;
    let wcs = poll_n(&p.cq, 2)?;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        if wc.qp_num() == p.b.qp_num() {
            ensure!(wc.byte_len() == 600, "byte_len {}", wc.byte_len());
            ensure!(back.len() == 2, "two receive chunks");
            let got: Vec<u8> = back
                .iter()
                .flat_map(|(_, c)| c.as_slice().to_vec())
                .take(600)
                .collect();
            let want: Vec<u8> = [(b'a', 100), (b'b', 200), (b'c', 300)]
                .iter()
                .flat_map(|&(b, n)| std::iter::repeat_n(b, n))
                .collect();
            ensure!(got == want, "scattered bytes differ");
        } else {
            ensure!(
                back.len() == 3,
                "three send chunks back, got {}",
                back.len()
            );
        }
    }
    Ok(())
}

fn ud_through_an_address_handle(env: &Env) -> Result<(), Failed> {
    let mut p = pair(env, QpType::Ud, QpCaps::default(), AccessFlags::empty())?;
    let ah = crate::common::post_datagram(env, &p.pd, &mut p.a, &mut p.b)?;
    drop(ah); // the send keeps its address handle alive
    let wcs = poll_n(&p.cq, 2)?;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        if wc.qp_num() == p.b.qp_num() {
            ensure!(wc.src_qp() == p.a.qp_num(), "src_qp {}", wc.src_qp());
            ensure!(wc.imm_data() == Some(42), "imm {:?}", wc.imm_data());
            ensure!(
                wc.byte_len() == 40 + 9,
                "byte_len {} (GRH + 9)",
                wc.byte_len()
            );
            ensure!(
                &back[0].1.as_slice()[40..49] == b"datagram!",
                "payload after the 40-byte GRH differs"
            );
        }
    }
    Ok(())
}

fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, what: &str) -> Result<(), Failed> {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    ensure!(n == 1, "{what}: descriptor not readable within 5 s");
    Ok(())
}

fn srq_receives_and_limit_event(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let srq_receives_and_limit_event = pd.create_srq(8, 1, 0)?;
    let mut sender = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mut receiver =
        pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).srq(&srq_receives_and_limit_event))?;
    ensure!(
        receiver
            .srq()
            .is_some_and(|s| s.same_as(&srq_receives_and_limit_event)),
        "QP does not report its SRQ"
    );
    let o = opts(env, AccessFlags::empty());
    let (es, er) = (
        sender.local_endpoint(&o, Psn::new(1)?)?,
        receiver.local_endpoint(&o, Psn::new(2)?)?,
    );
    sender.connect(&o, es.psn, &er)?;
    receiver.connect(&o, er.psn, &es)?;
    let mut bufs = pd.alloc_chunks(6, 256, AccessFlags::LOCAL_WRITE)?;
    let sends: Vec<Chunk> = bufs.drain(4..).collect();
    srq_receives_and_limit_event.post_recv(
        bufs.into_iter()
            .enumerate()
            .map(|(i, c)| RecvWr::new(i as u64).sge(c))
            .collect::<Vec<_>>(),
    )?;
    ensure!(
        srq_receives_and_limit_event.outstanding() == 4,
        "4 on the SRQ"
    );
    // Posting to a QP that uses an SRQ is refused.
    let spare = pd
        .alloc_chunks(1, 64, AccessFlags::LOCAL_WRITE)?
        .pop()
        .unwrap();
    ensure!(
        receiver.post_recv([RecvWr::new(9).sge(spare)]).is_err(),
        "QP with SRQ took a receive"
    );
    // Arm the limit: below 3 remaining, an async event.
    srq_receives_and_limit_event.arm_limit(3)?;
    sender.post_send(
        sends
            .into_iter()
            .map(|c| SendWr::new(0, SendOp::Send).sge_len(c, 16))
            .collect::<Vec<_>>(),
    )?;
    let wcs = poll_n(&cq, 4)?;
    let mut got = 0;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        if wc.qp_num() == receiver.qp_num() {
            // Alternate: the SRQ directly, and the QP (which defers to its SRQ).
            got += if got % 2 == 0 {
                srq_receives_and_limit_event.reclaim(wc, |d| ensure_chunk(d.into_chunk()))
            } else {
                receiver.reclaim(wc, |d| ensure_chunk(d.into_chunk()))
            };
            ensure!(
                srq_receives_and_limit_event.reclaim(wc, |_| ()) == 0,
                "a receive was handed back twice"
            );
        } else {
            sender.reclaim(wc, |_| ());
        }
    }
    ensure!(
        got == 2 && srq_receives_and_limit_event.outstanding() == 2,
        "SRQ handed back {got}, {} outstanding",
        srq_receives_and_limit_event.outstanding()
    );
    wait_readable(env.ctx.async_fd(), "SRQ limit event")?;
    match env.ctx.get_async_event()? {
        AsyncEvent::SrqLimitReached { srq_handle } => {
            ensure!(
                srq_handle == srq_receives_and_limit_event.handle(),
                "event for another SRQ"
            )
        }
        other => return Err(format!("expected SrqLimitReached, got {other:?}").into()),
    }
    Ok(())
}

fn ensure_chunk(c: Option<Chunk>) {
    assert!(c.is_some(), "a reclaimed receive had no chunk");
}

fn completion_channel_events(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let channel = CompletionChannel::new(&env.ctx)?;
    let cq = env.ctx.create_cq_with_channel(16, &channel, 0)?;
    let plain = env.ctx.create_cq(4)?;
    ensure!(
        plain.req_notify(false).is_err(),
        "req_notify without a channel accepted"
    );
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    let o = opts(env, AccessFlags::empty());
    let ea = a.local_endpoint(&o, Psn::new(1)?)?;
    a.bring_up_ud(o.port, o.qkey, ea.psn)?;
    channel.set_nonblocking(true)?;
    match channel.get_event() {
        Err(e) => ensure!(e.errno() == Some(libc::EAGAIN), "no event pending: {e}"),
        Ok(ev) => return Err(format!("event before any completion: {ev:?}").into()),
    }
    cq.req_notify(false)?;
    let mut av = AddressVector::new(env.port).dlid(ea.lid);
    if !ea.gid.is_zero() {
        let idx = env
            .ctx
            .gid_table()?
            .into_iter()
            .find(|e| e.gid == ea.gid)
            .map(|e| e.index as u8)
            .unwrap_or(0);
        av = av.global(GlobalRoute::new(ea.gid, idx));
    }
    let ah = pd.create_ah(&av)?;
    a.post_send([SendWr::new(1, SendOp::Send)
        .inline(b"")
        .ud(&ah, ea.qpn, QKey::PINGPONG)])?;
    use std::os::fd::AsFd;
    wait_readable(channel.as_fd(), "completion event")?;
    let ev = channel.get_event()?;
    ensure!(
        ev.is_for(&cq) && !ev.is_for(&plain),
        "event for the wrong CQ"
    );
    let wcs = poll_n(&cq, 1)?;
    ensure!(wcs[0].is_success(), "{:?}", wcs[0]);
    Ok(())
}

/// A read-only SharedChunk is the source of many outstanding writes and
/// sends at once; it is writable again only once the last of them ended
/// (reclaimed, reset or destroyed); reads and atomics refuse it, and a
/// refused post lets its clones go.
fn one_shared_source_for_many_writes_and_sends(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let caps = QpCaps {
        max_send_wr: 32,
        max_recv_wr: 32,
        ..QpCaps::default()
    };
    let mut p = pair(env, QpType::Rc, caps, access)?;
    let region = crate::common::remote_region(&p.pd, 4096)?;
    let remote = |i: u64| RemoteAddr {
        addr: region.addr() + 256 * i,
        rkey: region.rkey(),
    };
    let mut bufs = chunks(&p, 6, 256)?;
    let mut src = bufs.remove(0);
    src.as_mut_slice().fill(0x5a);
    let src = SharedChunk::new(src);

    // 8 writes and 2 sends from the one buffer, all outstanding at once.
    p.b.post_recv(
        bufs.drain(..2)
            .enumerate()
            .map(|(i, c)| RecvWr::new(50 + i as u64).sge(c)),
    )?;
    p.a.post_send((0..8u64).map(|i| {
        let wr = SendWr::new(i, SendOp::RdmaWrite(remote(i))).sge_shared(&src, 256);
        if i == 7 {
            wr
        } else {
            wr.unsignaled()
        }
    }))?;
    ensure!(
        src.holders() == 9,
        "8 writes hold it: {} holders",
        src.holders()
    );
    p.a.post_send([
        SendWr::new(8, SendOp::Send).sge_shared(&src, 100),
        SendWr::new(9, SendOp::Send).sge_shared(&src, 256),
    ])?;
    ensure!(
        src.holders() == 11,
        "10 requests hold it: {} holders",
        src.holders()
    );
    let src = src
        .try_into_chunk()
        .err()
        .ok_or("writable while requests hold it")?;

    // Reads and atomics write into their local entries: refused, and the
    // refused call lets its clones and hands its owned chunks back.
    let own = bufs.pop().unwrap();
    let e =
        p.a.post_send([
            SendWr::new(20, SendOp::Send).sge(own),
            SendWr::new(21, SendOp::RdmaRead(remote(0))).sge_shared(&src, 8),
        ])
        .err()
        .ok_or("a read into a SharedChunk was accepted")?;
    ensure!(
        e.posted == 0 && e.returned.len() == 1 && e.to_string().contains("read-only"),
        "{e}: {} returned",
        e.returned.len()
    );
    let e =
        p.a.post_send([SendWr::new(
            22,
            SendOp::FetchAdd {
                remote: remote(0),
                add: 1,
            },
        )
        .sge_shared(&src, 8)])
            .err()
            .ok_or("an atomic into a SharedChunk was accepted")?;
    ensure!(e.to_string().contains("read-only"), "{e}");
    ensure!(
        src.holders() == 11,
        "refusals kept clones: {} holders",
        src.holders()
    );

    // 8 writes end with one completion, 2 sends with theirs, 2 receives.
    let wcs = poll_n(&p.cq, 5)?;
    let mut ended = Vec::new();
    let mut owned = 0;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        p.a.reclaim(wc, |d| {
            ended.push(d.wr_id);
            owned += d.chunks().count();
        });
        p.b.reclaim(wc, |d| {
            let c = d.into_chunk().expect("a receive chunk");
            ended.push(100 + c.as_slice()[0] as u64);
        });
    }
    ended.sort_unstable();
    ensure!(
        owned == 0,
        "{owned} owned chunks came back from shared-only sends"
    );
    ensure!(
        ended == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100 + 0x5a, 100 + 0x5a],
        "ended {ended:?}"
    );
    let mut landed = vec![0; 2048];
    region.read(0, &mut landed)?;
    ensure!(landed.iter().all(|&b| b == 0x5a), "the writes did not land");
    let src = src
        .try_into_chunk()
        .map_err(|s| format!("still {} holders", s.holders()))?;

    // A RESET lets the clones of unfinished requests go too.
    let src = SharedChunk::new(src);
    p.a.modify(&QpAttr::new().state(QpState::Err))?;
    p.a.post_send([SendWr::new(30, SendOp::RdmaWrite(remote(0))).sge_shared(&src, 8)])?;
    ensure!(src.holders() == 2, "{} holders", src.holders());
    let back = p.a.reset()?;
    ensure!(back.len() == 1 && back[0].wr_id == 30, "{back:?}");
    // The handed-back request holds its clone until it is dropped.
    ensure!(src.holders() == 2, "{} holders", src.holders());
    drop(back);
    ensure!(src.holders() == 1, "after RESET: {} holders", src.holders());
    src.try_into_chunk()
        .map_err(|s| format!("still {} holders", s.holders()))?;
    Ok(())
}

//! Extended completion queues on a real device: every field rxe fills,
//! checked against what is known (QP numbers, lengths, immediates); the
//! fields it refuses; reclaiming through a `PolledWc`; batches (empty, many
//! more completions than the CQ holds, dropped in the middle); flushed
//! completions; the basic poll refused on the extended CQ; an event through
//! a completion channel, and SRQ receives reclaimed on the SRQ.

use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::cq_ex::{FieldSet, NoFields};
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionChannel, CompletionQueueEx, Error, PolledWc, ProtectionDomain,
    QpInitAttr, QpState, QpType, QueuePair, StandardFields, WcOpcode, WcStatus,
};

use crate::common::{connect, deadline, is_rxe, poll_n, scaled, Env, Test};

pub const TESTS: &[Test] = tests![
    send_recv_with_imm_reads_byte_len_imm_qp_num,
    rdma_write_with_imm_without_qp_num_still_reclaims,
    ud_receive_reads_src_qp_sl_slid_path_bits,
    timestamps_need_the_device_mask,
    cvlan_and_flow_tag_refused_on_rxe,
    bad_arguments_refused_before_the_call,
    empty_cq_starts_no_batch,
    many_drained_batches_see_each_completion_once,
    batch_dropped_midway_resumes_with_the_next,
    basic_poll_refused_on_as_cq,
    flushed_completions_read_and_reclaimed,
    event_through_a_channel_and_srq_reclaim,
];

/// Two connected QPs of type `t` whose completions all go to `cq`.
struct ExPair<F: FieldSet> {
    pd: ProtectionDomain,
    cq: CompletionQueueEx<F>,
    a: QueuePair,
    b: QueuePair,
}

fn ex_pair<F: FieldSet>(
    env: &Env,
    t: QpType,
    cq: CompletionQueueEx<F>,
    caps: QpCaps,
    access: AccessFlags,
) -> Result<ExPair<F>, Failed> {
    let pd = env.ctx.alloc_pd()?;
    let attr = QpInitAttr::new(t, cq.as_cq(), cq.as_cq()).caps(caps);
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr)?;
    connect(env, &mut a, &mut b, access)?;
    Ok(ExPair { pd, cq, a, b })
}

/// Polls `cq` in batches, each drained to its end, calling `f` on every
/// completion, until `n` were seen (or the deadline passed). Returns the
/// number of completions of each batch.
fn drain<F: FieldSet>(
    cq: &mut CompletionQueueEx<F>,
    n: usize,
    mut f: impl FnMut(&PolledWc<'_, F>) -> Result<(), Failed>,
) -> Result<Vec<usize>, Failed> {
    let (start, limit) = (Instant::now(), deadline());
    let mut batches = Vec::new();
    let mut seen = 0;
    while seen < n {
        if let Some(mut batch) = cq.start_poll()? {
            let mut k = 0;
            while let Some(wc) = batch.next()? {
                f(&wc)?;
                k += 1;
            }
            batches.push(k);
            seen += k;
        }
        ensure!(
            start.elapsed() < limit,
            "{seen} of {n} completions after {limit:?} (raise RDMA_VERBS_TIME_SCALE on a slow machine)"
        );
    }
    ensure!(seen == n, "{seen} completions, expected {n}");
    Ok(batches)
}

use crate::common::reclaim_on as reclaim;

fn chunks(pd: &ProtectionDomain, n: usize, len: usize) -> Result<Vec<Chunk>, Failed> {
    Ok(pd.alloc_chunks(n, len, AccessFlags::LOCAL_WRITE)?)
}

fn send_recv_with_imm_reads_byte_len_imm_qp_num(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq_ex(64).standard().build()?;
    ensure!(
        cq.wc_flags() == u64::from(rdma_verbs::sys::IBV_WC_STANDARD_FLAGS),
        "wc_flags {:#x}",
        cq.wc_flags()
    );
    let mut p = ex_pair(env, QpType::Rc, cq, QpCaps::default(), AccessFlags::empty())?;
    let mut bufs = chunks(&p.pd, 4, 256)?;
    let mut send2 = bufs.pop().unwrap();
    let mut send1 = bufs.pop().unwrap();
    send1.as_mut_slice()[..5].copy_from_slice(b"hello");
    send2.as_mut_slice()[..4].copy_from_slice(b"imm!");
    p.b.post_recv(
        bufs.into_iter()
            .enumerate()
            .map(|(i, c)| RecvWr::new(10 + i as u64).sge(c)),
    )?;
    p.a.post_send([
        SendWr::new(1, SendOp::Send).sge_len(send1, 5),
        SendWr::new(2, SendOp::SendWithImm(0xdead_beef)).sge_len(send2, 4),
    ])?;
    let (qa, qb) = (p.a.qp_num(), p.b.qp_num());
    let mut received = Vec::new();
    let mut sent = Vec::new();
    let ExPair { cq, a, b, .. } = &mut p;
    drain(cq, 4, |wc| {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut *a, &mut *b], wc);
        ensure!(back.len() == 1, "{} chunks back for {wc:?}", back.len());
        let (id, c) = &back[0];
        if wc.qp_num() == qb {
            ensure!(wc.opcode() == Ok(WcOpcode::Recv), "{wc:?}");
            let len = wc.byte_len() as usize;
            received.push((*id, len, wc.imm_data(), c.as_slice()[..len].to_vec()));
        } else {
            ensure!(
                wc.qp_num() == qa,
                "qp_num {:#x} is neither QP's",
                wc.qp_num()
            );
            ensure!(wc.opcode() == Ok(WcOpcode::Send), "{wc:?}");
            ensure!(wc.invalidated_rkey().is_none(), "{wc:?}");
            sent.push(*id);
        }
        Ok(())
    })?;
    received.sort();
    sent.sort();
    ensure!(
        received
            == vec![
                (10, 5, None, b"hello".to_vec()),
                (11, 4, Some(0xdead_beef), b"imm!".to_vec()),
            ],
        "received {received:?}"
    );
    ensure!(sent == vec![1, 2], "sends reclaimed {sent:?}");
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "requests left outstanding"
    );
    Ok(())
}

fn rdma_write_with_imm_without_qp_num_still_reclaims(env: &Env) -> Result<(), Failed> {
    // No qp_num: reclaim routes by the tag alone.
    let cq = env.ctx.create_cq_ex(16).imm().byte_len().build()?;
    let access = AccessFlags::REMOTE_WRITE;
    let mut p = ex_pair(env, QpType::Rc, cq, QpCaps::default(), access)?;
    let region =
        p.pd.register(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let remote = RemoteAddr {
        addr: region.addr() + 64,
        rkey: region.rkey(),
    };
    let mut bufs = chunks(&p.pd, 2, 100)?;
    let mut src = bufs.pop().unwrap();
    src.as_mut_slice()[..10].copy_from_slice(b"0123456789");
    p.b.post_recv([RecvWr::new(7).sge(bufs.pop().unwrap())])?;
    p.a.post_send([
        SendWr::new(3, SendOp::RdmaWriteWithImm(remote, 0x1234_5678)).sge_len(src, 10),
    ])?;
    let mut got = Vec::new();
    let ExPair { cq, a, b, .. } = &mut p;
    drain(cq, 2, |wc| {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut *a, &mut *b], wc);
        ensure!(back.len() == 1, "{} chunks back for {wc:?}", back.len());
        got.push((back[0].0, wc.opcode(), wc.imm_data(), wc.byte_len()));
        Ok(())
    })?;
    got.sort_by_key(|g| g.0);
    // The receive's byte_len is the write's length and carries the
    // immediate. The send side's byte_len and immediate are not compared:
    // rxe reports WITH_IMM (immediate 0) on the sender's completion of a
    // write with immediate, others do not.
    ensure!(
        got.len() == 2
            && got[0].0 == 3
            && got[0].1 == Ok(WcOpcode::RdmaWrite)
            && got[1] == (7, Ok(WcOpcode::RecvRdmaWithImm), Some(0x1234_5678), 10),
        "completions {got:?}"
    );
    let mut landed = [0u8; 10];
    region.read(64, &mut landed)?;
    ensure!(&landed == b"0123456789", "the write did not land");
    Ok(())
}

fn ud_receive_reads_src_qp_sl_slid_path_bits(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq_ex(16).standard().build()?;
    let mut p = ex_pair(env, QpType::Ud, cq, QpCaps::default(), AccessFlags::empty())?;
    let _ah = crate::common::post_datagram(env, &p.pd, &mut p.a, &mut p.b)?;
    let sender_lid = env.ctx.query_port(env.port)?.lid;
    let (qa, qb) = (p.a.qp_num(), p.b.qp_num());
    let mut checked = false;
    let ExPair { cq, a, b, .. } = &mut p;
    drain(cq, 2, |wc| {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut *a, &mut *b], wc);
        ensure!(back.len() == 1, "{} chunks back for {wc:?}", back.len());
        if wc.qp_num() == qb {
            ensure!(wc.src_qp() == qa, "src_qp {}, sender {qa:#x}", wc.src_qp());
            ensure!(wc.imm_data() == Some(42), "imm {:?}", wc.imm_data());
            ensure!(
                wc.byte_len() == 40 + 9,
                "byte_len {} (GRH + 9)",
                wc.byte_len()
            );
            ensure!(wc.sl() == 0, "sl {} (the address vector's is 0)", wc.sl());
            ensure!(
                wc.slid() == u32::from(sender_lid),
                "slid {} but the sender's port LID is {sender_lid}",
                wc.slid()
            );
            ensure!(
                wc.dlid_path_bits() == 0,
                "dlid_path_bits {} (LMC 0)",
                wc.dlid_path_bits()
            );
            ensure!(
                &back[0].1.as_slice()[40..49] == b"datagram!",
                "payload after the GRH differs"
            );
            checked = true;
        } else {
            ensure!(wc.qp_num() == qa, "{wc:?}");
        }
        Ok(())
    })?;
    ensure!(checked, "no receive completion");
    Ok(())
}

fn timestamps_need_the_device_mask(env: &Env) -> Result<(), Failed> {
    let attr = env.ctx.attr();
    let ts = env
        .ctx
        .create_cq_ex(16)
        .completion_timestamp()
        .qp_num()
        .build();
    if attr.completion_timestamp_mask == 0 {
        match ts {
            Err(Error::Unsupported {
                what: "completion timestamps",
                errno: None,
                ..
            }) => {}
            other => return Err(format!("timestamps without the mask: {other:?}").into()),
        }
        match env.ctx.create_cq_ex(16).completion_wallclock().build() {
            Err(Error::Unsupported {
                what: "completion timestamps",
                errno: None,
                ..
            }) => {}
            other => return Err(format!("wallclock without the mask: {other:?}").into()),
        }
        eprintln!(
            "cq_ex: {} has no completion timestamps (mask 0): refused before the call",
            env.ctx.name()
        );
        return Ok(());
    }
    // A device with the mask: read one.
    let cq = match ts {
        Ok(cq) => cq,
        Err(Error::Unsupported { errno: Some(e), .. }) => {
            eprintln!(
                "cq_ex: {} refused timestamps (errno {e}); not read",
                env.ctx.name()
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let mut p = ex_pair(env, QpType::Rc, cq, QpCaps::default(), AccessFlags::empty())?;
    let mut bufs = chunks(&p.pd, 2, 64)?;
    p.b.post_recv([RecvWr::new(1).sge(bufs.pop().unwrap())])?;
    p.a.post_send([SendWr::new(2, SendOp::Send).sge_len(bufs.pop().unwrap(), 8)])?;
    let mut stamps = Vec::new();
    let ExPair { cq, a, b, .. } = &mut p;
    drain(cq, 2, |wc| {
        ensure!(wc.is_success(), "{wc:?}");
        stamps.push(wc.completion_ts());
        reclaim(&mut [&mut *a, &mut *b], wc);
        Ok(())
    })?;
    ensure!(
        stamps
            .iter()
            .all(|&t| t & !attr.completion_timestamp_mask == 0),
        "timestamps {stamps:x?} outside the mask {:#x}",
        attr.completion_timestamp_mask
    );
    eprintln!("cq_ex: completion timestamps {stamps:?}");
    Ok(())
}

fn cvlan_and_flow_tag_refused_on_rxe(env: &Env) -> Result<(), Failed> {
    let rxe = is_rxe(env);
    for (name, r) in [
        ("cvlan", env.ctx.create_cq_ex(16).cvlan().build().map(drop)),
        (
            "flow_tag",
            env.ctx.create_cq_ex(16).flow_tag().build().map(drop),
        ),
    ] {
        match r {
            Err(Error::Unsupported { errno, .. }) if rxe => {
                ensure!(
                    errno == Some(libc::EOPNOTSUPP),
                    "rxe refused {name} with errno {errno:?}, expected EOPNOTSUPP"
                );
            }
            Err(Error::Unsupported { .. }) | Ok(()) if !rxe => {
                eprintln!("cq_ex: {name} on {}: {r:?}", env.ctx.name());
            }
            other => return Err(format!("{name}: {other:?} (rxe: {rxe})").into()),
        }
    }
    Ok(())
}

fn bad_arguments_refused_before_the_call(env: &Env) -> Result<(), Failed> {
    let max = env.ctx.attr().max_cqe;
    for cqe in [0, max.saturating_add(1)] {
        match env.ctx.create_cq_ex(cqe).build() {
            Err(Error::InvalidArgument {
                verb: "ibv_create_cq_ex",
                ..
            }) => {}
            other => return Err(format!("cqe {cqe}: {other:?}").into()),
        }
    }
    let channel = CompletionChannel::new(&env.ctx)?;
    let vectors = env.ctx.num_comp_vectors();
    match env.ctx.create_cq_ex(4).channel(&channel, vectors).build() {
        Err(Error::InvalidArgument {
            verb: "ibv_create_cq_ex",
            ..
        }) => {}
        other => return Err(format!("vector {vectors}: {other:?}").into()),
    }
    let other_ctx = rdma_verbs::Context::open(env.ctx.name())?;
    let foreign = CompletionChannel::new(&other_ctx)?;
    match env.ctx.create_cq_ex(4).channel(&foreign, 0).build() {
        Err(Error::InvalidArgument {
            verb: "ibv_create_cq_ex",
            ..
        }) => {}
        other => return Err(format!("a channel of another context: {other:?}").into()),
    }
    // With a channel of its own context it is made, and notifies.
    let cq = env.ctx.create_cq_ex(4).channel(&channel, 0).build()?;
    cq.req_notify(false)?;
    ensure!(cq.capacity() >= 4, "capacity {}", cq.capacity());
    ensure!(cq.as_cq().is_extended(), "as_cq is not marked extended");
    Ok(())
}

fn empty_cq_starts_no_batch(env: &Env) -> Result<(), Failed> {
    let mut cq = env.ctx.create_cq_ex(8).build()?;
    for _ in 0..3 {
        ensure!(cq.start_poll()?.is_none(), "a batch on an empty CQ");
    }
    ensure!(cq.wc_flags() == NoFields::WC_FLAGS, "wc_flags");
    Ok(())
}

/// More completions in total than the CQ holds, several per batch, each
/// batch drained to `ENOENT`: every completion is reclaimed exactly once
/// (a stale entry would reclaim nothing), and nothing is left. Calling
/// `ibv_end_poll` after rxe's `ENOENT` moves the consumer index past the
/// producer, which this catches.
fn many_drained_batches_see_each_completion_once(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq_ex(32).qp_num().build()?;
    let capacity = cq.capacity() as usize;
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        ..QpCaps::default()
    };
    let mut p = ex_pair(env, QpType::Rc, cq, caps, AccessFlags::empty())?;
    let mut free = chunks(&p.pd, 16, 64)?;
    let per_round = 4;
    let rounds = (capacity * 3) / (2 * per_round) + 2;
    let mut total = 0;
    let mut batch_sizes = Vec::new();
    for round in 0..rounds {
        let recvs: Vec<RecvWr> = (0..per_round)
            .map(|i| RecvWr::new(1000 + i as u64).sge(free.pop().unwrap()))
            .collect();
        p.b.post_recv(recvs)?;
        let sends: Vec<SendWr> = (0..per_round)
            .map(|i| SendWr::new(i as u64, SendOp::Send).sge_len(free.pop().unwrap(), 16))
            .collect();
        p.a.post_send(sends)?;
        // Let the completions pile up, so that batches hold several.
        std::thread::sleep(scaled(Duration::from_millis(5)));
        let ExPair { cq, a, b, .. } = &mut p;
        let sizes = drain(cq, 2 * per_round, |wc| {
            ensure!(wc.is_success(), "round {round}: {wc:?}");
            let back = reclaim(&mut [&mut *a, &mut *b], wc);
            ensure!(
                back.len() == 1,
                "round {round}: a completion reclaimed {} requests (stale or duplicate?): {wc:?}",
                back.len()
            );
            free.extend(back.into_iter().map(|(_, c)| c));
            Ok(())
        })?;
        total += 2 * per_round;
        batch_sizes.extend(sizes);
    }
    ensure!(
        total > capacity,
        "{total} completions do not exceed the capacity {capacity}"
    );
    ensure!(
        batch_sizes.iter().any(|&k| k > 1),
        "no batch held more than one completion: {batch_sizes:?}"
    );
    std::thread::sleep(scaled(Duration::from_millis(20)));
    ensure!(
        p.cq.start_poll()?.is_none(),
        "a completion left after all were reclaimed"
    );
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0 && free.len() == 16,
        "requests left outstanding"
    );
    eprintln!(
        "cq_ex: {total} completions through a CQ of {capacity} in {} batches (sizes {:?}...)",
        batch_sizes.len(),
        &batch_sizes[..batch_sizes.len().min(12)]
    );
    Ok(())
}

fn batch_dropped_midway_resumes_with_the_next(env: &Env) -> Result<(), Failed> {
    // Only a's send completions go to the extended CQ, in posting order.
    let mut cq = env.ctx.create_cq_ex(16).qp_num().build()?;
    let basic = env.ctx.create_cq(16)?;
    let pd = env.ctx.alloc_pd()?;
    let mut a = pd.create_qp(&QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq()))?;
    let mut b = pd.create_qp(&QpInitAttr::new(QpType::Rc, &basic, &basic))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    let n = 6;
    let mut bufs = chunks(&pd, 2 * n, 32)?;
    b.post_recv(
        bufs.drain(n..)
            .map(|c| RecvWr::new(0).sge(c))
            .collect::<Vec<_>>(),
    )?;
    a.post_send(
        bufs.into_iter()
            .enumerate()
            .map(|(i, c)| SendWr::new(i as u64, SendOp::Send).sge_len(c, 8))
            .collect::<Vec<_>>(),
    )?;
    for wc in poll_n(&basic, n)? {
        b.reclaim(&wc, drop);
    }
    std::thread::sleep(scaled(Duration::from_millis(20)));
    // Batches of at most two: each dropped after its second completion.
    let mut order = Vec::new();
    let mut dropped_early = 0;
    let (start, limit) = (Instant::now(), deadline());
    while order.len() < n {
        if let Some(mut batch) = cq.start_poll()? {
            for _ in 0..2 {
                let Some(wc) = batch.next()? else { break };
                ensure!(wc.is_success() && wc.qp_num() == a.qp_num(), "{wc:?}");
                let mut ids = Vec::new();
                a.reclaim(&wc, |d| ids.push(d.wr_id));
                ensure!(ids.len() == 1, "reclaimed {ids:?} for {wc:?}");
                order.extend(ids);
            }
            if order.len() < n {
                dropped_early += 1;
            }
            drop(batch);
        }
        ensure!(start.elapsed() < limit, "only {order:?} after {limit:?}");
    }
    ensure!(
        order == (0..n as u64).collect::<Vec<_>>(),
        "completions came back as {order:?}"
    );
    ensure!(dropped_early > 0, "no batch was dropped in the middle");
    ensure!(cq.start_poll()?.is_none(), "a completion left over");
    ensure!(a.outstanding_sends() == 0, "sends outstanding");
    Ok(())
}

fn basic_poll_refused_on_as_cq(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq_ex(8).standard().build()?;
    let mut wcs = [rdma_verbs::WorkCompletion::default(); 4];
    match cq.as_cq().poll(&mut wcs) {
        Err(Error::InvalidArgument {
            verb: "ibv_poll_cq",
            ..
        }) => {}
        other => return Err(format!("poll on an extended CQ: {other:?}").into()),
    }
    let _: &CompletionQueueEx<StandardFields> = &cq;
    Ok(())
}

fn flushed_completions_read_and_reclaimed(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq_ex(32).qp_num().build()?;
    let mut p = ex_pair(env, QpType::Rc, cq, QpCaps::default(), AccessFlags::empty())?;
    let bufs = chunks(&p.pd, 6, 64)?;
    p.a.post_recv(
        bufs.into_iter()
            .enumerate()
            .map(|(i, c)| RecvWr::new(50 + i as u64).sge(c))
            .collect::<Vec<_>>(),
    )?;
    p.a.modify(&QpAttr::new().state(QpState::Err))?;
    let mut back = Vec::new();
    let qa = p.a.qp_num();
    let ExPair { cq, a, .. } = &mut p;
    drain(cq, 6, |wc| {
        ensure!(
            wc.status() == Ok(WcStatus::WrFlushErr) && !wc.is_success(),
            "status {:?}",
            wc.status()
        );
        ensure!(wc.qp_num() == qa, "{wc:?}");
        let _ = wc.vendor_err();
        a.reclaim(wc, |d| back.push(d.wr_id));
        Ok(())
    })?;
    back.sort();
    ensure!(
        back == (50..56).collect::<Vec<u64>>(),
        "flushed receives handed back: {back:?}"
    );
    ensure!(p.a.outstanding_recvs() == 0, "receives outstanding");
    Ok(())
}

/// Waits (non-blocking reads, up to the deadline) for the channel's next
/// event; `None` when it stays empty that long.
fn next_event(
    ch: &CompletionChannel,
    wait: Duration,
) -> Result<Option<rdma_verbs::CqEvent>, Failed> {
    let start = Instant::now();
    loop {
        match ch.get_event() {
            Ok(ev) => return Ok(Some(ev)),
            Err(e) if e.errno() == Some(libc::EAGAIN) => {}
            Err(e) => return Err(e.into()),
        }
        if start.elapsed() > wait {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An extended CQ with a completion channel: armed, it signals one event
/// for the completions that follow (none before, none unarmed); a receive
/// taken from an SRQ, polled as a `PolledWc`, is reclaimed on the SRQ
/// itself (once: the QP's reclaim then ends nothing).
fn event_through_a_channel_and_srq_reclaim(env: &Env) -> Result<(), Failed> {
    let channel = CompletionChannel::new(&env.ctx)?;
    channel.set_nonblocking(true)?;
    let mut cq = env
        .ctx
        .create_cq_ex(16)
        .byte_len()
        .qp_num()
        .channel(&channel, 0)
        .build()?;
    let pd = env.ctx.alloc_pd()?;
    let srq = pd.create_srq(4, 1, 0)?;
    let attr = QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq());
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr.clone().srq(&srq))?;
    connect(env, &mut a, &mut b, AccessFlags::empty())?;
    cq.req_notify(false)?;
    ensure!(
        next_event(&channel, Duration::ZERO)?.is_none(),
        "an event before any completion"
    );
    for round in 0..2u64 {
        let mut bufs = chunks(&pd, 2, 64)?;
        let mut out = bufs.pop().unwrap();
        out.as_mut_slice()[..5].copy_from_slice(b"hello");
        srq.post_recv([RecvWr::new(7 + round).sge(bufs.pop().unwrap())])?;
        a.post_send([SendWr::new(1, SendOp::Send).sge_len(out, 5)])?;
        if round == 0 {
            // Armed: one event for this CQ.
            let ev = next_event(&channel, deadline())?.ok_or("no CQ event")?;
            ensure!(ev.is_for(cq.as_cq()), "an event for another CQ");
        }
        let (qa, qb) = (a.qp_num(), b.qp_num());
        let mut got = Vec::new();
        drain(&mut cq, 2, |wc| {
            ensure!(wc.is_success(), "{wc:?}");
            if wc.qp_num() == qb {
                let len = wc.byte_len() as usize;
                let n = srq.reclaim(wc, |d| {
                    let id = d.wr_id;
                    got.extend(d.chunks().map(|c| (id, c.as_slice()[..len].to_vec())))
                });
                ensure!(n == 1, "the SRQ ended {n} receives");
                ensure!(srq.reclaim(wc, drop) == 0, "a receive reclaimed twice");
                ensure!(b.reclaim(wc, drop) == 0, "reclaimed again through the QP");
            } else {
                ensure!(wc.qp_num() == qa, "qp_num {:#x}", wc.qp_num());
                ensure!(a.reclaim(wc, drop) == 1, "the send not ended");
            }
            Ok(())
        })?;
        ensure!(
            got == vec![(7 + round, b"hello".to_vec())],
            "round {round}: received {got:?}"
        );
        ensure!(srq.outstanding() == 0, "receives left in the SRQ");
        if round == 1 {
            // Not re-armed after the first event: no second one.
            ensure!(
                next_event(&channel, Duration::from_millis(100))?.is_none(),
                "an event without req_notify"
            );
        }
    }
    Ok(())
}

//! The extended send path (`ibv_create_qp_ex`, `ibv_wr_*` batches) on a
//! real device: every operation, UD and UC, several entries (how each
//! chunk comes back, aborted, refused or reset, is `ex_chunks_back.rs`'s).

use std::time::Duration;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Error, ProtectionDomain, QpInitAttr, QpState, QpType,
    QueuePair, WcOpcode, WcStatus, WorkCompletion,
};

use crate::common::{connect, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    creation_is_checked_first,
    every_rc_operation_in_one_batch,
    ud_batch_through_an_address_handle,
    uc_write_with_immediate,
    several_entries,
];

/// Everything an RC QP can post through a batch.
pub(crate) fn rc_ops() -> SendOpsFlags {
    SendOpsFlags::for_transport(QpType::Rc)
}

/// Two connected extended QPs of type `t` sharing one CQ.
pub(crate) struct ExPair {
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) a: QueuePair,
    pub(crate) b: QueuePair,
}

pub(crate) fn ex_pair(
    env: &Env,
    t: QpType,
    ops: SendOpsFlags,
    caps: QpCaps,
    access: AccessFlags,
) -> Result<ExPair, Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(256)?;
    let attr = QpInitAttr::new(t, &cq, &cq).caps(caps).send_ops(ops);
    let mut a = pd.create_qp(&attr)?;
    let mut b = pd.create_qp(&attr)?;
    ensure!(a.send_ops() == Some(ops), "send_ops {:?}", a.send_ops());
    connect(env, &mut a, &mut b, access)?;
    Ok(ExPair { pd, cq, a, b })
}

/// Two connected RC QPs with `caps` that post SEND only.
pub(crate) fn send_pair(env: &Env, caps: QpCaps) -> Result<ExPair, Failed> {
    ex_pair(
        env,
        QpType::Rc,
        SendOpsFlags::SEND,
        caps,
        AccessFlags::empty(),
    )
}

/// Posts `n` 64-byte receives on `p.b` (wr_ids 0..n).
pub(crate) fn post_recvs(p: &mut ExPair, n: usize) -> Result<(), Failed> {
    let bufs = chunks(&p.pd, n, 64)?;
    p.b.post_recv(
        bufs.into_iter()
            .enumerate()
            .map(|(i, c)| RecvWr::new(i as u64).sge(c)),
    )?;
    Ok(())
}

pub(crate) fn chunks(pd: &ProtectionDomain, n: usize, len: usize) -> Result<Vec<Chunk>, Failed> {
    Ok(pd.alloc_chunks(n, len, AccessFlags::LOCAL_WRITE)?)
}

/// Reclaims `wc` on whichever QP it belongs to: `(wr_id, signaled, chunks)`.
pub(crate) fn reclaim(
    qps: &mut [&mut QueuePair],
    wc: &WorkCompletion,
) -> Vec<(u64, bool, Vec<Chunk>)> {
    let mut back = Vec::new();
    for qp in qps.iter_mut() {
        qp.reclaim(wc, |c| {
            let (id, sig) = (c.wr_id, c.signaled);
            back.push((id, sig, c.chunks().collect()));
        });
    }
    back
}

fn creation_is_checked_first(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let refused = |t: QpType, ops: SendOpsFlags, needle: &str| -> Result<(), Failed> {
        match pd.create_qp(&QpInitAttr::new(t, &cq, &cq).send_ops(ops)) {
            Err(e @ Error::InvalidArgument { .. }) => {
                ensure!(e.to_string().contains(needle), "{t:?} {ops:?}: {e}");
                Ok(())
            }
            other => Err(format!("{t:?} {ops:?}: {other:?}").into()),
        }
    };
    refused(QpType::Rc, SendOpsFlags::empty(), "send_ops is empty")?;
    refused(QpType::Rc, SendOpsFlags::SEND | SendOpsFlags::TSO, "TSO")?;
    refused(QpType::Uc, SendOpsFlags::ATOMIC_WRITE, "UC QPs cannot post")?;
    refused(QpType::Ud, SendOpsFlags::FLUSH, "UD QPs cannot post")?;
    refused(QpType::Ud, SendOpsFlags::RDMA_WRITE, "UD QPs cannot post")?;
    refused(QpType::Uc, SendOpsFlags::RDMA_READ, "UC QPs cannot post")?;
    refused(QpType::Uc, SendOpsFlags::LOCAL_INV, "UC QPs cannot post")?;
    // A QP without send_ops has no batch.
    let mut plain = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    ensure!(plain.send_ops().is_none(), "plain QP has send_ops");
    match plain.start_batch() {
        Err(e) => ensure!(e.to_string().contains("without send_ops"), "{e}"),
        Ok(_) => return Err("a batch on a QP without send_ops".into()),
    }
    // Sends need RTS (or SQD, SQE, ERR): RESET is refused before any call.
    let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).send_ops(rc_ops()))?;
    match qp.start_batch() {
        Err(Error::QpState { state, .. }) => ensure!(state == QpState::Reset, "{state:?}"),
        other => return Err(format!("batch in RESET: {other:?}").into()),
    }
    ensure!(
        qp.query_state()? == QpState::Reset,
        "the QP moved: {:?}",
        qp.query_state()
    );
    Ok(())
}

fn every_rc_operation_in_one_batch(env: &Env) -> Result<(), Failed> {
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let caps = QpCaps {
        max_send_wr: 32,
        max_inline_data: 64,
        ..QpCaps::default()
    };
    let mut p = ex_pair(env, QpType::Rc, rc_ops(), caps, access)?;
    let mut region = crate::common::remote_region(&p.pd, 8192)?;
    region.write(0, &[0xee; 8192])?;
    region.write(0, &100u64.to_ne_bytes())?; // compare-and-swap target
    region.write(8, &5u64.to_ne_bytes())?; // fetch-and-add target
    region.write(4096, b"read me back")?;
    let at = |off: u64| RemoteAddr {
        addr: region.addr() + off,
        rkey: region.rkey(),
    };
    let mut bufs = chunks(&p.pd, 4, 256)?;
    let mut recv_bufs = chunks(&p.pd, 3, 256)?;
    p.b.post_recv(
        recv_bufs
            .drain(..)
            .enumerate()
            .map(|(i, c)| RecvWr::new(100 + i as u64).sge(c)),
    )?;
    let mut send = bufs.pop().unwrap();
    send.as_mut_slice()[..5].copy_from_slice(b"hello");
    let mut write = bufs.pop().unwrap();
    write.as_mut_slice()[..6].copy_from_slice(b"landed");
    let mut write_imm = bufs.pop().unwrap();
    write_imm.as_mut_slice()[..3].copy_from_slice(b"imm");
    let read_into = bufs.pop().unwrap();
    let mut olds = p.pd.alloc_chunks(2, 8, AccessFlags::LOCAL_WRITE)?;
    let (faa_old, cas_old) = (olds.pop().unwrap(), olds.pop().unwrap());

    let mut batch = p.a.start_batch()?;
    ensure!(batch.is_empty(), "a new batch holds requests");
    batch.post(SendWr::new(1, SendOp::Send).sge_len(send, 5))?;
    batch.post(SendWr::new(2, SendOp::SendWithImm(0xfeed)).inline(b"inline-imm"))?;
    batch.post(SendWr::new(3, SendOp::RdmaWrite(at(1000))).sge_len(write, 6))?;
    batch.post(SendWr::new(4, SendOp::RdmaWriteWithImm(at(2000), 77)).sge_len(write_imm, 3))?;
    batch.post(SendWr::new(5, SendOp::RdmaRead(at(4096))).sge_len(read_into, 12))?;
    batch.post(
        SendWr::new(
            6,
            SendOp::CompareSwap {
                remote: at(0),
                compare: 100,
                swap: 200,
            },
        )
        .sge(cas_old),
    )?;
    batch.post(
        SendWr::new(
            7,
            SendOp::FetchAdd {
                remote: at(8),
                add: 3,
            },
        )
        .sge(faa_old),
    )?;
    ensure!(batch.len() == 7, "batch holds {}", batch.len());
    batch.complete()?;
    ensure!(
        p.a.outstanding_sends() == 7,
        "{} outstanding",
        p.a.outstanding_sends()
    );

    // 7 send completions and 3 receives (send, send-with-imm, write-with-imm).
    let wcs = poll_n(&p.cq, 10)?;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for wc in &wcs {
        ensure!(wc.status() == Ok(WcStatus::Success), "{wc:?}");
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        ensure!(back.len() == 1, "{wc:?} ended {} requests", back.len());
        let (id, signaled, chunks) = back.into_iter().next().unwrap();
        ensure!(signaled, "{id} not signalled");
        if wc.qp_num() == p.b.qp_num() {
            let c = chunks.into_iter().next().ok_or("receive without chunk")?;
            // A write with immediate lands in the region, not the buffer.
            let data = if wc.opcode() == Ok(WcOpcode::RecvRdmaWithImm) {
                ensure!(
                    wc.byte_len() == 3,
                    "write-with-imm byte_len {}",
                    wc.byte_len()
                );
                Vec::new()
            } else {
                c.as_slice()[..wc.byte_len() as usize].to_vec()
            };
            recvs.push((wc.opcode(), wc.imm_data(), data));
        } else {
            sends.push((id, wc.opcode(), chunks));
        }
    }
    let ids: Vec<u64> = sends.iter().map(|s| s.0).collect();
    ensure!(
        ids == [1, 2, 3, 4, 5, 6, 7],
        "send completions in order {ids:?}"
    );
    let ops: Vec<_> = sends.iter().map(|s| s.1).collect();
    ensure!(
        ops == [
            Ok(WcOpcode::Send),
            Ok(WcOpcode::Send),
            Ok(WcOpcode::RdmaWrite),
            Ok(WcOpcode::RdmaWrite),
            Ok(WcOpcode::RdmaRead),
            Ok(WcOpcode::CompSwap),
            Ok(WcOpcode::FetchAdd),
        ],
        "opcodes {ops:?}"
    );
    ensure!(sends[1].2.is_empty(), "the inline send lent no chunk");
    ensure!(
        &sends[4].2[0].as_slice()[..12] == b"read me back",
        "the read brought back other bytes"
    );
    let old = |c: &Chunk| u64::from_ne_bytes(c.as_slice()[..8].try_into().unwrap());
    ensure!(
        old(&sends[5].2[0]) == 100,
        "CAS old value {}",
        old(&sends[5].2[0])
    );
    ensure!(
        old(&sends[6].2[0]) == 5,
        "FAA old value {}",
        old(&sends[6].2[0])
    );
    let mut word = [0u8; 8];
    region.read(0, &mut word)?;
    ensure!(u64::from_ne_bytes(word) == 200, "CAS did not swap");
    region.read(8, &mut word)?;
    ensure!(u64::from_ne_bytes(word) == 8, "FAA did not add");
    let mut landed = [0u8; 6];
    region.read(1000, &mut landed)?;
    ensure!(&landed == b"landed", "the write did not land: {landed:?}");
    region.read(2000, &mut landed[..3])?;
    ensure!(
        &landed[..3] == b"imm",
        "the write with immediate did not land"
    );

    ensure!(
        recvs
            == [
                (Ok(WcOpcode::Recv), None, b"hello".to_vec()),
                (Ok(WcOpcode::Recv), Some(0xfeed), b"inline-imm".to_vec()),
                (Ok(WcOpcode::RecvRdmaWithImm), Some(77), Vec::new()),
            ],
        "receives {recvs:?}"
    );
    ensure!(
        p.a.outstanding_sends() == 0 && p.b.outstanding_recvs() == 0,
        "requests left"
    );
    Ok(())
}

fn ud_batch_through_an_address_handle(env: &Env) -> Result<(), Failed> {
    let mut p = ex_pair(
        env,
        QpType::Ud,
        SendOpsFlags::SEND | SendOpsFlags::SEND_WITH_IMM,
        QpCaps::default(),
        AccessFlags::empty(),
    )?;
    let (ah, eb) = crate::common::ud_dest(env, &p.pd, &p.b)?;
    let mut bufs = chunks(&p.pd, 3, 1024 + 40)?;
    let mut send = bufs.pop().unwrap();
    send.as_mut_slice()[..9].copy_from_slice(b"datagram!");
    p.b.post_recv(
        bufs.drain(..)
            .enumerate()
            .map(|(i, c)| RecvWr::new(i as u64).sge(c)),
    )?;
    // A UD send without a destination is refused, and the batch goes on.
    let mut batch = p.a.start_batch()?;
    let e = batch
        .post(SendWr::new(9, SendOp::Send).inline(b"x"))
        .err()
        .ok_or("a UD send without a destination was accepted")?;
    ensure!(
        e.posted == 0 && e.error.to_string().contains("destination"),
        "{e}"
    );
    batch.post(SendWr::new(1, SendOp::SendWithImm(42)).sge_len(send, 9).ud(
        &ah,
        eb.qpn,
        QKey::PINGPONG,
    ))?;
    batch.post(
        SendWr::new(2, SendOp::Send)
            .inline(b"inline")
            .ud(&ah, eb.qpn, QKey::PINGPONG),
    )?;
    batch.complete()?;
    drop(ah); // the requests keep their address handle alive
    let wcs = poll_n(&p.cq, 4)?;
    let mut payloads = Vec::new();
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        ensure!(back.len() == 1, "{wc:?}");
        if wc.qp_num() == p.b.qp_num() {
            ensure!(wc.src_qp() == p.a.qp_num(), "src_qp {}", wc.src_qp());
            let c = &back[0].2[0];
            payloads.push((
                wc.imm_data(),
                c.as_slice()[40..wc.byte_len() as usize].to_vec(),
            ));
        }
    }
    ensure!(
        payloads
            == [
                (Some(42), b"datagram!".to_vec()),
                (None, b"inline".to_vec())
            ],
        "{payloads:?}"
    );
    Ok(())
}

fn uc_write_with_immediate(env: &Env) -> Result<(), Failed> {
    let ops = SendOpsFlags::for_transport(QpType::Uc) - SendOpsFlags::BIND_MW;
    let mut p = ex_pair(
        env,
        QpType::Uc,
        ops,
        QpCaps::default(),
        AccessFlags::REMOTE_WRITE,
    )?;
    let region = crate::common::remote_region(&p.pd, 4096)?;
    let mut bufs = chunks(&p.pd, 2, 128)?;
    let mut src = bufs.pop().unwrap();
    src.as_mut_slice()[..4].copy_from_slice(b"ucwr");
    p.b.post_recv([RecvWr::new(5).sge(bufs.pop().unwrap())])?;
    let remote = RemoteAddr {
        addr: region.addr() + 64,
        rkey: region.rkey(),
    };
    let mut batch = p.a.start_batch()?;
    let e = batch
        .post(SendWr::new(8, SendOp::RdmaRead(remote)).sge(chunks(&p.pd, 1, 8)?.remove(0)))
        .err()
        .ok_or("a UC read was accepted")?;
    ensure!(e.returned.len() == 1, "the refused read's chunk came back");
    batch.post(SendWr::new(1, SendOp::RdmaWriteWithImm(remote, 9)).sge_len(src, 4))?;
    batch.complete()?;
    let wcs = poll_n(&p.cq, 2)?;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        ensure!(reclaim(&mut [&mut p.a, &mut p.b], wc).len() == 1, "{wc:?}");
        if wc.qp_num() == p.b.qp_num() {
            ensure!(wc.imm_data() == Some(9), "{wc:?}");
        }
    }
    let mut got = [0u8; 4];
    region.read(64, &mut got)?;
    ensure!(&got == b"ucwr", "{got:?}");
    Ok(())
}

fn several_entries(env: &Env) -> Result<(), Failed> {
    let caps = QpCaps {
        max_send_sge: 3,
        ..QpCaps::default()
    };
    let mut p = send_pair(env, caps)?;
    let mut bufs = chunks(&p.pd, 4, 64)?;
    let dst =
        p.pd.alloc_chunks(1, 512, AccessFlags::LOCAL_WRITE)?
            .remove(0);
    p.b.post_recv([RecvWr::new(1).sge(dst)])?;
    for (i, c) in bufs.iter_mut().enumerate() {
        c.as_mut_slice().fill(b'a' + i as u8);
    }
    let (c3, c2, c1) = (
        bufs.pop().unwrap(),
        bufs.pop().unwrap(),
        bufs.pop().unwrap(),
    );
    let mut batch = p.a.start_batch()?;
    // Entries of equal length: exact on every provider.
    batch.post(
        SendWr::new(1, SendOp::Send)
            .sge_len(c1, 10)
            .sge_len(c2, 10)
            .sge_len(c3, 10),
    )?;
    // Unequal entries: rxe's ibv_wr_set_sge_list would count them wrong,
    // so they are refused there (with the chunks back); elsewhere they go.
    let (a, b) = (bufs.pop().unwrap(), chunks(&p.pd, 1, 64)?.remove(0));
    let unequal = batch.post(SendWr::new(2, SendOp::Send).sge_len(a, 5).sge_len(b, 20));
    let rxe = crate::common::is_rxe(env);
    match (&unequal, rxe) {
        (Err(e), true) => {
            ensure!(matches!(e.error, Error::Unsupported { .. }), "{e}");
            ensure!(e.returned.len() == 2 && e.posted == 0, "{e:?}");
        }
        (Ok(()), false) => {}
        (other, _) => return Err(format!("unequal entries, rxe={rxe}: {other:?}").into()),
    }
    batch.complete()?;
    let n = if rxe { 2 } else { 3 };
    if !rxe {
        p.b.post_recv([RecvWr::new(2).sge(chunks(&p.pd, 1, 512)?.remove(0))])?;
    }
    let wcs = poll_n(&p.cq, n)?;
    for wc in &wcs {
        ensure!(wc.is_success(), "{wc:?}");
        let back = reclaim(&mut [&mut p.a, &mut p.b], wc);
        if wc.qp_num() == p.b.qp_num() && back[0].0 == 1 {
            ensure!(wc.byte_len() == 30, "byte_len {}", wc.byte_len());
            let got = &back[0].2[0].as_slice()[..30];
            let want: Vec<u8> = [b'b', b'c', b'd'].iter().flat_map(|&x| [x; 10]).collect();
            ensure!(got == want.as_slice(), "{got:?}");
        } else if wc.qp_num() == p.a.qp_num() && back[0].0 == 1 {
            ensure!(back[0].2.len() == 3, "3 chunks back, in order");
            ensure!(
                back[0]
                    .2
                    .iter()
                    .map(|c| c.as_slice()[0])
                    .collect::<Vec<_>>()
                    == b"bcd",
                "chunks back out of order"
            );
        }
    }
    Ok(())
}

/// Nothing arrives at `qp`'s CQ for a little while.
pub(crate) fn quiet(cq: &CompletionQueue, what: &str) -> Result<(), Failed> {
    let mut wcs = [WorkCompletion::default(); 4];
    let until = std::time::Instant::now() + crate::common::scaled(Duration::from_millis(300));
    while std::time::Instant::now() < until {
        let got = cq.poll(&mut wcs)?;
        ensure!(got.is_empty(), "{what}: {got:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

//! What both sides of a connection do: set up the verbs objects and the
//! buffers, move a QP of the program's own (`-q`), send the 16-byte
//! messages, disconnect and free.

use std::sync::mpsc;
use std::time::Duration;

use rdma_verbs::cm::{CmId, ConnParam};
use rdma_verbs::qp::{QpAttr, SendOp, SendWr};
use rdma_verbs::{
    AccessFlags, CompletionChannel, Error, QpCaps, QpInitAttr, QpState, QpType, QueuePair,
};

use crate::cb::{self, Cb, Conn, INFO_LEN, WR_SEND};
use crate::opts::Opts;
use crate::out;
use crate::time;

/// `RPING_SQ_DEPTH`: send queue depth; the CQ has room for twice that.
const SQ_DEPTH: u32 = 16;
/// `ENOMEM`, returned negated by the C buffer setup when malloc fails.
const ENOMEM: i32 = 12;

/// The connection parameters of the C program's `rdma_connect` (and of
/// its `rdma_accept` with `-q`): one RDMA read each way, 7 retries, RNR
/// retry forever; with `-q` the QP number of the program's own QP.
pub fn conn_param(qp: Option<&QueuePair>) -> ConnParam<'static> {
    let p = ConnParam::new()
        .responder_resources(1)
        .initiator_depth(1)
        .retry_count(7)
        .rnr_retry_count(7);
    match qp {
        Some(qp) => p.qp_num(qp.qp_num()),
        None => p,
    }
}

/// `rping_setup_qp`: PD, completion channel, CQ and QP on the id's device.
/// `Err`: the C return value (the message is printed).
fn setup_qp(id: &CmId, o: &Opts) -> Result<Conn, i32> {
    let ctx = id.context().map_err(|e| {
        eprintln!("ibv_alloc_pd failed");
        out::ret_of(&e)
    })?;
    let pd = ctx.alloc_pd().map_err(|e| {
        eprintln!("ibv_alloc_pd failed");
        out::ret_of(&e)
    })?;
    debug_log!("created pd {:p}", &pd);
    let cc = CompletionChannel::new(&ctx).map_err(|e| {
        eprintln!("ibv_create_comp_channel failed");
        out::ret_of(&e)
    })?;
    debug_log!("created channel {:p}", &cc);
    let cq = ctx
        .create_cq_with_channel(SQ_DEPTH * 2, &cc, 0)
        .map_err(|e| {
            eprintln!("ibv_create_cq failed");
            out::ret_of(&e)
        })?;
    debug_log!("created cq {:p}", &cq);
    cq.req_notify(false).map_err(|e| {
        // (The C program's message for this step.)
        eprintln!("ibv_create_cq failed");
        out::ret_of(&e)
    })?;
    let attr = QpInitAttr::new(QpType::Rc, &cq, &cq).caps(QpCaps {
        max_send_wr: SQ_DEPTH,
        max_recv_wr: 2,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    });
    let qp = if o.self_create_qp {
        // A QP of our own, moved to INIT at once (pkey 0, the id's port,
        // no remote access yet) so that a receive can be posted; the CM's
        // attributes move it on when the connection is made.
        let mut qp = pd.create_qp(&attr).map_err(|e| {
            out::perror("ibv_create_qp", &e);
            -1
        })?;
        let init = QpAttr::new()
            .state(QpState::Init)
            .pkey_index(0)
            .port(id.port_num())
            .access_flags(AccessFlags::empty());
        qp.modify(&init).map_err(|e| {
            out::perror("ibv_modify_qp", &e);
            -1
        })?;
        qp
    } else {
        id.create_qp(&pd, &attr).map_err(|e| {
            out::perror("rdma_create_qp", &e);
            -1
        })?
    };
    debug_log!("created qp {:p}", &qp);
    Ok(Conn {
        pd,
        cc,
        cq,
        qp,
        recv: None,
        sends: Vec::new(),
        rdma: None,
        start: None,
        sink: None,
    })
}

/// `rping_setup_buffers`: the receive buffer, the send buffers and the
/// RDMA buffer(s) of `-S` bytes. The client's two are registered for
/// remote read and write, as in C, and advertised to the server; the
/// server's is only a local source and target.
fn setup_buffers(cb: &mut Cb<'_>, o: &Opts) -> Result<(), i32> {
    debug_log!("rping_setup_buffers called on cb {:p}", cb);
    let server = cb.server;
    let conn = cb.conn.as_mut().ok_or(-1)?;
    let mut recv = conn
        .pd
        .alloc_chunks(1, INFO_LEN, AccessFlags::LOCAL_WRITE)
        .map_err(|e| {
            eprintln!("recv_buf reg_mr failed");
            out::ret_of(&e)
        })?;
    conn.recv = recv.pop();
    // One per send the queue can hold, so one is always free to fill.
    conn.sends = conn
        .pd
        .alloc_chunks(SQ_DEPTH as usize, INFO_LEN, AccessFlags::empty())
        .map_err(|e| {
            eprintln!("send_buf reg_mr failed");
            out::ret_of(&e)
        })?;
    // A size below 1 only gets here through the C parser's quirk of a later
    // -a clearing an earlier size error; C's malloc of it fails.
    let Ok(size) = usize::try_from(o.size) else {
        eprintln!("rdma_buf malloc failed");
        return Err(-ENOMEM);
    };
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    if server {
        let mut rdma = conn
            .pd
            .alloc_chunks(1, size, AccessFlags::LOCAL_WRITE)
            .map_err(|e| {
                eprintln!("rdma_buf reg_mr failed");
                out::ret_of(&e)
            })?;
        conn.rdma = rdma.pop();
    } else {
        conn.sink = Some(conn.pd.register(size, remote).map_err(|e| {
            eprintln!("rdma_buf reg_mr failed");
            out::ret_of(&e)
        })?);
        conn.start = Some(conn.pd.register(size, remote).map_err(|e| {
            eprintln!("start_buf reg_mr failed");
            out::ret_of(&e)
        })?);
    }
    debug_log!("allocated & registered buffers...");
    Ok(())
}

/// PD to buffers, the first receive posted and the CQ thread started: the
/// common part of both sides. `Err`: the C return value.
pub fn setup(cb: &mut Cb<'_>, id: &CmId, o: &Opts, tx: mpsc::Sender<cb::Msg>) -> Result<(), i32> {
    cb.conn = Some(setup_qp(id, o).inspect_err(|ret| eprintln!("setup_qp failed: {ret}"))?);
    setup_buffers(cb, o).inspect_err(|ret| eprintln!("rping_setup_buffers failed: {ret}"))?;
    cb.post_recv()
        .inspect_err(|ret| eprintln!("ibv_post_recv failed: {ret}"))?;
    let conn = cb.conn.as_ref().ok_or(-1)?;
    cb::spawn_cq_thread(conn.cc.clone(), conn.cq.clone(), tx);
    Ok(())
}

/// `rping_self_modify_qp`: INIT, RTR and RTS with the CM's attributes.
pub fn self_modify_qp(id: &CmId, qp: &mut QueuePair) -> Result<(), Error> {
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        qp.modify(&id.init_qp_attr(state)?)?;
    }
    Ok(())
}

/// `rping_disconnect`, then what C's join of the CQ thread waits for: the
/// flushed receive. Also waits (briefly) for the DISCONNECTED event, whose
/// line the C program's CM thread prints meanwhile. (When the peer
/// disconnected first, the CM thread has answered it already, and this
/// `rdma_disconnect` changes nothing.)
pub fn disconnect(cb: &mut Cb<'_>, id: &CmId, o: &Opts) {
    if let Some(conn) = cb.conn.as_mut() {
        if o.self_create_qp {
            // Our own QP: the CM does not move it.
            if conn.qp.modify(&QpAttr::new().state(QpState::Err)).is_err() {
                return;
            }
        }
    }
    let _ = id.disconnect();
    cb.drain_until(time::scaled(Duration::from_secs(5)), Cb::cq_quiet);
    cb.drain_until(time::scaled(Duration::from_secs(2)), |cb| cb.disconnected);
}

/// Sends a `rping_rdma_info` (16 zero bytes when `info` is `None`).
/// `Err`: the C return value of the failed post.
pub fn send_info(cb: &mut Cb<'_>, info: Option<(u64, u32, u32)>) -> Result<(), i32> {
    let mut chunk = cb.send_chunk().ok_or(-1)?;
    if let Some((addr, rkey, len)) = info {
        let b = chunk.as_mut_slice();
        b[0..8].copy_from_slice(&addr.to_be_bytes());
        b[8..12].copy_from_slice(&rkey.to_be_bytes());
        b[12..16].copy_from_slice(&len.to_be_bytes());
        debug_log!("RDMA addr {addr:x} rkey {rkey:x} len {}", len as i32);
    }
    let conn = cb.conn.as_mut().ok_or(-1)?;
    conn.qp
        .post_send([SendWr::new(WR_SEND, SendOp::Send).sge(chunk)])
        .map_err(|mut e| {
            conn.sends.append(&mut e.returned);
            out::ret_of(&e.error)
        })
}

/// The bytes of a C string: up to the first NUL (or all of them).
pub fn c_str(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// Prints `prefix` and a C string, as `printf("%s%s\n")`.
pub fn print_c_str(prefix: &str, s: &[u8]) {
    let mut line = Vec::with_capacity(prefix.len() + s.len() + 1);
    line.extend_from_slice(prefix.as_bytes());
    line.extend_from_slice(c_str(s));
    line.push(b'\n');
    out::print_bytes(&line);
}

/// `rping_free_buffers` and `rping_free_qp`.
pub fn free_buffers(cb: &mut Cb<'_>) {
    debug_log!("rping_free_buffers called on cb {:p}", cb);
    cb.conn = None;
}

//! The server: listen, accept, serve the pings (`rping_run_server`), and
//! the persistent server (`-P`), which serves each connection in a thread
//! of its own.

use std::sync::{mpsc, Arc};
use std::thread;

use rdma_verbs::cm::{CmId, ConnParam};
use rdma_verbs::qp::{RemoteAddr, SendOp, SendWr};
use rdma_verbs::Chunk;

use crate::cb::{self, Cb, Conn, Routes, State, WR_RDMA};
use crate::conn::{
    c_str, conn_param, disconnect, free_buffers, print_c_str, self_modify_qp, send_info, setup,
};
use crate::opts::Opts;
use crate::out;

/// `rping_bind_server`: bind to `-a` (default: any IPv4 address) and
/// listen with a backlog of 3. `Err`: the C return value.
pub fn bind_server(o: &Opts, id: &CmId) -> Result<(), i32> {
    id.bind(o.addr_with_port()).map_err(|e| {
        out::perror("rdma_bind_addr", &e);
        -1
    })?;
    debug_log!("rdma_bind_addr successful");
    debug_log!("rdma_listen");
    id.listen(3).map_err(|e| {
        out::perror("rdma_listen", &e);
        -1
    })
}

/// `rping_accept`.
fn accept(cb: &mut Cb<'_>, child: &CmId, o: &Opts) -> Result<(), i32> {
    debug_log!("accepting client connection request");
    let conn = cb.conn.as_mut().ok_or(-1)?;
    let r = if o.self_create_qp {
        self_modify_qp(child, &mut conn.qp).map_err(|e| out::ret_of(&e))?;
        child.accept(&conn_param(Some(&conn.qp)))
    } else {
        // rdma_accept(id, NULL): the depths the client asked for.
        child.accept(&ConnParam::new())
    };
    r.map_err(|e| {
        out::perror("rdma_accept", &e);
        -1
    })?;
    let state = cb.wait();
    if state == State::Error {
        eprintln!("wait for CONNECTED state {state}");
        return Err(-1);
    }
    Ok(())
}

/// `rping_test_server`: serves pings until the client disconnects (0) or
/// something fails.
fn test_server(cb: &mut Cb<'_>, o: &Opts) -> i32 {
    let mut ret;
    loop {
        // Wait for the client's source buffer.
        if let Err(e) = cb.wait_for(State::RdmaReadAdv) {
            ret = e;
            break;
        }
        debug_log!("server received sink adv");

        ret = read_remote(cb);
        if ret != 0 {
            eprintln!("post send error {ret}");
            break;
        }
        debug_log!("server posted rdma read req ");
        if let Err(e) = cb.wait_for(State::RdmaReadComplete) {
            ret = e;
            break;
        }
        debug_log!("server received read complete");
        if o.verbose {
            if let Some(buf) = cb.conn.as_ref().and_then(|c| c.rdma.as_ref()) {
                print_c_str("server ping data: ", buf.as_slice());
            }
        }
        // Tell the client to go on.
        if let Err(e) = send_info(cb, None) {
            eprintln!("post send error {e}");
            ret = e;
            break;
        }
        debug_log!("server posted go ahead");

        // Wait for the client's sink buffer.
        if let Err(e) = cb.wait_for(State::RdmaWriteAdv) {
            ret = e;
            break;
        }
        debug_log!("server received sink adv");
        ret = write_remote(cb);
        if ret != 0 {
            eprintln!("post send error {ret}");
            break;
        }
        if let Err(e) = cb.wait_for(State::RdmaWriteComplete) {
            ret = e;
            break;
        }
        debug_log!("server rdma write complete ");
        if let Err(e) = send_info(cb, None) {
            eprintln!("post send error {e}");
            ret = e;
            break;
        }
        debug_log!("server posted go ahead");
    }
    if cb.state == State::Disconnected {
        0
    } else {
        ret
    }
}

/// Posts the RDMA READ of the client's advertised buffer into ours; the C
/// return value of the post.
///
/// The C server READs the advertised length whatever its own `-S`; a
/// longer READ than its buffer fails on the device with a local protection
/// error (`cq completion failed status 4`). The crate refuses to post a
/// scatter entry longer than its chunk, so that case is reported here the
/// way the C program's completion handler reports it.
fn read_remote(cb: &mut Cb<'_>) -> i32 {
    let remote = cb.remote;
    let Some(conn) = cb.conn.as_mut() else {
        return -1;
    };
    let Some(chunk) = conn.rdma.take() else {
        return -1;
    };
    let len = remote.len as usize;
    if len > chunk.len() {
        conn.rdma = Some(chunk);
        debug_log!("server posted rdma read req ");
        eprintln!(
            "cq completion failed status {}",
            rdma_verbs::WcStatus::LocProtErr.as_raw()
        );
        cb.fail_cq();
        return 0;
    }
    let op = SendOp::RdmaRead(RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey,
    });
    post_rdma(conn, op, chunk, len)
}

/// Posts the RDMA WRITE of our buffer's string (`strlen + 1` bytes) to the
/// client's sink; the C return value of the post.
fn write_remote(cb: &mut Cb<'_>) -> i32 {
    let remote = cb.remote;
    let Some(conn) = cb.conn.as_mut() else {
        return -1;
    };
    let Some(chunk) = conn.rdma.take() else {
        return -1;
    };
    let len = (c_str(chunk.as_slice()).len() + 1).min(chunk.len());
    debug_log!(
        "rdma write from lkey {:x} laddr {:x} len {len}",
        chunk.lkey(),
        chunk.addr()
    );
    let op = SendOp::RdmaWrite(RemoteAddr {
        addr: remote.addr,
        rkey: remote.rkey,
    });
    post_rdma(conn, op, chunk, len)
}

/// Posts one RDMA request on `len` bytes of our buffer `chunk`; the C
/// return value of the post (a refused post gives the buffer back).
fn post_rdma(conn: &mut Conn, op: SendOp, chunk: Chunk, len: usize) -> i32 {
    match conn
        .qp
        .post_send([SendWr::new(WR_RDMA, op).sge_len(chunk, len)])
    {
        Ok(()) => 0,
        Err(mut e) => {
            conn.rdma = e.returned.pop();
            out::ret_of(&e.error)
        }
    }
}

/// One connection of the server, on the request's new id `child`: set
/// up, accept, serve, disconnect. `persistent`: as the `-P` thread, which
/// does not report the result of the pings.
fn serve(
    cb: &mut Cb<'_>,
    child: &CmId,
    o: &Opts,
    tx: mpsc::Sender<cb::Msg>,
    persistent: bool,
) -> i32 {
    if let Err(ret) = setup(cb, child, o, tx) {
        return ret;
    }
    if let Err(ret) = accept(cb, child, o) {
        eprintln!("connect error {ret}");
        free_buffers(cb);
        return ret;
    }
    let mut ret = test_server(cb, o);
    if ret != 0 && !persistent {
        eprintln!("rping server failed: {ret}");
    }
    if persistent {
        ret = 0;
    }
    disconnect(cb, child, o);
    free_buffers(cb);
    ret
}

/// `rping_run_server`: one connection, then the program ends.
pub fn run_server(
    o: &Opts,
    id: &CmId,
    rx: mpsc::Receiver<cb::Msg>,
    tx: mpsc::Sender<cb::Msg>,
    routes: &Routes,
) -> i32 {
    if let Err(ret) = bind_server(o, id) {
        return ret;
    }
    let mut cb = Cb::new(true, rx, id.key());
    let child = match cb.wait_request() {
        Ok(child) => child,
        Err(ret) => return ret,
    };
    let child = Arc::new(child);
    cb::route(routes, child.key(), tx.clone(), Some(child.clone()));
    let ret = serve(&mut cb, &child, o, tx, false);
    cb::unroute(routes, child.key());
    ret
}

/// `rping_run_persistent_server`: a thread per connection, forever.
pub fn run_persistent_server(
    o: &Opts,
    id: &CmId,
    rx: mpsc::Receiver<cb::Msg>,
    routes: &Routes,
) -> i32 {
    if let Err(ret) = bind_server(o, id) {
        return ret;
    }
    let mut listening = Cb::new(true, rx, id.key());
    loop {
        let child = match listening.wait_request() {
            Ok(child) => child,
            Err(ret) => return ret,
        };
        let (tx, rx) = mpsc::channel();
        let child = Arc::new(child);
        cb::route(routes, child.key(), tx.clone(), Some(child.clone()));
        let (o, routes, parent) = (o.clone(), routes.clone(), id.key());
        thread::spawn(move || {
            let mut cb = Cb::new(true, rx, parent);
            cb.state = State::ConnectRequest;
            serve(&mut cb, &child, &o, tx, true);
            cb::unroute(&routes, child.key());
            drop(cb);
            drop(child);
            if out::fatal() {
                out::exit(-1);
            }
        });
    }
}

//! The client: resolve, connect, ping, disconnect (`rping_run_client`).

use std::sync::mpsc;
use std::time::Duration;

use rdma_verbs::cm::CmId;

use crate::cb::{self, Cb, State};
use crate::conn::{
    conn_param, disconnect, free_buffers, print_c_str, self_modify_qp, send_info, setup,
};
use crate::opts::Opts;
use crate::out;

/// The address and route resolution timeout.
const RESOLVE_TIMEOUT: Duration = Duration::from_millis(2000);

/// The ping text: `snprintf(buf, size, "rdma-ping-%d: ", ping)`, then from
/// where that text ends, characters counting up from `start`, wrapping from
/// `z` to `A`, and a NUL at the end.
fn ping_text(ping: i32, start: u8, size: usize) -> Vec<u8> {
    let head = format!("rdma-ping-{ping}: ");
    let mut buf = vec![0u8; size];
    let n = head.len().min(size.saturating_sub(1));
    buf[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = start;
    for b in buf.iter_mut().skip(head.len()) {
        *b = c;
        c += 1;
        if c > b'z' {
            c = b'A';
        }
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
    buf
}

/// `rping_connect_client`.
fn connect_client(cb: &mut Cb<'_>, id: &CmId, o: &Opts) -> Result<(), i32> {
    let conn = cb.conn.as_ref().ok_or(-1)?;
    let own = o.self_create_qp.then_some(&conn.qp);
    id.connect(&conn_param(own)).map_err(|e| {
        out::perror("rdma_connect", &e);
        -1
    })?;
    cb.wait_for(State::Connected)?;
    if o.self_create_qp {
        let conn = cb.conn.as_mut().ok_or(-1)?;
        self_modify_qp(id, &mut conn.qp).map_err(|e| {
            out::perror("rping_modify_qp", &e);
            out::ret_of(&e)
        })?;
        id.establish().map_err(|e| {
            out::perror("rdma_establish", &e);
            -1
        })?;
    }
    debug_log!("rdma_connect successful");
    Ok(())
}

/// `rping_test_client`: the pings. 0 also when the server disconnected.
fn test_client(cb: &mut Cb<'_>, o: &Opts) -> i32 {
    let size = usize::try_from(o.size).unwrap_or(0);
    let mut start = b'A';
    let mut ping: i32 = 0;
    let mut ret = 0;
    while o.count == 0 || ping < o.count {
        cb.state = State::RdmaReadAdv;
        let text = ping_text(ping, start, size);
        start = if start >= b'z' { b'A' } else { start + 1 };
        let Some(conn) = cb.conn.as_mut() else {
            return -1;
        };
        let (Some(src), Some(sink)) = (conn.start.as_mut(), conn.sink.as_ref()) else {
            return -1;
        };
        if src.write(0, &text).is_err() {
            return -1;
        }
        let src_info = (src.addr(), src.rkey(), o.size as u32);
        let sink_info = (sink.addr(), sink.rkey(), o.size as u32);

        if let Err(e) = send_info(cb, Some(src_info)) {
            eprintln!("post send error {e}");
            ret = e;
            break;
        }
        // Wait for the server to have read it.
        if let Err(e) = cb.wait_for(State::RdmaWriteAdv) {
            ret = e;
            break;
        }
        if let Err(e) = send_info(cb, Some(sink_info)) {
            eprintln!("post send error {e}");
            ret = e;
            break;
        }
        // Wait for the server to have written it back.
        if let Err(e) = cb.wait_for(State::RdmaWriteComplete) {
            ret = e;
            break;
        }
        let Some(conn) = cb.conn.as_ref() else {
            return -1;
        };
        let (Some(src), Some(sink)) = (conn.start.as_ref(), conn.sink.as_ref()) else {
            return -1;
        };
        let mut back = vec![0u8; size];
        if sink.read(0, &mut back).is_err() {
            return -1;
        }
        if o.validate {
            let mut sent = vec![0u8; size];
            if src.read(0, &mut sent).is_err() || sent != back {
                eprintln!("data mismatch!");
                ret = -1;
                break;
            }
        }
        if o.verbose {
            print_c_str("ping data: ", &back);
        }
        ping = ping.wrapping_add(1);
    }
    if cb.state == State::Disconnected {
        0
    } else {
        ret
    }
}

/// `rping_run_client`: resolve, set up, connect, ping, disconnect.
pub fn run_client(
    o: &Opts,
    id: &CmId,
    rx: mpsc::Receiver<cb::Msg>,
    tx: mpsc::Sender<cb::Msg>,
) -> i32 {
    let mut cb = Cb::new(false, rx, id.key()).resolving(id);
    // rping_bind_client
    if let Err(e) = id.resolve_addr(o.src, o.addr_with_port(), RESOLVE_TIMEOUT) {
        out::perror("rdma_resolve_addr", &e);
        return -1;
    }
    let state = cb.wait();
    if state != State::RouteResolved {
        eprintln!("waiting for addr/route resolution state {state}");
        return -1;
    }
    debug_log!("rdma_resolve_addr - rdma_resolve_route successful");

    if let Err(ret) = setup(&mut cb, id, o, tx) {
        return ret;
    }
    if let Err(ret) = connect_client(&mut cb, id, o) {
        eprintln!("connect error {ret}");
        free_buffers(&mut cb);
        return ret;
    }
    let ret = test_client(&mut cb, o);
    if ret != 0 {
        eprintln!("rping client failed: {ret}");
    }
    disconnect(&mut cb, id, o);
    free_buffers(&mut cb);
    ret
}

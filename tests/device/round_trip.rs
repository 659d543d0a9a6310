//! The request/response loop of the guide ("A request/response loop"):
//! replies come into a [`RecvBuffers`] pool, requests go out of a free
//! list of send chunks, and one `take` per completion routes both, so
//! the loop carries no `Option` for a buffer and no flag for a send that
//! has not completed yet. Attacked where it could lose a buffer: a send
//! completion that arrives after its reply, a free list of one chunk
//! (every request waits for the last one's send completion), and requests
//! sent inline, with no send buffer at all.

use std::collections::VecDeque;
use std::thread;
use std::time::Instant;

use libtest_mimic::Failed;
use rdma_verbs::qp::*;
use rdma_verbs::{AccessFlags, Chunk, CompletionQueue, QpType, QueuePair, WorkCompletion};

use crate::common::{connect, deadline, poll_n, Env, Test};

pub const TESTS: &[Test] = tests![
    two_send_chunks_lose_nothing,
    two_send_chunks_lose_nothing_when_replies_come_first,
    one_send_chunk_waits_for_a_late_send_completion,
    inline_requests_need_no_send_buffer,
];

/// Round trips of each test: 200, or 50 under valgrind (whose one
/// thread at a time makes each round trip a scheduling turn).
fn rounds() -> u32 {
    if crate::common::under_valgrind() {
        50
    } else {
        200
    }
}
/// Bytes of a request and of a reply.
const LEN: usize = 16;

/// The client's side: its QP and CQ, and the PD its buffers come from.
struct Client {
    pd: rdma_verbs::ProtectionDomain,
    qp: QueuePair,
    cq: CompletionQueue,
}

/// A client and a server QP, each with its own CQ, connected; sends of up
/// to 64 bytes inline.
fn ends(env: &Env) -> Result<(Client, QueuePair, CompletionQueue), Failed> {
    use rdma_verbs::{QpCaps, QpInitAttr};
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_inline_data: 64,
        ..QpCaps::default()
    };
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(64)?;
    let server_cq = env.ctx.create_cq(64)?;
    let mut qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).caps(caps))?;
    let mut server =
        pd.create_qp(&QpInitAttr::new(QpType::Rc, &server_cq, &server_cq).caps(caps))?;
    connect(env, &mut qp, &mut server, AccessFlags::empty())?;
    Ok((Client { pd, qp, cq }, server, server_cq))
}

/// The server: answers [`rounds`] requests, each with the request's bytes
/// plus one, sent inline from its stack. Hands its QP back, for the caller
/// to keep until the client saw its last send complete (the server's
/// acknowledgement may follow its reply).
fn serve(mut qp: QueuePair, cq: CompletionQueue, pool: usize) -> Result<QueuePair, String> {
    let pd = qp.pd().clone();
    let mut requests = RecvBuffers::new(&pd, pool, LEN).map_err(|e| e.to_string())?;
    requests.post(&mut qp).map_err(|e| e.error.to_string())?;
    let mut wcs = [WorkCompletion::default(); 8];
    let (start, limit) = (Instant::now(), deadline());
    let mut served = 0;
    let rounds = rounds();
    let mut idle_since = start;
    while served < rounds {
        if idle_since.elapsed() > limit {
            return Err(format!(
                "server: {served} of {rounds} requests, then none in {limit:?} ({:?} into the run)",
                start.elapsed()
            ));
        }
        let polled = cq.poll(&mut wcs).map_err(|e| e.to_string())?;
        if polled.is_empty() {
            // As the client's poller: let the other thread run.
            std::thread::yield_now();
        } else {
            idle_since = Instant::now();
        }
        for wc in polled.iter() {
            match requests.take(&mut qp, wc) {
                Taken::Mine(req) => {
                    if !req.is_success() {
                        return Err(format!("server: request failed: {wc:?}"));
                    }
                    let mut reply = [0u8; LEN];
                    for (r, q) in reply.iter_mut().zip(req.iter()) {
                        *r = q.wrapping_add(1);
                    }
                    drop(req);
                    qp.post_send([SendWr::new(0, SendOp::Send).inline(&reply)])
                        .map_err(|e| e.error.to_string())?;
                    served += 1;
                }
                // The replies' send completions: nothing to keep.
                Taken::Other(done) if done.kind == RequestKind::Send => {}
                other => return Err(format!("server: unexpected {other:?} for {wc:?}")),
            }
        }
        requests.post(&mut qp).map_err(|e| e.error.to_string())?;
    }
    Ok(qp)
}

/// What the client's loop saw.
struct Seen {
    /// Replies handled while their request's send completion was not (the
    /// case the `Option` and flag were for).
    reply_first: u32,
    /// Requests that had to wait for a send chunk to come back.
    waited: u32,
}

/// The client's completions: in the order the device gave them, or
/// (`late_sends`) each round's two in the order reply, then send, so that
/// the reply is handled before its request's send completion, which waits
/// for the next round. rxe completes a send before the reply to it
/// arrives nearly always (in 1 or 2 rounds of 200 measured, not); a NIC
/// need not.
struct Source {
    held: VecDeque<WorkCompletion>,
    late_sends: bool,
    start: Instant,
}

impl Source {
    fn next(&mut self, cq: &CompletionQueue, waiting_for: &str) -> Result<WorkCompletion, Failed> {
        if self.held.is_empty() {
            let want = if self.late_sends { 2 } else { 1 };
            let mut got = poll_n(cq, want).map_err(|e| {
                let into = self.start.elapsed();
                Failed::from(format!(
                    "{waiting_for} ({into:?} into the run): {}",
                    e.message().unwrap_or("?")
                ))
            })?;
            // The reply first (the device gives either order).
            got.sort_by_key(|wc| wc.request_kind() != Some(RequestKind::Recv));
            self.held.extend(got);
        }
        Ok(self.held.pop_front().unwrap_or_default())
    }
}

/// The guide's client loop: [`rounds`] requests of `LEN` bytes (from the
/// free list `free`, or inline when it is `None`), each reply checked.
fn client(e: &mut Client, mut free: Option<Vec<Chunk>>, late_sends: bool) -> Result<Seen, Failed> {
    let chunks = free.as_ref().map_or(0, Vec::len);
    let mut replies = RecvBuffers::new(&e.pd, 2, LEN)?;
    replies.post(&mut e.qp)?;
    let mut wcs = Source {
        held: VecDeque::new(),
        late_sends,
        start: Instant::now(),
    };
    let mut seen = Seen {
        reply_first: 0,
        waited: 0,
    };
    for round in 0..rounds() {
        let body = [round as u8; LEN];
        // A request's buffer: one is free, or comes back with the next
        // send completion (which the reply loop below files too).
        let wr = match free.as_mut() {
            None => SendWr::new(u64::from(round), SendOp::Send).inline(&body),
            Some(list) => {
                let mut chunk = loop {
                    if let Some(c) = list.pop() {
                        break c;
                    }
                    seen.waited += 1;
                    let wc = wcs.next(&e.cq, "a send chunk")?;
                    match replies.take(&mut e.qp, &wc) {
                        Taken::Other(done) => list.extend(done.chunks()),
                        other => return Err(format!("{other:?} before a request").into()),
                    }
                };
                chunk.as_mut_slice()[..LEN].copy_from_slice(&body);
                SendWr::new(u64::from(round), SendOp::Send).sge_len(chunk, LEN)
            }
        };
        e.qp.post_send([wr])?;
        let mut sent = false;
        loop {
            let wc = wcs.next(&e.cq, "a reply")?;
            ensure!(wc.is_success(), "round {round}: {wc:?}");
            match replies.take(&mut e.qp, &wc) {
                Taken::Mine(reply) => {
                    let want = [(round as u8).wrapping_add(1); LEN];
                    ensure!(*reply == want, "round {round}: reply {:?}", &*reply);
                    seen.reply_first += u32::from(!sent);
                    break;
                }
                Taken::Other(done) => {
                    ensure!(done.kind == RequestKind::Send, "{done:?}");
                    sent |= done.wr_id == u64::from(round);
                    if let Some(list) = free.as_mut() {
                        list.extend(done.chunks());
                    }
                }
                Taken::Nothing => return Err(format!("{wc:?} ends nothing").into()),
            }
        }
        // The reply's buffer was let go with `reply`: post it again.
        replies.post(&mut e.qp)?;
    }
    // The last send completion may still be on its way (or held): nothing
    // is lost, it brings the last chunk back.
    wcs.late_sends = false;
    while e.qp.outstanding_sends() > 0 {
        let wc = wcs.next(&e.cq, "the last send completion")?;
        match replies.take(&mut e.qp, &wc) {
            Taken::Other(done) => {
                if let Some(list) = free.as_mut() {
                    list.extend(done.chunks());
                }
            }
            other => return Err(format!("{other:?} after the last reply").into()),
        }
    }
    let back = free.as_ref().map_or(0, Vec::len);
    ensure!(back == chunks, "{back} of {chunks} send chunks back");
    ensure!(
        replies.posted() == 2 && e.qp.outstanding_recvs() == 2,
        "{} reply buffers posted",
        replies.posted()
    );
    Ok(seen)
}

/// Runs the server on its own thread and the client loop with
/// `send_chunks` send chunks (0: inline requests).
fn run(env: &Env, send_chunks: usize, late_sends: bool) -> Result<Seen, Failed> {
    let (mut e, server, server_cq) = ends(env)?;
    let free = match send_chunks {
        0 => None,
        n => Some(e.pd.alloc_chunks(n, LEN, AccessFlags::LOCAL_WRITE)?),
    };
    let t = thread::spawn(move || serve(server, server_cq, 4));
    let seen = client(&mut e, free, late_sends)?;
    let served = t.join().map_err(|_| "the server panicked")?;
    drop(served?);
    println!(
        "round_trip: {} round trips, {send_chunks} send chunks, late sends {late_sends}: {} replies before their send completion, {} waits for a chunk",
        rounds(),
        seen.reply_first,
        seen.waited
    );
    Ok(seen)
}

/// Two send chunks, completions as the device gives them: every reply
/// checked, both chunks back.
fn two_send_chunks_lose_nothing(env: &Env) -> Result<(), Failed> {
    run(env, 2, false).map(drop)
}

/// Two send chunks, each reply handled before its send completion: a
/// request never waits (the other chunk is free), and both come back.
fn two_send_chunks_lose_nothing_when_replies_come_first(env: &Env) -> Result<(), Failed> {
    let seen = run(env, 2, true)?;
    ensure!(
        seen.reply_first == rounds() && seen.waited == 0,
        "{} replies first, {} waits",
        seen.reply_first,
        seen.waited
    );
    Ok(())
}

/// One send chunk, each reply handled before its send completion: every
/// request after the first waits for the last one's completion, which
/// brings the chunk back.
fn one_send_chunk_waits_for_a_late_send_completion(env: &Env) -> Result<(), Failed> {
    let seen = run(env, 1, true)?;
    ensure!(
        seen.reply_first == rounds() && seen.waited == rounds() - 1,
        "{} replies first, {} waits",
        seen.reply_first,
        seen.waited
    );
    Ok(())
}

/// Requests sent inline, each reply handled before its send completion:
/// the provider copied them at the post, their completions bring nothing
/// back, and the loop is the same.
fn inline_requests_need_no_send_buffer(env: &Env) -> Result<(), Failed> {
    let seen = run(env, 0, true)?;
    ensure!(
        seen.reply_first == rounds(),
        "{} replies first",
        seen.reply_first
    );
    Ok(())
}

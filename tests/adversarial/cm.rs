//! The connection manager's promises, attacked from safe code: an id never
//! points at a destroyed QP (whichever is dropped first, whatever event
//! comes next), an event keeps its id alive (no hang, no use after free),
//! every event is handed out exactly once among threads reading one
//! channel, a waiting reader does not block other calls, and calls in the
//! wrong order get errors without changing anything. Run under valgrind in
//! the VM (`.ci/vm test --valgrind`), which sees any use of freed memory.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
use rdma_verbs::{CompletionQueue, ProtectionDomain, QpInitAttr, QpState, QpType, QueuePair};

use crate::common::{cm_addr, deadline, Env, Test};

pub const TESTS: &[Test] = tests![
    qp_dropped_before_disconnect,
    qp_dropped_before_the_reject,
    client_gone_before_accept,
    events_shared_by_reader_threads_come_once,
    blocked_reader_does_not_block_calls,
    event_dropped_on_another_thread_after_its_id,
    calls_twice_and_out_of_order,
    channel_handle_dropped_first,
];

fn expect_for(ch: &EventChannel, kind: CmEventKind, id: &CmId) -> Result<CmEvent, Failed> {
    let ev = ch.expect(kind, deadline())?;
    ensure!(ev.is_for(id), "{kind} for another id");
    Ok(ev)
}

struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn verbs(id: &CmId) -> Result<Verbs, Failed> {
    let ctx = id.context()?;
    Ok(Verbs {
        pd: ctx.alloc_pd()?,
        cq: ctx.create_cq(16)?,
    })
}

fn qp(id: &CmId, v: &Verbs) -> Result<QueuePair, Failed> {
    Ok(id.create_qp(&v.pd, &QpInitAttr::new(QpType::Rc, &v.cq, &v.cq))?)
}

/// A channel and an id bound to the test port's address (any free port),
/// with that address.
fn bound(env: &Env) -> Result<(EventChannel, CmId, SocketAddr), Failed> {
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    let l = ch.create_id(PortSpace::Tcp)?;
    l.bind(SocketAddr::new(ip, 0))?;
    let to = l.local_addr().ok_or("no address")?;
    Ok((ch, l, to))
}

/// A listener and a client with its route resolved, on one channel each.
fn setup(env: &Env) -> Result<(EventChannel, CmId, EventChannel, CmId), Failed> {
    let ip = cm_addr(env)?;
    let (sch, cch) = (EventChannel::new()?, EventChannel::new()?);
    let l = sch.create_id(PortSpace::Tcp)?;
    l.bind(SocketAddr::new(ip, 0))?;
    l.listen(16)?;
    let to = l.local_addr().ok_or("no address")?;
    let c = cch.create_id(PortSpace::Tcp)?;
    c.resolve_addr(None, to, Duration::from_secs(2))?;
    expect_for(&cch, CmEventKind::AddrResolved, &c)?;
    c.resolve_route(Duration::from_secs(2))?;
    expect_for(&cch, CmEventKind::RouteResolved, &c)?;
    Ok((sch, l, cch, c))
}

/// The client's QP goes first; the peer's disconnect and the client's own
/// (which in C would move `id->qp` to ERR) must not touch it.
fn qp_dropped_before_disconnect(env: &Env) -> Result<(), Failed> {
    let (sch, l, cch, c) = setup(env)?;
    let cv = verbs(&c)?;
    let cqp = qp(&c, &cv)?;
    c.connect(&ConnParam::new())?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &l)?;
    let s = req.take_request().ok_or("no request")?;
    drop(req);
    let sv = verbs(&s)?;
    let sqp = qp(&s, &sv)?;
    s.accept(&ConnParam::new())?;
    expect_for(&cch, CmEventKind::Established, &c)?;
    expect_for(&sch, CmEventKind::Established, &s)?;
    drop(cqp);
    s.disconnect()?;
    ensure!(sqp.state() == QpState::Err, "server QP {}", sqp.state());
    expect_for(&cch, CmEventKind::Disconnected, &c)?;
    // librdmacm's disconnect modifies `id->qp`: cleared when the QP went.
    c.disconnect()?;
    expect_for(&sch, CmEventKind::Disconnected, &s)?;
    // The id has no QP any more: a new one is not refused as "the id has
    // a QP already" but goes to librdmacm (whose kernel has no INIT
    // attributes for a disconnected id).
    let again = c.create_qp(&cv.pd, &QpInitAttr::new(QpType::Rc, &cv.cq, &cv.cq));
    ensure!(
        matches!(
            again,
            Err(rdma_verbs::Error::Verb {
                verb: "rdma_create_qp",
                ..
            })
        ),
        "a second QP: {again:?}"
    );
    Ok(())
}

/// The reject arrives after the client's QP is gone: librdmacm moves
/// `id->qp` to ERR while it reads the event, which must find no QP.
fn qp_dropped_before_the_reject(env: &Env) -> Result<(), Failed> {
    let (sch, l, cch, c) = setup(env)?;
    let cv = verbs(&c)?;
    let cqp = qp(&c, &cv)?;
    c.connect(&ConnParam::new())?;
    drop(cqp);
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &l)?;
    let s = req.take_request().ok_or("no request")?;
    s.reject(b"no")?;
    let ev = cch.get_event_timeout(deadline())?.ok_or("no answer")?;
    ensure!(ev.kind() == CmEventKind::Rejected, "{ev:?}");
    Ok(())
}

/// The client's id and QP are gone before the server accepts: the server
/// hears of it through events (or its accept fails), and nothing hangs.
fn client_gone_before_accept(env: &Env) -> Result<(), Failed> {
    let (sch, l, cch, c) = setup(env)?;
    let cv = verbs(&c)?;
    let cqp = qp(&c, &cv)?;
    c.connect(&ConnParam::new())?;
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &l)?;
    drop(c);
    drop(cqp);
    drop(cch);
    let s = req.take_request().ok_or("no request")?;
    drop(req);
    let sv = verbs(&s)?;
    // The request may be dead already (the kernel then has no QP
    // attributes for it, and `rdma_create_qp` fails), the accept may fail,
    // or the server learns from an event that the peer is gone.
    let sqp = match qp(&s, &sv) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("cm: vanished client: rdma_create_qp on its request: {e:?}");
            return Ok(());
        }
    };
    let accepted = s.accept(&ConnParam::new());
    if accepted.is_ok() {
        let start = Instant::now();
        loop {
            ensure!(
                start.elapsed() < deadline() * 3,
                "no event about the vanished client"
            );
            if let Some(ev) = sch.get_event_timeout(Duration::from_millis(500))? {
                ensure!(ev.is_for(&s), "{ev:?}");
                if ev.kind() != CmEventKind::Established {
                    eprintln!("cm: vanished client: the server got {}", ev.kind());
                    break;
                }
            }
        }
    }
    ensure!(
        sqp.state() == sqp.query_state()?,
        "server QP known {} ",
        sqp.state()
    );
    Ok(())
}

/// Four threads read one channel while 40 ids resolve: each event comes to
/// exactly one of them.
fn events_shared_by_reader_threads_come_once(env: &Env) -> Result<(), Failed> {
    let (ch, _l, to) = bound(env)?;
    let ids: Vec<CmId> = (0..40)
        .map(|_| ch.create_id(PortSpace::Tcp))
        .collect::<Result<_, _>>()?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (ch, seen) = (ch.clone(), seen.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let start = Instant::now();
                while seen.lock().unwrap().len() < 40 {
                    if start.elapsed() > deadline() * 2 {
                        return Err("reader timed out".into());
                    }
                    if let Some(ev) = ch
                        .get_event_timeout(Duration::from_millis(100))
                        .map_err(|e| e.to_string())?
                    {
                        if ev.kind() != CmEventKind::AddrResolved {
                            return Err(format!("{ev:?}"));
                        }
                        seen.lock().unwrap().push(ev.id_key());
                    }
                }
                Ok(())
            })
        })
        .collect();
    for id in &ids {
        id.resolve_addr(None, to, Duration::from_secs(2))?;
    }
    for r in readers {
        r.join().map_err(|_| "reader panicked")??;
    }
    let seen = seen.lock().unwrap().clone();
    let unique: HashSet<u64> = seen.iter().copied().collect();
    let want: HashSet<u64> = ids.iter().map(CmId::key).collect();
    ensure!(
        seen.len() == 40 && unique == want,
        "events: {} seen, {} distinct",
        seen.len(),
        unique.len()
    );
    Ok(())
}

/// A thread waits on the channel with no timeout; meanwhile this thread
/// makes ids, resolves, and finally gives the reader its event.
fn blocked_reader_does_not_block_calls(env: &Env) -> Result<(), Failed> {
    let (ch, l, to) = bound(env)?;
    l.listen(4)?;
    let reader = {
        let ch = ch.clone();
        std::thread::spawn(move || ch.get_event().map(|ev| (ev.kind(), ev.id_key())))
    };
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let id = ch.create_id(PortSpace::Tcp)?;
    let other = ch.create_id(PortSpace::Udp)?;
    drop(other);
    ensure!(l.local_addr() == Some(to), "listener address changed");
    id.resolve_addr(None, to, Duration::from_secs(2))?;
    ensure!(
        start.elapsed() < deadline(),
        "calls took {:?} while a reader waited",
        start.elapsed()
    );
    let (kind, key) = reader.join().map_err(|_| "reader panicked")??;
    ensure!(
        kind == CmEventKind::AddrResolved && key == id.key(),
        "{kind} for {key}"
    );
    Ok(())
}

/// An event is moved to another thread, its id is dropped here, the event
/// is read and dropped there: the id is destroyed after, not before.
fn event_dropped_on_another_thread_after_its_id(env: &Env) -> Result<(), Failed> {
    let (ch, _l, to) = bound(env)?;
    for _ in 0..20 {
        let id = ch.create_id(PortSpace::Tcp)?;
        id.resolve_addr(None, to, Duration::from_secs(2))?;
        let ev = expect_for(&ch, CmEventKind::AddrResolved, &id)?;
        let key = id.key();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            (ev.kind(), ev.id_key(), ev.private_data().len())
        });
        drop(id);
        let (kind, k, _) = t.join().map_err(|_| "thread panicked")?;
        ensure!(kind == CmEventKind::AddrResolved && k == key, "{kind} {k}");
    }
    Ok(())
}

/// Each call twice, and calls in the wrong state: errors, and the QP's
/// known state stays what the device says.
fn calls_twice_and_out_of_order(env: &Env) -> Result<(), Failed> {
    let (sch, l, cch, c) = setup(env)?;
    // A second listen is refused by the kernel; the listener still listens.
    let twice = l.listen(4);
    ensure!(
        matches!(
            twice,
            Err(rdma_verbs::Error::Verb {
                errno: libc::EINVAL,
                ..
            })
        ),
        "listen twice: {twice:?}"
    );
    let cv = verbs(&c)?;
    let cqp = qp(&c, &cv)?;
    ensure!(
        c.accept(&ConnParam::new()).is_err(),
        "accept on a client id"
    );
    c.connect(&ConnParam::new())?;
    ensure!(c.connect(&ConnParam::new()).is_err(), "connect twice");
    let mut req = expect_for(&sch, CmEventKind::ConnectRequest, &l)?;
    let s = req.take_request().ok_or("no request")?;
    drop(req);
    let sv = verbs(&s)?;
    let sqp = qp(&s, &sv)?;
    s.accept(&ConnParam::new())?;
    let again = s.accept(&ConnParam::new());
    ensure!(again.is_err(), "accept twice: {again:?}");
    ensure!(
        sqp.state() == QpState::Rts && sqp.query_state()? == QpState::Rts,
        "server QP {}",
        sqp.state()
    );
    expect_for(&cch, CmEventKind::Established, &c)?;
    ensure!(c.establish().is_err(), "establish on an id with a CM QP");
    c.disconnect()?;
    let twice = c.disconnect();
    eprintln!("cm: second disconnect: {twice:?}");
    ensure!(
        cqp.state() == QpState::Err && cqp.query_state()? == QpState::Err,
        "client QP {}",
        cqp.state()
    );
    Ok(())
}

/// Dropping the last channel handle while ids live: the ids keep it.
fn channel_handle_dropped_first(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    id.bind(SocketAddr::new(ip, 0))?;
    id.listen(1)?;
    drop(ch);
    ensure!(
        id.local_addr().is_some(),
        "no address after the channel handle went"
    );
    id.close()?;
    Ok(())
}

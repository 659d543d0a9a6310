//! Several connections without tokio: `CmRouter` hands each waiter the CM
//! events of its id (or of a listener and the ids taken from it), keeping
//! the others; `CqRouter` hands each QP its completions of a shared CQ.
//! Attacked from safe code: interleaved requests of several clients, the
//! events of an id dropped while they are kept (no hang: its destroy waits
//! for no acknowledgement), the deadline, the wrong channel, the same wait
//! twice, several threads on a busy machine; nothing lost, nothing twice.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::Failed;
use rdma_verbs::cm::{CmEventKind, CmId, CmRouter, ConnParam, EventChannel, EventsOf, PortSpace};
use rdma_verbs::{CompletionQueue, Error, ProtectionDomain, QpInitAttr, QpType, QueuePair};

use crate::cm::listener;
use crate::common::{cm_addr, deadline, under_valgrind, Env, Test};

pub const TESTS: &[Test] = tests![
    interleaved_requests_of_several_clients_on_one_router,
    kept_events_of_a_dropped_id_are_swept_without_a_hang,
    requests_kept_for_a_dropped_listener_are_rejected,
    deadline_names_what_was_awaited_and_loses_nothing,
    wrong_channel_refused_typed,
    same_wait_twice_gets_each_event_once,
    threads_on_a_busy_machine_get_their_own_events,
];

const SHORT: Duration = Duration::from_millis(100);

/// A CM QP on `id`, with its PD and CQ.
fn cm_qp(id: &CmId) -> Result<(ProtectionDomain, CompletionQueue, QueuePair), Failed> {
    let ctx = id.context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let qp = id.create_qp(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    Ok((pd, cq, qp))
}

/// Reads everything on the channel into the router's queue (a wait for an
/// id without events), until `n` events are kept; each wait must time out
/// with the typed error.
fn keep_until(router: &CmRouter, n: usize) -> Result<(), Failed> {
    let idle = router.create_id(PortSpace::Tcp)?;
    let start = Instant::now();
    while router.kept() < n {
        match router.next(EventsOf::Id(&idle), Duration::from_millis(20)) {
            Err(Error::Timeout { what, .. }) => {
                ensure!(what == "a CM event of the id", "timeout names {what:?}")
            }
            other => return Err(format!("a wait for an idle id gave {other:?}").into()),
        }
        ensure!(
            start.elapsed() < deadline(),
            "{} of {n} events kept after {:?}",
            router.kept(),
            deadline()
        );
    }
    Ok(())
}

/// One router for a listener and four client ids: the clients connect at
/// once, the server accepts one request at a time and waits for that
/// connection's ESTABLISHED while the other requests (and the clients'
/// events) are kept; each side takes its own events in its own order.
fn interleaved_requests_of_several_clients_on_one_router(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let router = CmRouter::new()?;
    let (l, addr) = listener(router.channel(), ip, PortSpace::Tcp)?;
    let t = deadline();
    let clients = (0..4)
        .map(|_| router.create_id(PortSpace::Tcp))
        .collect::<Result<Vec<_>, _>>()?;
    for c in &clients {
        c.resolve_addr(None, addr, Duration::from_secs(2))?;
    }
    for c in clients.iter().rev() {
        router.expect(c, CmEventKind::AddrResolved, t)?;
    }
    for c in &clients {
        c.resolve_route(Duration::from_secs(2))?;
    }
    for c in clients.iter().rev() {
        router.expect(c, CmEventKind::RouteResolved, t)?;
    }
    let mut sides = Vec::new();
    for c in &clients {
        sides.push(cm_qp(c)?);
        c.connect(&ConnParam::new())?;
    }
    let (mut children, mut child_sides, mut most_kept) = (Vec::new(), Vec::new(), 0);
    for _ in 0..clients.len() {
        let mut req = router.expect(&l, CmEventKind::ConnectRequest, t)?;
        let child = req.take_request().ok_or("no request id")?;
        drop(req);
        ensure!(
            child.listener_key() == Some(l.key()),
            "listener_key {:?}",
            child.listener_key()
        );
        child_sides.push(cm_qp(&child)?);
        child.accept(&ConnParam::new())?;
        router.expect(&child, CmEventKind::Established, t)?;
        most_kept = most_kept.max(router.kept());
        children.push(child);
    }
    for c in clients.iter().rev() {
        router.expect(c, CmEventKind::Established, t)?;
    }
    ensure!(
        clients.iter().all(|c| c.listener_key().is_none()),
        "client with a listener"
    );
    // The listener's family: the children's DISCONNECTED, never the
    // clients' (which are on the same channel).
    for c in &clients {
        c.disconnect()?;
    }
    let keys: HashSet<u64> = children.iter().map(CmId::key).collect();
    let mut seen = HashSet::new();
    for _ in 0..children.len() {
        let ev = router.next(EventsOf::Listener(&l), t)?;
        ensure!(
            ev.kind() == CmEventKind::Disconnected && keys.contains(&ev.id_key()),
            "listener family gave {ev:?}"
        );
        ensure!(seen.insert(ev.id_key()), "{ev:?} twice");
        // Answer: the client's own DISCONNECTED waits for it.
        let child = children.iter().find(|c| c.key() == ev.id_key());
        drop(ev);
        let _ = child.ok_or("no such child")?.disconnect();
    }
    for c in clients.iter().rev() {
        router.expect(c, CmEventKind::Disconnected, t)?;
    }
    ensure!(router.kept() == 0, "{} events left kept", router.kept());
    eprintln!("route: at most {most_kept} events kept while accepting");
    drop((sides, child_sides));
    Ok(())
}

/// Two events kept for one id (ADDR_RESOLVED, ROUTE_RESOLVED), and one for
/// another; both ids dropped (one through `close`, refused while its event
/// is held): the next look acknowledges all three and the ids are
/// destroyed then, without a hang. A `CmId` dropped while its events are
/// kept must never wait in `rdma_destroy_id`.
fn kept_events_of_a_dropped_id_are_swept_without_a_hang(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let (_sch, l_addr) = {
        let sch = EventChannel::new()?;
        let (l, a) = listener(&sch, ip, PortSpace::Tcp)?;
        ((sch, l), a)
    };
    let router = CmRouter::new()?;
    let (a, b) = (
        router.create_id(PortSpace::Tcp)?,
        router.create_id(PortSpace::Tcp)?,
    );
    a.resolve_addr(None, l_addr, Duration::from_secs(2))?;
    keep_until(&router, 1)?;
    a.resolve_route(Duration::from_secs(2))?;
    b.resolve_addr(None, l_addr, Duration::from_secs(2))?;
    keep_until(&router, 3)?;
    let start = Instant::now();
    drop(a);
    match b.close() {
        Err(Error::InUse { .. }) => {}
        other => return Err(format!("close with a kept event: {other:?}").into()),
    }
    ensure!(router.kept() == 0, "{} events still kept", router.kept());
    ensure!(
        start.elapsed() < deadline(),
        "the sweep took {:?}",
        start.elapsed()
    );
    // The router goes on: a new id's events come.
    let c = router.create_id(PortSpace::Tcp)?;
    c.resolve_addr(None, l_addr, Duration::from_secs(2))?;
    router.expect(&c, CmEventKind::AddrResolved, deadline())?;
    Ok(())
}

/// A connection request kept for a listener that is then dropped: nobody
/// can take it any more, so the next look rejects it (the client sees
/// REJECTED), and the listener is destroyed.
fn requests_kept_for_a_dropped_listener_are_rejected(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let router = CmRouter::new()?;
    let (l, addr) = listener(router.channel(), ip, PortSpace::Tcp)?;
    let cr = CmRouter::new()?;
    let client = cr.create_id(PortSpace::Tcp)?;
    client.resolve_addr(None, addr, Duration::from_secs(2))?;
    cr.expect(&client, CmEventKind::AddrResolved, deadline())?;
    client.resolve_route(Duration::from_secs(2))?;
    cr.expect(&client, CmEventKind::RouteResolved, deadline())?;
    let _side = cm_qp(&client)?;
    client.connect(&ConnParam::new())?;
    keep_until(&router, 1)?;
    drop(l);
    ensure!(router.kept() == 0, "{} events still kept", router.kept());
    match cr.expect(&client, CmEventKind::Established, deadline()) {
        Err(Error::CmEvent {
            got: "RDMA_CM_EVENT_REJECTED",
            ..
        }) => Ok(()),
        other => Err(format!("connect to a dropped listener: {other:?}").into()),
    }
}

/// A wait for an id with no event ends at its deadline with
/// `Error::Timeout` naming the awaited kind, and the events of others read
/// meanwhile are all still there, each once.
fn deadline_names_what_was_awaited_and_loses_nothing(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let sch = EventChannel::new()?;
    let (_l, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    let router = CmRouter::new()?;
    let ids = (0..3)
        .map(|_| router.create_id(PortSpace::Tcp))
        .collect::<Result<Vec<_>, _>>()?;
    let idle = router.create_id(PortSpace::Tcp)?;
    for id in &ids {
        id.resolve_addr(None, addr, Duration::from_secs(2))?;
    }
    keep_until(&router, ids.len())?;
    let start = Instant::now();
    match router.expect(&idle, CmEventKind::Established, SHORT) {
        Err(Error::Timeout { what, waited }) => ensure!(
            what == "RDMA_CM_EVENT_ESTABLISHED" && waited == SHORT,
            "timeout says {what:?} {waited:?}"
        ),
        other => return Err(format!("expect on an idle id: {other:?}").into()),
    }
    ensure!(
        start.elapsed() >= SHORT,
        "returned after {:?}",
        start.elapsed()
    );
    ensure!(
        router.try_next(EventsOf::Id(&idle))?.is_none(),
        "an event for the idle id"
    );
    for id in &ids {
        let ev = router.next(EventsOf::Id(id), Duration::MAX)?;
        ensure!(
            ev.kind() == CmEventKind::AddrResolved && ev.is_for(id),
            "{ev:?}"
        );
    }
    ensure!(router.try_next(EventsOf::Any)?.is_none(), "an event left");
    // An event of the wrong kind is a typed error naming both, and taken.
    ids[0].resolve_route(Duration::from_secs(2))?;
    match router.expect(&ids[0], CmEventKind::Established, deadline()) {
        Err(Error::CmEvent { awaited, got, .. }) => ensure!(
            awaited == "RDMA_CM_EVENT_ESTABLISHED" && got == "RDMA_CM_EVENT_ROUTE_RESOLVED",
            "{awaited} {got}"
        ),
        other => return Err(format!("expect of another kind: {other:?}").into()),
    }
    ensure!(router.kept() == 0, "{} kept", router.kept());
    Ok(())
}

/// An id of another channel is refused before any wait, whichever way it
/// is named.
fn wrong_channel_refused_typed(_env: &Env) -> Result<(), Failed> {
    let router = CmRouter::new()?;
    let other = EventChannel::new()?;
    let id = other.create_id(PortSpace::Tcp)?;
    let start = Instant::now();
    let refused = |r: Result<(), Error>| match r {
        Err(Error::InvalidArgument { verb, reason }) => {
            ensure!(
                verb == "rdma_get_cm_event" && reason.contains("another event channel"),
                "{verb}: {reason}"
            );
            Ok(())
        }
        other => Err(Failed::from(format!("{other:?}"))),
    };
    refused(router.next(EventsOf::Id(&id), deadline()).map(drop))?;
    refused(router.next(EventsOf::Listener(&id), deadline()).map(drop))?;
    refused(router.try_next(EventsOf::Id(&id)).map(drop))?;
    refused(
        router
            .expect(&id, CmEventKind::AddrResolved, deadline())
            .map(drop),
    )?;
    ensure!(
        start.elapsed() < deadline() / 2,
        "waited {:?}",
        start.elapsed()
    );
    Ok(())
}

/// Two threads wait for the same id at once: its one event goes to one of
/// them, the other times out; the event is never given twice.
fn same_wait_twice_gets_each_event_once(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let sch = EventChannel::new()?;
    let (_l, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    let router = CmRouter::new()?;
    let id = Arc::new(router.create_id(PortSpace::Tcp)?);
    let wait = crate::common::scaled(Duration::from_secs(2));
    let results = std::thread::scope(|s| {
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (router, id) = (router.clone(), Arc::clone(&id));
                s.spawn(move || router.next(EventsOf::Id(&id), wait).map(|e| e.kind()))
            })
            .collect();
        std::thread::sleep(SHORT);
        let started = id.resolve_addr(None, addr, Duration::from_secs(2));
        let got: Vec<_> = waiters.into_iter().map(|w| w.join()).collect();
        (started, got)
    });
    results.0?;
    let (mut events, mut timeouts) = (0, 0);
    for r in results.1 {
        match r.map_err(|_| "a waiter panicked")? {
            Ok(CmEventKind::AddrResolved) => events += 1,
            Err(Error::Timeout { .. }) => timeouts += 1,
            other => return Err(format!("a waiter got {other:?}").into()),
        }
    }
    ensure!(
        events == 1 && timeouts == 1,
        "{events} events, {timeouts} timeouts"
    );
    ensure!(router.kept() == 0, "{} kept", router.kept());
    Ok(())
}

/// Four threads, each stepping ids of its own through address and route
/// resolution on one router, with two threads spinning beside them (not
/// under valgrind): each gets exactly its events, nothing is left,
/// nothing hangs.
fn threads_on_a_busy_machine_get_their_own_events(env: &Env) -> Result<(), Failed> {
    let ip = cm_addr(env)?;
    let sch = EventChannel::new()?;
    let (_l, addr) = listener(&sch, ip, PortSpace::Tcp)?;
    let router = CmRouter::new()?;
    // Under valgrind, which runs one thread at a time, spinning threads
    // starve the others for minutes: none there.
    let (rounds, hogs) = if under_valgrind() { (3, 0) } else { (20, 2) };
    let stop = AtomicBool::new(false);
    let out: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hogs: Vec<_> = (0..hogs)
            .map(|_| {
                s.spawn(|| {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let router = router.clone();
                s.spawn(move || -> Result<(), String> {
                    let t = deadline();
                    let e = |x: Error| x.to_string();
                    for _ in 0..rounds {
                        let id = router.create_id(PortSpace::Tcp).map_err(e)?;
                        id.resolve_addr(None, addr, Duration::from_secs(2))
                            .map_err(e)?;
                        router
                            .expect(&id, CmEventKind::AddrResolved, t)
                            .map_err(e)?;
                        id.resolve_route(Duration::from_secs(2)).map_err(e)?;
                        router
                            .expect(&id, CmEventKind::RouteResolved, t)
                            .map_err(e)?;
                    }
                    Ok(())
                })
            })
            .collect();
        let out = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect();
        stop.store(true, Ordering::Relaxed);
        for h in hogs {
            let _ = h.join();
        }
        out
    });
    for r in out {
        r?;
    }
    ensure!(router.kept() == 0, "{} kept", router.kept());
    Ok(())
}

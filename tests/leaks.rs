//! Dropping verbs objects in any order leaves the device's resource counts
//! (`rdma resource show`) where they were: nothing leaks, and nothing is
//! freed while a child still needs it (that would fail or crash).
//!
//! Runs in its own process, one test at a time, so no other test's objects
//! disturb the counts.

#[path = "common/mod.rs"]
#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::process::Command;

use libtest_mimic::Failed;
use rdma_verbs::{AccessFlags, Context, QpInitAttr, QpType};

use common::{Env, Test};

const TESTS: &[Test] = tests![
    counts_rise_while_objects_live,
    every_drop_order_returns_to_baseline,
    close_in_order_returns_to_baseline,
    extended_objects_return_to_baseline_in_every_drop_order,
    #[cfg(feature = "cm")]
    cm::listener_accepts_100_connections_and_tears_down,
];

fn main() -> std::process::ExitCode {
    // Counts are per device: these tests must not run concurrently.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    // rxe before rdma-core 34 has no extended CQs or QPs, before 36 no
    // memory windows (see `common::Need`).
    const EXTENDED: &str = "extended_objects_return_to_baseline_in_every_drop_order";
    let needs = [
        (EXTENDED, common::Need::ExtendedCq),
        (EXTENDED, common::Need::ExtendedQp),
        (EXTENDED, common::Need::MemoryWindows),
    ];
    common::run_with("leaks", TESTS, &needs, args)
}

/// `rdma resource show <dev>` as a map: {"pd": 1, "cq": 1, "qp": 1, ...}.
fn counts(dev: &str) -> Result<BTreeMap<String, u64>, Failed> {
    let out = Command::new("rdma")
        .args(["resource", "show", dev])
        .output()
        .map_err(|e| format!("running `rdma resource show` (iproute2): {e}"))?;
    ensure!(
        out.status.success(),
        "rdma resource show {dev}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "0: rxe0: pd 1 cq 1 qp 1 cm_id 0 mr 0 ctx 0 srq 0"
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut map = BTreeMap::new();
    for pair in words.windows(2) {
        let is_key = pair[0].chars().all(|c| c.is_ascii_lowercase() || c == '_');
        if let (true, Ok(n)) = (is_key, pair[1].parse::<u64>()) {
            map.insert(pair[0].to_owned(), n);
        }
    }
    for key in ["pd", "cq", "qp", "mr"] {
        ensure!(
            map.contains_key(key),
            "no `{key}` count in `{}`",
            text.trim()
        );
    }
    Ok(map)
}

struct Objects {
    ctx: Option<Context>,
    pd: Option<rdma_verbs::ProtectionDomain>,
    mr: Option<rdma_verbs::MemoryRegion>,
    cq: Option<rdma_verbs::CompletionQueue>,
    qp: Option<rdma_verbs::QueuePair>,
}

fn make(dev: &str) -> Result<Objects, Failed> {
    let ctx = Context::open(dev)?;
    let pd = ctx.alloc_pd()?;
    let mr = pd.register(8192, AccessFlags::LOCAL_WRITE)?;
    let cq = ctx.create_cq(32)?;
    let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    Ok(Objects {
        ctx: Some(ctx),
        pd: Some(pd),
        mr: Some(mr),
        cq: Some(cq),
        qp: Some(qp),
    })
}

impl Objects {
    fn drop_one(&mut self, which: usize) {
        match which {
            0 => drop(self.ctx.take()),
            1 => drop(self.pd.take()),
            2 => drop(self.mr.take()),
            3 => drop(self.cq.take()),
            _ => drop(self.qp.take()),
        }
    }
}

/// The extended objects: a PD, a region with a type 2 window (bound to it
/// in the 60 orders that drop the window before the QPs), an extended CQ
/// and two connected extended QPs, dropped in each of the 120 orders of
/// those five handles, then the context.
fn extended_objects_return_to_baseline_in_every_drop_order(env: &Env) -> Result<(), Failed> {
    use rdma_verbs::qp::SendOpsFlags;
    use rdma_verbs::{MwBind, MwType};
    let dev = env.ctx.name();
    let base = counts(dev)?;
    let mut orders = Vec::new();
    permutations(&mut vec![0, 1, 2, 3, 4], 0, &mut orders);
    for order in &orders {
        let ctx = Context::open(dev)?;
        let pd = ctx.alloc_pd()?;
        let mr = pd.register(8192, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
        let cq = ctx.create_cq_ex(32).standard().build()?;
        let attr = QpInitAttr::new(QpType::Rc, cq.as_cq(), cq.as_cq())
            .send_ops(SendOpsFlags::for_transport(QpType::Rc));
        let (mut a, mut b) = (pd.create_qp(&attr)?, pd.create_qp(&attr)?);
        common::connect(env, &mut a, &mut b, AccessFlags::REMOTE_READ)?;
        let mut mw = pd.alloc_mw(MwType::Type2)?;
        // rxe's bound type 2 window holds a reference on its QP, and
        // destroying that QP while the window lives waits for the kernel's
        // pool timeout (measured: 50 s a QP on Linux 6.1). So the window is
        // bound only in the orders that drop it before the QPs, and its
        // bind's completion is reclaimed first (until then the QP's ledger
        // holds the window, which would make every such order wait).
        let pos = |x: usize| order.iter().position(|&i| i == x);
        let mut cq = cq;
        if pos(4) < pos(3) {
            a.bind_mw(
                &mut mw,
                &MwBind::new(&mr, 0, 4096, AccessFlags::REMOTE_READ)?,
            )?;
            let start = std::time::Instant::now();
            let mut ended = 0;
            while ended == 0 {
                ensure!(start.elapsed() < common::deadline(), "no bind completion");
                if let Some(mut poll) = cq.start_poll()? {
                    while let Some(wc) = poll.next()? {
                        ensure!(wc.is_success(), "bind: {wc:?}");
                        ended += a.reclaim(&wc, drop);
                    }
                }
            }
        }
        let live = counts(dev)?;
        ensure!(delta(&base, &live, "qp") == 2, "{live:?}");
        let (mut pd, mut mr, mut cq, mut qps, mut mw) =
            (Some(pd), Some(mr), Some(cq), Some((a, b)), Some(mw));
        for &i in order {
            match i {
                0 => drop(pd.take()),
                1 => drop(mr.take()),
                2 => drop(cq.take()),
                3 => drop(qps.take()),
                _ => drop(mw.take()),
            }
        }
        drop(ctx);
        let now = counts(dev)?;
        ensure!(
            now == base,
            "drop order {order:?}: {now:?} != baseline {base:?}"
        );
    }
    Ok(())
}

fn delta(base: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>, key: &str) -> i64 {
    now[key] as i64 - base[key] as i64
}

fn counts_rise_while_objects_live(env: &Env) -> Result<(), Failed> {
    let dev = env.ctx.name();
    let base = counts(dev)?;
    let objs = make(dev)?;
    let live = counts(dev)?;
    for key in ["pd", "mr", "cq", "qp"] {
        ensure!(
            delta(&base, &live, key) == 1,
            "{key}: {} -> {} with one live",
            base[key],
            live[key]
        );
    }
    drop(objs);
    let after = counts(dev)?;
    ensure!(after == base, "after drop {after:?} != baseline {base:?}");
    Ok(())
}

/// All 120 orders of dropping the context, PD, MR, CQ and QP handles.
fn every_drop_order_returns_to_baseline(env: &Env) -> Result<(), Failed> {
    let dev = env.ctx.name();
    let base = counts(dev)?;
    let mut orders = Vec::new();
    permutations(&mut vec![0, 1, 2, 3, 4], 0, &mut orders);
    ensure!(orders.len() == 120, "{} orders", orders.len());
    for order in &orders {
        let mut objs = make(dev)?;
        for &i in order {
            objs.drop_one(i);
        }
        let now = counts(dev)?;
        ensure!(
            now == base,
            "drop order {order:?}: {now:?} != baseline {base:?}"
        );
    }
    eprintln!(
        "leaks: {} drop orders checked against baseline {base:?}",
        orders.len()
    );
    Ok(())
}

fn permutations(v: &mut Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
    if k == v.len() {
        out.push(v.clone());
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permutations(v, k + 1, out);
        v.swap(k, i);
    }
}

fn close_in_order_returns_to_baseline(env: &Env) -> Result<(), Failed> {
    let dev = env.ctx.name();
    let base = counts(dev)?;
    let o = make(dev)?;
    o.qp.expect("made").close()?;
    o.mr.expect("made").close()?;
    o.cq.expect("made").close()?;
    o.pd.expect("made").close()?;
    o.ctx.expect("made").close()?;
    let now = counts(dev)?;
    ensure!(now == base, "after close(): {now:?} != baseline {base:?}");
    Ok(())
}

/// A CM listener accepting 100 connections, each with CM QPs on both sides,
/// then tearing them all down.
#[cfg(feature = "cm")]
mod cm {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use libtest_mimic::Failed;
    use rdma_verbs::cm::{CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
    use rdma_verbs::{CompletionQueue, ProtectionDomain, QpInitAttr, QpState, QpType, QueuePair};

    use super::{counts, delta};
    use crate::common::{cm_addr, deadline, Env};

    /// One end of a connection: its id and QP.
    struct End {
        id: CmId,
        qp: Option<QueuePair>,
    }

    /// Makes `n` connections to a listener, all ids on one channel and all
    /// QPs in one PD and CQ, driven by events as a server would be; checks
    /// the counts while they live (and each QP's known state against the
    /// device), then disconnects them from the client side and drops all.
    fn round(env: &Env, n: usize) -> Result<(), Failed> {
        let dev = env.ctx.name();
        let before = counts(dev)?;
        let ip = cm_addr(env)?;
        let ch = EventChannel::new()?;
        let listener = ch.create_id(PortSpace::Tcp)?;
        listener.bind(SocketAddr::new(ip, 0))?;
        listener.listen(u32::try_from(n).unwrap_or(u32::MAX))?;
        let to = listener.local_addr().ok_or("no listener address")?;
        let mut clients: HashMap<u64, End> = HashMap::new();
        let mut servers: HashMap<u64, End> = HashMap::new();
        for _ in 0..n {
            let id = ch.create_id(PortSpace::Tcp)?;
            id.resolve_addr(None, to, Duration::from_secs(5))?;
            clients.insert(id.key(), End { id, qp: None });
        }
        let mut verbs: Option<(ProtectionDomain, CompletionQueue)> = None;
        let mut up = (0, 0);
        let start = Instant::now();
        let limit = deadline() * 3;
        let qp_on = |id: &CmId,
                     verbs: &mut Option<(ProtectionDomain, CompletionQueue)>|
         -> Result<QueuePair, Failed> {
            if verbs.is_none() {
                let ctx = id.context()?;
                let pd = ctx.alloc_pd()?;
                let cq = ctx.create_cq(4 * 256)?;
                *verbs = Some((pd, cq));
            }
            let (pd, cq) = verbs.as_ref().ok_or("no PD")?;
            Ok(id.create_qp(pd, &QpInitAttr::new(QpType::Rc, cq, cq))?)
        };
        while up != (n, n) {
            ensure!(
                start.elapsed() < limit,
                "{up:?} of {n} connections up after {limit:?}"
            );
            let Some(mut ev) = ch.get_event_timeout(Duration::from_millis(200))? else {
                continue;
            };
            ensure!(
                ev.status() == 0 || ev.kind() == CmEventKind::Rejected,
                "event {ev:?}"
            );
            match ev.kind() {
                CmEventKind::AddrResolved => {
                    let c = clients
                        .get(&ev.id_key())
                        .ok_or("address of an unknown id")?;
                    c.id.resolve_route(Duration::from_secs(5))?;
                }
                CmEventKind::RouteResolved => {
                    let c = clients
                        .get_mut(&ev.id_key())
                        .ok_or("route of an unknown id")?;
                    let qp = qp_on(&c.id, &mut verbs)?;
                    c.qp = Some(qp);
                    c.id.connect(&ConnParam::new())?;
                }
                CmEventKind::ConnectRequest => {
                    let id = ev.take_request().ok_or("no new id")?;
                    let qp = qp_on(&id, &mut verbs)?;
                    id.accept(&ConnParam::new())?;
                    ensure!(
                        qp.state() == QpState::Rts,
                        "server QP in {} after accept",
                        qp.state()
                    );
                    servers.insert(id.key(), End { id, qp: Some(qp) });
                }
                CmEventKind::Established if clients.contains_key(&ev.id_key()) => {
                    let qp = clients[&ev.id_key()]
                        .qp
                        .as_ref()
                        .ok_or("client without QP")?;
                    ensure!(
                        qp.state() == QpState::Rts && qp.query_state()? == QpState::Rts,
                        "client QP known {} after ESTABLISHED",
                        qp.state()
                    );
                    up.0 += 1;
                }
                CmEventKind::Established => up.1 += 1,
                other => return Err(format!("unexpected {other} while connecting: {ev:?}").into()),
            }
        }
        let live = counts(dev)?;
        for (key, want) in [("qp", 2 * n), ("cm_id", 2 * n + 1)] {
            if live.contains_key(key) {
                ensure!(
                    delta(&before, &live, key) == want as i64,
                    "{key}: {} -> {} with {n} connections",
                    before[key],
                    live[key]
                );
            }
        }
        // Tear down from the client side; each server disconnects when told.
        for c in clients.values() {
            c.id.disconnect()?;
            ensure!(
                c.qp.as_ref().map(QueuePair::state) == Some(QpState::Err),
                "client QP not in ERR after rdma_disconnect"
            );
        }
        let mut down = (0, 0);
        let start = Instant::now();
        while down != (n, n) {
            ensure!(
                start.elapsed() < limit,
                "{down:?} of {n} disconnected after {limit:?}"
            );
            let Some(ev) = ch.get_event_timeout(Duration::from_millis(200))? else {
                continue;
            };
            match ev.kind() {
                CmEventKind::Disconnected if servers.contains_key(&ev.id_key()) => {
                    let s = &servers[&ev.id_key()];
                    s.id.disconnect()?;
                    ensure!(
                        s.qp.as_ref().map(QueuePair::state) == Some(QpState::Err),
                        "server QP not in ERR after rdma_disconnect"
                    );
                    down.1 += 1;
                }
                CmEventKind::Disconnected => down.0 += 1,
                CmEventKind::TimewaitExit => {}
                other => return Err(format!("unexpected {other} while disconnecting").into()),
            }
        }
        // Drop in a mixed order: ids before their QPs on one side, after on the other.
        for (_, mut s) in servers {
            drop(s.qp.take());
            drop(s.id);
        }
        for (_, c) in clients {
            drop(c.id);
            drop(c.qp);
        }
        drop(verbs);
        drop(listener);
        drop(ch);
        Ok(())
    }

    pub fn listener_accepts_100_connections_and_tears_down(env: &Env) -> Result<(), Failed> {
        let dev = env.ctx.name();
        // librdmacm opens its own context of the device the first time, and
        // keeps it for the life of the process (with a PD of its own that it
        // lets go only when its last id goes): the baseline is taken after
        // one connection made and torn down.
        round(env, 1)?;
        let base = counts(dev)?;
        let start = Instant::now();
        round(env, 100)?;
        let took = start.elapsed();
        let now = counts(dev)?;
        ensure!(
            now == base,
            "after 100 connections: {now:?} != baseline {base:?}"
        );
        eprintln!("leaks: 100 CM connections up and down in {took:?}, counts back at {base:?}");
        Ok(())
    }
}

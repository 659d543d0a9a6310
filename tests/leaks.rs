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

use common::{Env, TestFn};

const TESTS: &[(&str, TestFn)] = &[
    (
        "leaks::counts_rise_while_objects_live",
        counts_rise_while_objects_live,
    ),
    (
        "leaks::every_drop_order_returns_to_baseline",
        every_drop_order_returns_to_baseline,
    ),
    (
        "leaks::close_in_order_returns_to_baseline",
        close_in_order_returns_to_baseline,
    ),
];

fn main() -> std::process::ExitCode {
    // Counts are per device: these tests must not run concurrently.
    let mut args = libtest_mimic::Arguments::from_args();
    args.test_threads = Some(1);
    common::run_with("leaks", TESTS, args)
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

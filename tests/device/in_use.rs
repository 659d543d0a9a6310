//! `close()` refused while something still uses the object: the error
//! names the users by kind and count, clones of the object itself
//! included, and follows them as they come and go.

use libtest_mimic::Failed;
use rdma_verbs::qp::AddressVector;
use rdma_verbs::{
    AccessFlags, CompletionChannel, Context, Error, InUseBy, MwType, QpInitAttr, QpType, UserKind,
};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    pd_names_regions_qps_and_more,
    cq_counts_each_qp_once,
    context_names_pds_cqs_and_qps,
    srq_names_its_qps,
];

/// The `(object, users, by)` of an `Error::InUse`, or a failure.
fn refusal(
    what: &str,
    r: rdma_verbs::Result<()>,
) -> Result<(&'static str, usize, InUseBy), Failed> {
    match r {
        Err(Error::InUse {
            object, users, by, ..
        }) => {
            // The total is the breakdown's sum.
            let sum: usize = by.kinds().iter().map(|(_, n)| n).sum::<usize>() + by.others();
            ensure!(by.is_itemized(), "{what}: not itemized: {by}");
            ensure!(sum <= users, "{what}: {by} is more than {users} users");
            Ok((object, users, by))
        }
        other => Err(format!("{what}: expected InUse, got {other:?}").into()),
    }
}

/// `close()` of a clone of `handle` is refused with exactly `message`
/// (the object's own name, then `it is still used by ...`).
fn expect_message(
    what: &str,
    r: rdma_verbs::Result<()>,
    object: &str,
    list: &str,
) -> Result<InUseBy, Failed> {
    let e = match r {
        Err(e) => e,
        Ok(()) => return Err(format!("{what}: closed").into()),
    };
    let want = format!(
        "cannot close the {object} now: it is still used by {list}; it will be destroyed when the last of them is dropped"
    );
    ensure!(e.to_string() == want, "{what}:\n got {e}\nwant {want}");
    let (_, _, by) = refusal(what, Err(e))?;
    Ok(by)
}

fn pd_names_regions_qps_and_more(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let obj = "protection domain";
    let mr = pd.register(64, AccessFlags::LOCAL_WRITE)?;
    // Eight chunks of one region: one memory region.
    let chunks = pd.alloc_chunks(8, 64, AccessFlags::LOCAL_WRITE)?;
    let qp1 = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let qp2 = pd.create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq))?;
    // Closing a clone: `pd` itself is its one other handle.
    expect_message(
        "PD, 2 MRs, 2 QPs",
        pd.clone().close(),
        obj,
        "2 queue pairs, 2 memory regions, 1 other handle (a clone)",
    )?;
    let clone = pd.clone();
    let by = expect_message(
        "and a clone",
        pd.clone().close(),
        obj,
        "2 queue pairs, 2 memory regions, 2 other handles (clones)",
    )?;
    ensure!(
        by.count(UserKind::QueuePair) == 2
            && by.count(UserKind::MemoryRegion) == 2
            && by.others() == 2,
        "{by:?}"
    );
    // The clone itself is refused too, naming the original as the clone.
    expect_message(
        "closing the clone",
        clone.close(),
        obj,
        "2 queue pairs, 2 memory regions, 1 other handle (a clone)",
    )?;
    drop(chunks);
    drop(qp2);
    let mw = pd.alloc_mw(MwType::Type2).ok();
    let ah = pd.create_ah(&ah_attr(env)?)?;
    let srq = pd.create_srq(4, 1, 0).ok();
    let mut list = vec!["1 queue pair".to_owned(), "1 memory region".to_owned()];
    if mw.is_some() {
        list.push("1 memory window".into());
    }
    list.push("1 address handle".into());
    // The order is fixed: PD children in UserKind order.
    let mut want: Vec<String> = Vec::new();
    if srq.is_some() {
        want.push("1 queue pair".into());
        want.push("1 shared receive queue".into());
        want.extend(list.into_iter().skip(1));
    } else {
        want = list;
    }
    let (_, users, by) = refusal("with a window, an AH, an SRQ", pd.clone().close())?;
    want.push("1 other handle (a clone)".into());
    ensure!(
        by.to_string() == want.join(", "),
        "{by} != {}",
        want.join(", ")
    );
    ensure!(users == want.len(), "users {users}");
    drop((qp1, mr, mw, ah, srq));
    pd.close()?;
    Ok(())
}

fn ah_attr(env: &Env) -> Result<AddressVector, Failed> {
    let port = env.ctx.query_port(env.port)?;
    let mut av = AddressVector::new(env.port).dlid(port.lid);
    if port.grh_required() {
        let (gid, index) = crate::common::port_gid(env)?;
        av = av.global(rdma_verbs::qp::GlobalRoute::new(gid, index));
    }
    Ok(av)
}

fn cq_counts_each_qp_once(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let other = env.ctx.create_cq(16)?;
    let obj = "completion queue";
    // Both queues on `cq`: one QP, two of its handle clones.
    let both = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let (_, users, by) = refusal("one QP on both queues", cq.clone().close())?;
    ensure!(
        users == 3 && by.count(UserKind::QueuePair) == 1 && by.others() == 1,
        "{users} {by}"
    );
    ensure!(
        by.to_string() == "1 queue pair, 1 other handle (a clone)",
        "{by}"
    );
    // Send queue on `cq`, receive queue on `other`, and the reverse.
    let split = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &other))?;
    let rev = pd.create_qp(&QpInitAttr::new(QpType::Ud, &other, &cq))?;
    expect_message(
        "three QPs",
        cq.clone().close(),
        obj,
        "3 queue pairs, 1 other handle (a clone)",
    )?;
    expect_message(
        "two on the other",
        other.clone().close(),
        obj,
        "2 queue pairs, 1 other handle (a clone)",
    )?;
    let (_, users, by) = refusal("no clone", {
        let c = cq.clone();
        drop(cq);
        c.close()
    })?;
    ensure!(
        users == 4 && by.to_string() == "3 queue pairs",
        "{users}: {by}"
    );
    drop((both, split, rev));
    other.close()?;
    Ok(())
}

fn context_names_pds_cqs_and_qps(env: &Env) -> Result<(), Failed> {
    // A context of its own, so that only this test's objects use it.
    let ctx = Context::open(env.ctx.name())?;
    let obj = "device context";
    let pd1 = ctx.alloc_pd()?;
    let pd2 = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16)?;
    let (_, users, by) = refusal("2 PDs, 1 CQ", ctx.clone().close())?;
    ensure!(
        by.count(UserKind::ProtectionDomain) == 2 && by.count(UserKind::CompletionQueue) == 1,
        "{by}"
    );
    // Anything else is named as other handles; nothing is left out.
    ensure!(users == 3 + by.others(), "{users} users: {by}");
    let base = by.others();
    let channel = CompletionChannel::new(&ctx)?;
    let qp = pd1.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq))?;
    let mut want =
        "2 protection domains, 1 completion queue, 1 completion channel, 1 queue pair".to_owned();
    match base {
        0 => {}
        1 => want.push_str(", 1 other handle (a clone)"),
        n => want.push_str(&format!(", {n} other handles (clones)")),
    }
    expect_message("with a channel and a QP", ctx.clone().close(), obj, &want)?;
    drop((qp, channel, pd2));
    let (_, _, by) = refusal("after drops", ctx.clone().close())?;
    ensure!(
        by.count(UserKind::ProtectionDomain) == 1
            && by.count(UserKind::CompletionQueue) == 1
            && by.count(UserKind::QueuePair) == 0
            && by.count(UserKind::CompletionChannel) == 0,
        "{by}"
    );
    drop((pd1, cq));
    ctx.close()?;
    Ok(())
}

fn srq_names_its_qps(env: &Env) -> Result<(), Failed> {
    if env.ctx.attr().max_srq == 0 {
        eprintln!("in_use::srq: the device has no SRQs");
        return Ok(());
    }
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16)?;
    let srq = pd.create_srq(16, 1, 0)?;
    let obj = "shared receive queue";
    let qps = (0..3)
        .map(|_| pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq).srq(&srq)))
        .collect::<Result<Vec<_>, _>>()?;
    expect_message(
        "3 QPs",
        srq.clone().close(),
        obj,
        "3 queue pairs, 1 other handle (a clone)",
    )?;
    // close_and_reclaim is refused the same way.
    match srq.clone().close_and_reclaim() {
        Err(e) => {
            ensure!(
                e.to_string()
                    .contains("still used by 3 queue pairs, 1 other handle (a clone);"),
                "{e}"
            );
        }
        Ok(_) => return Err("close_and_reclaim with QPs alive".into()),
    }
    let mut qps = qps;
    qps.truncate(1);
    expect_message(
        "1 QP",
        srq.clone().close(),
        obj,
        "1 queue pair, 1 other handle (a clone)",
    )?;
    drop(qps);
    srq.close()?;
    Ok(())
}

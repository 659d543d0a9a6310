//! Protection domains, memory regions, completion queues.

use libtest_mimic::Failed;
use rdma_verbs::{AccessFlags, CompletionQueue, Error, MemoryRegion, WorkCompletion};

use crate::common::{Env, Test};

pub const TESTS: &[Test] = tests![
    pd_alloc_and_close,
    mr_register_and_copy,
    mr_bad_arguments,
    mr_outlives_its_pd_handle,
    cq_create_and_poll_empty,
    cq_bad_sizes,
    cq_poll_from_threads,
];

fn pd_alloc_and_close(env: &Env) -> Result<(), Failed> {
    let a = env.ctx.alloc_pd()?;
    let b = env.ctx.alloc_pd()?;
    ensure!(
        a.handle() != b.handle(),
        "two PDs share handle {}",
        a.handle()
    );
    ensure!(a.context().name() == env.ctx.name(), "PD on another device");
    a.close()?;
    b.close()?;
    Ok(())
}

fn mr_register_and_copy(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    for (len, access) in [
        (1, AccessFlags::empty()),
        (4096, AccessFlags::LOCAL_WRITE),
        (1 << 20, all),
    ] {
        let mut mr = pd.register(len, access)?;
        ensure!(mr.len() == len, "len {} != {len}", mr.len());
        ensure!(mr.access() == access, "access {:?}", mr.access());
        ensure!(
            mr.addr() % 4096 == 0,
            "addr {:#x} not page aligned",
            mr.addr()
        );
        ensure!(mr.lkey() != 0 || mr.rkey() != 0, "both keys 0");
        ensure!(mr.to_vec().iter().all(|&b| b == 0), "buffer not zeroed");
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        mr.write(0, &data)?;
        ensure!(mr.to_vec() == data, "read back differs");
        let mut tail = [0u8; 1];
        mr.read(len - 1, &mut tail)?;
        ensure!(tail[0] == data[len - 1], "last byte differs");
        match mr.read(len, &mut tail) {
            Err(Error::InvalidArgument { .. }) => {}
            other => return Err(format!("read past the end: {other:?}").into()),
        }
        ensure!(
            mr.write(usize::MAX, &[1]).is_err(),
            "write at usize::MAX accepted"
        );
        mr.close()?;
    }
    Ok(())
}

fn mr_bad_arguments(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    match MemoryRegion::new(&pd, 0, AccessFlags::LOCAL_WRITE) {
        Err(Error::InvalidArgument {
            verb: "ibv_reg_mr",
            reason,
        }) => {
            ensure!(reason.contains("empty"), "reason {reason}")
        }
        other => return Err(format!("len 0: {other:?}").into()),
    }
    match pd.register(4096, AccessFlags::REMOTE_WRITE) {
        Err(Error::InvalidArgument { reason, .. }) => {
            ensure!(reason.contains("LOCAL_WRITE"), "reason {reason}")
        }
        other => return Err(format!("REMOTE_WRITE alone: {other:?}").into()),
    }
    let max = env.ctx.attr().max_mr_size;
    if let Some(too_big) = max.checked_add(1).and_then(|m| usize::try_from(m).ok()) {
        match pd.register(too_big, AccessFlags::empty()) {
            Err(Error::InvalidArgument { reason, .. }) => {
                ensure!(reason.contains("max_mr_size"), "reason {reason}")
            }
            other => return Err(format!("len max_mr_size+1: {other:?}").into()),
        }
    }
    Ok(())
}

fn mr_outlives_its_pd_handle(env: &Env) -> Result<(), Failed> {
    let pd = env.ctx.alloc_pd()?;
    let mut mr = pd.register(64, AccessFlags::LOCAL_WRITE)?;
    match pd.clone().close() {
        Err(Error::InUse {
            object: "protection domain",
            users,
            by,
            ..
        }) => {
            ensure!(users == 2, "users {users}");
            ensure!(
                by.to_string() == "1 memory region, 1 other handle (a clone)",
                "users named as {by}"
            );
        }
        other => return Err(format!("closing a PD with an MR: {other:?}").into()),
    }
    drop(pd);
    mr.write(0, b"still here")?;
    ensure!(
        mr.pd().context().name() == env.ctx.name(),
        "MR's PD is on another device"
    );
    mr.close()?;
    Ok(())
}

fn cq_create_and_poll_empty(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq(100)?;
    ensure!(cq.capacity() >= 100, "capacity {} < 100", cq.capacity());
    let mut wcs = [WorkCompletion::default(); 16];
    let got = cq.poll(&mut wcs)?;
    ensure!(
        got.is_empty(),
        "empty CQ returned {} completions",
        got.len()
    );
    let got = cq.poll(&mut [])?;
    ensure!(got.is_empty(), "zero-length poll returned completions");
    cq.close()?;
    Ok(())
}

fn cq_bad_sizes(env: &Env) -> Result<(), Failed> {
    let max = env.ctx.attr().max_cqe;
    for cqe in [0, max + 1] {
        match CompletionQueue::new(&env.ctx, cqe) {
            Err(Error::InvalidArgument {
                verb: "ibv_create_cq",
                reason,
            }) => {
                ensure!(reason.contains("max_cqe"), "reason {reason}")
            }
            other => return Err(format!("cqe {cqe}: {other:?}").into()),
        }
    }
    let big = CompletionQueue::new(&env.ctx, max)?;
    ensure!(
        big.capacity() >= max,
        "capacity {} < max {max}",
        big.capacity()
    );
    Ok(())
}

fn cq_poll_from_threads(env: &Env) -> Result<(), Failed> {
    let cq = env.ctx.create_cq(16)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut wcs = [WorkCompletion::default(); 4];
                    (0..100).try_for_each(|_| cq.poll(&mut wcs).map(|w| assert!(w.is_empty())))
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("poller panicked"))
    })?;
    Ok(())
}

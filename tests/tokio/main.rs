//! The `tokio` feature against a real device: many QPs exchanging
//! messages with a task each (on one shared CQ, and on a CQ each), futures
//! dropped at every await point with the completion or event still
//! delivered afterwards, the CM's steps as `async fn`s, and the typed
//! refusals. See `tests/common/mod.rs` for how the device is chosen and
//! skipped.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;

mod cancel;
#[cfg(feature = "cm")]
mod cm;
mod exchange;
mod misuse;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libtest_mimic::Failed;

fn main() -> std::process::ExitCode {
    let mut tests = Vec::new();
    tests.extend_from_slice(exchange::TESTS);
    tests.extend_from_slice(cancel::TESTS);
    tests.extend_from_slice(misuse::TESTS);
    #[cfg(feature = "cm")]
    tests.extend_from_slice(cm::TESTS);
    common::run("tokio", &tests)
}

/// A multi-threaded runtime with two workers (the VM's two CPUs).
pub fn runtime() -> Result<tokio::runtime::Runtime, Failed> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Runs `f` on a fresh runtime with `limit` for the whole of it: a wait
/// that never ends (a lost wakeup) fails the test instead of hanging it.
pub fn run_for<F>(limit: Duration, f: F) -> Result<(), Failed>
where
    F: Future<Output = Result<(), Failed>>,
{
    let rt = runtime()?;
    rt.block_on(async {
        match tokio::time::timeout(limit, f).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "not finished after {limit:?}: a wait was never woken (raise RDMA_VERBS_TIME_SCALE on a slow machine)"
            )
            .into()),
        }
    })
}

/// The test's deadline.
pub fn limit() -> Duration {
    common::deadline()
}

/// Runs `f` on a fresh runtime for as long as `progress` keeps moving: a
/// test of many messages fails once none has gone through for `stall` (a
/// lost wakeup stops every message of the QP it strands, and the test's
/// end with them), and never for being slow as a whole, as it is on a busy
/// machine (the two 64-pair exchanges took 52 s each alone on rxe in a
/// one-CPU VM on Linux 7.2, and more than 120 s side by side).
pub fn run_progressing<F>(stall: Duration, progress: &AtomicU64, f: F) -> Result<(), Failed>
where
    F: Future<Output = Result<(), Failed>>,
{
    let rt = runtime()?;
    rt.block_on(async {
        let mut f = std::pin::pin!(f);
        let (mut seen, mut since) = (progress.load(Ordering::Relaxed), Instant::now());
        loop {
            if let Ok(r) = tokio::time::timeout(Duration::from_millis(500), f.as_mut()).await {
                return r;
            }
            let now = progress.load(Ordering::Relaxed);
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= stall {
                return Err(format!(
                    "no message went through for {stall:?} after {now}: a wait was never woken \
                     (raise RDMA_VERBS_TIME_SCALE on a slow machine)"
                )
                .into());
            }
        }
    })
}

/// A waker that does nothing, for polling a future once by hand (what
/// `Waker::noop` does on Rust 1.85 and later; the crate's floor is older).
pub fn noop_waker() -> std::task::Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    std::task::Waker::from(std::sync::Arc::new(Noop))
}

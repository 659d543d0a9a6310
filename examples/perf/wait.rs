//! Deadlines for every wait.
//!
//! Busy loops check a [`Stall`] detector: a wait that sees no progress for
//! [`stall_limit`] fails with a message naming what it waited for. The one
//! wait that blocks in the kernel (a CQ event with `-e`) is guarded by a
//! watchdog thread armed for its duration, which ends the process with a
//! message if it runs out (there is no safe way to put a timeout on
//! `ibv_get_cq_event`). TCP waits use socket timeouts. Every limit is scaled
//! by `RDMA_VERBS_TIME_SCALE` (see `examples/common/time.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::time::scaled;

/// How long a data-path wait may go without progress.
pub fn stall_limit() -> Duration {
    scaled(Duration::from_secs(20))
}

/// How long the TCP handshakes may take.
pub fn handshake_limit() -> Duration {
    scaled(Duration::from_secs(60))
}

/// How long one size's run may take, as the server sees it.
pub fn run_limit() -> Duration {
    scaled(Duration::from_secs(600))
}

/// Counts empty checks; every 4096 of them in a row it looks at the clock.
pub struct Stall {
    streak: u32,
    since: Option<Instant>,
    limit: Duration,
}

impl Stall {
    pub fn new() -> Self {
        Stall {
            streak: 0,
            since: None,
            limit: stall_limit(),
        }
    }

    /// Something happened.
    #[inline]
    pub fn progress(&mut self) {
        self.streak = 0;
        self.since = None;
    }

    /// Nothing happened; `Err` once nothing has happened for the limit.
    #[inline]
    pub fn idle(&mut self, what: &str) -> Result<(), String> {
        self.streak = self.streak.wrapping_add(1);
        if self.streak % 4096 != 0 {
            return Ok(());
        }
        let now = Instant::now();
        match self.since {
            None => self.since = Some(now),
            Some(t) if now - t > self.limit => {
                return Err(format!(
                    "timed out: no progress for {:.0?} while waiting for {what}",
                    self.limit
                ))
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// The watchdog's deadline, in milliseconds since `BASE` (0: disarmed).
static DEADLINE_MS: AtomicU64 = AtomicU64::new(0);
static BASE: OnceLock<Instant> = OnceLock::new();
static WHAT: Mutex<String> = Mutex::new(String::new());

fn base() -> Instant {
    *BASE.get_or_init(Instant::now)
}

/// Starts the watchdog thread (once).
pub fn start_watchdog() {
    base();
    // Room for any message, so that arming never allocates.
    if let Ok(mut w) = WHAT.lock() {
        w.reserve(256);
    }
    std::thread::spawn(|| loop {
        std::thread::sleep(Duration::from_millis(100));
        let d = DEADLINE_MS.load(Ordering::Acquire);
        if d != 0 && base().elapsed().as_millis() as u64 > d {
            let what = WHAT.lock().map(|w| w.clone()).unwrap_or_default();
            eprintln!("perf: timed out waiting for {what}");
            std::process::exit(1);
        }
    });
}

/// Arms the watchdog for `limit` from now, naming the wait.
pub fn arm(limit: Duration, what: &str) {
    if let Ok(mut w) = WHAT.lock() {
        w.clear();
        w.push_str(if what.len() <= 256 { what } else { "a wait" });
    }
    let d = (base().elapsed() + limit).as_millis() as u64;
    DEADLINE_MS.store(d.max(1), Ordering::Release);
}

/// Disarms the watchdog.
pub fn disarm() {
    DEADLINE_MS.store(0, Ordering::Release);
}

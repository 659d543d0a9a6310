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
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::time::scaled;

/// How long a data-path wait may go without progress (read from the
/// environment once: it is asked for every CQ event with `-e`).
pub fn stall_limit() -> Duration {
    static LIMIT: OnceLock<Duration> = OnceLock::new();
    *LIMIT.get_or_init(|| scaled(Duration::from_secs(20)))
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

// The watchdog's view of the one blocking wait (a CQ event with `-e`):
// bit 0 says it is armed, the bits above count the waits armed so far.
// Arming and disarming are a load and a store each (only the waiting
// thread writes), so that a wait per CQ event costs what perftest's bare
// `ibv_get_cq_event` costs; no clock is read and no lock taken on that
// path.
static ARMED: AtomicU64 = AtomicU64::new(0);
static LIMIT_MS: AtomicU64 = AtomicU64::new(0);

/// Starts the watchdog thread (once). Every 100 ms it looks at the armed
/// wait: one that stays armed, the same one, for longer than its limit
/// ends the process with a message (so a wait times out between its limit
/// and 100 ms after it).
pub fn start_watchdog() {
    std::thread::spawn(|| {
        let mut seen: Option<(u64, Instant)> = None;
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let s = ARMED.load(Ordering::Acquire);
            if s & 1 == 0 {
                seen = None;
                continue;
            }
            match seen {
                Some((armed, since)) if armed == s => {
                    let limit = Duration::from_millis(LIMIT_MS.load(Ordering::Relaxed));
                    if since.elapsed() > limit {
                        eprintln!("perf: timed out waiting for a CQ event");
                        std::process::exit(1);
                    }
                }
                _ => seen = Some((s, Instant::now())),
            }
        }
    });
}

/// Arms the watchdog for a CQ event, `limit` from now.
#[inline]
pub fn arm_cq_event(limit: Duration) {
    LIMIT_MS.store(limit.as_millis() as u64, Ordering::Relaxed);
    let s = ARMED.load(Ordering::Relaxed);
    ARMED.store(((s >> 1) + 1) << 1 | 1, Ordering::Release);
}

/// Disarms the watchdog.
#[inline]
pub fn disarm() {
    let s = ARMED.load(Ordering::Relaxed);
    ARMED.store(s & !1, Ordering::Release);
}

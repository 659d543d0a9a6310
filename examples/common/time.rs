//! Waits that stretch on a slow or busy machine.

use std::time::Duration;

/// `base` times `RDMA_VERBS_TIME_SCALE` (a positive number, default 1): set
/// it on a loaded machine, or under valgrind, to give every wait of the
/// examples (and the tests and `.ci/vm`) more time.
pub fn scaled(base: Duration) -> Duration {
    let factor = std::env::var("RDMA_VERBS_TIME_SCALE")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(1.0);
    base.mul_f64(factor)
}

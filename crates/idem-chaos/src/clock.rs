//! One monotonic clock per run: every time in the history, the ledger and the fault log is
//! the time since the run started, so they compare directly.

use std::time::{Duration, Instant};

/// The run's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Time since the run started.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Milliseconds since the run started.
    pub fn ms(&self) -> u64 {
        u64::try_from(self.now().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Milliseconds of a duration, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

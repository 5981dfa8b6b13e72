//! A rate limit per principal: the generic cell rate algorithm, one timestamp per principal.
//!
//! A principal may make `count` requests at once, then one per `per / count`. Each principal
//! is kept as a 64-bit keyed hash of its name (never the name) and the time its next request
//! would be on schedule; an entry whose time has passed says nothing a missing entry would
//! not, so it is dropped when room is needed. Memory is bounded: at most `capacity`
//! principals are tracked, and while that many are all within their window a new principal
//! is refused (fail closed) rather than let in unmetered.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::Rate;

/// Principals one limiter tracks at most.
pub(super) const DEFAULT_CAPACITY: usize = 100_000;

/// Pruning walks every entry, so it runs at most this often while the limiter is full.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// The rate limit of one token route's issue endpoint.
#[derive(Debug)]
pub struct Limiter {
    /// Time between two requests at the sustained rate.
    interval: Duration,
    /// How far ahead of schedule a principal may be (the burst, less one interval).
    tolerance: Duration,
    capacity: usize,
    hasher: RandomState,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per principal hash: when its next request is on schedule.
    due: HashMap<u64, Instant>,
    last_prune: Option<Instant>,
}

impl Limiter {
    /// A limiter allowing `rate` per principal, tracking at most `capacity` principals.
    pub fn new(rate: Rate, capacity: usize) -> Self {
        let interval = rate.per / rate.count.max(1);
        Self {
            interval,
            tolerance: rate.per.saturating_sub(interval),
            capacity: capacity.max(1),
            hasher: RandomState::new(),
            state: Mutex::new(State::default()),
        }
    }

    /// Admits one request of `principal` (`None`: the anonymous caller) at `now`, or says
    /// how long to wait.
    ///
    /// # Errors
    /// The wait until a request would be admitted.
    pub fn check(&self, principal: Option<&str>, now: Instant) -> Result<(), Duration> {
        let key = self.hasher.hash_one(principal);
        let mut state = self.state.lock();
        let known = state.due.get(&key).copied();
        let due = known.map_or(now, |d| d.max(now));
        let ahead = due.saturating_duration_since(now);
        if ahead > self.tolerance {
            return Err(ahead - self.tolerance);
        }
        if known.is_none() && state.due.len() >= self.capacity {
            state.prune(now);
            if state.due.len() >= self.capacity {
                tracing::warn!(
                    capacity = self.capacity,
                    "token rate limiter full: a new principal is refused until others go idle"
                );
                return Err(self.interval.max(PRUNE_EVERY));
            }
        }
        state.due.insert(key, due + self.interval);
        Ok(())
    }

    /// Principals tracked now.
    pub fn len(&self) -> usize {
        self.state.lock().due.len()
    }

    /// Whether no principal is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl State {
    /// Drops principals whose schedule has caught up with `now`, at most once per
    /// [`PRUNE_EVERY`].
    fn prune(&mut self, now: Instant) {
        if self
            .last_prune
            .is_some_and(|at| now.saturating_duration_since(at) < PRUNE_EVERY)
        {
            return;
        }
        self.last_prune = Some(now);
        self.due.retain(|_, due| *due > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u32, secs: u64) -> Rate {
        Rate {
            count,
            per: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let l = Limiter::new(rate(3, 60), 10);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.check(Some("a"), t0), Ok(()));
        }
        // The fourth waits one interval (20 s) from the start.
        assert_eq!(l.check(Some("a"), t0), Err(Duration::from_secs(20)));
        assert_eq!(
            l.check(Some("a"), t0 + Duration::from_secs(5)),
            Err(Duration::from_secs(15))
        );
        assert_eq!(l.check(Some("a"), t0 + Duration::from_secs(20)), Ok(()));
        assert!(l.check(Some("a"), t0 + Duration::from_secs(20)).is_err());
        // Another principal, and the anonymous caller, have buckets of their own.
        assert_eq!(l.check(Some("b"), t0), Ok(()));
        assert_eq!(l.check(None, t0), Ok(()));
    }

    #[test]
    fn one_per_period() {
        let l = Limiter::new(rate(1, 10), 10);
        let t0 = Instant::now();
        assert_eq!(l.check(None, t0), Ok(()));
        assert_eq!(l.check(None, t0), Err(Duration::from_secs(10)));
        assert_eq!(l.check(None, t0 + Duration::from_secs(10)), Ok(()));
    }

    #[test]
    fn memory_is_bounded_and_idle_principals_make_room() {
        let l = Limiter::new(rate(1, 10), 2);
        let t0 = Instant::now();
        assert_eq!(l.check(Some("a"), t0), Ok(()));
        assert_eq!(l.check(Some("b"), t0), Ok(()));
        // Full, and both are within their window: a third principal is refused.
        assert!(l.check(Some("c"), t0).is_err());
        assert_eq!(l.len(), 2);
        // Once they are idle, they are dropped to make room.
        assert_eq!(l.check(Some("c"), t0 + Duration::from_secs(11)), Ok(()));
        assert_eq!(l.len(), 1);
    }
}

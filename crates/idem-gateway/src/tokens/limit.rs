//! A rate limit per principal: governor's keyed GCRA, with the number of principals bounded.
//!
//! A principal may make `count` requests at once, then one per `per / count`. Each principal
//! is keyed by a 64-bit keyed hash of its name (never the name). governor forgets nothing by
//! itself, so memory is bounded here: at most `capacity` principals are tracked. A new
//! principal that finds the limiter full first has idle principals dropped (governor's
//! `retain_recent`, at most once per [`PRUNE_EVERY`]); if it is still full, the new principal
//! is refused (fail closed) rather than let in unmetered. Tracked principals are metered as
//! usual meanwhile.

use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use governor::clock::{Clock, MonotonicClock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::{Quota, RateLimiter};
use parking_lot::RwLock;

use crate::config::Rate;

/// Principals one limiter tracks at most.
pub(super) const DEFAULT_CAPACITY: usize = 100_000;

/// Pruning walks every entry, so it runs at most this often while the limiter is full.
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// The rate limit of one token route's issue endpoint.
#[derive(Debug)]
pub struct Limiter<C: Clock = MonotonicClock> {
    governor: RateLimiter<u64, Tracked, C, NoOpMiddleware<C::Instant>>,
    /// The same map governor keeps, to ask whether a principal is tracked.
    tracked: Tracked,
    /// Time between two requests at the sustained rate.
    interval: Duration,
    capacity: usize,
    hasher: RandomState,
    /// Held shared to meter a tracked principal and exclusively to add or drop principals,
    /// so the bound is exact. Holds when idle principals were last dropped.
    admit: RwLock<Option<C::Instant>>,
}

/// governor's DashMap store behind an `Arc`, shared by the rate limiter and [`Limiter`].
#[derive(Debug, Default, Clone)]
struct Tracked(Arc<DashMapStateStore<u64>>);

impl StateStore for Tracked {
    type Key = u64;

    fn measure_and_replace<T, F, E>(&self, key: &u64, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        self.0.measure_and_replace(key, f)
    }
}

impl ShrinkableKeyedStateStore<u64> for Tracked {
    fn retain_recent(&self, drop_below: Nanos) {
        self.0.retain_recent(drop_below);
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Limiter {
    /// A limiter allowing `rate` per principal, tracking at most `capacity` principals.
    ///
    /// # Errors
    /// A rate governor cannot keep (finer than one request per nanosecond; the configuration
    /// refuses such rates).
    pub fn new(rate: Rate, capacity: usize) -> anyhow::Result<Self> {
        Self::with_clock(rate, capacity, MonotonicClock)
    }
}

impl<C: Clock> Limiter<C> {
    /// As [`Limiter::new`], on `clock`.
    ///
    /// # Errors
    /// As [`Limiter::new`].
    pub fn with_clock(rate: Rate, capacity: usize, clock: C) -> anyhow::Result<Self> {
        let burst = NonZeroU32::new(rate.count).ok_or_else(|| anyhow!("rate {rate}: no burst"))?;
        let quota = Quota::with_period(rate.per / burst.get())
            .ok_or_else(|| anyhow!("rate {rate} is finer than one per nanosecond"))?
            .allow_burst(burst);
        let tracked = Tracked::default();
        Ok(Self {
            governor: RateLimiter::new(quota, tracked.clone(), clock),
            tracked,
            interval: quota.replenish_interval(),
            capacity: capacity.max(1),
            hasher: RandomState::new(),
            admit: RwLock::new(None),
        })
    }

    /// Admits one request of `principal` (`None`: the anonymous caller) now, or says how long
    /// to wait.
    ///
    /// # Errors
    /// The wait until a request would be admitted.
    pub fn check(&self, principal: Option<&str>) -> Result<(), Duration> {
        let key = self.hasher.hash_one(principal);
        {
            let _metering = self.admit.read();
            if self.tracked.0.contains_key(&key) {
                return self.meter(key);
            }
        }
        let mut pruned = self.admit.write();
        if !self.tracked.0.contains_key(&key) && self.governor.len() >= self.capacity {
            let now = self.governor.clock().now();
            let due = pruned.is_none_or(|at| Duration::from(now.duration_since(at)) >= PRUNE_EVERY);
            if due {
                *pruned = Some(now);
                self.governor.retain_recent();
            }
            if self.governor.len() >= self.capacity {
                tracing::warn!(
                    capacity = self.capacity,
                    "token rate limiter full: a new principal is refused until others go idle"
                );
                return Err(self.interval.max(PRUNE_EVERY));
            }
        }
        self.meter(key)
    }

    /// Runs governor's check for a principal the caller holds the lock for.
    fn meter(&self, key: u64) -> Result<(), Duration> {
        self.governor
            .check_key(&key)
            .map_err(|no| no.wait_time_from(self.governor.clock().now()))
    }

    /// Principals tracked now.
    pub fn len(&self) -> usize {
        self.governor.len()
    }

    /// Whether no principal is tracked.
    pub fn is_empty(&self) -> bool {
        self.governor.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn rate(count: u32, secs: u64) -> Rate {
        Rate {
            count,
            per: Duration::from_secs(secs),
        }
    }

    fn limiter(count: u32, secs: u64, capacity: usize) -> Limiter<FakeRelativeClock> {
        Limiter::with_clock(rate(count, secs), capacity, FakeRelativeClock::default())
            .expect("limiter")
    }

    fn wait(l: &Limiter<FakeRelativeClock>, secs: u64) {
        l.governor.clock().advance(Duration::from_secs(secs));
    }

    #[test]
    fn a_burst_then_the_sustained_rate() {
        let l = limiter(3, 60, 10);
        for _ in 0..3 {
            assert_eq!(l.check(Some("a")), Ok(()));
        }
        // The fourth waits one interval (20 s) from the start.
        assert_eq!(l.check(Some("a")), Err(Duration::from_secs(20)));
        wait(&l, 5);
        assert_eq!(l.check(Some("a")), Err(Duration::from_secs(15)));
        wait(&l, 15);
        assert_eq!(l.check(Some("a")), Ok(()));
        assert!(l.check(Some("a")).is_err());
        // Another principal, and the anonymous caller, have buckets of their own.
        assert_eq!(l.check(Some("b")), Ok(()));
        assert_eq!(l.check(None), Ok(()));
    }

    #[test]
    fn one_per_period() {
        let l = limiter(1, 10, 10);
        assert_eq!(l.check(None), Ok(()));
        assert_eq!(l.check(None), Err(Duration::from_secs(10)));
        wait(&l, 10);
        assert_eq!(l.check(None), Ok(()));
    }

    #[test]
    fn memory_is_bounded_and_idle_principals_make_room() {
        // Two per principal per 10 s (one every 5 s); one principal tracked at most.
        let l = limiter(2, 10, 1);
        assert_eq!(l.check(Some("a")), Ok(()));
        // Full, and `a` is within its window: a new principal is refused, not let in
        // unmetered, and not tracked.
        assert_eq!(l.check(Some("b")), Err(Duration::from_secs(5)));
        assert_eq!(l.len(), 1);
        // The tracked principal is still metered as usual meanwhile.
        assert_eq!(l.check(Some("a")), Ok(()));
        assert_eq!(l.check(Some("a")), Err(Duration::from_secs(5)));
        // governor drops a principal one interval after its schedule has caught up (10 s,
        // then 5 s): until then the new one is still refused.
        wait(&l, 14);
        assert!(l.check(Some("b")).is_err());
        wait(&l, 1);
        assert_eq!(l.check(Some("b")), Ok(()));
        assert_eq!(l.len(), 1);
        // `a` starts afresh, and is now the one refused while `b` is within its window.
        assert!(l.check(Some("a")).is_err());
    }

    #[test]
    fn the_bound_holds_under_concurrent_new_principals() {
        let l = limiter(1, 60, 50);
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|w| {
                    let l = &l;
                    s.spawn(move || {
                        (0..200)
                            .filter(|p| l.check(Some(&format!("{w}-{p}"))).is_ok())
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("worker")).sum()
        });
        assert_eq!((admitted, l.len()), (50, 50));
    }

    #[test]
    fn governor_alone_tracks_every_principal_the_limiter_caps_them() {
        // The unguarded variant: governor's keyed limiter alone keeps a state per principal
        // it ever saw, so a caller inventing principals grows it without end.
        let g = RateLimiter::keyed(Quota::per_minute(NonZeroU32::MIN));
        for p in 0..100_u32 {
            assert_eq!(g.check_key(&p), Ok(()));
        }
        assert_eq!(g.len(), 100);
        let l = limiter(1, 60, 10);
        let admitted = (0..100)
            .filter(|p| l.check(Some(&p.to_string())).is_ok())
            .count();
        assert_eq!((admitted, l.len()), (10, 10));
    }
}

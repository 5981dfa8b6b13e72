//! [`RetryPolicy`]: how many attempts, how long to wait between them, and when to give up.

use std::time::Duration;

/// How the wait before a retry is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// Uniform between zero and the exponential cap ("full jitter"): clients that failed
    /// together do not retry together.
    #[default]
    Full,
    /// Exactly the exponential cap: deterministic, for tests and demonstrations.
    None,
}

/// One retry policy for every carrier (HTTP and gRPC alike).
///
/// The wait before retry `n` (counting from zero) is drawn per [`Jitter`] below
/// `min(max_backoff, initial_backoff * 2^n)`; a server's `Retry-After` (or gRPC `RetryInfo`)
/// raises it, up to `max_retry_after`. No wait runs past the overall deadline: the client
/// gives up instead.
///
/// ```
/// use std::time::Duration;
/// use idem_client::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(4)
///     .deadline(Duration::from_secs(10))
///     .attempt_timeout(Duration::from_secs(2));
/// assert_eq!(policy.backoff_cap(3), Duration::from_millis(800));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    max_retry_after: Duration,
    deadline: Duration,
    attempt_timeout: Duration,
    jitter: Jitter,
}

impl Default for RetryPolicy {
    /// 5 attempts, backoff from 100 ms up to 5 s with full jitter, `Retry-After` honoured up
    /// to 30 s, 10 s per attempt, 30 s overall.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
            deadline: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10),
            jitter: Jitter::Full,
        }
    }
}

impl RetryPolicy {
    /// Most requests sent for one operation (at least 1). Status queries do not count.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The cap of the first wait; it doubles with every retry.
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// The largest cap a wait is drawn under.
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// The longest `Retry-After` honoured; a server asking for more gets this.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.max_retry_after = d;
        self
    }

    /// The overall deadline of one operation, every attempt, wait and status query included.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }

    /// The longest one attempt (or one status query) may take; past it the attempt is an
    /// ambiguous failure.
    pub fn attempt_timeout(mut self, d: Duration) -> Self {
        self.attempt_timeout = d;
        self
    }

    /// How waits are drawn.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The most requests sent for one operation.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The overall deadline.
    pub fn overall_deadline(&self) -> Duration {
        self.deadline
    }

    /// The per-attempt timeout.
    pub fn per_attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The cap the wait before retry `n` (from zero) is drawn under.
    pub fn backoff_cap(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }

    /// The wait before retry `n`: drawn under [`backoff_cap`](Self::backoff_cap), raised
    /// to the server's `retry_after` (capped by `max_retry_after`) when it gave one.
    pub fn wait(&self, n: u32, retry_after: Option<Duration>) -> Duration {
        let cap = self.backoff_cap(n);
        let drawn = match self.jitter {
            Jitter::Full => {
                let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(fastrand::u64(0..=nanos))
            }
            Jitter::None => cap,
        };
        match retry_after {
            Some(asked) => drawn.max(asked.min(self.max_retry_after)),
            None => drawn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_exponentially_under_the_cap() {
        let p = RetryPolicy::default()
            .initial_backoff(Duration::from_millis(100))
            .max_backoff(Duration::from_secs(1));
        assert_eq!(p.backoff_cap(0), Duration::from_millis(100));
        assert_eq!(p.backoff_cap(2), Duration::from_millis(400));
        assert_eq!(p.backoff_cap(4), Duration::from_secs(1));
        assert_eq!(p.backoff_cap(200), Duration::from_secs(1));
        for n in 0..10 {
            assert!(p.wait(n, None) <= p.backoff_cap(n));
        }
    }

    #[test]
    fn retry_after_raises_the_wait_up_to_its_cap() {
        let p = RetryPolicy::default()
            .jitter(Jitter::None)
            .max_retry_after(Duration::from_secs(3));
        assert_eq!(
            p.wait(0, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(
            p.wait(0, Some(Duration::from_secs(60))),
            Duration::from_secs(3)
        );
        assert_eq!(p.wait(1, Some(Duration::ZERO)), Duration::from_millis(200));
    }

    #[test]
    fn full_jitter_spreads_the_waits() {
        let p = RetryPolicy::default().max_backoff(Duration::from_secs(10));
        let waits: std::collections::HashSet<Duration> = (0..50).map(|_| p.wait(6, None)).collect();
        assert!(waits.len() > 10, "{waits:?}");
    }

    #[test]
    fn at_least_one_attempt() {
        assert_eq!(RetryPolicy::default().max_attempts(0).attempts(), 1);
    }
}

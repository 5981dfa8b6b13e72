//! Engine policy: lease, handler timeout, record TTL, takeover, store timeout, in-flight wait.

use std::time::Duration;

use thiserror::Error;

use crate::record::{ReleaseKind, TakeoverPolicy};

/// Margin a lease must keep beyond the handler timeout, so a slow handler never loses its
/// claim to a retry while it can still produce an effect.
pub const LEASE_MARGIN: Duration = Duration::from_secs(15);

/// An invalid policy, caught when the engine is built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A duration that must be positive was zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// The lease does not cover the handler timeout plus [`LEASE_MARGIN`].
    #[error(
        "lease {lease:?} must cover the handler timeout {handler_timeout:?} plus a {LEASE_MARGIN:?} margin"
    )]
    LeaseTooShort {
        /// Configured lease.
        lease: Duration,
        /// Configured handler timeout.
        handler_timeout: Duration,
    },
    /// The record would expire before its lease.
    #[error("record ttl {ttl:?} must be at least the lease {lease:?}")]
    TtlShorterThanLease {
        /// Configured TTL.
        ttl: Duration,
        /// Configured lease.
        lease: Duration,
    },
    /// Renewal would not happen before the lease runs out.
    #[error("renew interval {renew_every:?} must be shorter than the lease {lease:?}")]
    RenewTooSlow {
        /// Configured renewal interval.
        renew_every: Duration,
        /// Configured lease.
        lease: Duration,
    },
}

/// How the engine treats one kind of operation. Build with [`Policy::builder`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub(crate) lease: Duration,
    pub(crate) handler_timeout: Duration,
    pub(crate) record_ttl: Duration,
    pub(crate) takeover: TakeoverPolicy,
    pub(crate) store_timeout: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) in_flight_wait: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(45),
            handler_timeout: Duration::from_secs(30),
            record_ttl: Duration::from_secs(24 * 3600),
            takeover: TakeoverPolicy::Reexecute,
            store_timeout: Duration::from_secs(1),
            renew_every: Duration::from_secs(15),
            in_flight_wait: None,
        }
    }
}

impl Policy {
    /// A builder starting from the defaults: 30 s handler timeout, 45 s lease renewed every
    /// 15 s, 24 h record TTL, re-execute on takeover, 1 s store timeout, no in-flight wait.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder {
            policy: Self::default(),
            renew_set: false,
        }
    }

    /// Lease length.
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// Handler timeout.
    pub fn handler_timeout(&self) -> Duration {
        self.handler_timeout
    }
    /// Record TTL.
    pub fn record_ttl(&self) -> Duration {
        self.record_ttl
    }
    /// Takeover policy.
    pub fn takeover(&self) -> TakeoverPolicy {
        self.takeover
    }
    /// Per-operation store timeout.
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }
    /// Renewal interval.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
    /// How long a duplicate waits for an in-flight result before answering "in flight".
    pub fn in_flight_wait(&self) -> Option<Duration> {
        self.in_flight_wait
    }

    /// What an interrupted handler (timed out, cancelled) leaves behind: under `reexecute`
    /// a retry may run again; under `hold` the outcome is unknown.
    pub fn interrupted_release(&self) -> ReleaseKind {
        match self.takeover {
            TakeoverPolicy::Hold => ReleaseKind::Unknown,
            _ => ReleaseKind::Retryable,
        }
    }

    fn validate(&self) -> Result<(), PolicyError> {
        for (name, d) in [
            ("lease", self.lease),
            ("handler timeout", self.handler_timeout),
            ("record ttl", self.record_ttl),
            ("store timeout", self.store_timeout),
            ("renew interval", self.renew_every),
        ] {
            if d.is_zero() {
                return Err(PolicyError::Zero(name));
            }
        }
        if self.lease < self.handler_timeout.saturating_add(LEASE_MARGIN) {
            return Err(PolicyError::LeaseTooShort {
                lease: self.lease,
                handler_timeout: self.handler_timeout,
            });
        }
        if self.record_ttl < self.lease {
            return Err(PolicyError::TtlShorterThanLease {
                ttl: self.record_ttl,
                lease: self.lease,
            });
        }
        if self.renew_every >= self.lease {
            return Err(PolicyError::RenewTooSlow {
                renew_every: self.renew_every,
                lease: self.lease,
            });
        }
        Ok(())
    }
}

/// Builds a validated [`Policy`].
#[derive(Clone, Debug)]
pub struct PolicyBuilder {
    policy: Policy,
    renew_set: bool,
}

impl PolicyBuilder {
    /// Lease length; must cover the handler timeout plus [`LEASE_MARGIN`].
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        self.policy.lease = d;
        self
    }
    /// Handler timeout.
    #[must_use]
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.policy.handler_timeout = d;
        self
    }
    /// Record TTL; at least the lease.
    #[must_use]
    pub fn record_ttl(mut self, d: Duration) -> Self {
        self.policy.record_ttl = d;
        self
    }
    /// Takeover policy.
    #[must_use]
    pub fn takeover(mut self, t: TakeoverPolicy) -> Self {
        self.policy.takeover = t;
        self
    }
    /// Per-operation store timeout; past it a store call is an error (503).
    #[must_use]
    pub fn store_timeout(mut self, d: Duration) -> Self {
        self.policy.store_timeout = d;
        self
    }
    /// Renewal interval (default: a third of the lease).
    #[must_use]
    pub fn renew_every(mut self, d: Duration) -> Self {
        self.policy.renew_every = d;
        self.renew_set = true;
        self
    }
    /// Wait up to `d` for an in-flight duplicate's result, then replay it.
    #[must_use]
    pub fn in_flight_wait(mut self, d: Option<Duration>) -> Self {
        self.policy.in_flight_wait = d;
        self
    }

    /// Checks and returns the policy.
    ///
    /// # Errors
    /// [`PolicyError`] names the rule the policy breaks.
    pub fn build(mut self) -> Result<Policy, PolicyError> {
        if !self.renew_set {
            self.policy.renew_every = self.policy.lease / 3;
        }
        self.policy.validate()?;
        Ok(self.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_policies_are_refused() {
        let s = Duration::from_secs;
        assert!(Policy::builder().build().is_ok());
        assert_eq!(
            Policy::builder().record_ttl(Duration::ZERO).build(),
            Err(PolicyError::Zero("record ttl"))
        );
        assert_eq!(
            Policy::builder().lease(Duration::ZERO).build(),
            Err(PolicyError::Zero("lease"))
        );
        assert!(matches!(
            Policy::builder()
                .handler_timeout(s(30))
                .lease(s(44))
                .build(),
            Err(PolicyError::LeaseTooShort { .. })
        ));
        assert!(matches!(
            Policy::builder().lease(s(60)).record_ttl(s(59)).build(),
            Err(PolicyError::TtlShorterThanLease { .. })
        ));
        assert!(matches!(
            Policy::builder().renew_every(s(45)).build(),
            Err(PolicyError::RenewTooSlow { .. })
        ));
        let p = Policy::builder()
            .handler_timeout(s(5))
            .lease(s(20))
            .build()
            .expect("valid");
        assert_eq!(p.renew_every(), Duration::from_secs(20) / 3);
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn bad_policies_fail_at_build_time_with_a_clear_error() {
        // Guards: a lease shorter than the handler can run (a slow handler loses its claim to a
        // retry), a record that expires before its lease, and zero durations reaching run time.
        let zero = Duration::ZERO;
        let cases: Vec<(&str, Result<Policy, PolicyError>, PolicyError)> = vec![
            (
                "zero record ttl",
                Policy::builder().record_ttl(zero).build(),
                PolicyError::Zero("record ttl"),
            ),
            (
                "zero lease",
                Policy::builder().lease(zero).build(),
                PolicyError::Zero("lease"),
            ),
            (
                "zero handler timeout",
                Policy::builder().handler_timeout(zero).build(),
                PolicyError::Zero("handler timeout"),
            ),
            (
                "zero store timeout",
                Policy::builder().store_timeout(zero).build(),
                PolicyError::Zero("store timeout"),
            ),
            (
                "zero renew interval",
                Policy::builder().renew_every(zero).build(),
                PolicyError::Zero("renew interval"),
            ),
            (
                "lease longer than the ttl",
                Policy::builder()
                    .lease(secs(120))
                    .record_ttl(secs(60))
                    .build(),
                PolicyError::TtlShorterThanLease {
                    ttl: secs(60),
                    lease: secs(120),
                },
            ),
            (
                "lease under handler timeout + 15 s",
                Policy::builder()
                    .handler_timeout(secs(30))
                    .lease(secs(44))
                    .build(),
                PolicyError::LeaseTooShort {
                    lease: secs(44),
                    handler_timeout: secs(30),
                },
            ),
            (
                "lease exactly the handler timeout",
                Policy::builder()
                    .handler_timeout(secs(30))
                    .lease(secs(30))
                    .build(),
                PolicyError::LeaseTooShort {
                    lease: secs(30),
                    handler_timeout: secs(30),
                },
            ),
            (
                "renewal no sooner than the lease",
                Policy::builder().renew_every(secs(45)).build(),
                PolicyError::RenewTooSlow {
                    renew_every: secs(45),
                    lease: secs(45),
                },
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, Err(want), "{what}");
        }
        let msg = Policy::builder()
            .handler_timeout(secs(30))
            .lease(secs(44))
            .build()
            .expect_err("short")
            .to_string();
        assert!(
            msg.contains("44s") && msg.contains("30s") && msg.contains("15s"),
            "names the numbers: {msg}"
        );
        assert!(
            Policy::builder()
                .handler_timeout(secs(30))
                .lease(secs(45))
                .build()
                .is_ok(),
            "exactly the margin is enough"
        );
    }
}

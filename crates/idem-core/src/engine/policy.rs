//! Engine policy: lease, handler timeout, record TTL, takeover, store timeout, in-flight wait,
//! probe timeout.

use std::time::Duration;

use thiserror::Error;

use crate::record::{ReleaseKind, TakeoverPolicy};

/// Margin a lease must keep beyond the handler timeout under [`TakeoverPolicy::Reexecute`],
/// so a slow handler never loses its claim to a retry that would run it again while it can
/// still produce an effect.
pub const LEASE_MARGIN: Duration = Duration::from_secs(15);

/// The default lease under [`TakeoverPolicy::Hold`]. An expired lease re-runs nothing there,
/// so the lease only says how soon a dead holder is noticed: short, renewed every third.
pub const HELD_LEASE: Duration = Duration::from_secs(10);

/// An invalid policy, caught when the engine is built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A duration that must be positive was zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Under [`TakeoverPolicy::Reexecute`], the lease does not cover the handler timeout plus
    /// [`LEASE_MARGIN`].
    #[error(
        "lease {lease:?} must cover the handler timeout {handler_timeout:?} plus a {LEASE_MARGIN:?} margin when an expired lease is re-executed"
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
    pub(crate) probe_timeout: Duration,
    /// Whether the takeover policy was chosen, rather than left at its default: a
    /// same-transaction run re-executes unless told otherwise.
    pub(crate) takeover_set: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            lease: HELD_LEASE,
            handler_timeout: Duration::from_secs(30),
            record_ttl: Duration::from_secs(24 * 3600),
            takeover: TakeoverPolicy::Hold,
            store_timeout: Duration::from_secs(1),
            renew_every: HELD_LEASE / 3,
            in_flight_wait: None,
            probe_timeout: Duration::from_secs(2),
            takeover_set: false,
        }
    }
}

impl Policy {
    /// A builder starting from the defaults: 30 s handler timeout, `hold` on an expired lease
    /// with a 10 s lease ([`HELD_LEASE`]; under `reexecute` the handler timeout plus
    /// [`LEASE_MARGIN`]) renewed every third of it, 24 h record TTL, 1 s store timeout, no
    /// in-flight wait, 2 s probe timeout.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder {
            policy: Self::default(),
            renew_set: false,
            lease_set: false,
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
    /// How long the engine waits for its [`Probe`](super::Probe) before answering.
    pub fn probe_timeout(&self) -> Duration {
        self.probe_timeout
    }

    /// The takeover policy of a same-transaction run ([`Engine::run_in_tx`](super::Engine::run_in_tx)):
    /// the one chosen, else `reexecute`, since there a crash rolls the effect back with the
    /// claim and nothing is left to run twice.
    pub fn takeover_in_tx(&self) -> TakeoverPolicy {
        if self.takeover_set {
            self.takeover
        } else {
            TakeoverPolicy::Reexecute
        }
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
            ("probe timeout", self.probe_timeout),
        ] {
            if d.is_zero() {
                return Err(PolicyError::Zero(name));
            }
        }
        if self.takeover == TakeoverPolicy::Reexecute
            && self.lease < self.handler_timeout.saturating_add(LEASE_MARGIN)
        {
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
    lease_set: bool,
}

impl PolicyBuilder {
    /// Lease length (default: [`HELD_LEASE`] under `hold`, the handler timeout plus
    /// [`LEASE_MARGIN`] under `reexecute`, which it must cover there).
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        self.policy.lease = d;
        self.lease_set = true;
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
    /// Takeover policy (default `hold`; same-transaction runs default to `reexecute`).
    #[must_use]
    pub fn takeover(mut self, t: TakeoverPolicy) -> Self {
        self.policy.takeover = t;
        self.policy.takeover_set = true;
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
    /// How long a claim that found an unknown record waits for the engine's
    /// [`Probe`](super::Probe) (default 2 s); past it the probe counts as "cannot say".
    #[must_use]
    pub fn probe_timeout(mut self, d: Duration) -> Self {
        self.policy.probe_timeout = d;
        self
    }

    /// Checks and returns the policy.
    ///
    /// # Errors
    /// [`PolicyError`] names the rule the policy breaks.
    pub fn build(mut self) -> Result<Policy, PolicyError> {
        if !self.lease_set {
            self.policy.lease = match self.policy.takeover {
                TakeoverPolicy::Reexecute => {
                    self.policy.handler_timeout.saturating_add(LEASE_MARGIN)
                }
                _ => HELD_LEASE,
            };
        }
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
                .takeover(TakeoverPolicy::Reexecute)
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
            Policy::builder().renew_every(s(10)).build(),
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
                "lease under handler timeout + 15 s, re-executed",
                Policy::builder()
                    .takeover(TakeoverPolicy::Reexecute)
                    .handler_timeout(secs(30))
                    .lease(secs(44))
                    .build(),
                PolicyError::LeaseTooShort {
                    lease: secs(44),
                    handler_timeout: secs(30),
                },
            ),
            (
                "lease exactly the handler timeout, re-executed",
                Policy::builder()
                    .takeover(TakeoverPolicy::Reexecute)
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
                Policy::builder().renew_every(secs(10)).build(),
                PolicyError::RenewTooSlow {
                    renew_every: secs(10),
                    lease: secs(10),
                },
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(got, Err(want), "{what}");
        }
        let msg = Policy::builder()
            .takeover(TakeoverPolicy::Reexecute)
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
                .takeover(TakeoverPolicy::Reexecute)
                .handler_timeout(secs(30))
                .lease(secs(45))
                .build()
                .is_ok(),
            "exactly the margin is enough"
        );
    }

    #[test]
    fn the_defaults_hold_with_a_short_lease_and_re_execute_only_in_a_transaction() {
        let p = Policy::builder().build().expect("defaults");
        assert_eq!(p, Policy::default());
        assert_eq!(p.takeover(), TakeoverPolicy::Hold);
        assert_eq!(p.lease(), HELD_LEASE);
        assert_eq!(p.renew_every(), HELD_LEASE / 3);
        assert_eq!(p.interrupted_release(), ReleaseKind::Unknown);
        assert_eq!(p.takeover_in_tx(), TakeoverPolicy::Reexecute);
        // Under `hold` an expired lease re-runs nothing, so the lease may be shorter than the
        // handler runs.
        let short = Policy::builder()
            .handler_timeout(secs(30))
            .lease(secs(3))
            .build()
            .expect("a short lease under hold");
        assert_eq!(short.renew_every(), Duration::from_secs(1));
        // Chosen `reexecute`: the lease defaults to cover the handler, and a transaction
        // follows the choice.
        let again = Policy::builder()
            .takeover(TakeoverPolicy::Reexecute)
            .handler_timeout(secs(10))
            .build()
            .expect("reexecute");
        assert_eq!(again.lease(), secs(25));
        assert_eq!(again.takeover_in_tx(), TakeoverPolicy::Reexecute);
        let held = Policy::builder()
            .takeover(TakeoverPolicy::Hold)
            .build()
            .expect("hold");
        assert_eq!(held.takeover_in_tx(), TakeoverPolicy::Hold);
    }
}

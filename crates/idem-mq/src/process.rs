//! The broker-neutral part of a consumer: a message in, the engine's [`Outcome`] and what to
//! do with the delivery ([`Disposition`]) out. The broker adapters only carry it out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::key_source::KeySources;
use idem_core::{
    Answer, Engine, EngineError, Fingerprint, Kept, Key, Outcome, Refusal, ReleaseKind, Scope,
    ScopedKey, Settled, Settlement, Store,
};
use idem_wire::message::DeadLetter;

use crate::config::ConsumerConfig;
use crate::message::Message;
use crate::work::{HandlerError, Job, RunResult, Work};

/// Fingerprint version of a message: the payload's bytes.
const FINGERPRINT_VERSION: u16 = 1;

/// What to do with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Acknowledge: the effect is durable (now or earlier).
    Ack,
    /// Do not acknowledge; have the broker deliver it again after `after`.
    Redeliver {
        /// How long until it comes back.
        after: Duration,
        /// True when a handler attempt failed (it counts towards `max_attempts`).
        counted: bool,
    },
    /// Move it to the dead-letter path, then acknowledge the original.
    DeadLetter(DeadReason),
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadReason {
    /// No key source was present.
    NoKey,
    /// A key source was present but unusable.
    BadKey(String),
    /// The key was used with a different payload.
    Mismatch,
    /// The handler failed on every one of this many attempts; the record is left unknown.
    Exhausted(u32),
    /// The handler refused it for good; the record is left unknown.
    Permanent(String),
    /// The outcome of an earlier attempt is unknown; an operator resolves the record.
    Unknown,
}

impl DeadReason {
    /// The wire contract's name for it.
    pub fn wire(&self) -> DeadLetter {
        match self {
            Self::NoKey => DeadLetter::NoKey,
            Self::BadKey(_) => DeadLetter::BadKey,
            Self::Mismatch => DeadLetter::Mismatch,
            Self::Exhausted(_) => DeadLetter::Exhausted,
            Self::Permanent(_) => DeadLetter::Permanent,
            Self::Unknown => DeadLetter::Unknown,
        }
    }

    /// A short, stable name (the `x-idem-reason` header of a dead letter).
    pub fn as_str(&self) -> &'static str {
        self.wire().slug()
    }
}

/// What became of one delivery.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// The key, when one was found.
    pub key: Option<Key>,
    /// The engine's outcome.
    pub outcome: Outcome,
    /// What the adapter does with the delivery.
    pub disposition: Disposition,
}

/// Counters of a consumer, shared with its handle.
#[derive(Debug, Default)]
pub struct Stats {
    /// Deliveries whose handler ran and whose completion is durable.
    pub executed: AtomicU64,
    /// Deliveries acknowledged without running (the key had completed).
    pub replayed: AtomicU64,
    /// Deliveries sent back because another consumer held the key.
    pub in_flight: AtomicU64,
    /// Deliveries whose key was used with another payload.
    pub mismatched: AtomicU64,
    /// Deliveries sent back after a failed handler attempt.
    pub retried: AtomicU64,
    /// Deliveries dead-lettered (mismatches included).
    pub dead_lettered: AtomicU64,
    /// Deliveries sent back because the store failed (nothing ran, nothing acknowledged).
    pub store_unavailable: AtomicU64,
    /// Deliveries acknowledged.
    pub acked: AtomicU64,
}

impl Stats {
    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self, delivered: &Delivered) {
        match delivered.outcome {
            Outcome::Executed(Kept::Stored) => Self::bump(&self.executed),
            Outcome::Replayed => Self::bump(&self.replayed),
            Outcome::InFlight => Self::bump(&self.in_flight),
            Outcome::Mismatch => Self::bump(&self.mismatched),
            Outcome::StoreUnavailable => Self::bump(&self.store_unavailable),
            _ => {}
        }
        match delivered.disposition {
            Disposition::Ack => Self::bump(&self.acked),
            Disposition::DeadLetter(_) => Self::bump(&self.dead_lettered),
            Disposition::Redeliver { counted: true, .. } => Self::bump(&self.retried),
            Disposition::Redeliver { .. } => {}
        }
    }
}

/// Called after each delivery is processed (with how long it took): for access logs and
/// metrics.
pub type Observer = Arc<dyn Fn(&Message, &Delivered, Duration) + Send + Sync>;

/// Takes a message through key, fingerprint, engine and disposition.
pub struct Processor<S, W> {
    engine: Engine<S>,
    scope: Scope,
    keys: KeySources,
    config: ConsumerConfig,
    work: W,
    stats: Arc<Stats>,
    observer: Option<Observer>,
}

impl<S, W> std::fmt::Debug for Processor<S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("scope", &self.scope)
            .field("keys", &self.keys)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: Store, W: Work<S>> Processor<S, W> {
    /// A processor running `work` on `engine`, keys taken by `keys` inside `scope`.
    pub fn new(
        engine: Engine<S>,
        scope: Scope,
        keys: KeySources,
        config: ConsumerConfig,
        work: W,
    ) -> Self {
        Self {
            engine,
            scope,
            keys,
            config,
            work,
            stats: Arc::default(),
            observer: None,
        }
    }

    /// Calls `observer` after every delivery.
    #[must_use]
    pub fn observe(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Processes one message.
    pub async fn process(&self, message: &Message) -> Delivered {
        let started = std::time::Instant::now();
        let delivered = self.process_uncounted(message).await;
        self.stats.count(&delivered);
        if let Some(observe) = &self.observer {
            observe(message, &delivered, started.elapsed());
        }
        match &delivered.disposition {
            Disposition::DeadLetter(reason) => {
                tracing::warn!(key = ?delivered.key.as_ref().map(Key::as_str), outcome = %delivered.outcome, ?reason, attempt = message.attempt(), "message dead-lettered")
            }
            d => {
                tracing::debug!(key = ?delivered.key.as_ref().map(Key::as_str), outcome = %delivered.outcome, disposition = ?d, "message processed")
            }
        }
        delivered
    }

    async fn process_uncounted(&self, message: &Message) -> Delivered {
        // A key read from a payload that names a member twice could be another order's than
        // the one the handler reads: refused, as the HTTP layer refuses such a body. Payloads
        // are only scanned when a key source reads them.
        if self.keys.needs_body()
            && let Some(member) = message.ambiguous_member()
        {
            tracing::error!(%member, "message payload names a member twice; dead-lettered, not run");
            return Delivered {
                key: None,
                outcome: Outcome::Refused(Refusal::BodyAmbiguous),
                disposition: Disposition::DeadLetter(DeadReason::BadKey(format!(
                    "the payload names member `{member}` more than once"
                ))),
            };
        }
        let key = match self.keys.resolve(message) {
            Ok(Some(found)) => found.key,
            Ok(None) => {
                tracing::error!(sources = %self.keys, "message has no key; dead-lettered, not run");
                return Delivered {
                    key: None,
                    outcome: Outcome::Refused(Refusal::KeyMissing),
                    disposition: Disposition::DeadLetter(DeadReason::NoKey),
                };
            }
            Err(e) => {
                tracing::error!(error = %e, "message key unusable; dead-lettered, not run");
                return Delivered {
                    key: None,
                    outcome: Outcome::Refused(Refusal::KeyMalformed),
                    disposition: Disposition::DeadLetter(DeadReason::BadKey(e.to_string())),
                };
            }
        };
        let scoped = ScopedKey::new(self.scope.clone(), key.clone());
        let fingerprint = Fingerprint::of_bytes(FINGERPRINT_VERSION, message.payload());
        let job = Job {
            key: &scoped,
            fingerprint: &fingerprint,
            message,
        };
        let result = self.work.run(&self.engine, &job).await;
        let (outcome, disposition) = self.dispose(result, message.attempt());
        let disposition = match disposition {
            Park(reason) => self.park(&scoped, &fingerprint, reason).await,
            Now(d) => d,
        };
        Delivered {
            key: Some(key),
            outcome,
            disposition,
        }
    }

    /// The pure part: the engine's answer and the attempt number to an outcome and what to do.
    fn dispose(&self, result: RunResult, attempt: u32) -> (Outcome, Next) {
        let cfg = &self.config;
        let interrupted = self.engine.policy().interrupted_release();
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => {
                let outcome = e.outcome(interrupted);
                let next = match e {
                    EngineError::Store(_) => Now(Disposition::Redeliver {
                        after: cfg.store_retry_delay,
                        counted: false,
                    }),
                    EngineError::LeaseLost => Now(Disposition::Redeliver {
                        after: cfg.in_flight_delay,
                        counted: false,
                    }),
                    // Interrupted: released as the policy says; unknown is settled from the
                    // engine's probe on the redelivery if it has one, else an operator's.
                    _ if interrupted == ReleaseKind::Unknown => self.unknown(),
                    _ => self.failed_attempt(attempt),
                };
                return (outcome, next);
            }
        };
        let outcome = answer.outcome();
        let next = match answer {
            Answer::Executed {
                output, settled, ..
            } => match (output, settled) {
                (Ok(()), Settled::Stored) => Now(Disposition::Ack),
                // Not durable (the store failed while recording, or a newer holder took the
                // key over): no ack; the redelivery finds out what the record says.
                (_, Settled::Failed(_) | Settled::Fenced) => Now(Disposition::Redeliver {
                    after: cfg.store_retry_delay,
                    counted: false,
                }),
                (Err(HandlerError::Unknown(_)), _)
                | (_, Settled::Released(ReleaseKind::Unknown)) => self.unknown(),
                (Err(HandlerError::Permanent(why)), _) => Park(DeadReason::Permanent(why)),
                (Err(HandlerError::Retry(_)), _) => self.failed_attempt(attempt),
                // `Ok` with a release only comes from a custom `Work`: treat it as retryable.
                (Ok(()), _) => self.failed_attempt(attempt),
            },
            Answer::Replayed(_) => Now(Disposition::Ack),
            Answer::InFlight { retry_after } => Now(Disposition::Redeliver {
                after: retry_after.min(cfg.in_flight_delay),
                counted: false,
            }),
            Answer::Mismatch => Now(Disposition::DeadLetter(DeadReason::Mismatch)),
            Answer::Unknown => Now(Disposition::DeadLetter(DeadReason::Unknown)),
            // A later answer kind: nothing is known to be durable, so the message comes back.
            _ => Now(Disposition::Redeliver {
                after: cfg.store_retry_delay,
                counted: false,
            }),
        };
        (outcome, next)
    }

    /// A handler whose outcome is ambiguous left its key unknown. With a probe the engine
    /// settles it on the next delivery (stored and acknowledged, or released and run, or
    /// still unknown and then dead-lettered), so the message comes back; without one the key
    /// waits for an operator and the message is dead-lettered now.
    fn unknown(&self) -> Next {
        if self.engine.has_probe() {
            Now(Disposition::Redeliver {
                after: self.config.in_flight_delay,
                counted: false,
            })
        } else {
            Now(Disposition::DeadLetter(DeadReason::Unknown))
        }
    }

    fn failed_attempt(&self, attempt: u32) -> Next {
        if attempt >= self.config.max_attempts {
            Park(DeadReason::Exhausted(attempt))
        } else {
            Now(Disposition::Redeliver {
                after: self.config.backoff_after(attempt),
                counted: true,
            })
        }
    }

    /// Leaves the key unknown through the engine (claim, then release as unknown), so an
    /// operator sees it in the admin list and no redelivery runs it until it is resolved.
    async fn park(
        &self,
        key: &ScopedKey,
        fingerprint: &Fingerprint,
        reason: DeadReason,
    ) -> Disposition {
        let parked = self
            .engine
            .run(key, fingerprint, |_lease| async {
                Settlement::release((), ReleaseKind::Unknown)
            })
            .await;
        match parked {
            // Another attempt completed it meanwhile: the effect is durable.
            Ok(Answer::Replayed(_)) => Disposition::Ack,
            Ok(Answer::InFlight { retry_after }) => Disposition::Redeliver {
                after: retry_after.min(self.config.in_flight_delay),
                counted: false,
            },
            Ok(_) => Disposition::DeadLetter(reason),
            // The record could not be parked: try again later rather than lose sight of it.
            Err(_) => Disposition::Redeliver {
                after: self.config.store_retry_delay,
                counted: false,
            },
        }
    }
}

/// A disposition, or one that needs the record parked first.
enum Next {
    Now(Disposition),
    Park(DeadReason),
}
use Next::{Now, Park};

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use idem_core::MemoryStore;

    use super::*;
    use crate::work::Handled;

    /// Security: a key read from `{"order":{"id":1,"id":2}}` named order 2 while a handler
    /// keeping the first member acted on order 1. Such a payload is dead-lettered, not run.
    #[tokio::test]
    async fn a_payload_naming_its_key_member_twice_is_dead_lettered_not_run() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let work = Handled(move |_message: Message| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        let processor = Processor::new(
            Engine::new(MemoryStore::new(64), Default::default()),
            Scope::new("orders.paid").expect("scope"),
            KeySources::parse(&["{json.order.id}:ship"]).expect("sources"),
            ConsumerConfig::default(),
            work,
        );
        let ambiguous = Message::new(Vec::new(), r#"{"order":{"id":1,"id":2}}"#, 1);
        let delivered = processor.process(&ambiguous).await;
        assert!(
            matches!(&delivered.disposition, Disposition::DeadLetter(DeadReason::BadKey(why)) if why.contains("`id`")),
            "{:?}",
            delivered.disposition
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        // The same order written once runs.
        let plain = Message::new(Vec::new(), r#"{"order":{"id":1}}"#, 1);
        let delivered = processor.process(&plain).await;
        assert!(
            matches!(delivered.disposition, Disposition::Ack),
            "{:?}",
            delivered.disposition
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

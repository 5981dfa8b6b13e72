//! The retry loop every carrier shares: send, classify, and per the [`decide`](crate::decide)
//! table retry, wait, ask the status endpoint, return or stop; within the policy's attempts
//! and overall deadline, with one `tracing` event per attempt and per status query.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::decide::{Attempt, KeyState, Step, after_attempt, after_status};
use crate::error::ClientError;
use crate::policy::RetryPolicy;

/// An answer and how it was obtained.
#[derive(Debug)]
pub struct Done<T> {
    /// The answer.
    pub answer: T,
    /// Requests sent.
    pub attempts: u32,
    /// Whether it came from the status endpoint (the stored answer of an attempt whose own
    /// answer was lost).
    pub from_status: bool,
}

/// Runs one operation under `policy`. `send(attempt, timeout)` sends the request once;
/// `status(timeout)` asks the status endpoint about `key` (`Ok(None)` when there is none).
pub(crate) async fn run<T: fmt::Display>(
    policy: &RetryPolicy,
    key: &str,
    mut send: impl AsyncFnMut(u32, Duration) -> Attempt<T>,
    mut status: impl AsyncFnMut(Duration) -> Result<Option<KeyState<T>>, ClientError>,
) -> Result<Done<T>, ClientError> {
    let deadline = Instant::now() + policy.overall_deadline();
    let mut attempts = 0u32;
    let mut waits = 0u32;
    let mut last = String::from("none");
    let mut ask = false;
    let mut wait: Option<Option<Duration>> = None;
    loop {
        if let Some(retry_after) = wait.take() {
            let pause = policy.wait(waits, retry_after);
            waits += 1;
            if Instant::now() + pause >= deadline {
                return Err(gave_up(policy, key, attempts, last));
            }
            tokio::time::sleep(pause).await;
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(gave_up(policy, key, attempts, last));
        }
        let timeout = policy.per_attempt_timeout().min(remaining);
        if ask {
            let Some(state) = status(timeout).await? else {
                return Err(ClientError::Ambiguous {
                    key: key.to_owned(),
                    cause: last,
                });
            };
            tracing::info!(
                target: "idem_client",
                key,
                attempt = attempts,
                query = "status",
                state = state_label(&state),
                "status query"
            );
            if let KeyState::Unavailable(why) = &state {
                last = format!("status query failed: {why}");
            }
            match after_status(state) {
                Step::Return(answer) => {
                    return Ok(Done {
                        answer,
                        attempts,
                        from_status: true,
                    });
                }
                Step::Unknown => return Err(unknown(key)),
                Step::Retry(after) => {
                    ask = false;
                    wait = after.map(Some);
                }
                Step::AskStatus(after) => wait = Some(after),
            }
            continue;
        }
        if attempts >= policy.attempts() {
            return Err(ClientError::AttemptsExhausted {
                key: key.to_owned(),
                attempts,
                last,
            });
        }
        attempts += 1;
        let attempt = send(attempts, timeout).await;
        let label = attempt_label(&attempt);
        tracing::info!(
            target: "idem_client",
            key,
            attempt = attempts,
            result = label.as_str(),
            "attempt"
        );
        match after_attempt(attempt) {
            Step::Return(answer) => {
                return Ok(Done {
                    answer,
                    attempts,
                    from_status: false,
                });
            }
            Step::Unknown => return Err(unknown(key)),
            Step::Retry(after) => {
                last = label;
                wait = Some(after);
            }
            Step::AskStatus(_) => {
                last = label;
                ask = true;
            }
        }
    }
}

fn gave_up(policy: &RetryPolicy, key: &str, attempts: u32, last: String) -> ClientError {
    ClientError::DeadlineExceeded {
        key: key.to_owned(),
        attempts,
        deadline: policy.overall_deadline(),
        last,
    }
}

fn unknown(key: &str) -> ClientError {
    ClientError::OutcomeUnknown {
        key: key.to_owned(),
    }
}

fn attempt_label<T: fmt::Display>(a: &Attempt<T>) -> String {
    match a {
        Attempt::NotSent(why) => format!("not sent: {why}"),
        Attempt::Ambiguous(why) => format!("ambiguous: {why}"),
        Attempt::Retryable { answer, why, .. } => format!("{} ({answer})", why.as_str()),
        Attempt::OutcomeUnknown(answer) => format!("outcome unknown ({answer})"),
        Attempt::Final(answer) => format!("final ({answer})"),
    }
}

fn state_label<T>(s: &KeyState<T>) -> &'static str {
    match s {
        KeyState::Absent => "absent",
        KeyState::InFlight { .. } => "in_flight",
        KeyState::Completed(_) => "completed",
        KeyState::Unknown => "unknown",
        KeyState::Unavailable(_) => "unavailable",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::decide::Later;
    use crate::policy::Jitter;

    type Script<T> = Mutex<VecDeque<T>>;

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
            .jitter(Jitter::None)
            .max_attempts(3)
            .deadline(Duration::from_secs(10))
    }

    /// Runs the loop over scripted attempts and status answers; `None` for "no endpoint".
    async fn play(
        policy: &RetryPolicy,
        attempts: Vec<Attempt<&'static str>>,
        states: Option<Vec<KeyState<&'static str>>>,
    ) -> (Result<Done<&'static str>, ClientError>, usize) {
        let attempts: Script<_> = Mutex::new(attempts.into());
        let has_status = states.is_some();
        let states: Script<_> = Mutex::new(states.unwrap_or_default().into());
        let queries = Mutex::new(0usize);
        let result = run(
            policy,
            "k-1",
            async |_, _| {
                let next = attempts.lock().expect("lock").pop_front();
                next.unwrap_or(Attempt::NotSent("script ended".into()))
            },
            async |_| {
                *queries.lock().expect("lock") += 1;
                if !has_status {
                    return Ok(None);
                }
                let next = states.lock().expect("lock").pop_front();
                Ok(Some(
                    next.unwrap_or(KeyState::Unavailable("script ended".into())),
                ))
            },
        )
        .await;
        let q = *queries.lock().expect("lock");
        (result, q)
    }

    #[tokio::test(start_paused = true)]
    async fn failures_before_sending_are_retried() {
        let (r, q) = play(
            &policy(),
            vec![Attempt::NotSent("refused".into()), Attempt::Final("ok")],
            Some(vec![]),
        )
        .await;
        let done = r.expect("answer");
        assert_eq!(
            (done.answer, done.attempts, done.from_status, q),
            ("ok", 2, false, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ambiguous_failure_asks_before_deciding() {
        // Completed: the stored answer, without sending again.
        let (r, _) = play(
            &policy(),
            vec![Attempt::Ambiguous("reset".into())],
            Some(vec![
                KeyState::InFlight { retry_after: None },
                KeyState::Completed("stored"),
            ]),
        )
        .await;
        let done = r.expect("answer");
        assert_eq!(
            (done.answer, done.attempts, done.from_status),
            ("stored", 1, true)
        );
        // Absent: sent again with the same key.
        let (r, q) = play(
            &policy(),
            vec![Attempt::Ambiguous("reset".into()), Attempt::Final("second")],
            Some(vec![KeyState::Unavailable("503".into()), KeyState::Absent]),
        )
        .await;
        let done = r.expect("answer");
        assert_eq!((done.answer, done.attempts, q), ("second", 2, 2));
        // Unknown: a typed error, nothing sent again.
        let (r, _) = play(
            &policy(),
            vec![
                Attempt::Ambiguous("timeout".into()),
                Attempt::Final("never"),
            ],
            Some(vec![KeyState::Unknown]),
        )
        .await;
        assert!(matches!(r, Err(ClientError::OutcomeUnknown { key }) if key == "k-1"));
        // No endpoint: the caller is told it cannot be known.
        let (r, _) = play(&policy(), vec![Attempt::Ambiguous("timeout".into())], None).await;
        assert!(
            matches!(r, Err(ClientError::Ambiguous { cause, .. }) if cause.contains("timeout"))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn final_and_unknown_answers_stop_at_once() {
        let (r, _) = play(&policy(), vec![Attempt::Final("422")], Some(vec![])).await;
        assert_eq!(r.expect("answer").attempts, 1);
        let (r, _) = play(
            &policy(),
            vec![Attempt::OutcomeUnknown("409")],
            Some(vec![]),
        )
        .await;
        assert!(matches!(r, Err(ClientError::OutcomeUnknown { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_and_deadline_bound_the_operation() {
        let busy = || Attempt::Retryable {
            answer: "503",
            why: Later::Unavailable,
            retry_after: None,
        };
        let (r, _) = play(
            &policy(),
            vec![busy(), busy(), busy(), busy()],
            Some(vec![]),
        )
        .await;
        assert!(
            matches!(r, Err(ClientError::AttemptsExhausted { attempts: 3, .. })),
            "{r:?}"
        );
        // The server asks for more time than the deadline leaves: stop instead of waiting.
        let slow = Attempt::Retryable {
            answer: "429",
            why: Later::Throttled,
            retry_after: Some(Duration::from_secs(20)),
        };
        let p = policy().max_retry_after(Duration::from_secs(60));
        let started = Instant::now();
        let (r, _) = play(&p, vec![slow], Some(vec![])).await;
        assert!(
            matches!(r, Err(ClientError::DeadlineExceeded { attempts: 1, .. })),
            "{r:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured() {
        let started = Instant::now();
        let (r, _) = play(
            &policy(),
            vec![
                Attempt::Retryable {
                    answer: "409",
                    why: Later::InFlight,
                    retry_after: Some(Duration::from_secs(2)),
                },
                Attempt::Final("ok"),
            ],
            Some(vec![]),
        )
        .await;
        assert_eq!(r.expect("answer").answer, "ok");
        assert!(started.elapsed() >= Duration::from_secs(2));
    }
}

//! The HTTP clients: each picks operations (a caller, a key from a hot set or a long tail, a
//! body), sends each attempt to a random gateway and retries it with the same key on `409 in
//! flight` (honouring `Retry-After`), `503`, timeouts and broken or refused connections, with
//! backoff. Some operations reuse a completed key with another body (must get `422` and never
//! run); hot keys are shared by every caller, so the same key is sent by several principals.
//! Every attempt is recorded with its times, its gateway and what came back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::gateway::{ADMIN_TOKEN, STATUS_PATH};
use crate::history::{Answer, Attempt, AttemptResult, History, Op, OpKind, Phase};
use crate::upstream::Principals;

/// The callers every run uses.
pub fn callers() -> Vec<String> {
    ["alice", "bob", "carol"].map(String::from).to_vec()
}

/// A pooled HTTP/1.1 client.
#[derive(Debug, Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

/// A raw HTTP answer.
#[derive(Debug)]
pub struct Raw {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Http {
    /// A client with a one-second connect timeout.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(5))
                .build(connector),
        }
    }

    /// Sends one request; the error says whether anything could have been sent.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
        timeout: Duration,
    ) -> AttemptResultOr<Raw> {
        let mut b = Request::builder().method(method).uri(url);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        let req = match b.body(Full::new(Bytes::from(body.to_owned()))) {
            Ok(r) => r,
            Err(e) => return Err(AttemptResult::Broken(format!("bad request: {e}"))),
        };
        let exchange = async {
            let res = self.client.request(req).await.map_err(|e| {
                if e.is_connect() {
                    AttemptResult::Refused
                } else {
                    AttemptResult::Broken(format!("{e:?}"))
                }
            })?;
            let (parts, body) = res.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| AttemptResult::Broken(format!("reading the body: {e}")))?
                .to_bytes();
            Ok(Raw {
                status: parts.status.as_u16(),
                headers: parts.headers,
                body,
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(AttemptResult::Timeout),
        }
    }
}

/// An answer, or the attempt's failure.
pub type AttemptResultOr<T> = Result<T, AttemptResult>;

/// Reads an HTTP answer the way the checker needs it.
pub fn read_answer(raw: &Raw) -> Answer {
    let header = |n: &str| raw.headers.get(n).and_then(|v| v.to_str().ok());
    let json: Option<Value> = serde_json::from_slice(&raw.body).ok();
    let field = |name: &str| {
        json.as_ref()
            .and_then(|j| j.get(name))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let problem = if header("content-type").is_some_and(|c| c.contains("problem+json")) {
        field("type").map(|t| {
            t.rsplit_once("/problems/")
                .map_or(t.as_str(), |(_, slug)| slug)
                .to_owned()
        })
    } else {
        None
    };
    Answer {
        status: raw.status,
        replayed: header("idempotent-replayed") == Some("true"),
        exec: if problem.is_none() {
            field("exec")
        } else {
            None
        },
        caller: field("caller"),
        key: field("key"),
        problem,
        retry_after: header("retry-after").and_then(|v| v.trim().parse().ok()),
    }
}

/// How an operation ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// A definite answer (the upstream's, or a refusal that will not change).
    Settled,
    /// `409 outcome-unknown`: nothing runs until the record is resolved.
    Unknown,
    /// Given up: the deadline passed or the run stopped.
    Open,
}

/// What the clients share.
#[derive(Debug)]
pub struct Clients {
    clock: Clock,
    http: Http,
    gateways: Vec<String>,
    history: Mutex<History>,
    /// Normal operations that got an upstream answer: candidates for replays and probes.
    answered: Mutex<Vec<usize>>,
    stop: AtomicBool,
    attempt_timeout: Duration,
    seed: u64,
}

impl Clients {
    /// Clients of `gateways` (their base URLs).
    pub fn new(clock: Clock, gateways: Vec<String>, attempt_timeout: Duration, seed: u64) -> Self {
        Self {
            clock,
            http: Http::new(),
            gateways,
            history: Mutex::new(History::default()),
            answered: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            attempt_timeout,
            seed,
        }
    }

    /// Tells the clients to stop after their current attempt.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The history so far.
    pub fn history(&self) -> History {
        self.history.lock().clone()
    }

    /// Operations and attempts so far.
    pub fn counts(&self) -> (usize, usize) {
        let h = self.history.lock();
        (h.ops.len(), h.attempts.len())
    }

    fn new_op(&self, client: usize, caller: &str, key: &str, body: String, kind: OpKind) -> usize {
        let mut h = self.history.lock();
        let id = h.ops.len();
        h.ops.push(Op {
            id,
            client,
            caller: caller.to_owned(),
            key: key.to_owned(),
            body,
            kind,
        });
        id
    }

    /// One client's loop until [`Clients::stop`].
    pub async fn client(self: Arc<Self>, id: usize, hot: usize) {
        let mut rng = fastrand::Rng::with_seed(
            self.seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let callers = callers();
        let mut tail = 0u64;
        while !self.stop.load(Ordering::SeqCst) {
            let roll = rng.f64();
            let earlier = {
                let answered = self.answered.lock();
                (!answered.is_empty()).then(|| answered[rng.usize(..answered.len())])
            };
            let op = match earlier {
                Some(prev) if roll < 0.07 => {
                    let (caller, key, body) = self.op_parts(prev);
                    let other = mismatch_body(&body);
                    self.new_op(id, &caller, &key, other, OpKind::Mismatch)
                }
                Some(prev) if roll < 0.15 => {
                    let (caller, key, body) = self.op_parts(prev);
                    self.new_op(id, &caller, &key, body, OpKind::Normal)
                }
                _ => {
                    let caller = &callers[rng.usize(..callers.len())];
                    let key = if rng.f64() < 0.3 {
                        format!("hot-{}", rng.usize(..hot.max(1)))
                    } else {
                        tail += 1;
                        format!("t{id}-{tail}")
                    };
                    let body = body_for(caller, &key);
                    self.new_op(id, caller, &key, body, OpKind::Normal)
                }
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            self.run_op(op, Phase::Main, deadline, &mut rng, false)
                .await;
        }
    }

    fn op_parts(&self, op: usize) -> (String, String, String) {
        let h = self.history.lock();
        h.ops
            .get(op)
            .map(|o| (o.caller.clone(), o.key.clone(), o.body.clone()))
            .unwrap_or_default()
    }

    /// Sends `op` until it settles, `deadline` passes or (in the main phase) the run stops;
    /// with `wait_unknown`, an unknown key is asked again until the deadline (a reconciler
    /// may settle it).
    pub async fn run_op(
        &self,
        op: usize,
        phase: Phase,
        deadline: Instant,
        rng: &mut fastrand::Rng,
        wait_unknown: bool,
    ) -> Ending {
        let Some((caller, key, body, kind)) = self
            .history
            .lock()
            .ops
            .get(op)
            .map(|o| (o.caller.clone(), o.key.clone(), o.body.clone(), o.kind))
        else {
            return Ending::Open;
        };
        let api_key = Principals::api_key(&caller);
        let headers = [
            ("idempotency-key", key.as_str()),
            ("x-api-key", api_key.as_str()),
            ("content-type", "application/json"),
        ];
        let mut backoff = Duration::from_millis(50);
        loop {
            if (phase == Phase::Main && self.stop.load(Ordering::SeqCst))
                || Instant::now() >= deadline
            {
                return Ending::Open;
            }
            let g = rng.usize(..self.gateways.len().max(1));
            let url = format!("{}/charge", self.gateways.get(g).map_or("", String::as_str));
            let start_ms = self.clock.ms();
            let sent = self
                .http
                .send(Method::POST, &url, &headers, &body, self.attempt_timeout)
                .await;
            let result = match sent {
                Ok(raw) => AttemptResult::Answer(read_answer(&raw)),
                Err(failure) => failure,
            };
            let end_ms = self.clock.ms();
            let pause = next_step(&result, kind, &mut backoff, rng);
            self.history.lock().attempts.push(Attempt {
                op,
                gateway: g,
                start_ms,
                end_ms,
                phase,
                result: result.clone(),
            });
            match pause {
                Step::Done => {
                    if kind == OpKind::Normal && result.answer().is_some_and(Answer::from_upstream)
                    {
                        self.answered.lock().push(op);
                    }
                    return Ending::Settled;
                }
                Step::Unknown if !wait_unknown => return Ending::Unknown,
                Step::Unknown => tokio::time::sleep(Duration::from_secs(1)).await,
                Step::Wait(d) => tokio::time::sleep(d).await,
            }
        }
    }

    /// Queries the status endpoint of `gateway` about `op`'s key, as its caller.
    pub async fn status_of(&self, gateway: &str, op: usize) -> String {
        let Some((caller, key)) = self
            .history
            .lock()
            .ops
            .get(op)
            .map(|o| (o.caller.clone(), o.key.clone()))
        else {
            return "no such op".into();
        };
        let api_key = Principals::api_key(&caller);
        let url = format!("{gateway}{STATUS_PATH}/{key}?route=charge");
        match self
            .http
            .send(
                Method::GET,
                &url,
                &[("x-api-key", &api_key)],
                "",
                Duration::from_secs(5),
            )
            .await
        {
            Ok(raw) => serde_json::from_slice::<Value>(&raw.body)
                .ok()
                .and_then(|v| v.get("state").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| format!("answered {}", raw.status)),
            Err(e) => format!("no answer: {e:?}"),
        }
    }

    /// Unknown records the admin API of `admin` lists, as (namespace, principal, key).
    pub async fn unknown_records(&self, admin: &str) -> Vec<(String, String, String)> {
        let url = format!("{admin}/admin/records?state=unknown&limit=10000");
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let Ok(raw) = self
            .http
            .send(
                Method::GET,
                &url,
                &[("authorization", &auth)],
                "",
                Duration::from_secs(10),
            )
            .await
        else {
            return Vec::new();
        };
        let Ok(v) = serde_json::from_slice::<Value>(&raw.body) else {
            return Vec::new();
        };
        v.get("records")
            .and_then(Value::as_array)
            .map(|records| {
                records
                    .iter()
                    .map(|r| {
                        let s = |n: &str| {
                            r.get(n)
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned()
                        };
                        (s("namespace"), s("principal"), s("key"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Records what the gateways said at the end.
    pub fn set_final(&self, states: Vec<(usize, String)>, unknown: Vec<(String, String, String)>) {
        let mut h = self.history.lock();
        h.final_states = states;
        h.unknown_records = unknown;
    }

    /// The normal operations, one per caller and key, whose key never got an upstream
    /// answer: what the settle phase retries.
    pub fn open_ops(&self) -> Vec<usize> {
        let h = self.history.lock();
        let mut answered: HashMap<(&str, &str), bool> = HashMap::new();
        let mut first: HashMap<(&str, &str), usize> = HashMap::new();
        for op in h.ops.iter().filter(|o| o.kind == OpKind::Normal) {
            first.entry((&op.caller, &op.key)).or_insert(op.id);
            answered.entry((&op.caller, &op.key)).or_insert(false);
        }
        for a in &h.attempts {
            let Some(op) = h.ops.get(a.op) else { continue };
            if op.kind == OpKind::Normal && a.result.answer().is_some_and(Answer::from_upstream) {
                answered.insert((&op.caller, &op.key), true);
            }
        }
        let mut open: Vec<usize> = first
            .into_iter()
            .filter(|(k, _)| !answered.get(k).copied().unwrap_or(true))
            .map(|(_, id)| id)
            .collect();
        open.sort_unstable();
        open
    }
}

/// What a client does after an attempt.
#[derive(Debug)]
enum Step {
    /// The operation is settled.
    Done,
    /// The key is unknown.
    Unknown,
    /// Try again after this.
    Wait(Duration),
}

fn next_step(
    result: &AttemptResult,
    kind: OpKind,
    backoff: &mut Duration,
    rng: &mut fastrand::Rng,
) -> Step {
    let jittered = |d: Duration, rng: &mut fastrand::Rng| d.mul_f64(0.5 + rng.f64() * 0.5);
    let mut retry = |rng: &mut fastrand::Rng| {
        let d = jittered(*backoff, rng);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
        Step::Wait(d)
    };
    let Some(a) = result.answer() else {
        return retry(rng);
    };
    if a.from_upstream() {
        return Step::Done;
    }
    match (a.status, a.problem.as_deref()) {
        (409, Some("outcome-unknown")) => Step::Unknown,
        (409, _) | (503, _) => {
            let after = a.retry_after.map_or(*backoff, |s| {
                Duration::from_secs(s).min(Duration::from_secs(1))
            });
            Step::Wait(jittered(after, rng))
        }
        // The record became unknown (hold) or was released: the next attempt says which.
        (502 | 504, _) => retry(rng),
        (422, _) if kind == OpKind::Mismatch => Step::Done,
        (500, _) => retry(rng),
        // Any other answer will not change by retrying; the checker judges it.
        _ => Step::Done,
    }
}

/// The body an operation of `caller` on `key` sends.
pub fn body_for(caller: &str, key: &str) -> String {
    let amount = key
        .bytes()
        .chain(caller.bytes())
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        % 1000;
    json!({"amount": amount, "caller": caller, "key": key}).to_string()
}

/// Another body for the same key: the same fields with another amount and the probe's mark.
pub fn mismatch_body(body: &str) -> String {
    let mut v: Value = serde_json::from_str(body).unwrap_or_else(|_| json!({}));
    let amount = v.get("amount").and_then(Value::as_u64).unwrap_or(0) + 1;
    v["amount"] = amount.into();
    v["probe"] = "mismatch".into();
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_upstream_or_problem() {
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", "application/json".parse().expect("value"));
        headers.insert("idempotent-replayed", "true".parse().expect("value"));
        let up = read_answer(&Raw {
            status: 201,
            headers,
            body: Bytes::from_static(br#"{"exec":"e-3","caller":"bob","key":"k"}"#),
        });
        assert_eq!(up.exec.as_deref(), Some("e-3"));
        assert!(up.replayed && up.from_upstream());
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "content-type",
            "application/problem+json".parse().expect("value"),
        );
        headers.insert("retry-after", "1".parse().expect("value"));
        let p = read_answer(&Raw {
            status: 409,
            headers,
            body: Bytes::from_static(
                br#"{"type":"https://idem.dev/problems/in-flight","key":"k"}"#,
            ),
        });
        assert_eq!(p.problem.as_deref(), Some("in-flight"));
        assert_eq!(p.retry_after, Some(1));
        assert!(!p.from_upstream());
    }

    #[test]
    fn a_mismatch_body_differs_and_is_marked() {
        let b = body_for("alice", "k-1");
        let m = mismatch_body(&b);
        assert_ne!(b, m);
        assert!(m.contains("\"probe\":\"mismatch\""));
        assert_eq!(body_for("alice", "k-1"), b, "bodies are deterministic");
    }
}

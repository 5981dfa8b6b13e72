//! The service behind the gateways and relays, inside the harness (the nemesis never touches
//! it). It listens on one port per gateway and relay, so every call is known by where it came
//! from, and keeps a [`Ledger`] of every call and every execution: who, which key, which
//! fence, what it answered.
//!
//! It misbehaves the way services do, drawn per call from the run's seed, the caller, the key
//! and the call's number for that key: it answers slowly at random (sometimes past the route's
//! timeout), fails before acting (503), and fails after acting (500, which the routes store,
//! or a dropped connection). The work of a call runs in a task of its own, so a caller that
//! gives up does not stop an execution that has started, as in a real service.
//!
//! `GET /status?key=…&principal=…` is the status webhook the reconciler asks
//! (`crates/idem-gateway/src/reconcile.rs`): `{"outcome":"unknown"}` while a call for the key
//! is between arrival and its effect, `{"outcome":"complete",…}` with the first execution's
//! answer once one has acted, `{"outcome":"release"}` when none ever did.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::clock::Clock;

/// The fence header the gateway forwards with every protected request.
pub const FENCE_HEADER: &str = "idempotency-fence";

/// How the upstream misbehaves; probabilities per call.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    /// Answer 503 without acting.
    pub fail_before: f64,
    /// Act, then answer 500 (gateway routes only: a relay retries any 500).
    pub fail_after: f64,
    /// Act, then drop the connection without answering.
    pub drop_after: f64,
    /// Take 100–600 ms before acting.
    pub slow: f64,
    /// Take longer than the route's timeout before acting.
    pub very_slow: f64,
    /// The route's timeout.
    pub timeout: Duration,
}

impl Profile {
    /// The default mix for a route timeout.
    pub fn new(timeout: Duration) -> Self {
        Self {
            fail_before: 0.04,
            fail_after: 0.02,
            drop_after: 0.02,
            slow: 0.15,
            very_slow: 0.01,
            timeout,
        }
    }
}

/// What one call will do.
#[derive(Debug, Clone, Copy)]
struct Plan {
    before: Duration,
    after: Duration,
    refuse: bool,
    fail: bool,
    drop: bool,
}

impl Profile {
    fn draw(&self, rng: &mut fastrand::Rng, relay: bool) -> Plan {
        let before = if rng.f64() < self.very_slow {
            self.timeout + Duration::from_millis(rng.u64(100..600))
        } else if rng.f64() < self.slow {
            Duration::from_millis(rng.u64(100..600))
        } else {
            Duration::from_millis(rng.u64(0..30))
        };
        let roll = rng.f64();
        let refuse = roll < self.fail_before;
        let fail = !relay && !refuse && roll < self.fail_before + self.fail_after;
        let drop = !refuse && !fail && roll < self.fail_before + self.fail_after + self.drop_after;
        Plan {
            before,
            after: Duration::from_millis(rng.u64(0..20)),
            refuse,
            fail,
            drop,
        }
    }
}

/// One call that reached the upstream.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// Its index in the ledger.
    pub id: usize,
    /// Which gateway or relay sent it (`g0`, `r1`).
    pub via: String,
    /// The caller (`alice`) or the relay's principal (`relay:rabbit`).
    pub principal: String,
    /// Its `Idempotency-Key` header, if it had one.
    pub key: Option<String>,
    /// Its `Idempotency-Fence` header, if it had one.
    pub fence: Option<String>,
    /// When it arrived (ms since the run started).
    pub arrived_ms: u64,
    /// Its body.
    pub body: String,
    /// What became of it.
    pub outcome: CallOutcome,
}

/// What became of a call.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub enum CallOutcome {
    /// Still before its effect.
    Pending,
    /// Answered 503 without acting.
    Refused,
    /// Acted.
    Executed(Execution),
}

/// One execution: the effect happened.
#[derive(Debug, Clone, Serialize)]
pub struct Execution {
    /// Its id, which its answer carries (`e-17`).
    pub exec: String,
    /// When it acted.
    pub at_ms: u64,
    /// The status it answered (or would have, when dropped).
    pub status: u16,
    /// The body it answered.
    pub body: String,
    /// Whether the connection was dropped instead of answering.
    pub dropped: bool,
}

impl Call {
    /// The execution, if the call acted.
    pub fn execution(&self) -> Option<&Execution> {
        match &self.outcome {
            CallOutcome::Executed(e) => Some(e),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct KeyState {
    calls: u64,
    pending: u32,
    executions: Vec<usize>,
}

#[derive(Debug, Default)]
struct Inner {
    calls: Vec<Call>,
    keys: HashMap<(String, String), KeyState>,
    executions: u64,
}

/// Every call and execution the upstream saw.
#[derive(Debug)]
pub struct Ledger {
    inner: Mutex<Inner>,
    clock: Clock,
}

impl Ledger {
    fn new(clock: Clock) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            clock,
        }
    }

    /// Records a call's arrival; answers its id and its number among the key's calls.
    fn arrive(&self, mut call: Call) -> (usize, u64) {
        let mut inner = self.inner.lock();
        let id = inner.calls.len();
        call.id = id;
        let state = inner
            .keys
            .entry((call.principal.clone(), call.key.clone().unwrap_or_default()))
            .or_default();
        state.calls += 1;
        state.pending += 1;
        let n = state.calls;
        inner.calls.push(call);
        (id, n)
    }

    fn refuse(&self, id: usize) {
        let mut inner = self.inner.lock();
        let Some(call) = inner.calls.get_mut(id) else {
            return;
        };
        call.outcome = CallOutcome::Refused;
        let k = (call.principal.clone(), call.key.clone().unwrap_or_default());
        if let Some(s) = inner.keys.get_mut(&k) {
            s.pending = s.pending.saturating_sub(1);
        }
    }

    /// The effect: records the execution and the answer it gives.
    fn act(&self, id: usize, via: &str, plan: Plan) -> Option<Execution> {
        let mut inner = self.inner.lock();
        inner.executions += 1;
        let exec = format!("e-{}", inner.executions);
        let at_ms = self.clock.ms();
        let call = inner.calls.get_mut(id)?;
        let amount = serde_json::from_str::<Value>(&call.body)
            .ok()
            .and_then(|b| b.get("amount").cloned())
            .unwrap_or(Value::Null);
        let (status, body) = if plan.fail {
            let body = json!({"exec": exec, "caller": call.principal, "key": call.key,
                "error": "failed after acting", "via": via});
            (500, body.to_string())
        } else {
            let body = json!({"exec": exec, "caller": call.principal, "key": call.key,
                "amount": amount, "via": via});
            (201, body.to_string())
        };
        let execution = Execution {
            exec,
            at_ms,
            status,
            body,
            dropped: plan.drop,
        };
        call.outcome = CallOutcome::Executed(execution.clone());
        let k = (call.principal.clone(), call.key.clone().unwrap_or_default());
        if let Some(s) = inner.keys.get_mut(&k) {
            s.pending = s.pending.saturating_sub(1);
            s.executions.push(id);
        }
        Some(execution)
    }

    /// What the status webhook says about `principal`'s `key`.
    fn webhook(&self, principal: &str, key: &str) -> Value {
        let inner = self.inner.lock();
        let Some(state) = inner.keys.get(&(principal.to_owned(), key.to_owned())) else {
            return json!({"outcome": "release"});
        };
        if state.pending > 0 {
            return json!({"outcome": "unknown"});
        }
        match state
            .executions
            .first()
            .and_then(|&i| inner.calls.get(i))
            .and_then(Call::execution)
        {
            Some(e) => json!({
                "outcome": "complete",
                "status": e.status,
                "headers": {"content-type": "application/json"},
                "body": e.body,
            }),
            None => json!({"outcome": "release"}),
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().calls.clone()
    }

    /// Executions so far.
    pub fn executions(&self) -> u64 {
        self.inner.lock().executions
    }

    /// Calls still between arrival and effect.
    pub fn pending(&self) -> u64 {
        self.inner
            .lock()
            .keys
            .values()
            .map(|s| u64::from(s.pending))
            .sum()
    }
}

/// Maps a scope's principal as idem derives it (`credential_principal` for a caller,
/// `internal_principal("relay", name)` for a relay) back to its caller.
#[derive(Debug, Default, Clone)]
pub struct Principals {
    by_hash: HashMap<String, String>,
}

impl Principals {
    /// The API key a caller sends in `x-api-key`.
    pub fn api_key(caller: &str) -> String {
        format!("ak-{caller}")
    }

    /// Knows `callers` (their API keys) and `relays` (named `relay:<name>`).
    pub fn new(callers: &[String], relays: &[String]) -> Self {
        let mut by_hash = HashMap::new();
        for c in callers {
            by_hash.insert(
                idem_core::key::credential_principal(Self::api_key(c).as_bytes()),
                c.clone(),
            );
        }
        for r in relays {
            by_hash.insert(
                idem_core::key::internal_principal("relay", r),
                format!("relay:{r}"),
            );
        }
        Self { by_hash }
    }

    /// The caller behind a stored principal, if known.
    pub fn caller(&self, principal: &str) -> Option<&str> {
        self.by_hash.get(principal).map(String::as_str)
    }
}

#[derive(Debug)]
struct State {
    ledger: Arc<Ledger>,
    principals: Principals,
    profile: Profile,
    seed: u64,
}

/// The running upstream; its listeners stop when it is dropped.
#[derive(Debug)]
pub struct Upstream {
    addrs: Vec<SocketAddr>,
    ledger: Arc<Ledger>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Upstream {
    /// Listens on a spare loopback port for each of `vias` (`g0`, `g1`, `r0`, …).
    ///
    /// # Errors
    /// A listener cannot be bound.
    pub async fn start(
        vias: &[String],
        profile: Profile,
        seed: u64,
        clock: Clock,
        principals: Principals,
    ) -> anyhow::Result<Self> {
        let ledger = Arc::new(Ledger::new(clock));
        let state = Arc::new(State {
            ledger: Arc::clone(&ledger),
            principals,
            profile,
            seed,
        });
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for via in vias {
            let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
            addrs.push(listener.local_addr()?);
            tasks.push(tokio::spawn(accept(
                listener,
                Arc::from(via.as_str()),
                Arc::clone(&state),
            )));
        }
        Ok(Self {
            addrs,
            ledger,
            tasks,
        })
    }

    /// `http://127.0.0.1:<port>` of the `i`th via.
    pub fn url(&self, i: usize) -> String {
        self.addrs
            .get(i)
            .map_or_else(String::new, |a| format!("http://{a}"))
    }

    /// The ledger.
    pub fn ledger(&self) -> Arc<Ledger> {
        Arc::clone(&self.ledger)
    }
}

async fn accept(listener: TcpListener, via: Arc<str>, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (via, state) = (Arc::clone(&via), Arc::clone(&state));
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (via, state) = (Arc::clone(&via), Arc::clone(&state));
                async move { handle(req, via, state).await }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Returned by the service to drop the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped after acting")
    }
}

impl std::error::Error for Dropped {}

type Reply = Result<Response<Full<Bytes>>, Dropped>;

fn respond(status: u16, body: String) -> Reply {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(res)
}

async fn handle(req: Request<Incoming>, via: Arc<str>, state: Arc<State>) -> Reply {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/status") => webhook(&req, &state),
        (Method::POST, p) if p == "/charge" || p.starts_with("/relay/") => {
            call(req, &via, state).await
        }
        _ => respond(404, r#"{"error":"no such path"}"#.into()),
    }
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    let Some(q) = req.uri().query() else {
        return HashMap::new();
    };
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let v = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn webhook(req: &Request<Incoming>, state: &State) -> Reply {
    let q = query(req);
    let (Some(key), Some(principal)) = (q.get("key"), q.get("principal")) else {
        return respond(400, r#"{"error":"key and principal are required"}"#.into());
    };
    let Some(caller) = state.principals.caller(principal) else {
        // Not a principal this upstream knows: it never executed anything for it.
        return respond(200, json!({"outcome": "release"}).to_string());
    };
    respond(200, state.ledger.webhook(caller, key).to_string())
}

fn header(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A per-call random stream: the same seed, caller, key and call number draw the same
/// behaviour in every run.
fn call_rng(seed: u64, principal: &str, key: &str, n: u64) -> fastrand::Rng {
    let mut h = fnv_basis(seed);
    for b in principal.bytes().chain([0]).chain(key.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    fastrand::Rng::with_seed(h ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// FNV-1a's offset basis mixed with the seed.
fn fnv_basis(seed: u64) -> u64 {
    0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

async fn call(req: Request<Incoming>, via: &str, state: Arc<State>) -> Reply {
    let path = req.uri().path().to_owned();
    let relay = path.strip_prefix("/relay/").map(str::to_owned);
    let principal = match &relay {
        Some(name) => format!("relay:{name}"),
        None => match header(&req, "x-api-key") {
            Some(k) => k.strip_prefix("ak-").unwrap_or(&k).to_owned(),
            None => String::new(),
        },
    };
    let key = header(&req, "idempotency-key");
    let fence = header(&req, FENCE_HEADER);
    let body = match req.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => return Err(Dropped),
    };
    let arrived_ms = state.ledger.clock.ms();
    let (id, n) = state.ledger.arrive(Call {
        id: 0,
        via: via.to_owned(),
        principal: principal.clone(),
        key: key.clone(),
        fence,
        arrived_ms,
        body,
        outcome: CallOutcome::Pending,
    });
    let plan = state.profile.draw(
        &mut call_rng(state.seed, &principal, key.as_deref().unwrap_or(""), n),
        relay.is_some(),
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<Option<(u16, String)>>();
    let via = via.to_owned();
    tokio::spawn(async move {
        tokio::time::sleep(plan.before).await;
        if plan.refuse {
            state.ledger.refuse(id);
            let _ = tx.send(Some((503, r#"{"error":"not now"}"#.to_owned())));
            return;
        }
        let execution = state.ledger.act(id, &via, plan);
        tokio::time::sleep(plan.after).await;
        let _ = tx.send(match execution {
            Some(e) if !e.dropped => Some((e.status, e.body)),
            _ => None,
        });
    });
    match rx.await {
        Ok(Some((status, body))) => respond(status, body),
        _ => Err(Dropped),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_reads_the_reconcilers_encoding() {
        assert_eq!(percent_decode("h%3Aab12"), "h:ab12");
        assert_eq!(percent_decode("a%2Fb%20c"), "a/b c");
        assert_eq!(percent_decode("bad%zz"), "bad%zz");
    }

    #[test]
    fn the_same_call_draws_the_same_plan() {
        let p = Profile::new(Duration::from_secs(1));
        let a = p.draw(&mut call_rng(7, "alice", "k-1", 1), false);
        let b = p.draw(&mut call_rng(7, "alice", "k-1", 1), false);
        assert_eq!(
            (a.before, a.refuse, a.fail, a.drop),
            (b.before, b.refuse, b.fail, b.drop)
        );
    }

    #[test]
    fn principals_map_back_to_callers() {
        let p = Principals::new(&["alice".into()], &["rabbit".into()]);
        let alice = idem_core::key::credential_principal(b"ak-alice");
        assert_eq!(p.caller(&alice), Some("alice"));
        let relay = idem_core::key::internal_principal("relay", "rabbit");
        assert_eq!(p.caller(&relay), Some("relay:rabbit"));
        // A caller whose API key reads like a relay's name is not that relay.
        let pretender = idem_core::key::credential_principal(b"relay:rabbit");
        assert_eq!(p.caller(&pretender), None);
        assert_eq!(p.caller("h:00"), None);
    }
}

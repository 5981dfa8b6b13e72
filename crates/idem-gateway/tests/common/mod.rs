//! Shared harness: the real `idem` binary, a programmable test upstream, and a small client.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    missing_debug_implementations
)]

pub mod configs;
pub mod in_process;
pub mod pki;
pub mod wire;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// A running `idem` process, killed on drop.
pub struct Gateway {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    _dir: Option<TempDir>,
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idem-gw-{tag}-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idem")
}

impl Gateway {
    /// Starts `idem serve` with a TOML config (written to a temp file) and extra args.
    pub fn start(config: &str, args: &[&str]) -> Self {
        Self::start_env(config, args, &[])
    }

    pub fn start_env(config: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let (dir, mut cmd) = command("serve", config);
        cmd.args(["--listen", "127.0.0.1:0"]).args(args);
        cmd.env("RUST_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.current_dir(&dir.0);
        let mut gw = Self::spawn(cmd);
        gw._dir = Some(dir);
        gw
    }

    /// Spawns a prepared command and waits for its listener lines.
    #[allow(clippy::zombie_processes)] // the child is reaped in `Drop`
    pub fn spawn(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn idem");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    lines.lock().push(line);
                }
            });
        }
        let mut reader = BufReader::new(stdout);
        let mut admin = None;
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).expect("read stdout");
            if n == 0 {
                let status = child.wait().expect("wait");
                panic!(
                    "idem exited ({status}) before listening:\n{}",
                    lines.lock().join("\n")
                );
            }
            let after = |prefix: &str| {
                let rest = line.trim().strip_prefix(prefix)?;
                rest.strip_prefix("http://")
                    .or_else(|| rest.strip_prefix("https://"))
                    .map(str::to_owned)
            };
            if let Some(a) = after("admin listening on ") {
                admin = Some(a.parse().expect("admin addr"));
            }
            if let Some(a) = after("idem listening on ") {
                let addr = a.parse().expect("addr");
                // Keep draining stdout so the child never blocks on a full pipe.
                std::thread::spawn(move || for _ in reader.lines() {});
                return Self {
                    child: Some(child),
                    addr,
                    admin,
                    stderr: lines,
                    _dir: None,
                };
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin.expect("admin listener"), path)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("child").id()
    }

    /// Sends SIGTERM.
    pub fn term(&self) {
        self.signal("-TERM");
    }

    /// SIGHUP: reload the configuration.
    pub fn hup(&self) {
        self.signal("-HUP");
    }

    /// Sends signal `sig` (`-STOP`, `-CONT`, …) to the process and asserts it was delivered.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// The configuration file `start` wrote, for tests that change it and reload.
    pub fn config_path(&self) -> std::path::PathBuf {
        self._dir
            .as_ref()
            .expect("started from a config")
            .0
            .join("idem.toml")
    }

    /// SIGKILL, now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit; returns whether it exited successfully.
    pub async fn wait_exit(&mut self, limit: Duration) -> bool {
        let mut child = self.child.take().expect("child");
        let status = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + limit;
            loop {
                if let Some(s) = child.try_wait().expect("try_wait") {
                    return Some(s);
                }
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .expect("join");
        matches!(status, Some(s) if s.success())
    }

    pub fn logs(&self) -> String {
        self.stderr.lock().join("\n")
    }

    /// Whether a log line containing `needle` shows up within 5 s. A line is logged after
    /// the response is sent and read from the pipe by another thread, so it can trail the
    /// response the test has just received.
    pub async fn logged(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if self.logs().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.logs().contains(needle)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the test upstream saw.
#[derive(Default)]
pub struct Seen {
    pub executions: AtomicU64,
    pub by_path: Mutex<HashMap<String, u64>>,
    pub request_ids: Mutex<Vec<String>>,
    pub headers: Mutex<Vec<HeaderMap>>,
    /// Notified when a request arrives (before any delay).
    pub arrived: Notify,
    /// Requests being handled right now, and the most there ever were at once.
    pub running: AtomicU64,
    pub peak: AtomicU64,
    /// Upgraded (`/ws`) connections open at the upstream right now.
    pub tunnels: AtomicU64,
}

impl Seen {
    pub fn count(&self, path: &str) -> u64 {
        self.by_path.lock().get(path).copied().unwrap_or(0)
    }
    pub fn total(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
    /// The most requests the upstream was handling at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
    /// Upgraded connections open at the upstream.
    pub fn tunnels(&self) -> u64 {
        self.tunnels.load(Ordering::SeqCst)
    }
}

/// Counts one request as running at the upstream until dropped.
struct Running<'a>(&'a Seen);

impl<'a> Running<'a> {
    fn start(seen: &'a Seen) -> Self {
        let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
        seen.peak.fetch_max(now, Ordering::SeqCst);
        Self(seen)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A test upstream: a path containing `/status/{code}` answers that status, `?delay_ms=N`
/// waits first, a path ending in `/reset` drops the connection without answering, one ending
/// in `/ws` with an `Upgrade` header switches to a protocol that echoes every byte; every
/// request is counted by path.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    pub async fn start_on(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Seen::default());
        let task = tokio::spawn(serve(listener, Arc::clone(&seen)));
        Self { addr, seen, task }
    }

    /// POSTs `{}` to `url` with idempotency key `key` in the background, and returns once the
    /// request has reached this upstream (at most 5 s), so it is in flight behind the gateway.
    /// The handle answers with the reply, or the error if the connection died.
    pub async fn in_flight(
        &self,
        http: &Http,
        url: String,
        key: &str,
    ) -> tokio::task::JoinHandle<Result<Reply, String>> {
        self.in_flight_with(http, url, &[("idempotency-key", key)])
            .await
    }

    /// [`in_flight`](Self::in_flight) with `headers` in place of the key alone.
    pub async fn in_flight_with(
        &self,
        http: &Http,
        url: String,
        headers: &[(&str, &str)],
    ) -> tokio::task::JoinHandle<Result<Reply, String>> {
        let arrived = self.seen.arrived.notified();
        tokio::pin!(arrived);
        arrived.as_mut().enable();
        let http = http.clone();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        let pending = tokio::spawn(async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            http.try_send(Method::POST, &url, &headers, "{}").await
        });
        tokio::time::timeout(Duration::from_secs(5), arrived)
            .await
            .expect("the request reached the upstream");
        pending
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

async fn serve(listener: TcpListener, seen: Arc<Seen>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let seen = Arc::clone(&seen);
                async move { handle(req, seen).await }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades()
                .await;
        });
    }
}

#[derive(Debug)]
struct Reset;
impl std::fmt::Display for Reset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reset")
    }
}
impl std::error::Error for Reset {}

async fn handle(
    mut req: Request<hyper::body::Incoming>,
    seen: Arc<Seen>,
) -> Result<http::Response<Full<Bytes>>, Reset> {
    if req.uri().path().ends_with("/ws") && req.headers().contains_key(http::header::UPGRADE) {
        *seen
            .by_path
            .lock()
            .entry(req.uri().path().to_owned())
            .or_default() += 1;
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(echo(on, seen));
        let mut res = http::Response::new(Full::new(Bytes::new()));
        *res.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = res.headers_mut();
        h.insert("upgrade", "echo".parse().expect("value"));
        h.insert("connection", "upgrade".parse().expect("value"));
        return Ok(res);
    }
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let _running = Running::start(&seen);
    let n = seen.executions.fetch_add(1, Ordering::SeqCst) + 1;
    *seen.by_path.lock().entry(path.clone()).or_default() += 1;
    if let Some(id) = parts
        .headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
    {
        seen.request_ids.lock().push(id.to_owned());
    }
    seen.headers.lock().push(parts.headers.clone());
    seen.arrived.notify_waiters();
    let delay = parts
        .uri
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("delay_ms=")))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    if path.ends_with("/reset") {
        return Err(Reset);
    }
    if let Some((encoding, body)) = encoded(&path) {
        // A compressed answer, as a server that negotiated `accept-encoding` sends it.
        let mut res = http::Response::new(Full::new(Bytes::from_static(body)));
        *res.status_mut() = StatusCode::CREATED;
        let h = res.headers_mut();
        h.insert("content-type", "application/json".parse().expect("value"));
        h.insert("content-encoding", encoding.parse().expect("value"));
        h.insert("vary", "accept-encoding".parse().expect("value"));
        return Ok(res);
    }
    if path.ends_with("/idem-problem") {
        // The upstream's own answer that looks like one of idem's problems.
        let mut res = http::Response::new(Full::new(Bytes::from_static(
            br#"{"type":"https://idem.dev/problems/in-flight","title":"Request in flight","status":409}"#,
        )));
        *res.status_mut() = StatusCode::CONFLICT;
        res.headers_mut().insert(
            "content-type",
            "application/problem+json".parse().expect("value"),
        );
        return Ok(res);
    }
    let status = path
        .split("/status/")
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let echo = serde_json::json!({
        "n": n,
        "path": path,
        "method": parts.method.as_str(),
        "body": String::from_utf8_lossy(&body),
    });
    let mut res = http::Response::new(Full::new(Bytes::from(echo.to_string())));
    *res.status_mut() = status;
    res.headers_mut()
        .insert("content-type", "application/json".parse().expect("value"));
    res.headers_mut()
        .insert("set-cookie", "session=secret".parse().expect("value"));
    Ok(res)
}

/// Echoes every byte of an upgraded connection until its other side closes it, counted in
/// [`Seen::tunnels`] while open.
async fn echo(on: hyper::upgrade::OnUpgrade, seen: Arc<Seen>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(upgraded) = on.await else { return };
    seen.tunnels.fetch_add(1, Ordering::SeqCst);
    let mut io = TokioIo::new(upgraded);
    let mut buf = [0u8; 1024];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if io.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    seen.tunnels.fetch_sub(1, Ordering::SeqCst);
}

/// `{"charged":true,"amount":100}` gzip-compressed (mtime 0).
pub const GZIP_BODY: &[u8] = &[
    31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 171, 86, 74, 206, 72, 44, 74, 79, 77, 81, 178, 42, 41, 42, 77,
    213, 81, 74, 204, 205, 47, 205, 43, 81, 178, 50, 52, 48, 168, 5, 0, 182, 44, 183, 32, 29, 0, 0,
    0,
];

/// `{"charged":true,"amount":100}` brotli-compressed.
pub const BROTLI_BODY: &[u8] = &[
    11, 14, 128, 123, 34, 99, 104, 97, 114, 103, 101, 100, 34, 58, 116, 114, 117, 101, 44, 34, 97,
    109, 111, 117, 110, 116, 34, 58, 49, 48, 48, 125, 3,
];

/// Paths ending in `/gzip` or `/br` answer with a compressed body.
fn encoded(path: &str) -> Option<(&'static str, &'static [u8])> {
    if path.ends_with("/gzip") {
        Some(("gzip", GZIP_BODY))
    } else if path.ends_with("/br") {
        Some(("br", BROTLI_BODY))
    } else {
        None
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn problem_type(&self) -> String {
        self.json()["type"]
            .as_str()
            .unwrap_or("")
            .trim_start_matches("https://idem.dev/problems/")
            .to_owned()
    }
    /// Asserts the answer's status is `want`, showing the body when it is not.
    #[track_caller]
    pub fn assert_status(&self, want: StatusCode) {
        assert_eq!(self.status, want, "{}", String::from_utf8_lossy(&self.body));
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// A pooled HTTP client for tests.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        self.try_send(method, url, headers, body)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    pub async fn try_send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Result<Reply, String> {
        let mut b = Request::builder().method(method).uri(url);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        let req = b
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| e.to_string())?;
        let res = self
            .client
            .request(req)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// `method` at `url` as `principal` (its `x-api-key`), with `extra` headers and `body`.
    pub async fn send_as(
        &self,
        method: Method,
        url: &str,
        principal: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut headers = vec![("x-api-key", principal)];
        headers.extend_from_slice(extra);
        self.send(method, url, &headers, body).await
    }

    /// A plain `GET` of `url`: no header, no body.
    pub async fn get(&self, url: &str) -> Reply {
        self.send(Method::GET, url, &[], "").await
    }

    /// `method` at `url` (an admin endpoint) with `body`, authorized by [`ADMIN_TOKEN`].
    pub async fn admin(&self, method: Method, url: &str, body: &str) -> Reply {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        self.send(method, url, &[("authorization", &auth)], body)
            .await
    }

    /// POSTs `{}` to `url` under idempotency key `key` and no other header: the request
    /// [`Upstream::in_flight`] sends, so a retry of one carries the same fingerprint.
    pub async fn post_keyed(&self, url: &str, key: &str) -> Reply {
        self.try_post_keyed(url, key)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    /// [`post_keyed`](Self::post_keyed): the answer, or why there was none.
    pub async fn try_post_keyed(&self, url: &str, key: &str) -> Result<Reply, String> {
        self.try_send(Method::POST, url, &[("idempotency-key", key)], "{}")
            .await
    }

    pub async fn post(&self, url: &str, key: Option<&str>, body: &str) -> Reply {
        let mut headers = vec![("content-type", "application/json")];
        if let Some(k) = key {
            headers.push(("idempotency-key", k));
        }
        self.send(Method::POST, url, &headers, body).await
    }
}

/// The `Idempotency-Key` a hand-made upstream was sent, or `""` without one.
pub fn idempotency_key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// A fresh idempotency key.
pub fn key() -> String {
    format!("k-{}", uuid::Uuid::now_v7())
}

/// True when the test must fail rather than skip on a missing service.
pub fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The shared services the store variants of the tests use.
pub const REDIS: &str = "127.0.0.1:6379";
pub const POSTGRES: &str = "127.0.0.1:5432";
pub const PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub const MYSQL: &str = "127.0.0.1:3306";
pub const MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// Whether `name` answers at `addr`. In CI a service that is down fails the test; elsewhere
/// the test says it skipped and returns.
pub async fn service_up(addr: &str, name: &str) -> bool {
    if reachable(addr).await {
        return true;
    }
    assert!(!ci(), "{name} is not running on {addr}");
    eprintln!("SKIPPED: {name} is not running on {addr}");
    false
}

/// Whether something accepts TCP connections at `addr`.
pub async fn reachable(addr: &str) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// `idem <subcommand> --config <file>`, `config` written to `idem.toml` in a fresh temp
/// directory, which the caller keeps for as long as the command runs.
pub fn command(subcommand: &str, config: &str) -> (TempDir, Command) {
    let dir = TempDir::new(subcommand);
    let path = dir.0.join("idem.toml");
    std::fs::write(&path, config).expect("write config");
    let mut cmd = Command::new(bin());
    cmd.arg(subcommand).arg("--config").arg(path);
    (dir, cmd)
}

/// Runs `idem check-config` on `config` (written to a fresh temp file); what it printed and
/// how it exited.
pub fn check_config(config: &str) -> std::process::Output {
    let (_dir, mut cmd) = command("check-config", config);
    cmd.output().expect("run idem check-config")
}

/// A fault proxy in front of `gw` that applies `plan`, in order, to the POSTs through it.
pub async fn posts_proxy(
    gw: &Gateway,
    plan: impl IntoIterator<Item = idem_testkit::fault_proxy::Fault>,
) -> idem_testkit::fault_proxy::FaultProxy {
    idem_testkit::fault_proxy::FaultProxy::start_matching(
        gw.addr,
        idem_testkit::fault_proxy::posts,
        plan,
    )
    .await
    .expect("proxy")
}

/// Serves `app` (a hand-made upstream) on a spare loopback port for as long as the test's
/// runtime lives; its address.
pub async fn serve_router(app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// A spare loopback port (bound, then released).
pub fn spare_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

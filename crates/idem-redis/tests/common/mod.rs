//! Test support: the shared local Redis, private `redis-server` instances and a private
//! 3-master cluster, each torn down even if the test panics or the process dies.
//!
//! Every private server runs under a tiny `sh` keeper whose stdin is a pipe from this process.
//! When the pipe closes (the guard is dropped, or this process exits in any way, abort
//! included) the keeper resumes, kills the server and removes its directory. So a cluster kept
//! in a `static` for the whole test binary is cleaned up too, though statics are never dropped.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idem_redis::{RedisConfig, RedisStore};

/// The shared server every developer machine and CI run has.
pub const LOCAL_URL: &str = "redis://127.0.0.1:6379";

/// A key prefix no other test or store instance uses.
pub fn unique_prefix() -> String {
    format!("idem-test:{}:", uuid::Uuid::now_v7().simple())
}

/// True when the shared Redis answers. In CI a missing server fails the test; elsewhere the
/// caller skips with a loud message.
pub fn local_redis_up() -> bool {
    let up = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:6379".parse().expect("addr"),
        Duration::from_millis(300),
    )
    .is_ok();
    if !up {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: Redis is not running on 127.0.0.1:6379"
        );
        eprintln!("!!! SKIPPING: no Redis on 127.0.0.1:6379 (set CI=1 to make this a failure)");
    }
    up
}

/// True when `redis-server` can be started. Same CI rule as [`local_redis_up`].
pub fn redis_server_available() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI: redis-server is not installed"
        );
        eprintln!("!!! SKIPPING: redis-server not found");
    }
    ok
}

/// A store on `url` with a fresh prefix and the given op timeout.
pub async fn store_at(url: &str, op_timeout: Duration) -> RedisStore {
    let config = RedisConfig::from_url(url)
        .expect("url")
        .prefix(unique_prefix())
        .expect("prefix")
        .op_timeout(op_timeout)
        .expect("timeout");
    RedisStore::connect(config).await.expect("connect")
}

/// A loopback port that is free now, and whose cluster bus port (+10000) is free too.
pub fn spare_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

const KEEPER: &str = r#"
dir=$1; shift
redis-server "$@" --dir "$dir" >"$dir/log" 2>&1 &
pid=$!
echo "$pid"
read -r _
kill -CONT "$pid" 2>/dev/null
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$dir"
"#;

/// A private `redis-server` on a spare loopback port.
pub struct Server {
    pub port: u16,
    pid: u32,
    keeper: Child,
    stdin: Option<ChildStdin>,
    extra: Vec<String>,
}

impl Server {
    /// Starts a server (no persistence) and waits until it answers.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(spare_port(), extra.iter().map(|s| s.to_string()).collect())
    }

    fn start_on(port: u16, extra: Vec<String>) -> Self {
        let dir =
            std::env::temp_dir().join(format!("idem-redis-test-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut keeper = Command::new("sh")
            .arg("-c")
            .arg(KEEPER)
            .arg("keeper")
            .arg(&dir)
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ])
            .args(&extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn redis-server keeper");
        let mut line = String::new();
        BufReader::new(keeper.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("keeper pid");
        let pid = line.trim().parse().expect("pid");
        let stdin = keeper.stdin.take();
        let server = Self {
            port,
            pid,
            keeper,
            stdin,
            extra,
        };
        server.wait_ready();
        server
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&self) {
        // Nothing to await: the server gives no signal but its open port. Poll briefly.
        let give_up = Instant::now() + Duration::from_secs(10);
        while self.cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                Instant::now() < give_up,
                "redis-server on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A private replica of this server, returned once it is online.
    pub async fn start_replica(&self) -> Server {
        let replica = Server::start(&["--replicaof", "127.0.0.1", &self.port.to_string()]);
        let give_up = Instant::now() + Duration::from_secs(10);
        while !self
            .cli(&["INFO", "replication"])
            .is_some_and(|i| i.contains("connected_slaves:1") && i.contains("state=online"))
        {
            assert!(Instant::now() < give_up, "replica did not come online");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        replica
    }

    /// Runs `redis-cli` against this server; `None` if it failed.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Calls of `command` since the last `CONFIG RESETSTAT`, from `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        let needle = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Every command's calls, for reports.
    pub fn all_calls(&self) -> Vec<(String, u64)> {
        let info = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
            })
            .collect()
    }

    /// Freezes the server (SIGSTOP); [`Server::resume`] or drop thaws it.
    pub fn freeze(&self) {
        signal("-STOP", self.pid);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn resume(&self) {
        signal("-CONT", self.pid);
    }

    /// Kills the server and its directory; the port is free again afterwards.
    pub fn kill(mut self) -> u16 {
        let port = self.port;
        self.shut();
        port
    }

    /// Kills the server and starts an empty one on the same port and options.
    pub fn restart_empty(mut self) -> Self {
        let (port, extra) = (self.port, std::mem::take(&mut self.extra));
        self.shut();
        Self::start_on(port, extra)
    }

    fn shut(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.keeper.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut();
    }
}

fn signal(sig: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// A private 3-master Redis Cluster on spare loopback ports.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts three cluster-enabled servers, joins them and waits until the cluster is ok.
    pub fn start() -> Self {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::start(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let give_up = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_some_and(|i| i.contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < give_up, "cluster did not converge");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { nodes }
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// One cluster for the whole test binary, created by the first caller; its keepers tear it
    /// down when the process exits.
    pub fn shared() -> &'static Cluster {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        CLUSTER.get_or_init(Cluster::start)
    }
}

/// The conformance harness: stores on one server (or cluster), each with its own key prefix,
/// sharing one connection. Time passes by sleeping; leases are judged by the server's clock.
pub struct RedisHarness {
    conn: idem_redis::script::Connection,
    url: String,
    lease: Duration,
}

impl RedisHarness {
    /// A harness on the shared local Redis, or `None` (skipped loudly) when it is missing.
    pub async fn local() -> Option<Self> {
        if !local_redis_up() {
            return None;
        }
        Some(Self::connect(LOCAL_URL).await)
    }

    /// A harness on the private cluster of this test binary, or `None` without redis-server.
    pub async fn cluster() -> Option<Self> {
        if !redis_server_available() {
            return None;
        }
        let url = tokio::task::spawn_blocking(|| Cluster::shared().url())
            .await
            .expect("start cluster");
        Some(Self::connect(&url).await)
    }

    async fn connect(url: &str) -> Self {
        let store = store_at(url, Duration::from_millis(500)).await;
        Self {
            conn: store.connection().clone(),
            url: url.to_owned(),
            lease: Duration::from_millis(600),
        }
    }
}

impl idem_testkit::Harness for RedisHarness {
    type Store = RedisStore;

    fn store(&self) -> impl std::future::Future<Output = RedisStore> + Send {
        let config = RedisConfig::from_url(&self.url)
            .and_then(|c| c.prefix(unique_prefix()))
            .and_then(|c| c.op_timeout(Duration::from_millis(500)))
            .expect("config");
        std::future::ready(RedisStore::with_connection(self.conn.clone(), config))
    }

    fn advance(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
        idem_testkit::sleep_for(d)
    }

    fn lease(&self) -> Duration {
        self.lease
    }
}

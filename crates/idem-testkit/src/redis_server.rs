//! Private `redis-server` instances and Redis Clusters for tests that stop, freeze or
//! cluster a server, which the shared local Redis must never be.
//!
//! Every private server runs under a tiny `sh` keeper whose stdin is a pipe from this process.
//! When the pipe closes (the guard is dropped, or this process exits in any way, abort
//! included) the keeper resumes, kills the server and removes its directory. So a cluster kept
//! in a `static` for the whole test binary is cleaned up too, though statics are never dropped.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// True when `redis-server` can be started. Outside CI a missing binary is reported loudly
/// and the caller skips; under CI (`CI` set) it fails the test.
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

/// A private `redis-server` on a spare loopback port, killed (and its directory removed) on
/// drop.
#[derive(Debug)]
pub struct Server {
    /// The port it listens on: the TLS port for [`Server::start_tls`].
    pub port: u16,
    /// The TLS port, when started with [`Server::start_tls`].
    pub tls_port: Option<u16>,
    /// `redis-cli` arguments that reach it (port, and TLS files when it speaks TLS).
    cli_args: Vec<String>,
    pid: u32,
    keeper: Child,
    stdin: Option<ChildStdin>,
    extra: Vec<String>,
}

impl Server {
    /// Starts a server (no persistence) with extra `redis-server` arguments and waits until
    /// it answers.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_on(spare_port(), extra.iter().map(|s| s.to_string()).collect())
    }

    /// Starts a server that speaks only TLS (`--port 0 --tls-port P`) with the given PEM
    /// files (`ca` verifies client certificates when `--tls-auth-clients yes` is passed in
    /// `extra`), and waits until its TLS port accepts connections.
    pub fn start_tls(cert: &str, key: &str, ca: &str, extra: &[&str]) -> Self {
        let tls_port = spare_port();
        let mut args: Vec<String> = [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--tls-ca-cert-file",
            ca,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = Self::spawn(0, args);
        server.port = tls_port;
        server.tls_port = Some(tls_port);
        server.cli_args = [
            "-p",
            &tls_port.to_string(),
            "--tls",
            "--cacert",
            ca,
            "--cert",
            cert,
            "--key",
            key,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        server.wait_ready();
        server
    }

    fn start_on(port: u16, extra: Vec<String>) -> Self {
        let server = Self::spawn(port, extra);
        server.wait_ready();
        server
    }

    fn spawn(port: u16, extra: Vec<String>) -> Self {
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
        Self {
            port,
            tls_port: None,
            cli_args: vec!["-p".to_owned(), port.to_string()],
            pid,
            keeper,
            stdin,
            extra,
        }
    }

    /// `redis://127.0.0.1:<port>` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls_port.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The `redis-server` process's id (for reading its CPU time, say).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
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
        crate::services::output_of(Command::new("redis-cli").args(&self.cli_args).args(args))
    }

    /// Calls of `command` since the last `CONFIG RESETSTAT`, from `INFO commandstats`; 0 when
    /// the server does not list it.
    pub fn calls(&self, command: &str) -> u64 {
        self.listed_calls(command).unwrap_or(0)
    }

    /// As [`calls`](Self::calls), but `None` when `INFO commandstats` does not list `command`
    /// (never called since the last reset, or the server did not answer).
    pub fn listed_calls(&self, command: &str) -> Option<u64> {
        let info = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        let needle = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
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

    /// Keys in the server's database.
    pub fn dbsize(&self) -> u64 {
        self.cli(&["DBSIZE"])
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
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

/// A private Redis Cluster of three masters (and optionally one replica each) on spare
/// loopback ports. Each server is killed when the cluster is dropped.
#[derive(Debug)]
pub struct Cluster {
    /// Every live node, masters and replicas.
    pub nodes: Vec<Server>,
    /// Whether the nodes speak TLS only (clients, cluster bus and replication).
    tls: bool,
}

impl Cluster {
    /// Three masters, no replicas, node timeout 2 s.
    pub fn start() -> Self {
        Self::start_with(0, 2000)
    }

    /// Three masters with one replica each, node timeout 1 s (a killed master's replica
    /// takes over within a few seconds).
    pub fn start_with_replicas() -> Self {
        Self::start_with(1, 1000)
    }

    /// Three masters that speak only TLS, with these PEM files (the server certificate also
    /// serves as `redis-cli`'s client certificate).
    pub fn start_tls(cert: &str, key: &str, ca: &str) -> Self {
        Self::start_on(0, 2000, Some((cert, key, ca)))
    }

    fn start_with(replicas: usize, node_timeout_ms: u64) -> Self {
        Self::start_on(replicas, node_timeout_ms, None)
    }

    fn start_on(replicas: usize, node_timeout_ms: u64, tls: Option<(&str, &str, &str)>) -> Self {
        let node_timeout = node_timeout_ms.to_string();
        let cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout,
            // A replica whose link to its master was cut at any time may still be
            // promoted: a test that kills a master wants its replica to take over.
            "--cluster-replica-validity-factor",
            "0",
        ];
        let nodes: Vec<Server> = (0..3 * (1 + replicas))
            .map(|_| match tls {
                None => Server::start(&cluster_args),
                Some((cert, key, ca)) => {
                    let mut extra = cluster_args.to_vec();
                    extra.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
                    Server::start_tls(cert, key, ca, &extra)
                }
            })
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some((cert, key, ca)) = tls {
            create.args(["--tls", "--cacert", ca, "--cert", cert, "--key", key]);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(nodes.iter().map(Server::addr))
            .args(["--cluster-replicas", &replicas.to_string()])
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self {
            nodes,
            tls: tls.is_some(),
        };
        cluster.wait_healthy(Duration::from_secs(20));
        if replicas > 0 {
            let give_up = Instant::now() + Duration::from_secs(20);
            while cluster.masters().iter().any(|&m| {
                cluster
                    .node(m)
                    .and_then(|n| n.cli(&["INFO", "replication"]))
                    .is_none_or(|i| !i.contains("state=online"))
            }) {
                assert!(Instant::now() < give_up, "replicas did not come online");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        cluster
    }

    /// Waits until every live node reports `cluster_state:ok` and agrees on three masters
    /// that cover the slots.
    pub fn wait_healthy(&self, limit: Duration) {
        let give_up = Instant::now() + limit;
        while !(self.nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_some_and(|i| i.contains("cluster_state:ok"))
        }) && self.masters().len() == 3)
        {
            assert!(Instant::now() < give_up, "cluster did not converge");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the node on `port` (a replica of a failed master) is a master that owns
    /// slots, and the cluster is healthy again.
    pub fn wait_promoted(&self, port: u16, limit: Duration) {
        let give_up = Instant::now() + limit;
        while !self.masters().contains(&port)
            || self
                .node(port)
                .and_then(|n| n.cli(&["ROLE"]))
                .is_none_or(|role| !role.starts_with("master"))
        {
            assert!(
                Instant::now() < give_up,
                "the replica on {port} was not promoted"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_healthy(give_up.saturating_duration_since(Instant::now()));
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…` over every live node
    /// (`rediss+cluster://` for a TLS cluster).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(Server::addr).collect();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+cluster://{}", hosts.join(","))
    }

    /// The node on `port`, if it is alive.
    pub fn node(&self, port: u16) -> Option<&Server> {
        self.nodes.iter().find(|n| n.port == port)
    }

    /// Ports of the masters that own slots, as the first answering node sees them.
    pub fn masters(&self) -> Vec<u16> {
        self.cluster_nodes()
            .into_iter()
            .filter(|n| n.master && n.alive && n.has_slots)
            .map(|n| n.port)
            .collect()
    }

    /// The port of the replica of the master on `master`, if it has one.
    pub fn replica_of(&self, master: u16) -> Option<u16> {
        let nodes = self.cluster_nodes();
        let id = nodes.iter().find(|n| n.port == master)?.id.clone();
        nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()) && n.alive)
            .map(|n| n.port)
    }

    /// Kills the node on `port` (SIGKILL) and forgets it.
    pub fn kill(&mut self, port: u16) {
        if let Some(i) = self.nodes.iter().position(|n| n.port == port) {
            self.nodes.remove(i).kill();
        }
    }

    /// Starts a new node and joins it as a replica of the master on `master`; returns once
    /// the master reports it online.
    pub fn add_replica(&mut self, master: u16) -> u16 {
        let id = self
            .cluster_nodes()
            .into_iter()
            .find(|n| n.port == master)
            .expect("master in the cluster")
            .id;
        let node = Server::start(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
            "--cluster-replica-validity-factor",
            "0",
        ]);
        let out = Command::new("redis-cli")
            .args(["--cluster", "add-node", &node.addr()])
            .arg(format!("127.0.0.1:{master}"))
            .args(["--cluster-slave", "--cluster-master-id", &id])
            .output()
            .expect("redis-cli --cluster add-node");
        assert!(
            out.status.success(),
            "add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let port = node.port;
        self.nodes.push(node);
        let give_up = Instant::now() + Duration::from_secs(20);
        while self
            .node(master)
            .and_then(|n| n.cli(&["INFO", "replication"]))
            .is_none_or(|i| !i.contains("state=online"))
        {
            assert!(
                Instant::now() < give_up,
                "the new replica did not come online"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        port
    }

    /// Keys held by each current master, by port.
    pub fn keys_per_master(&self) -> Vec<(u16, u64)> {
        self.masters()
            .into_iter()
            .map(|m| (m, self.node(m).map_or(0, Server::dbsize)))
            .collect()
    }

    fn cluster_nodes(&self) -> Vec<NodeLine> {
        let Some(text) = self.nodes.iter().find_map(|n| n.cli(&["CLUSTER", "NODES"])) else {
            return Vec::new();
        };
        text.lines().filter_map(NodeLine::parse).collect()
    }
}

/// One line of `CLUSTER NODES`.
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    alive: bool,
    master_id: Option<String>,
    has_slots: bool,
}

impl NodeLine {
    fn parse(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let addr = f.get(1)?.split('@').next()?;
        let port = addr.rsplit_once(':')?.1.parse().ok()?;
        let flags = f.get(2)?;
        Some(Self {
            id: (*f.first()?).to_owned(),
            port,
            master: flags.contains("master"),
            alive: !flags.contains("fail") && f.get(7) == Some(&"connected"),
            master_id: f.get(3).filter(|m| **m != "-").map(|m| (*m).to_owned()),
            has_slots: f.len() > 8,
        })
    }
}

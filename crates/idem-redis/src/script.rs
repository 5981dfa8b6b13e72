//! The reusable script layer: a connection to one node or a cluster, named Lua scripts run by
//! hash (EVALSHA, re-sent after a restart or failover made the server forget them), and a
//! bound on every call.
//!
//! The record store, and later the token service and the lock primitives, are each a few
//! [`NamedScript`]s run through a [`Connection`].

use std::fmt;
use std::time::Duration;

use idem_core::StoreError;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisFuture, ServerErrorKind, Value};

use crate::config::TlsPem;

/// A connection to a single Redis node or a Redis Cluster. Cheap to clone: clones share one
/// multiplexed connection (per node), which reconnects in the background after a failure.
#[derive(Clone)]
pub struct Connection {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.inner {
            Inner::Single(_) => "Connection(single)",
            Inner::Cluster(_) => "Connection(cluster)",
        })
    }
}

/// Connection-level timeouts.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Establishing (or re-establishing) a TCP connection.
    pub connect: Duration,
    /// Waiting for any one reply before the connection reports an error.
    pub response: Duration,
}

impl Connection {
    /// Connects to one node, given a `redis://`, `rediss://` or `unix://` URL, with `tls`'s
    /// certificates for `rediss://` (the system roots without them).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] if the URL is refused or the node cannot be reached,
    /// [`StoreError::Timeout`] if connecting takes longer than `timeouts.connect`.
    pub async fn single(
        url: &str,
        timeouts: Timeouts,
        tls: Option<&TlsPem>,
    ) -> Result<Self, StoreError> {
        let client = match tls {
            #[cfg(feature = "tls")]
            Some(pem) => redis::Client::build_with_tls(url, certificates(pem)),
            _ => redis::Client::open(url),
        }
        .map_err(StoreError::unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let manager = bounded(timeouts.connect, async {
            ConnectionManager::new_with_config(client, config)
                .await
                .map_err(StoreError::unavailable)
        })
        .await?;
        Ok(Self {
            inner: Inner::Single(manager),
        })
    }

    /// Connects to a cluster through any of its `nodes` (`redis://host:port` or
    /// `rediss://host:port` URLs), with `tls`'s certificates for `rediss://`.
    ///
    /// # Errors
    /// As [`Connection::single`].
    pub async fn cluster(
        nodes: &[String],
        timeouts: Timeouts,
        tls: Option<&TlsPem>,
    ) -> Result<Self, StoreError> {
        let builder = redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
            .connection_timeout(timeouts.connect)
            .response_timeout(timeouts.response)
            .retries(3)
            .max_retry_wait(200);
        let builder = match tls {
            #[cfg(feature = "tls")]
            Some(pem) => builder.certs(certificates(pem)),
            _ => builder,
        };
        let client = builder.build().map_err(StoreError::unavailable)?;
        let conn = bounded(timeouts.connect, async {
            client
                .get_async_connection()
                .await
                .map_err(StoreError::unavailable)
        })
        .await?;
        Ok(Self {
            inner: Inner::Cluster(conn),
        })
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// Runs one command, routed by its key on a cluster.
    ///
    /// # Errors
    /// The client's error.
    pub async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let mut c = self.clone();
        c.req_packed_command(cmd).await
    }

    /// Runs one key-less command on the master that owns `key`'s slot (on a single node:
    /// that node). `WAIT` must run where the key was written.
    ///
    /// # Errors
    /// The client's error.
    pub async fn query_at_key(&self, cmd: Cmd, key: &[u8]) -> Result<Value, RedisError> {
        match &self.inner {
            Inner::Single(m) => m.clone().req_packed_command(&cmd).await,
            Inner::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                c.clone()
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
            }
        }
    }

    /// Runs one command on the node at `host:port` (cluster) or on the single node.
    ///
    /// # Errors
    /// The client's error.
    pub async fn query_at_node(
        &self,
        cmd: Cmd,
        node: Option<(&str, u16)>,
    ) -> Result<Value, RedisError> {
        match (&self.inner, node) {
            (Inner::Cluster(c), Some((host, port))) => {
                let at = SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                };
                c.clone()
                    .route_command(cmd, RoutingInfo::SingleNode(at))
                    .await
            }
            _ => self.query(&cmd).await,
        }
    }

    /// The masters to visit for a key scan: `None` stands for the single node.
    ///
    /// # Errors
    /// The client's error, or a reply that does not parse.
    pub async fn masters(&self) -> Result<Vec<Option<(String, u16)>>, RedisError> {
        if !self.is_cluster() {
            return Ok(vec![None]);
        }
        let reply = self
            .query(&redis::cmd("CLUSTER").arg("SLOTS").clone())
            .await?;
        let mut out: Vec<Option<(String, u16)>> = Vec::new();
        if let Value::Array(ranges) = reply {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                let Some(Value::Array(master)) = parts.get(2) else {
                    continue;
                };
                let host: String =
                    redis::from_redis_value_ref(master.first().unwrap_or(&Value::Nil))?;
                let port: u16 = redis::from_redis_value_ref(master.get(1).unwrap_or(&Value::Nil))?;
                if !out.contains(&Some((host.clone(), port))) {
                    out.push(Some((host, port)));
                }
            }
        }
        Ok(out)
    }

    /// Every key matching `pattern` (and of type `kind`, when given) on every master, by
    /// `SCAN` in pages of 1000.
    ///
    /// # Errors
    /// The client's error, or a reply that does not parse.
    pub async fn scan_keys<K: redis::FromRedisValue>(
        &self,
        pattern: &str,
        kind: Option<&str>,
    ) -> Result<Vec<K>, RedisError> {
        let mut found = Vec::new();
        for node in self.masters().await? {
            let node = node.as_ref().map(|(h, p)| (h.as_str(), *p));
            let mut cursor = 0u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                if let Some(kind) = kind {
                    cmd.arg("TYPE").arg(kind);
                }
                let (next, keys): (u64, Vec<K>) =
                    redis::from_redis_value(self.query_at_node(cmd, node).await?)?;
                found.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(found)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Single(m) => m.req_packed_command(cmd),
            Inner::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Single(m) => m.req_packed_commands(pipeline, offset, count),
            Inner::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(m) => m.get_db(),
            Inner::Cluster(c) => c.get_db(),
        }
    }
}

/// The client's form of `pem`.
#[cfg(feature = "tls")]
fn certificates(pem: &TlsPem) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: pem
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: pem.ca.clone(),
    }
}

/// A Lua script with a name for logs, run by its SHA1.
///
/// [`NamedScript::run`] sends `EVALSHA`; if the server answers `NOSCRIPT` (it restarted, or a
/// failover promoted a replica that never saw the script) it loads the script and retries once.
pub struct NamedScript {
    name: &'static str,
    script: redis::Script,
}

impl fmt::Debug for NamedScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedScript")
            .field("name", &self.name)
            .field("sha1", &self.script.get_hash())
            .finish()
    }
}

impl NamedScript {
    /// A script from its Lua source.
    pub fn new(name: &'static str, source: &str) -> Self {
        Self {
            name,
            script: redis::Script::new(source),
        }
    }

    /// The script's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The script's SHA1, as `EVALSHA` uses it.
    pub fn sha1(&self) -> &str {
        self.script.get_hash()
    }

    /// Runs the script with `keys` (all in one hash slot on a cluster) and `args`.
    ///
    /// # Errors
    /// The client's error, including errors the script raised.
    ///
    /// # Cancel safety
    /// A script runs atomically on the server: dropping this future leaves it run or not run.
    pub async fn run(
        &self,
        conn: &Connection,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        // The EVALSHA command is built once, straight from the borrowed arguments (the
        // client's `ScriptInvocation` copies every argument twice), and re-sent as is after a
        // NOSCRIPT.
        let bytes: usize = keys.iter().chain(args).map(|a| a.len()).sum();
        let mut cmd = self.command(keys.len(), args.len(), bytes);
        for a in keys.iter().chain(args) {
            cmd.arg(*a);
        }
        self.run_command(conn, &cmd).await
    }

    /// Starts an `EVALSHA` of this script with `keys` keys; append the keys, then the
    /// arguments (`args` of them, `bytes` long in all, to size the buffer), and run it with
    /// [`NamedScript::run_command`].
    pub fn command(&self, keys: usize, args: usize, bytes: usize) -> Cmd {
        let sha = self.script.get_hash();
        let mut cmd = Cmd::with_capacity(3 + keys + args, 16 + sha.len() + bytes);
        cmd.arg("EVALSHA").arg(sha).arg(keys);
        cmd
    }

    /// Runs an `EVALSHA` built by [`NamedScript::command`]; on `NOSCRIPT` loads the script
    /// and sends the same command once more.
    ///
    /// # Errors
    /// The client's error, including errors the script raised.
    ///
    /// # Cancel safety
    /// As [`NamedScript::run`].
    pub async fn run_command(&self, conn: &Connection, cmd: &Cmd) -> Result<Value, RedisError> {
        let mut conn = conn.clone();
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(&mut conn).await?;
                cmd.query_async(&mut conn).await
            }
            result => result,
        }
    }
}

/// Runs `op` for at most `limit`; running out is `StoreError::Timeout` (idem-core's, here for
/// the scripts' callers).
pub use idem_core::store::bounded;

/// An operation's entry of a batch script's reply: `{-1, message}` is an error it raised
/// alone.
pub(crate) fn own_reply(item: Value) -> Result<Value, StoreError> {
    if let Value::Array(parts) = &item
        && let Some(Value::Int(-1)) = parts.first()
    {
        let message = match parts.get(1) {
            Some(Value::BulkString(m)) => String::from_utf8_lossy(m).into_owned(),
            _ => "script error".to_owned(),
        };
        return Err(StoreError::unavailable(message));
    }
    Ok(item)
}

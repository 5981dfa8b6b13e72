//! Where the store connects and how it behaves: URL, key prefix, timeouts, durability.

use std::time::Duration;

use idem_core::audit::AuditLevel;
use thiserror::Error;

/// A configuration the store refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL is not one of the accepted forms.
    #[error(
        "unsupported redis url {0:?}: expected redis://, rediss:// or redis+cluster://h1:p1,h2:p2"
    )]
    BadUrl(String),
    /// A `rediss` URL was given but TLS support was not compiled in.
    #[error("rediss:// needs idem-redis's `tls` feature")]
    TlsDisabled,
    /// The key prefix holds a brace (it would break the hash tag) or a control character.
    #[error("key prefix must be printable ASCII without braces")]
    BadPrefix,
    /// A duration that must be positive was zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// TLS certificates were given for a plain-text `redis://` URL.
    #[error("TLS certificates need a rediss:// or rediss+cluster:// URL")]
    TlsNotRequested,
}

/// PEM certificates for `rediss://`: the CA that signs the server's certificate (instead of the
/// system roots) and a client certificate for servers that ask for one.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsPem {
    /// CA certificates (PEM) trusted instead of the system roots.
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and private key (PEM).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPem")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// Where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// One node (or a proxy in front of several).
    Single(String),
    /// A Redis Cluster, reached through any of these seed nodes.
    Cluster(Vec<String>),
}

/// Wait for replicas after each claim and completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Durability {
    /// Replicas that must acknowledge the write.
    pub replicas: u32,
    /// How long `WAIT` may block.
    pub timeout: Duration,
}

/// Store configuration. Start from [`RedisConfig::from_url`].
#[derive(Clone, Debug)]
pub struct RedisConfig {
    pub(crate) target: Target,
    pub(crate) prefix: String,
    pub(crate) op_timeout: Duration,
    pub(crate) admin_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) durability: Option<Durability>,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) batching: bool,
    pub(crate) batches_in_flight: usize,
    pub(crate) audit_max_events: usize,
    pub(crate) audit_level: AuditLevel,
    pub(crate) tls: Option<TlsPem>,
}

/// Default number of script calls one store keeps in flight before it queues claims and
/// completions into batches (see [`RedisConfig::batching`]).
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 1;

/// Default bound of each audit stream (see [`RedisConfig::audit_max_events`]).
pub const DEFAULT_AUDIT_MAX_EVENTS: usize = 100_000;

/// Default per-operation timeout.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_millis(250);

impl RedisConfig {
    /// Parses `redis://…`, `rediss://…`, `unix://…` (one node) or
    /// `redis+cluster://[user:pass@]h1:p1,h2:p2` (`rediss+cluster://` with TLS).
    ///
    /// Defaults: prefix `idem:`, 250 ms per operation, 5 s for `list`, 1 s to connect, no
    /// durability wait, tombstones kept 60 s, the audit trail at [`AuditLevel::Operator`].
    ///
    /// # Errors
    /// [`RedisConfigError::BadUrl`] or [`RedisConfigError::TlsDisabled`].
    pub fn from_url(url: &str) -> Result<Self, RedisConfigError> {
        Ok(Self {
            target: parse_target(url)?,
            prefix: "idem:".to_owned(),
            op_timeout: DEFAULT_OP_TIMEOUT,
            admin_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            durability: None,
            tombstone_ttl: Duration::from_secs(60),
            batching: true,
            batches_in_flight: DEFAULT_BATCHES_IN_FLIGHT,
            audit_max_events: DEFAULT_AUDIT_MAX_EVENTS,
            audit_level: AuditLevel::default(),
            tls: None,
        })
    }

    /// Prefix of every key the store writes. Give each application (or test) its own.
    ///
    /// # Errors
    /// [`RedisConfigError::BadPrefix`] if it holds `{`, `}` or a byte outside printable ASCII.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, RedisConfigError> {
        let prefix = prefix.into();
        if prefix
            .bytes()
            .any(|b| !(0x21..=0x7e).contains(&b) || b == b'{' || b == b'}')
        {
            return Err(RedisConfigError::BadPrefix);
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// Bound on each record operation; running out is `StoreError::Timeout`.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for a zero duration.
    pub fn op_timeout(mut self, limit: Duration) -> Result<Self, RedisConfigError> {
        self.op_timeout = nonzero("op timeout", limit)?;
        Ok(self)
    }

    /// Bound on `list`, which scans keys.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for a zero duration.
    pub fn admin_timeout(mut self, limit: Duration) -> Result<Self, RedisConfigError> {
        self.admin_timeout = nonzero("admin timeout", limit)?;
        Ok(self)
    }

    /// Bound on establishing a connection.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for a zero duration.
    pub fn connect_timeout(mut self, limit: Duration) -> Result<Self, RedisConfigError> {
        self.connect_timeout = nonzero("connect timeout", limit)?;
        Ok(self)
    }

    /// After each claim and completion, `WAIT` for `replicas` within `timeout`; a short
    /// acknowledgement is `StoreError::Uncertain` and the handler does not run.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for zero replicas or a zero timeout.
    pub fn durability(
        mut self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Self, RedisConfigError> {
        if replicas == 0 {
            return Err(RedisConfigError::Zero("replicas"));
        }
        self.durability = Some(Durability {
            replicas,
            timeout: nonzero("durability timeout", timeout)?,
        });
        Ok(self)
    }

    /// How long a released or deleted record leaves its fence behind. Fences are also floored
    /// by the server clock in microseconds, so this only matters if that clock steps back.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for a zero duration.
    pub fn tombstone_ttl(mut self, ttl: Duration) -> Result<Self, RedisConfigError> {
        self.tombstone_ttl = nonzero("tombstone ttl", ttl)?;
        Ok(self)
    }

    /// Coalesce concurrent claims and completions (on by default; single node only).
    ///
    /// When a claim or completion finds its store with [`RedisConfig::batches_in_flight`]
    /// script calls already waiting for replies, it queues; when a reply comes back, all
    /// that queued go as one `EVALSHA` of a batch script that applies each of them in order,
    /// exactly as its own script would, and answers each separately. A lone operation still
    /// runs its own script at once, so an idle store adds no latency and no command. Each
    /// operation keeps its own timeout; a batch that fails fails each of its operations.
    /// On a Redis Cluster every operation runs its own script (a script's keys must share
    /// a slot, and concurrent records rarely do). Turn it off behind a proxy that shards
    /// keys over several nodes (twemproxy, Envoy's Redis proxy): such a proxy routes a script
    /// by its first key, so a batch's other records would land on the wrong shard.
    /// [`crate::RedisLock`] and [`crate::RedisTokens`] built from this configuration
    /// coalesce their own operations the same way (one call in flight each).
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Events each audit stream keeps, about (`XADD … MAXLEN ~`): 100 000 by default. There
    /// is one stream per namespace on one node, and one per namespace and slot on a cluster.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for 0.
    pub fn audit_max_events(mut self, n: usize) -> Result<Self, RedisConfigError> {
        if n == 0 {
            return Err(RedisConfigError::Zero("audit_max_events"));
        }
        self.audit_max_events = n;
        Ok(self)
    }

    /// Which changes the audit streams record. At the default, [`AuditLevel::Operator`], a
    /// first request is its two script calls (claim, complete) and nothing else: the
    /// scripts leave a fresh claim and its completion to the record. [`AuditLevel::All`]
    /// adds an `XADD` to each of them.
    pub fn audit_level(mut self, level: AuditLevel) -> Self {
        self.audit_level = level;
        self
    }

    /// Script calls (lone operations or batches) a store keeps in flight before it queues
    /// claims and completions; 1 by default.
    ///
    /// # Errors
    /// [`RedisConfigError::Zero`] for zero.
    pub fn batches_in_flight(mut self, n: usize) -> Result<Self, RedisConfigError> {
        if n == 0 {
            return Err(RedisConfigError::Zero("batches in flight"));
        }
        self.batches_in_flight = n;
        Ok(self)
    }

    /// Certificates for a `rediss://` or `rediss+cluster://` URL: a CA trusted instead of the
    /// system roots, and a client certificate. Without this call the server is verified
    /// against the system roots.
    ///
    /// # Errors
    /// [`RedisConfigError::TlsDisabled`] without the `tls` feature,
    /// [`RedisConfigError::TlsNotRequested`] for a plain-text URL.
    pub fn tls(mut self, pem: TlsPem) -> Result<Self, RedisConfigError> {
        require_tls()?;
        let tls = match &self.target {
            Target::Single(url) => url.starts_with("rediss://"),
            Target::Cluster(nodes) => nodes.iter().all(|n| n.starts_with("rediss://")),
        };
        if !tls {
            return Err(RedisConfigError::TlsNotRequested);
        }
        self.tls = Some(pem);
        Ok(self)
    }

    /// Where the store connects.
    pub fn target(&self) -> &Target {
        &self.target
    }
}

fn nonzero(what: &'static str, d: Duration) -> Result<Duration, RedisConfigError> {
    if d.is_zero() {
        Err(RedisConfigError::Zero(what))
    } else {
        Ok(d)
    }
}

fn parse_target(url: &str) -> Result<Target, RedisConfigError> {
    let bad = || RedisConfigError::BadUrl(url.to_owned());
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let tls = match scheme {
        "redis" | "unix" | "redis+unix" => false,
        "rediss" => true,
        "redis+cluster" => return cluster_nodes("redis", rest).ok_or_else(bad),
        "rediss+cluster" => {
            require_tls()?;
            return cluster_nodes("rediss", rest).ok_or_else(bad);
        }
        _ => return Err(bad()),
    };
    if tls {
        require_tls()?;
    }
    if rest.is_empty() {
        return Err(bad());
    }
    Ok(Target::Single(url.to_owned()))
}

fn require_tls() -> Result<(), RedisConfigError> {
    if cfg!(feature = "tls") {
        Ok(())
    } else {
        Err(RedisConfigError::TlsDisabled)
    }
}

/// `[auth@]h1:p1,h2:p2[/…]` into one URL per seed node, each carrying the credentials.
fn cluster_nodes(scheme: &str, rest: &str) -> Option<Target> {
    let (hosts_part, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (auth, hosts) = match hosts_part.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), hosts_part),
    };
    if hosts.split(',').any(str::is_empty) {
        return None;
    }
    Some(Target::Cluster(
        hosts
            .split(',')
            .map(|h| format!("{scheme}://{auth}{h}{tail}"))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed() {
        assert_eq!(
            RedisConfig::from_url("redis://127.0.0.1:6379/0").map(|c| c.target),
            Ok(Target::Single("redis://127.0.0.1:6379/0".into()))
        );
        assert_eq!(
            RedisConfig::from_url("redis+cluster://u:p@a:1,b:2").map(|c| c.target),
            Ok(Target::Cluster(vec![
                "redis://u:p@a:1".into(),
                "redis://u:p@b:2".into()
            ]))
        );
        assert_eq!(
            RedisConfig::from_url("redis+cluster://a:1/?protocol=resp3").map(|c| c.target),
            Ok(Target::Cluster(vec!["redis://a:1/?protocol=resp3".into()]))
        );
        assert!(matches!(
            RedisConfig::from_url("redis+cluster://a:1,,b:2"),
            Err(RedisConfigError::BadUrl(_))
        ));
        assert!(matches!(
            RedisConfig::from_url("http://a"),
            Err(RedisConfigError::BadUrl(_))
        ));
        assert!(matches!(
            RedisConfig::from_url("redis://"),
            Err(RedisConfigError::BadUrl(_))
        ));
        if cfg!(feature = "tls") {
            let c = RedisConfig::from_url("redis://a:1").expect("url");
            assert_eq!(
                c.tls(TlsPem::default()).map(|_| ()),
                Err(RedisConfigError::TlsNotRequested)
            );
            let c = RedisConfig::from_url("rediss+cluster://a:1,b:2").expect("url");
            assert!(c.tls(TlsPem::default()).is_ok());
        } else {
            assert_eq!(
                RedisConfig::from_url("rediss://a:1").map(|c| c.target),
                Err(RedisConfigError::TlsDisabled)
            );
        }
    }

    #[test]
    fn options_are_validated() {
        let c = RedisConfig::from_url("redis://a").expect("url");
        assert_eq!(
            c.clone().prefix("a{b").map(|_| ()),
            Err(RedisConfigError::BadPrefix)
        );
        assert_eq!(
            c.clone().prefix("a b").map(|_| ()),
            Err(RedisConfigError::BadPrefix)
        );
        assert!(c.clone().prefix("app:1:").is_ok());
        assert_eq!(
            c.clone().op_timeout(Duration::ZERO).map(|_| ()),
            Err(RedisConfigError::Zero("op timeout"))
        );
        assert_eq!(
            c.durability(0, Duration::from_millis(5)).map(|_| ()),
            Err(RedisConfigError::Zero("replicas"))
        );
    }
}

//! Stores chosen by URL: `memory:`, `sqlite:PATH`, `redis://`, `redis+cluster://`,
//! `postgres://`, `mysql://`.

use std::fmt;
use std::time::Duration;

use anyhow::bail;
use idem_core::{BoxStore, CachedStore, MemoryStore};

/// Default capacity of the memory store.
pub const DEFAULT_MEMORY_CAPACITY: usize = 1_000_000;

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreSpec {
    /// In-process memory (`memory:` or `memory:CAPACITY`).
    Memory {
        /// Most records kept.
        capacity: usize,
    },
    /// An SQLite file (`sqlite:PATH`, `sqlite://PATH`).
    Sqlite {
        /// The database file.
        path: String,
    },
    /// Redis (`redis://`, `rediss://`) or Redis Cluster (`redis+cluster://`).
    Redis {
        /// The URL as given.
        url: String,
        /// Cluster mode.
        cluster: bool,
    },
    /// PostgreSQL (`postgres://`, `postgresql://`).
    Postgres {
        /// The URL.
        url: String,
    },
    /// MySQL or MariaDB (`mysql://`, `mariadb://`).
    Mysql {
        /// The URL.
        url: String,
    },
}

impl StoreSpec {
    /// Parses a store URL.
    ///
    /// # Errors
    /// An unknown scheme or a malformed URL.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once(':') else {
            bail!(
                "`{}` is not a store URL: use memory:, sqlite:PATH, redis://, redis+cluster://, postgres:// or mysql://",
                redact(url)
            );
        };
        Ok(match scheme.to_ascii_lowercase().as_str() {
            "memory" => {
                let capacity = match rest.trim_start_matches("//") {
                    "" => DEFAULT_MEMORY_CAPACITY,
                    n => match n.parse::<usize>() {
                        Ok(c) if c > 0 => c,
                        _ => bail!(
                            "`{url}`: write memory: or memory:CAPACITY with a positive capacity"
                        ),
                    },
                };
                Self::Memory { capacity }
            }
            "sqlite" => {
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    bail!("`{url}`: write sqlite:PATH, e.g. sqlite:./idem.db");
                }
                Self::Sqlite {
                    path: path.to_owned(),
                }
            }
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
                need_host(url, rest)?;
                check_redis_url(url)?;
                Self::Redis {
                    url: url.to_owned(),
                    cluster: scheme.ends_with("+cluster"),
                }
            }
            "postgres" | "postgresql" => {
                need_host(url, rest)?;
                check_single_host(url, rest)?;
                Self::Postgres {
                    url: url.to_owned(),
                }
            }
            "mysql" | "mariadb" => {
                need_host(url, rest)?;
                Self::Mysql {
                    url: format!("mysql:{rest}"),
                }
            }
            other => bail!(
                "unknown store scheme `{other}:`; use memory:, sqlite:PATH, redis://, redis+cluster://, postgres:// or mysql://"
            ),
        })
    }

    /// The scheme, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory { .. } => "memory",
            Self::Sqlite { .. } => "sqlite",
            Self::Redis { cluster: false, .. } => "redis",
            Self::Redis { cluster: true, .. } => "redis+cluster",
            Self::Postgres { .. } => "postgres",
            Self::Mysql { .. } => "mysql",
        }
    }

    /// Whether several gateway processes can share this store and behave as one.
    pub fn shared(&self) -> bool {
        matches!(
            self,
            Self::Redis { .. } | Self::Postgres { .. } | Self::Mysql { .. }
        )
    }
}

/// Refuses a PostgreSQL URL with several hosts (`h1:p1,h2:p2`): the driver connects to one
/// host, and would otherwise fail at start with an unclear "invalid port number". A gateway
/// follows a failover through an address that moves to the new primary.
fn check_single_host(url: &str, rest: &str) -> anyhow::Result<()> {
    let authority = rest
        .trim_start_matches("//")
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    let hosts = authority.rsplit('@').next().unwrap_or(authority);
    if hosts.contains(',') {
        bail!(
            "`{}`: several hosts in one PostgreSQL URL are not supported; point the store at \
             one address that follows the primary (a virtual IP, a proxy such as HAProxy or \
             PgBouncer in front of the cluster, or a DNS name the failover updates): the \
             gateway's pool reconnects to it after a promotion",
            redact(url)
        );
    }
    Ok(())
}

/// Checks that `url` names a host. A cluster's comma-separated seed list is not one URL, so
/// only its first seed is checked here; the Redis client checks the rest.
fn need_host(url: &str, rest: &str) -> anyhow::Result<()> {
    let first = url.split(',').next().unwrap_or(url);
    let parsed = url::Url::parse(first).map_err(|e| anyhow::anyhow!("`{}`: {e}", redact(url)))?;
    match parsed.host_str() {
        Some(h) if !h.is_empty() && rest.starts_with("//") => Ok(()),
        _ => bail!("`{}` has no host", redact(url)),
    }
}

/// Checks a Redis URL the way the store will read it at start (a cluster's every seed, the
/// TLS scheme needing TLS support), so `check-config` refuses what `serve` would.
#[cfg(feature = "redis")]
fn check_redis_url(url: &str) -> anyhow::Result<()> {
    idem_redis::RedisConfig::from_url(url)
        .map(drop)
        .map_err(|e| anyhow::anyhow!("`{}`: {e}", redact(url)))
}

#[cfg(not(feature = "redis"))]
fn check_redis_url(_url: &str) -> anyhow::Result<()> {
    Ok(())
}

/// Query parameters that carry a credential in the URLs the stores read (libpq's
/// `password`, sslkey passphrases, tokens).
const SECRET_PARAMS: [&str; 6] = ["password", "pass", "pwd", "sslpassword", "token", "secret"];

fn secret_param(name: &str) -> bool {
    SECRET_PARAMS.iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// A URL with any password (in its user part or a `?password=` parameter) replaced by
/// `***`. What does not parse as one URL (a cluster's seed list, a URL without a host)
/// prints with every user part hidden and its query dropped, so a credential never shows.
pub(crate) fn redact(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) => {
            if url.password().is_some() {
                // Only fails for URLs that cannot have a password, which this one has.
                let _ = url.set_password(Some("***"));
            }
            if url.query_pairs().any(|(k, _)| secret_param(&k)) {
                let pairs: Vec<(String, String)> = url
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret_param(&k) {
                            "***".into()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                url.query_pairs_mut().clear().extend_pairs(pairs);
            }
            url.to_string()
        }
        Err(_) => {
            let no_query = text.split(['?', '#']).next().unwrap_or(text);
            match no_query.split_once("://") {
                Some((scheme, rest)) => {
                    let hosts: Vec<&str> = rest
                        .split(',')
                        .map(|seed| seed.rsplit_once('@').map_or(seed, |(_, host)| host))
                        .collect();
                    let hidden = rest.contains('@') || no_query.len() < text.len();
                    format!(
                        "{scheme}://{}{}",
                        if hidden { "***@" } else { "" },
                        hosts.join(",")
                    )
                }
                None => no_query.to_owned(),
            }
        }
    }
}

/// `message` (a store error) with every credential of `url` in it replaced by `***`: a
/// driver may quote what it was given.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    let mut secrets: Vec<String> = Vec::new();
    for seed in url.split(',') {
        let seed = if seed.contains("://") {
            seed.to_owned()
        } else {
            format!("x://{seed}")
        };
        if let Ok(u) = url::Url::parse(&seed) {
            if let Some(p) = u.password() {
                secrets.push(p.to_owned());
                // The password as a driver decodes it (form decoding also turns `+` into a
                // space, so the raw text is kept as well).
                let decoded: String = form_urlencoded::parse(format!("p={p}").as_bytes())
                    .map(|(_, v)| v.into_owned())
                    .collect();
                secrets.push(decoded);
            }
            secrets.extend(
                u.query_pairs()
                    .filter(|(k, _)| secret_param(k))
                    .map(|(_, v)| v.into_owned()),
            );
        }
    }
    let mut out = message.replace(url, &redact(url));
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

impl fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory { capacity } => write!(
                f,
                "memory: (in-process, {capacity} records, not shared, lost on restart)"
            ),
            Self::Sqlite { path } => write!(f, "sqlite:{path} (embedded file, one process)"),
            Self::Redis {
                url,
                cluster: false,
            } => write!(f, "{} (Redis, shared)", redact(url)),
            Self::Redis { url, cluster: true } => {
                write!(f, "{} (Redis Cluster, shared)", redact(url))
            }
            Self::Postgres { url } => write!(f, "{} (PostgreSQL, shared)", redact(url)),
            Self::Mysql { url } => write!(f, "{} (MySQL/MariaDB, shared)", redact(url)),
        }
    }
}

impl fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreSpec({self})")
    }
}

/// Default bound on a Redis `WAIT` for replicas.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(100);

/// Backend details beyond the URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// SQL table (default `idem_records`).
    pub table: Option<String>,
    /// Redis key prefix (default `idem:`).
    pub prefix: Option<String>,
    /// PostgreSQL / MySQL connections.
    pub pool: u32,
    /// How much of the audit trail the store keeps.
    pub audit: idem_core::AuditRetention,
    /// Which changes the store records in it.
    pub audit_level: idem_core::AuditLevel,
    /// Redis: replicas that acknowledge each claim and completion, and how long to wait.
    pub wait: Option<(u32, Duration)>,
    /// `rediss://`: certificate files.
    pub tls: Option<StoreTls>,
    /// `memory:`: most bytes the records take (`None`: [`idem_core::memory::DEFAULT_MAX_BYTES`]).
    pub memory_max_bytes: Option<usize>,
}

/// Certificate files for a `rediss://` store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreTls {
    /// CA certificates trusted instead of the system roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate chain and key.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl StoreTls {
    /// Reads the files, naming the one that cannot be read or holds no PEM block.
    ///
    /// # Errors
    /// A file that cannot be read, or is not PEM.
    pub(crate) fn read(&self) -> anyhow::Result<StorePem> {
        let read = |field: &str, path: &std::path::Path| -> anyhow::Result<Vec<u8>> {
            let bytes = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("`{field}` {}: {e}", path.display()))?;
            if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
                bail!("`{field}` {}: not a PEM file", path.display());
            }
            Ok(bytes)
        };
        let ca = self
            .ca_file
            .as_deref()
            .map(|p| read("store_tls_ca_file", p))
            .transpose()?;
        let client = match &self.client {
            Some((cert, key)) => Some((
                read("store_tls_cert_file", cert)?,
                read("store_tls_key_file", key)?,
            )),
            None => None,
        };
        Ok(StorePem { ca, client })
    }
}

/// The contents of [`StoreTls`]'s files.
#[derive(Clone)]
pub(crate) struct StorePem {
    /// CA certificates.
    pub(crate) ca: Option<Vec<u8>>,
    /// Client certificate chain and key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Opens the store, optionally behind the local cache of completed responses.
///
/// # Errors
/// The backend is not compiled in, or cannot be reached or set up within `timeout`.
pub async fn open(
    spec: &StoreSpec,
    options: &StoreOptions,
    timeout: Duration,
    cache: Option<(usize, Duration)>,
) -> anyhow::Result<BoxStore> {
    let store = match tokio::time::timeout(
        timeout.max(Duration::from_secs(10)),
        open_backend(spec, options, timeout),
    )
    .await
    {
        Ok(result) => result.map_err(tls_hint).map_err(|e| scrub_error(e, spec))?,
        Err(_) => bail!("store {spec}: no answer while connecting"),
    };
    #[cfg(feature = "planted-bugs")]
    let store = crate::planted::wrap(store)?;
    Ok(match cache {
        Some((entries, max_age)) => BoxStore::new(CachedStore::new(store, entries, max_age)),
        None => store,
    })
}

/// `e` with the store's credentials taken out of its text, since a driver may quote the URL
/// it was given.
fn scrub_error(e: anyhow::Error, spec: &StoreSpec) -> anyhow::Error {
    match spec {
        StoreSpec::Redis { url, .. } | StoreSpec::Postgres { url } | StoreSpec::Mysql { url } => {
            anyhow::anyhow!("{}", scrub(&format!("{e:#}"), url))
        }
        StoreSpec::Memory { .. } | StoreSpec::Sqlite { .. } => e,
    }
}

/// Adds what to check to an error from a TLS handshake with the store.
fn tls_hint(e: anyhow::Error) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("invalid peer certificate") {
        e.context(
            "the store's TLS certificate is not trusted: give the CA that signed it \
             (store_tls_ca_file for rediss://, sslrootcert= for PostgreSQL, ssl-ca= for MySQL) \
             and connect by a name or address the certificate lists",
        )
    } else if text.contains("CertificateRequired") {
        e.context(
            "the store asks for a client certificate: set store_tls_cert_file and \
             store_tls_key_file (rediss://), sslcert=/sslkey= (PostgreSQL) or ssl-cert=/ssl-key= (MySQL)",
        )
    } else {
        e
    }
}

/// Whether this build has the backend for `spec`.
///
/// # Errors
/// A message naming the missing backend and the feature that brings it.
pub fn available(spec: &StoreSpec) -> anyhow::Result<()> {
    let (built, feature) = match spec {
        StoreSpec::Memory { .. } => (true, ""),
        StoreSpec::Sqlite { .. } => (cfg!(feature = "sqlite"), "sqlite"),
        StoreSpec::Redis { .. } => (cfg!(feature = "redis"), "redis"),
        StoreSpec::Postgres { .. } => (cfg!(feature = "postgres"), "postgres"),
        StoreSpec::Mysql { .. } => (cfg!(feature = "mysql"), "mysql"),
    };
    if built {
        Ok(())
    } else {
        bail!(
            "store `{}` is not available in this build (cargo feature `{feature}` of idem-gateway)",
            spec.kind()
        )
    }
}

/// Connections each gateway keeps to PostgreSQL or MySQL.
pub const SQL_POOL_SIZE: u32 = 32;
/// How often expired SQL rows are reaped, and how many per batch.
const REAP_EVERY: Duration = Duration::from_secs(60);
const REAP_BATCH: u32 = 1_000;

async fn open_backend(
    spec: &StoreSpec,
    options: &StoreOptions,
    op_timeout: Duration,
) -> anyhow::Result<BoxStore> {
    #[allow(unused_variables)] // unused when every SQL backend is left out
    let table = options.table.as_deref().unwrap_or("idem_records");
    available(spec)?;
    match spec {
        StoreSpec::Memory { capacity } => {
            let max_bytes = options
                .memory_max_bytes
                .unwrap_or(idem_core::memory::DEFAULT_MAX_BYTES);
            let store =
                MemoryStore::bounded(*capacity, max_bytes, idem_core::SystemClock, options.audit)
                    .with_audit_level(options.audit_level);
            store.spawn_sweeper(Duration::from_secs(30));
            Ok(BoxStore::new(store))
        }
        #[cfg(feature = "sqlite")]
        StoreSpec::Sqlite { path } => {
            if let Some(dir) = std::path::Path::new(path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir)
                    .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
            }
            let store = idem_sql::SqliteStore::open(path)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .with_table(table)?
                .with_audit_retention(options.audit.max_age)
                .with_audit_level(options.audit_level);
            store.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            store.spawn_reaper(REAP_EVERY, REAP_BATCH);
            Ok(BoxStore::new(store))
        }
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres { url } => {
            let store = idem_sql::PgStore::connect(url, options.pool)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let store = idem_sql::PgStore::with_table(store.pool().clone(), table)?
                .with_audit_retention(options.audit.max_age)
                .with_audit_level(options.audit_level);
            store.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            store.spawn_reaper(REAP_EVERY, REAP_BATCH);
            Ok(BoxStore::new(store))
        }
        #[cfg(feature = "mysql")]
        StoreSpec::Mysql { url } => {
            let store = idem_sql::MySqlStore::connect(url, options.pool)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let store = idem_sql::MySqlStore::with_table(store.pool().clone(), table)?
                .with_audit_retention(options.audit.max_age)
                .with_audit_level(options.audit_level);
            store.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            store.spawn_reaper(REAP_EVERY, REAP_BATCH);
            Ok(BoxStore::new(store))
        }
        #[cfg(feature = "redis")]
        StoreSpec::Redis { url, .. } => {
            let mut config = idem_redis::RedisConfig::from_url(url)?
                .op_timeout(op_timeout)?
                .audit_max_events(options.audit.max_events)?
                .audit_level(options.audit_level);
            if let Some(prefix) = &options.prefix {
                config = config.prefix(prefix.clone())?;
            }
            if let Some((replicas, timeout)) = options.wait {
                config = config.durability(replicas, timeout)?;
            }
            if let Some(tls) = &options.tls {
                let StorePem { ca, client } = tls.read()?;
                config = config.tls(idem_redis::TlsPem { ca, client })?;
            }
            let store = idem_redis::RedisStore::connect(config)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(BoxStore::new(store))
        }
        // Reached when a backend's feature is off (`available` refused it above already).
        #[allow(unreachable_patterns)]
        other => bail!("store `{}` is not available in this build", other.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a `?password=` query parameter (and a URL that failed to parse) printed
    /// the credential in clear in `check-config`, the start-up log and errors.
    #[test]
    fn credentials_never_print() {
        for url in [
            "postgres://idem@db.internal/idem?password=hunter2&sslmode=require",
            "postgres://idem:hunter2@db.internal/idem",
            "mysql://root:hunter2@127.0.0.1/idem",
            "redis://:hunter2@127.0.0.1:6379/0",
            "redis://default:hunter2@127.0.0.1:6379/?password=hunter2",
            "redis+cluster://:hunter2@a:7000,:hunter2@b:7001",
        ] {
            let spec = StoreSpec::parse(url).expect(url);
            let shown = format!("{spec} {spec:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        for bad in [
            "postgres://idem:hunter2@/idem?password=hunter2",
            "mysql://root:hunter2@",
            "redis://:hunter2@",
        ] {
            let err = StoreSpec::parse(bad).expect_err(bad).to_string();
            assert!(!err.contains("hunter2"), "{err}");
        }
        assert_eq!(
            scrub(
                "connect to db.internal as idem with hunter2 failed",
                "postgres://idem:hunter2@db.internal/idem"
            ),
            "connect to db.internal as idem with *** failed"
        );
    }

    #[test]
    fn urls_parse_by_scheme() {
        assert_eq!(
            StoreSpec::parse("memory:").expect("ok"),
            StoreSpec::Memory {
                capacity: DEFAULT_MEMORY_CAPACITY
            }
        );
        assert_eq!(
            StoreSpec::parse("memory:10").expect("ok"),
            StoreSpec::Memory { capacity: 10 }
        );
        assert_eq!(
            StoreSpec::parse("sqlite:./idem.db").expect("ok"),
            StoreSpec::Sqlite {
                path: "./idem.db".into()
            }
        );
        assert_eq!(
            StoreSpec::parse("sqlite:///tmp/x.db").expect("ok"),
            StoreSpec::Sqlite {
                path: "/tmp/x.db".into()
            }
        );
        assert_eq!(
            StoreSpec::parse("redis+cluster://127.0.0.1:7000").expect("ok"),
            StoreSpec::Redis {
                url: "redis+cluster://127.0.0.1:7000".into(),
                cluster: true
            }
        );
        // Every documented cluster form keeps cluster mode and the whole seed list.
        let seeds = "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";
        assert_eq!(
            StoreSpec::parse(seeds).expect("ok"),
            StoreSpec::Redis {
                url: seeds.into(),
                cluster: true
            }
        );
        assert_eq!(
            StoreSpec::parse("redis://127.0.0.1:6379").expect("ok"),
            StoreSpec::Redis {
                url: "redis://127.0.0.1:6379".into(),
                cluster: false
            }
        );
        assert_eq!(
            StoreSpec::parse("postgres://u@h/db").expect("ok").kind(),
            "postgres"
        );
        assert_eq!(
            StoreSpec::parse("mariadb://root@h/test")
                .expect("ok")
                .kind(),
            "mysql"
        );
        for bad in [
            "",
            "memory:0",
            "sqlite:",
            "redis://",
            "redis+cluster://a:1,,b:2",
            "mongo://x",
            "nonsense",
        ] {
            assert!(StoreSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cluster_urls_display_as_clusters_without_passwords() {
        let s = StoreSpec::parse("redis+cluster://u:hunter2@127.0.0.1:1,127.0.0.1:2")
            .expect("ok")
            .to_string();
        assert!(
            !s.contains("hunter2") && s.contains("redis+cluster://***@127.0.0.1:1,127.0.0.1:2"),
            "{s}"
        );
        assert!(s.contains("Redis Cluster"), "{s}");
    }

    #[test]
    fn a_postgres_url_with_several_hosts_is_refused_clearly() {
        let err = StoreSpec::parse(
            "postgres://idem:secret@10.0.0.1:5432,10.0.0.2:5432/idem?target_session_attrs=read-write",
        )
        .expect_err("several hosts")
        .to_string();
        assert!(err.contains("several hosts"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        assert!(StoreSpec::parse("postgres://idem@db.internal:5432/idem").is_ok());
    }

    #[test]
    fn passwords_never_print() {
        let s = StoreSpec::parse("postgres://user:hunter2@db:5432/idem")
            .expect("ok")
            .to_string();
        assert!(
            !s.contains("hunter2") && s.contains("user:***@db:5432/idem"),
            "{s}"
        );
    }
}

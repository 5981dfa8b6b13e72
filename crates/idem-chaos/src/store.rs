//! The run's store, started privately on spare ports (the shared servers on the standard
//! ports are never faulted), and the faults the nemesis applies to it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use idem_testkit::redis_server::{Cluster, Server};
use parking_lot::Mutex;

use crate::StoreKind;
use crate::postgres::{self, Pg};

/// A private store.
#[derive(Debug)]
#[non_exhaustive]
pub enum Store {
    /// One Redis server; `None` only while it restarts.
    Redis(std::sync::Arc<Mutex<Option<Server>>>),
    /// A Redis Cluster of three masters with a replica each.
    Cluster {
        /// The cluster; held for seconds during a failover.
        cluster: std::sync::Arc<Mutex<Cluster>>,
        /// Its URL over the live nodes, kept apart so a gateway restarting during a
        /// failover need not wait for the cluster's lock.
        url: std::sync::Arc<Mutex<String>>,
    },
    /// One PostgreSQL server.
    Postgres(Pg),
    /// A primary and its synchronous standby.
    Standby {
        /// The servers, primary first; after a promotion the old primary is gone.
        servers: Mutex<Vec<std::sync::Arc<Pg>>>,
        /// Whether the standby was promoted.
        promoted: Mutex<bool>,
    },
}

/// What is missing to run `kind`, if anything.
pub fn missing(kind: StoreKind) -> Option<String> {
    match kind {
        StoreKind::Redis | StoreKind::RedisCluster => {
            let ok = std::process::Command::new("redis-server")
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            (!ok).then(|| "redis-server".to_owned())
        }
        StoreKind::Postgres | StoreKind::PostgresStandby => postgres::missing(),
    }
}

/// Runs blocking work (idem-testkit's Redis helpers wait by sleeping, and assert) off the
/// runtime's threads; a panic in it is an error.
async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| anyhow!("{what}: {e}"))
}

impl Store {
    /// Starts a store of `kind` under `base`.
    ///
    /// # Errors
    /// The store's binaries are missing or it does not start.
    pub async fn start(kind: StoreKind, base: &Path) -> anyhow::Result<Self> {
        if let Some(m) = missing(kind) {
            bail!("{m} is not installed");
        }
        Ok(match kind {
            StoreKind::Redis => {
                let server = blocking("starting redis-server", || Server::start(&[])).await?;
                Self::Redis(std::sync::Arc::new(Mutex::new(Some(server))))
            }
            StoreKind::RedisCluster => {
                let cluster =
                    blocking("starting the Redis Cluster", Cluster::start_with_replicas).await?;
                let url = cluster.url();
                Self::Cluster {
                    cluster: std::sync::Arc::new(Mutex::new(cluster)),
                    url: std::sync::Arc::new(Mutex::new(url)),
                }
            }
            StoreKind::Postgres => Self::Postgres(Pg::primary(base, "pg").await?),
            StoreKind::PostgresStandby => {
                let primary = Pg::primary(base, "pg-primary").await?;
                let standby = Pg::standby_of(&primary, base, "pg-standby").await?;
                primary.require_sync_standby()?;
                Self::Standby {
                    servers: Mutex::new(vec![
                        std::sync::Arc::new(primary),
                        std::sync::Arc::new(standby),
                    ]),
                    promoted: Mutex::new(false),
                }
            }
        })
    }

    /// The one address a [`Link`](crate::link::Link) can stand in front of, for stores
    /// reached at one address.
    pub fn target(&self) -> Option<SocketAddr> {
        match self {
            Self::Redis(s) => s.lock().as_ref().and_then(|s| s.addr().parse().ok()),
            Self::Postgres(pg) => Some(pg.addr()),
            Self::Standby { servers, .. } => servers.lock().first().map(|pg| pg.addr()),
            Self::Cluster { .. } => None,
        }
    }

    /// The store URL for a gateway reaching the store at `via` (its link), or directly (for
    /// a primary with a standby: the multi-host URL with `target_session_attrs=read-write`).
    pub fn url(&self, via: Option<SocketAddr>) -> String {
        match self {
            Self::Redis(s) => match via {
                Some(a) => format!("redis://{a}"),
                None => s.lock().as_ref().map(Server::url).unwrap_or_default(),
            },
            Self::Cluster { url, .. } => url.lock().clone(),
            Self::Postgres(pg) => {
                let a = via.unwrap_or_else(|| pg.addr());
                format!("postgres://postgres@{a}/postgres")
            }
            Self::Standby { servers, .. } => match via {
                Some(a) => format!("postgres://postgres@{a}/postgres"),
                None => {
                    let hosts: Vec<String> = servers
                        .lock()
                        .iter()
                        .map(|pg| pg.addr().to_string())
                        .collect();
                    format!(
                        "postgres://postgres@{}/postgres?target_session_attrs=read-write",
                        hosts.join(",")
                    )
                }
            },
        }
    }

    /// Extra top-level TOML for the gateways on this store.
    pub fn options(&self, run: &str) -> String {
        match self {
            Self::Redis(_) => format!("store_prefix = \"chaos-{run}:\"\n"),
            // Wait for a replica on every claim and completion, so a failover loses none.
            Self::Cluster { .. } => format!(
                "store_prefix = \"chaos-{run}:\"\nstore_wait_replicas = 1\nstore_wait_timeout = \"300ms\"\n"
            ),
            Self::Postgres(_) | Self::Standby { .. } => "store_pool = 8\n".to_owned(),
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the store (the primary).
    ///
    /// # Errors
    /// The store has nothing to freeze, or the signal failed.
    pub fn freeze(&self, stop: bool) -> anyhow::Result<()> {
        match self {
            Self::Redis(s) => {
                let guard = s.lock();
                let server = guard.as_ref().context("redis is restarting")?;
                if stop {
                    server.freeze();
                } else {
                    server.resume();
                }
                Ok(())
            }
            Self::Postgres(pg) => {
                if pg.pause(stop) {
                    Ok(())
                } else {
                    bail!("signal to postgres failed")
                }
            }
            Self::Standby { servers, .. } => {
                let primary = servers.lock().first().cloned().context("no primary")?;
                if primary.pause(stop) {
                    Ok(())
                } else {
                    bail!("signal to the primary failed")
                }
            }
            Self::Cluster { .. } => bail!("the cluster is not frozen whole"),
        }
    }

    /// Kills Redis and starts it again, empty, on the same port.
    ///
    /// # Errors
    /// The store is not a single Redis, or it did not come back.
    pub async fn restart_empty(&self) -> anyhow::Result<()> {
        let Self::Redis(slot) = self else {
            bail!("only a single Redis is restarted empty");
        };
        let slot = std::sync::Arc::clone(slot);
        blocking("restarting redis-server", move || {
            let mut guard = slot.lock();
            if let Some(server) = guard.take() {
                *guard = Some(server.restart_empty());
            }
        })
        .await
    }

    /// Kills the master at `index` (of the masters, in port order) and waits until its
    /// replica is promoted, then gives the new master a replica; answers what happened.
    ///
    /// # Errors
    /// The store is not a cluster, or the failover did not complete.
    pub async fn kill_master(&self, index: usize) -> anyhow::Result<String> {
        let Self::Cluster { cluster, url } = self else {
            bail!("not a cluster");
        };
        let (cluster, url) = (std::sync::Arc::clone(cluster), std::sync::Arc::clone(url));
        blocking("failing a cluster master over", move || {
            let mut c = cluster.lock();
            let mut masters = c.masters();
            masters.sort_unstable();
            let Some(&master) = masters.get(index % masters.len().max(1)) else {
                return "no master".to_owned();
            };
            let Some(replica) = c.replica_of(master) else {
                return format!("master {master} has no replica; left alone");
            };
            c.kill(master);
            *url.lock() = c.url();
            c.wait_promoted(replica, Duration::from_secs(30));
            let new = c.add_replica(replica);
            *url.lock() = c.url();
            format!("master {master} killed, replica {replica} promoted, new replica {new}")
        })
        .await
    }

    /// Kills the primary and promotes the standby; answers what happened.
    ///
    /// # Errors
    /// The store has no standby left to promote, or the promotion failed.
    pub async fn promote_standby(&self) -> anyhow::Result<String> {
        let Self::Standby { servers, promoted } = self else {
            bail!("no standby");
        };
        if *promoted.lock() {
            bail!("the standby was already promoted");
        }
        let (primary, standby) = {
            let s = servers.lock();
            (
                s.first().cloned().context("no primary")?,
                s.get(1).cloned().context("no standby")?,
            )
        };
        primary.kill();
        standby.promote().await?;
        *promoted.lock() = true;
        servers.lock().remove(0);
        Ok(format!(
            "primary {} killed, standby {} promoted",
            primary.port, standby.port
        ))
    }

    /// Whether the standby is still there to promote.
    pub fn can_promote(&self) -> bool {
        matches!(self, Self::Standby { promoted, .. } if !*promoted.lock())
    }
}

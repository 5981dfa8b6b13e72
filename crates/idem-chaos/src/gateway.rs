//! The idem processes of a run: `idem serve` gateways and `idem relay` relays, each in a
//! [`Slot`] that keeps its ports and configuration across kills and restarts, and the TOML
//! they are started with.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;

use crate::proc::{Proc, Spawn, spare_port};
use crate::{PlantedBug, RunConfig, Takeover};

/// The admin token every gateway of a run takes.
pub const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789";

/// The status endpoint's path.
pub const STATUS_PATH: &str = "/idem/status";

/// What the routes and the store look like to every process of the run.
#[derive(Debug, Clone)]
pub struct Routes {
    /// The routes' `timeout`.
    pub timeout: Duration,
    /// The routes' takeover policy.
    pub takeover: Takeover,
    /// Whether the routes name the upstream's status webhook and `serve` reconciles.
    pub webhook: bool,
    /// The lease, to set the reconciler's threshold for stuck records past it.
    pub lease: Duration,
    /// The routes' `lease` line, when the run sets one (else the gateway's default).
    pub lease_set: Option<Duration>,
    /// The planted bug every process runs with.
    pub planted: Option<PlantedBug>,
    /// `store_timeout`.
    pub store_timeout: Duration,
}

impl Routes {
    /// The routes of `config`.
    pub fn of(config: &RunConfig) -> Self {
        Self {
            timeout: config.route_timeout,
            takeover: config.takeover,
            webhook: config.status_webhook,
            lease: config.lease(),
            lease_set: config.lease,
            planted: config.planted,
            store_timeout: config.store_timeout,
        }
    }

    fn common(&self, upstream: &str, store: &str, store_options: &str) -> String {
        let status_url = if self.webhook {
            "status_url = \"/status?key={key}&principal={principal}&namespace={namespace}\"\n"
        } else {
            ""
        };
        let takeover = self
            .takeover
            .config_line()
            .map_or_else(String::new, |line| format!("{line}\n"));
        let lease = self.lease_set.map_or_else(String::new, |l| {
            format!("lease = \"{}ms\"\n", l.as_millis())
        });
        format!(
            r#"upstream = "{upstream}"
store = "{store}"
store_timeout = "{store_timeout}ms"
shutdown_grace = "1s"
{store_options}
[log]
level = "info"

[defaults]
timeout = "{timeout}ms"
{takeover}{lease}upstream_failure = "hold"
# This upstream's 500 comes after it acted: store it, as a real service of that kind must.
store_statuses = ["2xx", "3xx", "4xx", "500"]
{status_url}
[[routes]]
name = "charge"
method = "POST"
path = "/charge"
principal = {{ from = "header", header = "x-api-key" }}

[[routes]]
name = "messages"
method = "POST"
path = "/relay/*"
principal = {{ from = "none" }}
"#,
            store_timeout = self.store_timeout.as_millis(),
            timeout = self.timeout.as_millis(),
        )
    }

    /// The configuration of a gateway.
    pub fn serve(
        &self,
        port: u16,
        admin: u16,
        upstream: &str,
        store: &str,
        store_options: &str,
    ) -> String {
        let reconcile = if self.webhook {
            format!(
                "[reconcile]\nevery = \"2s\"\nafter = \"{}ms\"\ntimeout = \"1s\"\n",
                (self.lease + Duration::from_secs(2)).as_millis()
            )
        } else {
            String::new()
        };
        format!(
            "listen = \"127.0.0.1:{port}\"\n{common}\n[admin]\nlisten = \"127.0.0.1:{admin}\"\ntoken = \"{ADMIN_TOKEN}\"\n\n[status]\npath = \"{STATUS_PATH}\"\n\n{reconcile}",
            common = self.common(upstream, store, store_options),
        )
    }

    /// The configuration of a relay process: `relays` are its `[[relay]]` tables.
    pub fn relay(&self, upstream: &str, store: &str, store_options: &str, relays: &str) -> String {
        format!(
            "{common}\n{relays}",
            common = self.common(upstream, store, store_options)
        )
    }
}

/// Which command a slot runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// `idem serve`.
    Serve,
    /// `idem relay`.
    Relay,
}

/// One gateway or relay position: its name, ports and current process.
#[derive(Debug)]
pub struct Slot {
    /// `g0`, `r1`, ….
    pub name: String,
    /// What it runs.
    pub role: Role,
    /// The data listener (gateways).
    pub port: u16,
    /// The admin listener (gateways).
    pub admin: u16,
    dir: PathBuf,
    proc: Mutex<Option<Proc>>,
    incarnation: AtomicU32,
    paused: Mutex<bool>,
}

impl Slot {
    /// A slot with spare ports; nothing runs yet.
    ///
    /// # Errors
    /// No spare port, or the directory cannot be made.
    pub fn new(name: &str, role: Role, run_dir: &Path) -> anyhow::Result<Self> {
        let dir = run_dir.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            name: name.to_owned(),
            role,
            port: spare_port()?,
            admin: spare_port()?,
            dir,
            proc: Mutex::new(None),
            incarnation: AtomicU32::new(0),
            paused: Mutex::new(false),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:<admin port>`.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    /// Writes `config` and starts the process; returns once it listens (or runs, for a
    /// relay). A process already running is killed first.
    ///
    /// # Errors
    /// It exited or did not get ready within `limit`.
    pub async fn start(
        &self,
        idem: &Path,
        config: &str,
        planted: Option<PlantedBug>,
        limit: Duration,
    ) -> anyhow::Result<()> {
        self.kill();
        let n = self.incarnation.fetch_add(1, Ordering::SeqCst) + 1;
        let path = self.dir.join(format!("idem.{n}.toml"));
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        let command = match self.role {
            Role::Serve => "serve",
            Role::Relay => "relay",
        };
        let mut env = vec![("RUST_LOG", "info"), ("NO_COLOR", "1")];
        if let Some(bug) = planted {
            env.push(("CHAOS_PLANTED_BUG", bug.as_str()));
        }
        let proc = Proc::spawn(&Spawn {
            name: &self.name,
            program: idem,
            args: vec![command.as_ref(), "--config".as_ref(), path.as_os_str()],
            env,
            dir: &self.dir,
            log: self.dir.join(format!("idem.{n}")),
            stop_signal: "KILL",
            user: None,
        })?;
        let ready = match self.role {
            Role::Serve => "idem listening on",
            Role::Relay => "idem relay running",
        };
        let waited = proc.wait_for_line(ready, limit).await;
        *self.proc.lock() = Some(proc);
        *self.paused.lock() = false;
        waited
    }

    /// Starts it, trying again every half second until it gets ready or `limit` passes (a
    /// gateway may not start while its store is frozen or cut).
    ///
    /// # Errors
    /// It never got ready; the error is the last attempt's.
    pub async fn start_until(
        &self,
        idem: &Path,
        config: impl Fn() -> String,
        planted: Option<PlantedBug>,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let give_up = Instant::now() + limit;
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            match self
                .start(idem, &config(), planted, left.min(Duration::from_secs(15)))
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= give_up => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// SIGKILLs the process, if one runs.
    pub fn kill(&self) {
        if let Some(p) = self.proc.lock().take() {
            p.signal("KILL");
            p.stop();
        }
        *self.paused.lock() = false;
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`); false if nothing runs.
    pub fn pause(&self, stop: bool) -> bool {
        let sent = self
            .proc
            .lock()
            .as_ref()
            .is_some_and(|p| p.signal(if stop { "STOP" } else { "CONT" }));
        if sent {
            *self.paused.lock() = stop;
        }
        sent
    }

    /// Whether a process runs in the slot and is not stopped.
    pub fn up(&self) -> bool {
        !*self.paused.lock() && self.proc.lock().as_ref().is_some_and(Proc::alive)
    }

    /// The tail of the current process's log, for errors.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc
            .lock()
            .as_ref()
            .map(|p| p.stderr_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.kill();
    }
}

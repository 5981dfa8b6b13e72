//! Private PostgreSQL instances for a run: `initdb` and `postgres` as the `postgres` user
//! (the harness runs as root), on a spare loopback port, from a directory of the run's; and a
//! synchronous standby made with `pg_basebackup`, which [`Pg::promote`] turns into the
//! primary. Each server runs under a [`Proc`] keeper, so it stops with the harness.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use parking_lot::Mutex;

use crate::proc::{Proc, Spawn, spare_port, user_ids};

/// Where Debian's PostgreSQL 15 binaries are.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// Whether the PostgreSQL binaries and the `postgres` user are there; what is missing if
/// not.
pub fn missing() -> Option<String> {
    for bin in ["initdb", "postgres", "pg_ctl", "pg_basebackup", "psql"] {
        if !Path::new(PG_BIN).join(bin).exists() {
            return Some(format!("{PG_BIN}/{bin}"));
        }
    }
    if user_ids("postgres").is_err() {
        return Some("the postgres user".into());
    }
    None
}

/// One private PostgreSQL server.
#[derive(Debug)]
pub struct Pg {
    /// Its port.
    pub port: u16,
    name: String,
    base: PathBuf,
    data: PathBuf,
    ids: (u32, u32),
    proc: Mutex<Option<Proc>>,
}

impl Pg {
    /// `initdb` in `<base>/<name>` and starts the server.
    ///
    /// # Errors
    /// A step fails or the server does not answer within 30 s.
    pub async fn primary(base: &Path, name: &str) -> anyhow::Result<Self> {
        let pg = Self::prepare(base, name)?;
        pg.as_postgres(&[
            &format!("{PG_BIN}/initdb"),
            "-D",
            &pg.data.display().to_string(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ])?;
        pg.start().await?;
        Ok(pg)
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started and connected.
    ///
    /// # Errors
    /// A step fails or the standby does not stream within 30 s.
    pub async fn standby_of(primary: &Pg, base: &Path, name: &str) -> anyhow::Result<Self> {
        let pg = Self::prepare(base, name)?;
        pg.as_postgres(&[
            &format!("{PG_BIN}/pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            &pg.data.display().to_string(),
            "-R",
            "-X",
            "stream",
            "--no-sync",
        ])?;
        pg.start().await?;
        let give_up = Instant::now() + Duration::from_secs(30);
        while primary
            .sql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
            .as_deref()
            != Some("1")
        {
            if Instant::now() > give_up {
                bail!("the standby on {} did not start streaming", pg.port);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(pg)
    }

    fn prepare(base: &Path, name: &str) -> anyhow::Result<Self> {
        let ids = user_ids("postgres")?;
        let dir = base.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let status = Command::new("chown")
            .arg(format!("{}:{}", ids.0, ids.1))
            .arg(&dir)
            .status()
            .context("chown")?;
        if !status.success() {
            bail!("chown {} failed", dir.display());
        }
        Ok(Self {
            port: spare_port()?,
            name: name.to_owned(),
            data: dir.join("data"),
            base: dir,
            ids,
            proc: Mutex::new(None),
        })
    }

    fn as_postgres(&self, args: &[&str]) -> anyhow::Result<()> {
        let (program, rest) = args.split_first().context("no command")?;
        let out = Command::new(program)
            .args(rest)
            .uid(self.ids.0)
            .gid(self.ids.1)
            .current_dir(&self.base)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    async fn start(&self) -> anyhow::Result<()> {
        let program = PathBuf::from(format!("{PG_BIN}/postgres"));
        let data = self.data.display().to_string();
        let port = self.port.to_string();
        let socket = format!("unix_socket_directories={}", self.base.display());
        let args = [
            "-D",
            data.as_str(),
            "-p",
            port.as_str(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            socket.as_str(),
            // A killed process loses nothing the kernel holds; the machine does not crash.
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
            "-c",
            "wal_sender_timeout=5s",
            "-c",
            "wal_receiver_status_interval=1s",
        ];
        let proc = Proc::spawn(&Spawn {
            name: &self.name,
            program: &program,
            args: args.iter().map(std::ffi::OsStr::new).collect(),
            env: Vec::new(),
            dir: &self.base,
            log: self.base.join("server"),
            stop_signal: "QUIT",
            user: Some(self.ids),
        })?;
        *self.proc.lock() = Some(proc);
        let give_up = Instant::now() + Duration::from_secs(30);
        while self.sql("SELECT 1").as_deref() != Some("1") {
            let alive = self.proc.lock().as_ref().is_some_and(Proc::alive);
            if !alive || Instant::now() > give_up {
                let tail =
                    std::fs::read_to_string(self.base.join("server.err")).unwrap_or_default();
                bail!(
                    "PostgreSQL {} did not start on {}:\n{tail}",
                    self.name,
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Runs one statement with `psql` and answers its unaligned output, or `None`.
    pub fn sql(&self, statement: &str) -> Option<String> {
        idem_testkit::services::output_of(
            Command::new(format!("{PG_BIN}/psql"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", "postgres", "-d", "postgres", "-Atqc", statement])
                .env("PGCONNECT_TIMEOUT", "2")
                .stdin(Stdio::null()),
        )
    }

    /// Makes commits wait for the standby (`synchronous_standby_names = '*'`).
    ///
    /// # Errors
    /// The setting could not be applied.
    pub fn require_sync_standby(&self) -> anyhow::Result<()> {
        for statement in [
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "ALTER SYSTEM SET synchronous_commit = 'on'",
            "SELECT pg_reload_conf()",
        ] {
            self.sql(statement)
                .with_context(|| format!("`{statement}` on {}", self.name))?;
        }
        let give_up = Instant::now() + Duration::from_secs(10);
        while self
            .sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            .as_deref()
            != Some("1")
        {
            if Instant::now() > give_up {
                bail!("the standby did not become synchronous");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) the whole server: the postmaster and every
    /// backend it forked (stopping the postmaster alone leaves open connections served).
    pub fn pause(&self, stop: bool) -> bool {
        let guard = self.proc.lock();
        let Some(p) = guard.as_ref() else {
            return false;
        };
        let sig = if stop { "STOP" } else { "CONT" };
        let sent = p.signal(sig);
        for child in crate::proc::children(p.pid()) {
            crate::proc::signal(child, sig);
        }
        sent
    }

    /// SIGKILLs the postmaster and forgets it.
    pub fn kill(&self) {
        if let Some(p) = self.proc.lock().take() {
            p.signal("KILL");
            p.stop();
        }
    }

    /// `pg_ctl promote`, then waits until it takes writes.
    ///
    /// # Errors
    /// The promotion failed or took longer than 30 s.
    pub async fn promote(&self) -> anyhow::Result<()> {
        self.as_postgres(&[
            &format!("{PG_BIN}/pg_ctl"),
            "promote",
            "-D",
            &self.data.display().to_string(),
        ])?;
        let give_up = Instant::now() + Duration::from_secs(30);
        while self.sql("SELECT pg_is_in_recovery()").as_deref() != Some("f") {
            if Instant::now() > give_up {
                bail!("{} was not promoted", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        if let Some(p) = self.proc.lock().take() {
            p.stop();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

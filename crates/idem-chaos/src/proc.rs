//! Child processes the harness owns (`idem serve`, `idem relay`, PostgreSQL), each under a
//! tiny `sh` keeper whose stdin is a pipe from this process, as idem-testkit's private Redis
//! servers are: when the pipe closes (the [`Proc`] is dropped, or this process dies in any
//! way, abort and SIGKILL included) the keeper resumes the child, signals it and reaps it. So
//! no child outlives the harness, even when a panic or a kill cuts a run short.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Starts `"$@"` with its output in two files, prints its pid, and waits for stdin to close;
/// then resumes it (it may be stopped), sends it `$3` and reaps it.
const KEEPER: &str = r#"
out=$1; err=$2; sig=$3; shift 3
"$@" >"$out" 2>"$err" </dev/null &
pid=$!
echo "$pid"
read -r _
kill -CONT "$pid" 2>/dev/null
kill "-$sig" "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
"#;

/// How a [`Proc`] is started.
#[derive(Debug, Clone)]
pub struct Spawn<'a> {
    /// A name for messages (`g0`, `relay1`, `pg-primary`).
    pub name: &'a str,
    /// The program.
    pub program: &'a Path,
    /// Its arguments.
    pub args: Vec<&'a OsStr>,
    /// Extra environment variables.
    pub env: Vec<(&'a str, &'a str)>,
    /// Its working directory.
    pub dir: &'a Path,
    /// Where its stdout and stderr go (`<log>.out`, `<log>.err`).
    pub log: PathBuf,
    /// The signal the keeper sends when the [`Proc`] is dropped (`KILL`, or `QUIT` for a
    /// PostgreSQL that should stop at once but cleanly).
    pub stop_signal: &'a str,
    /// Run as this (uid, gid) instead of the harness's user.
    pub user: Option<(u32, u32)>,
}

/// A running child under its keeper; stopped (and reaped) on drop.
#[derive(Debug)]
pub struct Proc {
    name: String,
    pid: u32,
    keeper: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    /// Starts the child.
    ///
    /// # Errors
    /// The keeper cannot be started or does not report the child's pid.
    pub fn spawn(spec: &Spawn<'_>) -> anyhow::Result<Self> {
        let out = spec.log.with_extension("out");
        let err = spec.log.with_extension("err");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(KEEPER)
            .arg("keeper")
            .arg(&out)
            .arg(&err)
            .arg(spec.stop_signal)
            .arg(spec.program)
            .args(&spec.args)
            .current_dir(spec.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if let Some((uid, gid)) = spec.user {
            cmd.uid(uid).gid(gid);
        }
        let mut keeper = cmd
            .spawn()
            .with_context(|| format!("{}: starting the keeper", spec.name))?;
        let stdout = keeper.stdout.take().context("keeper stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .with_context(|| format!("{}: reading the child's pid", spec.name))?;
        let pid = line
            .trim()
            .parse()
            .with_context(|| format!("{}: the keeper printed {line:?}, not a pid", spec.name))?;
        let stdin = keeper.stdin.take();
        Ok(Self {
            name: spec.name.to_owned(),
            pid,
            keeper,
            stdin,
            out,
            err,
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `sig` (`STOP`, `CONT`, `KILL`, …); false if it could not be sent.
    pub fn signal(&self, sig: &str) -> bool {
        signal(self.pid, sig)
    }

    /// Whether the child still runs (a stopped child runs; a zombie does not).
    pub fn alive(&self) -> bool {
        alive(self.pid)
    }

    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The last `lines` lines of its stderr.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.err).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until its stdout has a line containing `needle`, at most `limit`.
    ///
    /// # Errors
    /// The child exited first, or the time ran out; the error carries its stderr's tail.
    pub async fn wait_for_line(&self, needle: &str, limit: Duration) -> anyhow::Result<()> {
        let give_up = Instant::now() + limit;
        loop {
            if self.stdout().lines().any(|l| l.contains(needle)) {
                return Ok(());
            }
            if !self.alive() {
                bail!(
                    "{} exited before printing {needle:?}:\n{}",
                    self.name,
                    self.stderr_tail(30)
                );
            }
            if Instant::now() > give_up {
                bail!(
                    "{} did not print {needle:?} within {limit:?}:\n{}",
                    self.name,
                    self.stderr_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the child through its keeper and waits for both.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.keeper.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Sends `sig` to `pid` with `kill(1)`; false if it failed.
pub fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The pids whose parent is `pid`, from `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    // `pid (comm) state ppid …`
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Whether `pid` runs: it exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) S …`: the state follows the last `)`.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x'))
}

/// The uid and gid of a system user, from `id`.
///
/// # Errors
/// `id` fails or prints something that is not a number.
pub fn user_ids(user: &str) -> anyhow::Result<(u32, u32)> {
    let get = |flag: &str| -> anyhow::Result<u32> {
        let out = Command::new("id")
            .arg(flag)
            .arg(user)
            .output()
            .context("running id")?;
        if !out.status.success() {
            bail!("no user {user}");
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("id {flag} {user}"))
    };
    Ok((get("-u")?, get("-g")?))
}

/// A loopback TCP port that is free now.
///
/// # Errors
/// No port can be bound.
pub fn spare_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("binding a spare port")?
        .local_addr()?
        .port())
}

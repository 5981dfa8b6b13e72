//! What service tests share: what to do when a server is not there, waiting for a
//! condition, and asking a server's command-line client.

use std::future::Future;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `command` (a server's command-line client) with its standard error discarded; its
/// standard output trimmed, or `None` if it could not start or exited with a failure.
pub fn output_of(command: &mut Command) -> Option<String> {
    let out = command.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Reports a missing server: under CI (the `CI` variable is set) the test fails, since a
/// service test never skips there; elsewhere it says so loudly, and the caller skips.
///
/// # Panics
/// Under CI, always.
pub fn missing(what: &str, e: &dyn std::fmt::Display) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} is required under CI but unreachable: {e}");
    }
    eprintln!("!!! SKIPPING: {what} unreachable ({e}); set it up to run this test");
}

/// Waits until `check` holds, for at most `limit`; returns whether it did.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

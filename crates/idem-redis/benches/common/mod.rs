//! What the Redis benches share: CPU readings from `/proc`, and the loop that keeps a number
//! of tasks running one operation after another for a set time.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// CPU seconds (user, system) process `pid` (a number, or `self`) has used so far, from
/// `/proc`; zero for what cannot be read.
pub(crate) fn cpu_split(pid: impl Display) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 100.0
    };
    (ticks(11), ticks(12))
}

/// CPU seconds (user + system) process `pid` has used so far, from `/proc`.
pub(crate) fn cpu_secs(pid: impl Display) -> f64 {
    let (user, system) = cpu_split(pid);
    user + system
}

/// Runs `op(worker, i)` in `concurrency` tasks, each calling it again as soon as it returns,
/// for `secs`; returns how many calls finished.
pub(crate) async fn run_workers<F, Fut>(concurrency: usize, secs: Duration, op: F) -> u64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let (op, stop, done) = (Arc::clone(&op), Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    op(w, i).await;
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("task");
    }
    done.load(Ordering::Relaxed)
}

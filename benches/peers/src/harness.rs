//! Timing and reporting: one measurement is N tasks calling one operation for S seconds; the
//! report gives medians over the rounds with their ranges, and ratios taken within a round.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::subjects::{Backend, Impl, Op, Row};

/// One measurement.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) backend: Backend,
    pub(crate) row: Row,
    pub(crate) tasks: usize,
    pub(crate) round: usize,
    pub(crate) which: Impl,
    /// Operations per second.
    pub(crate) rate: f64,
    /// CPU this process used per operation, µs (all threads).
    pub(crate) client_cpu_us: f64,
    /// CPU the private redis-server used per operation, µs (Redis rows on a private server).
    pub(crate) server_cpu_us: Option<f64>,
}

/// CPU seconds (user + system) process `pid` has used so far, from /proc.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may itself hold spaces and parentheses.
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
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs `op(worker, i)` in `tasks` tasks for `secs`; returns operations per second and the CPU
/// per operation of this process and of `server` (if given), in µs.
///
/// Each task watches the clock itself: an operation that completes on its first poll (an
/// in-process store) never yields, and tasks that never yield keep both workers busy, so
/// neither a timer nor a stop flag set by another task would ever be seen.
pub(crate) async fn measure(
    tasks: usize,
    secs: Duration,
    op: Op,
    server: Option<u32>,
) -> (f64, f64, Option<f64>) {
    let done = Arc::new(AtomicU64::new(0));
    let me = std::process::id();
    let (me0, server0) = (cpu_secs(me), server.map(cpu_secs));
    let started = Instant::now();
    let deadline = started + secs;
    let workers: Vec<_> = (0..tasks)
        .map(|w| {
            let (op, done) = (Arc::clone(&op), Arc::clone(&done));
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < deadline {
                    op(w, i).await;
                    i += 1;
                }
                done.fetch_add(i, Ordering::Relaxed);
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ops = done.load(Ordering::Relaxed).max(1) as f64;
    let client = (cpu_secs(me) - me0) / ops * 1e6;
    let server = server
        .zip(server0)
        .map(|(pid, s0)| (cpu_secs(pid) - s0) / ops * 1e6);
    (ops / elapsed, client, server)
}

/// Waits until no more tasks are alive than `before`: a peer's memory store frees its map in
/// its own background task after the store is dropped, which must not overlap the next
/// measurement. Returns how long that took.
pub(crate) async fn settle(before: usize) -> Duration {
    let started = Instant::now();
    let give_up = started + Duration::from_secs(60);
    let metrics = tokio::runtime::Handle::current().metrics();
    while metrics.num_alive_tasks() > before {
        if Instant::now() > give_up {
            eprintln!(
                "warning: {} tasks still alive after a measurement (before: {before})",
                metrics.num_alive_tasks()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    started.elapsed()
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn range(values: &[f64]) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// `12345.6` as `12 346`.
fn grouped(value: f64) -> String {
    if !value.is_finite() {
        return "—".to_owned();
    }
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (n, ch) in digits.chars().enumerate() {
        if n > 0 && (digits.len() - n) % 3 == 0 {
            out.push(' ');
        }
        out.push(ch);
    }
    out
}

/// "median [min–max]" of rates.
fn rates(values: &[f64]) -> String {
    let (lo, hi) = range(values);
    format!(
        "{} [{}–{}]",
        grouped(median(values)),
        grouped(lo),
        grouped(hi)
    )
}

/// "**median** [min–max]" of ratios.
fn ratios(values: &[f64]) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    let (lo, hi) = range(values);
    format!("**{:.2}** [{lo:.2}–{hi:.2}]", median(values))
}

/// The samples of one table line (backend, row, concurrency), one round at a time.
struct Line<'a> {
    samples: Vec<&'a Sample>,
    rounds: Vec<usize>,
}

impl<'a> Line<'a> {
    fn new(all: &'a [Sample], backend: Backend, row: Row, tasks: usize) -> Line<'a> {
        let samples: Vec<&Sample> = all
            .iter()
            .filter(|s| s.backend == backend && s.row == row && s.tasks == tasks)
            .collect();
        let mut rounds: Vec<usize> = samples.iter().map(|s| s.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        Line { samples, rounds }
    }

    fn get(&self, round: usize, which: Impl) -> Option<&'a Sample> {
        self.samples
            .iter()
            .copied()
            .find(|s| s.round == round && s.which == which)
    }

    fn rates(&self, which: Impl) -> Vec<f64> {
        self.rounds
            .iter()
            .filter_map(|&r| self.get(r, which).map(|s| s.rate))
            .collect()
    }

    /// idem's rate over the better peer's, in round `round`.
    fn over_best_peer(&self, round: usize) -> Option<f64> {
        let idem = self.get(round, Impl::Idem)?.rate;
        let best = [Impl::V03, Impl::V2]
            .iter()
            .filter_map(|&p| self.get(round, p).map(|s| s.rate))
            .fold(f64::NAN, f64::max);
        best.is_finite().then_some(idem / best)
    }

    fn over_floor(&self, round: usize) -> Option<f64> {
        Some(self.get(round, Impl::Idem)?.rate / self.get(round, Impl::Floor)?.rate)
    }

    fn per_round(&self, f: impl Fn(&Self, usize) -> Option<f64>) -> Vec<f64> {
        self.rounds.iter().filter_map(|&r| f(self, r)).collect()
    }
}

/// Markdown tables: every round, the medians, and the CPU per operation.
pub(crate) fn print_tables(all: &[Sample], backends: &[Backend], levels: &[usize]) {
    let head = Impl::ALL.map(Impl::label).join(" | ");
    let lines = || {
        backends.iter().flat_map(move |&b| {
            Row::ALL
                .into_iter()
                .flat_map(move |r| levels.iter().map(move |&c| (b, r, c)))
        })
    };
    println!("Per round (operations per second; ratios within the round):");
    println!();
    println!("| store | row | c | round | {head} | idem ÷ best peer | idem ÷ floor |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (b, r, c) in lines() {
        let line = Line::new(all, b, r, c);
        for &round in &line.rounds {
            let cells: Vec<String> = Impl::ALL
                .iter()
                .map(|&i| {
                    line.get(round, i)
                        .map_or("—".to_owned(), |s| grouped(s.rate))
                })
                .collect();
            let ratio = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.2}"));
            println!(
                "| {} | {} | {c} | {round} | {} | {} | {} |",
                b.label(),
                r.label(),
                cells.join(" | "),
                ratio(line.over_best_peer(round)),
                ratio(line.over_floor(round)),
            );
        }
    }
    println!();
    println!(
        "Medians over the rounds, operations per second [min–max]; ratios: median of the per-round ratios [min–max]:"
    );
    println!();
    println!("| store | row | c | {head} | idem ÷ best peer | idem ÷ floor |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (b, r, c) in lines() {
        let line = Line::new(all, b, r, c);
        let cells: Vec<String> = Impl::ALL.iter().map(|&i| rates(&line.rates(i))).collect();
        println!(
            "| {} | {} | {c} | {} | {} | {} |",
            b.label(),
            r.label(),
            cells.join(" | "),
            ratios(&line.per_round(Line::over_best_peer)),
            ratios(&line.per_round(Line::over_floor)),
        );
    }
    println!();
    println!(
        "CPU per operation, median µs (this process; redis-server when it is the bench's own):"
    );
    println!();
    println!("| store | row | c | {head} |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (b, r, c) in lines() {
        let line = Line::new(all, b, r, c);
        let cells: Vec<String> = Impl::ALL
            .iter()
            .map(|&i| {
                let pick = |f: &dyn Fn(&Sample) -> Option<f64>| {
                    let v: Vec<f64> = line
                        .samples
                        .iter()
                        .filter(|s| s.which == i)
                        .filter_map(|s| f(s))
                        .collect();
                    (!v.is_empty()).then(|| median(&v))
                };
                match (pick(&|s| Some(s.client_cpu_us)), pick(&|s| s.server_cpu_us)) {
                    (Some(client), Some(server)) => format!("{client:.1} / {server:.1}"),
                    (Some(client), None) => format!("{client:.1}"),
                    _ => "—".to_owned(),
                }
            })
            .collect();
        println!(
            "| {} | {} | {c} | {} |",
            b.label(),
            r.label(),
            cells.join(" | ")
        );
    }
}

/// Every sample as one CSV line, with a header.
pub(crate) fn print_csv(all: &[Sample]) {
    println!(
        "store,row,tasks,round,implementation,ops_per_sec,client_cpu_us_per_op,server_cpu_us_per_op"
    );
    for s in all {
        println!(
            "{},{},{},{},{},{:.1},{:.2},{}",
            s.backend.label(),
            s.row.label(),
            s.tasks,
            s.round,
            s.which.label(),
            s.rate,
            s.client_cpu_us,
            s.server_cpu_us.map_or(String::new(), |v| format!("{v:.2}")),
        );
    }
}

//! A run's report: the seed, the figures, a table of the faults injected (kind × count) and
//! one of the anomalies found (kind × count, with the first few keys).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::FaultKind;
use crate::checker::{Anomaly, Findings, Kind};
use crate::settle::SettleTimes;

/// What one run did and found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The seed (`--seed N` replays the schedule and the workload).
    pub seed: u64,
    /// One line describing the run's setup.
    pub setup: String,
    /// Operations the clients started.
    pub operations: usize,
    /// HTTP attempts.
    pub attempts: usize,
    /// Answers by status (`0` stands for no answer).
    pub statuses: BTreeMap<u16, usize>,
    /// Replayed answers.
    pub replays: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    /// What the checker found.
    pub findings: Findings,
    /// The time from a gateway's crash or stop to each key it held being settled.
    pub settle: SettleTimes,
    /// How long the whole run took.
    pub elapsed: Duration,
    /// Things worth knowing that are not anomalies (a store URL the gateway refused, a fault
    /// that could not be injected).
    pub notes: Vec<String>,
    /// Where the run's files are, if kept.
    pub dir: Option<String>,
}

impl Report {
    /// Every anomaly.
    pub fn anomalies(&self) -> &[Anomaly] {
        &self.findings.anomalies
    }

    /// Anomalies by kind.
    pub fn anomaly_counts(&self) -> BTreeMap<Kind, usize> {
        let mut out = BTreeMap::new();
        for a in &self.findings.anomalies {
            *out.entry(a.kind).or_default() += 1;
        }
        out
    }

    /// How many anomalies of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.anomaly_counts().get(&kind).copied().unwrap_or(0)
    }

    /// Faults injected in all.
    pub fn faults_injected(&self) -> usize {
        self.faults.values().sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_figures(f)?;
        writeln!(f)?;
        self.fmt_faults(f)?;
        writeln!(f)?;
        self.fmt_anomalies(f)?;
        writeln!(f)?;
        self.fmt_keys_and_verdict(f)
    }
}

impl Report {
    /// The seed and setup, the run's figures, the answers by status and the settle times.
    fn fmt_figures(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fd = &self.findings;
        writeln!(f, "idem-chaos seed {} — {}", self.seed, self.setup)?;
        writeln!(
            f,
            "{} operations, {} attempts, {} keys, {} executions, {} replays, {:.1}s",
            self.operations,
            self.attempts,
            fd.keys,
            fd.executions,
            self.replays,
            self.elapsed.as_secs_f64()
        )?;
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| {
                if *s == 0 {
                    format!("none×{n}")
                } else {
                    format!("{s}×{n}")
                }
            })
            .collect();
        writeln!(f, "answers: {}", statuses.join(" "))?;
        writeln!(
            f,
            "fences forwarded: {}",
            if fd.fences_forwarded { "yes" } else { "no" }
        )?;
        if fd.messages_once + fd.messages_dead > 0 {
            writeln!(
                f,
                "messages: {} executed once, {} dead-lettered",
                fd.messages_once, fd.messages_dead
            )?;
        }
        let st = &self.settle;
        let secs = |q: f64| {
            st.quantile_ms(q).map_or_else(
                || "-".to_owned(),
                |ms| format!("{:.1}s", ms as f64 / 1000.0),
            )
        };
        writeln!(
            f,
            "crash to settled key: {} keys hit, {} settled (median {}, p90 {}, max {}), {} not",
            st.hit,
            st.settled_ms.len(),
            secs(0.5),
            secs(0.9),
            secs(1.0),
            st.unsettled
        )?;
        Ok(())
    }

    /// The table of faults injected, by kind.
    fn fmt_faults(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<24} {:>6}", "fault", "count")?;
        for (kind, n) in &self.faults {
            writeln!(f, "{:<24} {n:>6}", kind.as_str())?;
        }
        if self.faults.is_empty() {
            writeln!(f, "{:<24} {:>6}", "(none)", 0)?;
        }
        Ok(())
    }

    /// The table of anomalies by kind with their first keys, then an example of each kind.
    fn fmt_anomalies(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fd = &self.findings;
        writeln!(f, "{:<24} {:>6}  first keys", "anomaly", "count")?;
        let counts = self.anomaly_counts();
        for (kind, n) in &counts {
            let mut keys: Vec<&str> = Vec::new();
            for a in fd.anomalies.iter().filter(|a| a.kind == *kind) {
                if !keys.contains(&a.key.as_str()) && keys.len() < 4 {
                    keys.push(&a.key);
                }
            }
            writeln!(f, "{:<24} {n:>6}  {}", kind.as_str(), keys.join(", "))?;
        }
        if counts.is_empty() {
            writeln!(f, "{:<24} {:>6}", "(none)", 0)?;
        }
        for kind in counts.keys() {
            if let Some(a) = fd.anomalies.iter().find(|a| a.kind == *kind) {
                writeln!(f, "  e.g. {kind} {}: {}", a.key, a.detail)?;
            }
        }
        Ok(())
    }

    /// The keys left unknown, never answered or re-executed after a data loss, the notes,
    /// the files and the verdict.
    fn fmt_keys_and_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fd = &self.findings;
        writeln!(
            f,
            "keys left unknown: {}{}",
            fd.unknown.len(),
            list(&fd.unknown)
        )?;
        if !fd.unanswered.is_empty() {
            writeln!(
                f,
                "keys never answered: {}{}",
                fd.unanswered.len(),
                list(&fd.unanswered)
            )?;
        }
        if !fd.after_data_loss.is_empty() {
            let keys: Vec<String> = fd
                .after_data_loss
                .iter()
                .map(|(k, n)| format!("{k} ×{n}"))
                .collect();
            writeln!(
                f,
                "re-executed after the store lost its data (not counted): {}{}",
                keys.len(),
                list(&keys)
            )?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        if let Some(dir) = &self.dir {
            writeln!(f, "files: {dir}")?;
        }
        let verdict = if fd.anomalies.is_empty() {
            "no anomalies"
        } else {
            "ANOMALIES FOUND"
        };
        write!(f, "{verdict} (seed {})", self.seed)
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = items.iter().take(6).map(String::as_str).collect();
    let more = if items.len() > shown.len() {
        ", …"
    } else {
        ""
    };
    format!(" ({}{more})", shown.join(", "))
}

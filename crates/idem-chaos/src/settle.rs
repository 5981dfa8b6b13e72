//! The time from a crash to a settled key: for every gateway the nemesis killed or stopped,
//! the operations that had an attempt in flight there at that moment (a key's own requests;
//! mismatch probes settle no key), and how long after the fault each first got the
//! upstream's answer (fresh or replayed) from any gateway.

use serde::Serialize;

use crate::FaultKind;
use crate::history::{History, OpKind};

/// What the crashes cost the keys they hit.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SettleTimes {
    /// Operations with an attempt in flight at a gateway when it was killed or stopped
    /// (mismatch probes left out).
    pub hit: usize,
    /// Of those, how long each took from the fault to its first upstream answer, in ms,
    /// sorted.
    pub settled_ms: Vec<u64>,
    /// Of those, how many never got one (left unknown, or given up).
    pub unsettled: usize,
}

impl SettleTimes {
    /// The `q`-quantile of the settled times (nearest rank), if any settled.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let n = self.settled_ms.len();
        if n == 0 {
            return None;
        }
        // Nearest rank: the smallest time at or above the q-th fraction of the sample.
        let rank = (q * n as f64).ceil().clamp(1.0, n as f64) as usize;
        self.settled_ms.get(rank - 1).copied()
    }
}

/// Measures [`SettleTimes`] over `history`.
pub fn measure(history: &History) -> SettleTimes {
    let mut out = SettleTimes::default();
    for fault in &history.faults {
        if !matches!(fault.kind, FaultKind::KillGateway | FaultKind::PauseGateway) {
            continue;
        }
        let Some(gateway) = fault
            .target
            .strip_prefix('g')
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let t = fault.start_ms;
        // A mismatch probe (another body on a completed key) settles no key: its right answer
        // is a 422, never the upstream's, and the checker holds it to that.
        let probe = |op: usize| {
            history
                .ops
                .get(op)
                .is_some_and(|o| o.kind == OpKind::Mismatch)
        };
        let mut hit: Vec<usize> = history
            .attempts
            .iter()
            .filter(|a| a.gateway == gateway && a.start_ms <= t && a.end_ms > t)
            .map(|a| a.op)
            .filter(|&op| !probe(op))
            .collect();
        hit.sort_unstable();
        hit.dedup();
        for op in hit {
            out.hit += 1;
            let first = history
                .attempts
                .iter()
                .filter(|a| a.op == op && a.end_ms > t)
                .filter(|a| a.result.answer().is_some_and(|ans| ans.from_upstream()))
                .map(|a| a.end_ms)
                .min();
            match first {
                Some(end) => out.settled_ms.push(end - t),
                None => out.unsettled += 1,
            }
        }
    }
    out.settled_ms.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Answer, Attempt, AttemptResult, FaultRecord, Op, Phase};

    fn attempt(op: usize, gateway: usize, start_ms: u64, end_ms: u64, ok: bool) -> Attempt {
        Attempt {
            op,
            gateway,
            start_ms,
            end_ms,
            phase: Phase::Main,
            result: if ok {
                AttemptResult::Answer(Answer {
                    status: 201,
                    replayed: true,
                    exec: Some("e1".into()),
                    caller: None,
                    key: None,
                    problem: None,
                    retry_after: None,
                })
            } else {
                AttemptResult::Broken("reset".into())
            },
        }
    }

    /// Gateway g1 killed at 1000 ms, back at 2000 ms.
    fn g1_killed_at_1000() -> FaultRecord {
        FaultRecord {
            kind: FaultKind::KillGateway,
            target: "g1".into(),
            start_ms: 1000,
            end_ms: 2000,
            detail: String::new(),
            in_force: None,
        }
    }

    #[test]
    fn a_key_in_flight_at_a_killed_gateway_settles_at_its_first_upstream_answer() {
        let history = History {
            attempts: vec![
                // In flight at g1 when it dies at 1000, answered by g0 at 5200.
                attempt(0, 1, 900, 1001, false),
                attempt(0, 0, 1100, 1500, false),
                attempt(0, 0, 5000, 5200, true),
                // In flight at g1, never answered.
                attempt(1, 1, 950, 1001, false),
                // At another gateway: not hit.
                attempt(2, 0, 950, 1200, true),
                // At g1 but finished before the fault: not hit.
                attempt(3, 1, 100, 200, true),
            ],
            faults: vec![g1_killed_at_1000()],
            ..History::default()
        };
        let times = measure(&history);
        assert_eq!(times.hit, 2);
        assert_eq!(times.settled_ms, vec![4200]);
        assert_eq!(times.unsettled, 1);
        assert_eq!(times.quantile_ms(0.5), Some(4200));
    }

    #[test]
    fn a_mismatch_probe_in_flight_at_a_killed_gateway_is_not_a_key_to_settle() {
        let op = |id: usize, kind| Op {
            id,
            client: 0,
            caller: "c".into(),
            key: format!("k{id}"),
            body: String::new(),
            kind,
        };
        let refused = |op: usize, gateway: usize, start_ms: u64, end_ms: u64| Attempt {
            result: AttemptResult::Answer(Answer {
                status: 422,
                replayed: false,
                exec: None,
                caller: None,
                key: None,
                problem: None,
                retry_after: None,
            }),
            ..attempt(op, gateway, start_ms, end_ms, false)
        };
        let history = History {
            ops: vec![op(0, OpKind::Normal), op(1, OpKind::Mismatch)],
            attempts: vec![
                // The key's own request: in flight at g1 when it dies, answered by g0.
                attempt(0, 1, 900, 1001, false),
                attempt(0, 0, 3000, 3200, true),
                // Another body on a completed key, in flight at g1 too: its retry gets the
                // 422 it must get, and never an upstream answer.
                attempt(1, 1, 950, 1001, false),
                refused(1, 0, 1100, 1150),
            ],
            faults: vec![g1_killed_at_1000()],
            ..History::default()
        };
        let times = measure(&history);
        assert_eq!(times.hit, 1, "only the key's own request settles a key");
        assert_eq!(times.settled_ms, vec![2200]);
        assert_eq!(times.unsettled, 0);
    }
}

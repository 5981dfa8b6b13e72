//! A counterexample or example path, written out step by step for a test's output.

use std::fmt::Write as _;

use stateright::Path;

use crate::action::Action;
use crate::ids::FenceSet;
use crate::state::State;

/// Each step of `path` with what it left behind: the record, the upstream's ledger and the
/// requests still in transit; then every client's end.
pub fn trace(path: &Path<State, Action>) -> String {
    let steps = path.clone().into_vec();
    let mut out = String::new();
    let mut number = 0;
    for pair in steps.windows(2) {
        let [(_, Some(action)), (after, _)] = pair else {
            continue;
        };
        number += 1;
        let ledger: Vec<u8> = after.upstream.ledger.iter().map(|e| e.fence).collect();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "{number:>3}. {action:?}\n       record {:?}, executed fences {ledger:?}, in transit {:?}",
            after.store.record,
            fences(after.upstream.in_transit),
        );
    }
    if let Some((last, _)) = steps.last() {
        for (client, c) in last.clients.iter().enumerate() {
            let _ = writeln!(
                out,
                "     client {client}: {:?} after {} request(s)",
                c.phase, c.sent
            );
        }
    }
    out
}

fn fences(set: FenceSet) -> Vec<u8> {
    set.iter().collect()
}

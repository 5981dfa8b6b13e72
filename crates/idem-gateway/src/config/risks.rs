//! What a configuration trades away of the promise: settings that can let a key take effect
//! twice under a single fault, which `idem check-config` names and `idem serve` logs.

use idem_core::TakeoverPolicy;

use super::Dur;
use super::settings::{Settings, UpstreamFailure};

impl Settings {
    /// One line per route (and the relays that follow it) whose settings can run a key twice
    /// under a single fault, saying what the fault is and how to avoid it. Empty for the
    /// defaults.
    pub fn risks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for route in &self.routes {
            let p = &route.policy;
            if !p.idempotency || p.fenced_upstream {
                continue;
            }
            let relays: Vec<&str> = self
                .relays
                .iter()
                .filter(|r| r.route == route.name)
                .map(|r| r.name.as_str())
                .collect();
            let also = if relays.is_empty() {
                String::new()
            } else {
                format!(" (and relay {})", relays.join(", "))
            };
            if p.engine.takeover() == TakeoverPolicy::Reexecute {
                out.push(format!(
                    "route `{}`{also}: takeover = \"reexecute\" runs a request again when the gateway \
                     holding it dies or stalls past its lease ({}) after the upstream may have acted: \
                     a second effect. Keep it only if the upstream refuses a stale fence (header `{}`) \
                     and say so with `fenced_upstream = true`; otherwise use takeover = \"hold\"",
                    route.name,
                    Dur(p.engine.lease()),
                    p.fence_header,
                ));
            }
            if p.upstream_failure == UpstreamFailure::Retry {
                out.push(format!(
                    "route `{}`{also}: upstream_failure = \"retry\" runs a request again after an \
                     upstream timeout or a reset after sending, when the upstream may have acted: a \
                     second effect. Keep it only if the upstream refuses a stale fence (header `{}`) \
                     and say so with `fenced_upstream = true`; otherwise use upstream_failure = \"hold\"",
                    route.name, p.fence_header,
                ));
            }
        }
        out
    }
}

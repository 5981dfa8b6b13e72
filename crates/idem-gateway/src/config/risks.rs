//! What a configuration trades away, which `idem check-config` names and `idem serve` logs:
//! settings that can let a key take effect twice under a single fault, and principals that
//! take a token minted for another service.

use idem_core::TakeoverPolicy;

use super::Dur;
use super::settings::{Settings, UpstreamFailure};
use crate::principal::PrincipalSource;

impl Settings {
    /// One line per route whose settings can run a key twice under a single fault, saying
    /// what the fault is and how to avoid it. Empty for the defaults.
    pub fn risks(&self) -> Vec<String> {
        self.risks_with(|_| String::new())
    }

    /// As [`Settings::risks`], with `also(route)` written after each route's name: what else
    /// follows that route's policy, such as ` (and relay orders)` (empty for nothing).
    pub fn risks_with(&self, also: impl Fn(&str) -> String) -> Vec<String> {
        let mut out = Vec::new();
        for route in &self.routes {
            let p = &route.policy;
            if !p.idempotency || p.fenced_upstream {
                continue;
            }
            let also = also(&route.name);
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

    /// One line per protected route whose JWT principal checks no `audience` or no `issuer`:
    /// any token its key signed is accepted, so one minted for another service that shares
    /// the key (or the issuer's signing key) acts here under its claim. Empty when every JWT
    /// principal checks both.
    pub fn credential_risks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for route in &self.routes {
            let p = &route.policy;
            let PrincipalSource::Jwt(jwt) = &p.principal else {
                continue;
            };
            if !p.idempotency {
                continue;
            }
            let unchecked = match (jwt.verifier.checks_audience(), jwt.verifier.checks_issuer()) {
                (true, true) => continue,
                (false, false) => "no `audience` and no `issuer`",
                (false, true) => "no `audience`",
                (true, false) => "no `issuer`",
            };
            out.push(format!(
                "route `{}`: the JWT principal checks {unchecked}, so a token signed with its key \
                 for another service is accepted here and acts as its `{}`. Set `audience` (and \
                 `issuer`) to the values the tokens meant for this route carry",
                route.name,
                jwt.verifier.claim(),
            ));
        }
        out
    }
}

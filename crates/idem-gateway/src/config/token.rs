//! A route's token mode: `token = { header, issue, ttl, rate, global_rate }`.
//!
//! The gateway issues one-time tokens at the `issue` path (answered by the gateway, never
//! forwarded) and the route takes its idempotency key from the token header instead of
//! `Idempotency-Key`. `docs/gateway.md` describes the flow and the error table.

use std::fmt;
use std::time::Duration;

use anyhow::{anyhow, bail};
use http::HeaderName;
use serde::{Deserialize, Serialize};

use super::Dur;
use super::settings::{Route, StatusSettings};
use crate::store::StoreSpec;

/// The header a token travels in unless `token.header` says otherwise.
const DEFAULT_TOKEN_HEADER: &str = "idempotency-token";
/// How long an issued token stays usable unless `token.ttl` says otherwise.
const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// Issues per principal unless `token.rate` says otherwise.
const DEFAULT_TOKEN_RATE: &str = "20/min";
/// Issues of one route for all callers together unless `token.global_rate` says otherwise.
/// With the default TTL (15 min) it keeps at most 90 000 live tokens per route, far below the
/// memory store's default capacity (1 000 000), so callers who invent credentials cannot
/// fill the token store for everyone.
const DEFAULT_GLOBAL_RATE: &str = "100/s";

/// A route's token mode as written.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawToken {
    /// The request header carrying the token (default `Idempotency-Token`).
    pub header: Option<String>,
    /// The path where `POST` issues a token for this route, e.g. `/checkout/token`.
    pub issue: Option<String>,
    /// How long an issued token stays usable (default `15m`).
    pub ttl: Option<Dur>,
    /// Issues allowed per principal: `20/min`, `5/s`, `100/h`, `3/10s` (default `20/min`).
    pub rate: Option<String>,
    /// Issues allowed for the route, all callers together (default `100/s`): the bound
    /// that holds when callers can invent principals (a `header` or `none` principal).
    pub global_rate: Option<String>,
}

/// A route's checked token mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSettings {
    /// The request header carrying the token.
    pub header: HeaderName,
    /// The issue path, normalised (`/checkout/token`).
    pub issue: String,
    /// How long an issued token stays usable.
    pub ttl: Duration,
    /// Issues allowed per principal.
    pub rate: Rate,
    /// Issues allowed for the route, all callers together.
    pub global_rate: Rate,
}

/// At most `count` events per `per`, with bursts of up to `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Events allowed per period (also the largest burst).
    pub count: u32,
    /// The period.
    pub per: Duration,
}

/// Most events a rate may allow per period.
const MAX_RATE_COUNT: u32 = 1_000_000;
/// Longest period a rate may have.
const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);

impl Rate {
    /// Parses `COUNT/PERIOD`: the period is a unit (`s`, `sec`, `second`, `min`, `minute`,
    /// `h`, `hour`, `d`, `day`) or a duration such as `10s`.
    ///
    /// # Errors
    /// A message saying what was expected.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let form = "write COUNT/PERIOD, e.g. 20/min, 5/s, 100/h or 3/10s";
        let (count, per) = text
            .trim()
            .split_once('/')
            .ok_or_else(|| anyhow!("`{text}` is not a rate: {form}"))?;
        let count: u32 = count
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=MAX_RATE_COUNT).contains(n))
            .ok_or_else(|| {
                anyhow!("`{text}`: the count must be a whole number from 1 to {MAX_RATE_COUNT}")
            })?;
        let per = match per.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            "d" | "day" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other)
                .map_err(|_| anyhow!("`{text}`: `{other}` is not a period; {form}"))?,
        };
        if per.is_zero() || per > MAX_RATE_PERIOD {
            bail!("`{text}`: the period must be between 1 ms and 1 day");
        }
        Ok(Self { count, per })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, Dur(self.per))
    }
}

/// Checks one route's token mode.
///
/// # Errors
/// The first problem found, naming the field.
pub(super) fn compile(raw: &RawToken) -> anyhow::Result<TokenSettings> {
    let issue = raw.issue.as_deref().ok_or_else(|| {
        anyhow!(
            "`token.issue` is required: the path where POST issues a token, e.g. /checkout/token"
        )
    })?;
    let issue = issue_path(issue).map_err(|e| anyhow!("`token.issue`: {e}"))?;
    let header = raw.header.as_deref().unwrap_or(DEFAULT_TOKEN_HEADER);
    let header = HeaderName::from_bytes(header.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| anyhow!("`token.header`: `{header}` is not a valid header name"))?;
    if matches!(
        header.as_str(),
        "authorization" | "cookie" | "host" | "content-length" | "transfer-encoding" | "connection"
    ) {
        bail!(
            "`token.header`: `{header}` is taken by HTTP itself; pick a header of its own, such as Idempotency-Token"
        );
    }
    let ttl = raw.ttl.map_or(DEFAULT_TOKEN_TTL, |d| d.0);
    if ttl.is_zero() || ttl > idem_core::token::MAX_TTL {
        bail!(
            "`token.ttl` must be between 1 ms and {} days",
            idem_core::token::MAX_TTL.as_secs() / 86_400
        );
    }
    let rate = Rate::parse(raw.rate.as_deref().unwrap_or(DEFAULT_TOKEN_RATE))
        .map_err(|e| anyhow!("`token.rate`: {e}"))?;
    let global_rate = Rate::parse(raw.global_rate.as_deref().unwrap_or(DEFAULT_GLOBAL_RATE))
        .map_err(|e| anyhow!("`token.global_rate`: {e}"))?;
    Ok(TokenSettings {
        header,
        issue,
        ttl,
        rate,
        global_rate,
    })
}

/// An issue path: absolute, plain (unreserved characters and `/` only), already in canonical
/// spelling, and not the root.
fn issue_path(path: &str) -> anyhow::Result<String> {
    super::parse::plain_path(path, path.trim(), "/checkout/token")
}

/// Checks what concerns token routes together: every issue path is one route's only, apart
/// from the status endpoint, and the store keeps tokens.
///
/// # Errors
/// The first problem found, naming the route.
pub(super) fn check_routes(
    routes: &[Route],
    store: &StoreSpec,
    status: Option<&StatusSettings>,
) -> anyhow::Result<()> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for route in routes {
        let Some(token) = &route.policy.token else {
            continue;
        };
        if !supports_tokens(store) {
            bail!(
                "route `{}`: token mode needs a store that keeps tokens (memory:, redis://, \
                 redis+cluster://, postgres:// or mysql://); `{}` keeps none",
                route.name,
                store.kind()
            );
        }
        let issue = token.issue.as_str();
        if let Some((other, _)) = seen.iter().find(|(_, p)| p.eq_ignore_ascii_case(issue)) {
            bail!(
                "route `{}`: `token.issue` {issue} is already route `{other}`'s issue path",
                route.name
            );
        }
        if let Some(s) = status {
            let below = issue.len() > s.path.len()
                && issue.as_bytes()[s.path.len()] == b'/'
                && issue[..s.path.len()].eq_ignore_ascii_case(&s.path);
            if issue.eq_ignore_ascii_case(&s.path) || below {
                bail!(
                    "route `{}`: `token.issue` {issue} lies under the status endpoint {}",
                    route.name,
                    s.path
                );
            }
        }
        seen.push((route.name.as_str(), issue));
    }
    Ok(())
}

/// Whether `store` has a token store: SQLite has none.
pub fn supports_tokens(store: &StoreSpec) -> bool {
    !matches!(store, StoreSpec::Sqlite { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_units_and_durations() {
        let r = |t: &str| Rate::parse(t).expect(t);
        assert_eq!(
            r("20/min"),
            Rate {
                count: 20,
                per: Duration::from_secs(60)
            }
        );
        assert_eq!(
            r("5/s"),
            Rate {
                count: 5,
                per: Duration::from_secs(1)
            }
        );
        assert_eq!(
            r(" 100 / hour "),
            Rate {
                count: 100,
                per: Duration::from_secs(3600)
            }
        );
        assert_eq!(
            r("3/10s"),
            Rate {
                count: 3,
                per: Duration::from_secs(10)
            }
        );
        assert_eq!(r("20/min").to_string(), "20/1m");
        for bad in [
            "",
            "20",
            "0/min",
            "-1/min",
            "x/min",
            "20/fortnight",
            "20/0s",
            "1/2d",
            "2000000/s",
        ] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn routes_compile_their_token_mode() {
        let s = crate::config::compile(
            &crate::config::from_toml(
                r#"
                upstream = "http://127.0.0.1:9"
                store = "memory:"
                [defaults]
                principal = { from = "none" }
                key_required = false
                [[routes]]
                name = "checkout"
                path = "/checkout/*"
                [routes.token]
                issue = "/checkout/token"
                [[routes]]
                name = "form"
                path = "/form"
                token = { header = "X-Form-Token", issue = "/form/token", ttl = "1h", rate = "5/s", global_rate = "50/s" }
                [[routes]]
                name = "plain"
                path = "/*"
                "#,
            )
            .expect("toml"),
        )
        .expect("valid");
        let checkout = s.routes[0].policy.token.as_ref().expect("token mode");
        assert_eq!(checkout.header.as_str(), "idempotency-token");
        assert_eq!(checkout.issue, "/checkout/token");
        assert_eq!(checkout.ttl, DEFAULT_TOKEN_TTL);
        assert_eq!(
            checkout.rate,
            Rate::parse(DEFAULT_TOKEN_RATE).expect("rate")
        );
        // By default the route's global rate keeps its live tokens (at the default TTL) far
        // below the memory store's default capacity.
        let global = checkout.global_rate;
        assert_eq!(global, Rate::parse(DEFAULT_GLOBAL_RATE).expect("rate"));
        let live = u128::from(global.count) * DEFAULT_TOKEN_TTL.as_nanos() / global.per.as_nanos();
        assert!(
            live * 10 <= crate::store::DEFAULT_MEMORY_CAPACITY as u128,
            "{live}"
        );
        // The token is always required, whatever `defaults` says of keys.
        assert!(s.routes[0].policy.key_required);
        let form = s.routes[1].policy.token.as_ref().expect("token mode");
        assert_eq!(form.header.as_str(), "x-form-token");
        assert_eq!(form.ttl, Duration::from_secs(3600));
        assert_eq!(
            form.rate,
            Rate {
                count: 5,
                per: Duration::from_secs(1)
            }
        );
        assert_eq!(form.global_rate.count, 50);
        assert!(s.routes[2].policy.token.is_none());
        assert!(!s.routes[2].policy.key_required);
    }

    #[test]
    fn issue_paths_are_plain() {
        assert_eq!(
            issue_path("/checkout/token").expect("ok"),
            "/checkout/token"
        );
        for bad in [
            "checkout/token",
            "/",
            "/a//b",
            "/a/../b",
            "/a b",
            "/a?x=1",
            "/a/",
        ] {
            assert!(issue_path(bad).is_err(), "{bad}");
        }
    }
}

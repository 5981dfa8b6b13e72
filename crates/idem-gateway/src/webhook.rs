//! A route's status webhook: asking the upstream what became of a key.
//!
//! A route opts in with `status_url` (a path on its upstream, or an absolute URL, with
//! `{key}` and optionally `{namespace}` and `{principal}`, e.g.
//! `/charges?idempotency_key={key}`). The webhook answers `200` with JSON:
//!
//! | answer | meaning |
//! |---|---|
//! | `{"outcome":"complete","status":201,"headers":{…},"body":…}` | the effect happened; this is its answer (stored and replayed) |
//! | `{"outcome":"release"}` | the effect did not happen |
//! | `{"outcome":"unknown"}`, another status, a timeout | it cannot say |
//!
//! The body of `complete` is the admin API's resolve body (an optional `ttl` too). Two users
//! ask it: a claim that finds its key unknown ([`Webhook`] is the engine's [`Probe`]), and
//! [`crate::reconcile`]'s passes over what is left.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use idem_core::{Probe, ProbeAnswer, ProbeFuture, Resolution, ScopedKey, StoredResponse};
use idem_http::RequestBody;
use serde_json::Value;

use crate::config::{Dur, Route, Settings};
use crate::upstream::{Clients, HttpClient, RawUpstream, UpstreamSpec};

/// Largest webhook answer read.
const MAX_ANSWER: usize = 4 << 20;

/// One route's status webhook.
#[derive(Clone)]
pub(crate) struct Webhook {
    /// The route it comes from.
    pub(crate) route: String,
    /// The namespace its keys live in.
    pub(crate) namespace: String,
    pub(crate) template: String,
    /// The route's upstream, for a template that is a path.
    pub(crate) base: Option<Uri>,
    /// How long a completed record is kept, unless the webhook says otherwise.
    ttl: Duration,
    /// The longest one call may take.
    timeout: Duration,
    /// The client that reaches the webhook: the route's upstream client (its TLS trust, client
    /// certificate and HTTP version) for a path, or one made from an absolute URL's origin.
    client: Option<HttpClient>,
}

impl fmt::Debug for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook")
            .field("route", &self.route)
            .field("namespace", &self.namespace)
            .field("template", &self.template)
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// The webhook of `route`, if it has a `status_url`; each call bounded by `timeout`.
    ///
    /// # Errors
    /// An absolute `status_url` that is not a usable origin.
    pub(crate) fn of_route(
        settings: &Settings,
        route: &Route,
        clients: &mut Clients,
        timeout: Duration,
    ) -> anyhow::Result<Option<Self>> {
        let Some(template) = &route.policy.status_url else {
            return Ok(None);
        };
        let upstream = route.upstream.as_ref().or(settings.upstream.as_ref());
        let spec = if template.starts_with('/') {
            upstream.cloned()
        } else {
            Some(
                origin_spec(template)
                    .with_context(|| format!("route `{}`: status_url `{template}`", route.name))?,
            )
        };
        Ok(Some(Self {
            route: route.name.clone(),
            namespace: route.policy.namespace.clone(),
            template: template.clone(),
            base: upstream.map(|u| u.uri.clone()),
            ttl: route.policy.engine.record_ttl(),
            timeout,
            client: spec.as_ref().map(|s| clients.get(s)),
        }))
    }

    /// What the webhook says about `key`: a resolution, `None` for "unknown", or why it
    /// could not say.
    pub(crate) async fn ask(&self, key: &ScopedKey) -> Result<Option<Resolution>, String> {
        let url = self.url(key)?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(url.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(RequestBody::from(Bytes::new()))
            .map_err(|e| format!("webhook request: {e}"))?;
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| format!("route `{}` has no client for its webhook", self.route))?;
        let call = async {
            let res = client
                .request(req)
                .await
                .map_err(|e| format!("webhook {url}: {e}"))?;
            let status = res.status();
            let body = http_body_util::Limited::new(res.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("webhook {url}: reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| format!("webhook {url}: no answer within {:?}", self.timeout))??;
        if status != StatusCode::OK {
            return Err(format!("webhook {url} answered {status}"));
        }
        let answer: Value =
            serde_json::from_slice(&body).map_err(|e| format!("webhook {url}: not JSON: {e}"))?;
        if answer.get("outcome").and_then(Value::as_str) == Some("unknown") {
            return Ok(None);
        }
        let resolution = resolution(&body).map_err(|e| format!("webhook {url}: {e}"))?;
        Ok(Some(match resolution {
            // The route's record TTL unless the webhook named one.
            Resolution::Complete { response, .. } if answer.get("ttl").is_none() => {
                Resolution::Complete {
                    response,
                    ttl: self.ttl,
                }
            }
            other => other,
        }))
    }

    /// The webhook URL for `key`: the template with its placeholders percent-encoded, on the
    /// route's upstream when it is a path.
    fn url(&self, key: &ScopedKey) -> Result<Uri, String> {
        let filled = self
            .template
            .replace("{key}", &idem_wire::path::segment(key.key.as_str()))
            .replace(
                "{namespace}",
                &idem_wire::path::segment(key.scope.namespace()),
            )
            .replace(
                "{principal}",
                &idem_wire::path::segment(key.scope.principal().unwrap_or("")),
            );
        let full = if filled.starts_with('/') {
            let base = self.base.as_ref().ok_or_else(|| {
                format!(
                    "route `{}` has no upstream for its status_url path",
                    self.route
                )
            })?;
            let prefix = base.path().trim_end_matches('/');
            format!(
                "{}://{}{prefix}{filled}",
                base.scheme_str().unwrap_or("http"),
                base.authority().map_or("", |a| a.as_str())
            )
        } else {
            filled
        };
        full.parse::<Uri>()
            .map_err(|e| format!("webhook URL `{full}`: {e}"))
    }
}

impl Probe for Webhook {
    fn probe<'a>(&'a self, key: &'a ScopedKey, _fence: u64) -> ProbeFuture<'a> {
        Box::pin(async move {
            let (answer, label) = match self.ask(key).await {
                Ok(Some(Resolution::Complete { response, .. })) => {
                    (ProbeAnswer::Done(response), "done")
                }
                Ok(Some(_)) => (ProbeAnswer::NotDone, "not_done"),
                Ok(None) => (
                    ProbeAnswer::Unknown("the upstream does not know yet".into()),
                    "unknown",
                ),
                Err(why) => {
                    tracing::warn!(route = %self.route, error = %why, "status webhook failed");
                    (ProbeAnswer::Unknown(why), "unknown")
                }
            };
            metrics::counter!(
                "idem_status_webhook_total",
                "route" => self.route.clone(),
                "answer" => label
            )
            .increment(1);
            answer
        })
    }
}

/// The upstream settings for an absolute webhook URL: its scheme and authority (`https` is
/// verified against the system roots, as an `https` upstream without a CA file is).
fn origin_spec(template: &str) -> anyhow::Result<UpstreamSpec> {
    let rest = template
        .strip_prefix("https://")
        .map(|r| ("https", r))
        .or_else(|| template.strip_prefix("http://").map(|r| ("http", r)));
    let Some((scheme, rest)) = rest else {
        bail!("must be a path or an http:// or https:// URL");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('{') {
        bail!("placeholders belong in the path or query, not the host");
    }
    UpstreamSpec::compile(&RawUpstream::Url(format!("{scheme}://{authority}")))
}

/// Reads a resolve body, the admin API's and a webhook's answer alike: `release`, or
/// `complete` with the answer to store (`status`, `headers`, `body`) and its `ttl`.
pub(crate) fn resolution(body: &[u8]) -> Result<Resolution, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body must be JSON: {e}"))?;
    match v.get("outcome").and_then(Value::as_str) {
        Some("release") => Ok(Resolution::Release),
        Some("complete") => {
            let status = v
                .get("status")
                .and_then(Value::as_u64)
                .ok_or("`status` is required to complete")?;
            let status = u16::try_from(status)
                .ok()
                .filter(|s| (200..=599).contains(s))
                .ok_or("`status` must be 200-599")?;
            let mut response = StoredResponse::new(status, Bytes::new());
            if let Some(b) = v.get("body") {
                response.body = match b {
                    Value::String(s) => Bytes::from(s.clone()),
                    other => Bytes::from(other.to_string()),
                };
            }
            if let Some(headers) = v.get("headers") {
                let obj = headers
                    .as_object()
                    .ok_or("`headers` must be an object of strings")?;
                for (name, value) in obj {
                    let value = value.as_str().ok_or("`headers` values must be strings")?;
                    response = response
                        .with_header(name.to_ascii_lowercase(), Bytes::from(value.to_owned()));
                }
            }
            let ttl = match v.get("ttl").and_then(Value::as_str) {
                Some(t) => Dur::parse(t)?.0,
                None => Duration::from_secs(24 * 3600),
            };
            Ok(Resolution::Complete { response, ttl })
        }
        _ => Err("`outcome` must be \"complete\" or \"release\"".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(template: &str, base: Option<&str>) -> Webhook {
        Webhook {
            route: "charge".into(),
            namespace: "payments".into(),
            template: template.into(),
            base: base.map(|b| b.parse().expect("uri")),
            ttl: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            client: None,
        }
    }

    #[test]
    fn webhook_urls_encode_the_key_and_join_the_upstream() {
        let key = crate::reconcile::scoped_key("payments", None, "a&c=d/?#").expect("key");
        let path = hook(
            "/charges?idempotency_key={key}&ns={namespace}",
            Some("http://127.0.0.1:9000/api/"),
        );
        assert_eq!(
            path.url(&key).expect("url").to_string(),
            "http://127.0.0.1:9000/api/charges?idempotency_key=a%26c%3Dd%2F%3F%23&ns=payments"
        );
        let absolute = hook("http://status.local/k/{key}", None);
        assert_eq!(
            absolute.url(&key).expect("url").to_string(),
            "http://status.local/k/a%26c%3Dd%2F%3F%23"
        );
    }

    #[test]
    fn absolute_webhooks_get_a_client_for_their_origin() {
        let plain = origin_spec("http://status.local:8080/k/{key}?x=1").expect("http");
        assert_eq!(plain.uri.to_string(), "http://status.local:8080/");
        assert!(plain.tls.is_none());
        let tls = origin_spec("https://status.example/k/{key}").expect("https");
        assert!(tls.tls.is_some(), "https webhooks are verified with TLS");
        assert!(origin_spec("https://{principal}.example/k").is_err());
        assert!(origin_spec("ftp://status.example/k").is_err());
    }

    #[tokio::test]
    async fn a_webhook_without_a_client_cannot_say() {
        let key = crate::reconcile::scoped_key("payments", None, "k").expect("key");
        let answer = hook("http://status.local/k/{key}", None)
            .probe(&key, 1)
            .await;
        assert!(matches!(answer, ProbeAnswer::Unknown(_)), "{answer:?}");
    }

    #[test]
    fn resolutions_parse() {
        assert_eq!(
            resolution(br#"{"outcome":"release"}"#),
            Ok(Resolution::Release)
        );
        let r = resolution(br#"{"outcome":"complete","status":201,"headers":{"Content-Type":"application/json"},"body":"{}","ttl":"1h"}"#)
            .expect("valid");
        let Resolution::Complete { response, ttl } = r else {
            panic!("not complete")
        };
        assert_eq!((response.status, ttl), (201, Duration::from_secs(3600)));
        assert_eq!(response.headers[0].0, "content-type");
        assert!(resolution(br#"{"outcome":"complete"}"#).is_err());
        assert!(resolution(br#"{"outcome":"maybe"}"#).is_err());
        assert!(resolution(b"garbage").is_err());
    }
}

//! Reconciliation: finds unknown records, and processing records stuck past a threshold,
//! asks the upstream's status webhook what became of each, and settles it from the answer.
//!
//! A route opts in with `status_url` (a path on its upstream, or an absolute URL, with
//! `{key}`, e.g. `/charges?idempotency_key={key}`). The webhook answers `200` with JSON:
//!
//! | answer | the record |
//! |---|---|
//! | `{"outcome":"complete","status":201,"headers":{…},"body":…}` | completed with that response (replayed to retries) |
//! | `{"outcome":"release"}` | released: the effect did not happen, a retry runs |
//! | `{"outcome":"unknown"}`, another status, a timeout | left as it is, and reported |
//!
//! The body of `complete` is the admin API's resolve body (an optional `ttl` too). Every
//! settlement goes through [`Store::resolve`], which refuses records that are completed or
//! held under a live lease, and is recorded in the audit trail with the reconciler as actor.
//! `idem reconcile` runs one pass (`--dry-run` asks the webhooks but changes nothing);
//! `[reconcile] every = "1m"` runs passes inside `idem serve`.

use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::BodyExt;
use idem_core::audit;
use idem_core::{
    Key, ListFilter, Record, Resolution, ResolveOutcome, Scope, ScopedKey, StateKind, Store,
};
use serde_json::{Value, json};

use crate::config::{ReconcileSettings, Settings};
use crate::upstream::{Clients, HttpClient, RawUpstream, UpstreamSpec};
use idem_http::RequestBody;

/// Largest webhook answer read.
const MAX_ANSWER: usize = 4 << 20;

/// One namespace's status webhook.
#[derive(Debug, Clone)]
struct Hook {
    /// The route it comes from.
    route: String,
    namespace: String,
    template: String,
    /// The route's upstream, for a template that is a path.
    base: Option<Uri>,
    /// How long a completed record is kept, unless the webhook says otherwise.
    ttl: Duration,
    /// The client that reaches the webhook: the route's upstream client (its TLS trust, client
    /// certificate and HTTP version) for a path, or one made from an absolute URL's origin.
    client: Option<HttpClient>,
}

/// What the reconciler does (or, in a dry run, would do) with one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Completed with the webhook's response (its status).
    Complete(u16),
    /// Released: the effect did not happen.
    Release,
    /// Left as it is, with the reason.
    Leave(String),
}

/// One record of a pass and what became of it.
#[derive(Debug, Clone)]
pub struct Item {
    /// The record's key.
    pub key: ScopedKey,
    /// Its state when found.
    pub state: StateKind,
    /// Its fence.
    pub fence: u64,
    /// What was decided.
    pub action: Action,
    /// Whether the decision was applied (false in a dry run, and for records left alone).
    pub applied: bool,
}

impl Item {
    /// The item as one JSON object.
    pub fn json(&self) -> Value {
        let (action, status, detail) = match &self.action {
            Action::Complete(s) => ("complete", Some(*s), None),
            Action::Release => ("release", None, None),
            Action::Leave(why) => ("leave", None, Some(why.clone())),
        };
        json!({
            "namespace": self.key.scope.namespace(),
            "principal": self.key.scope.principal(),
            "key": self.key.key.as_str(),
            "state": self.state.as_str(),
            "fence": self.fence,
            "action": action,
            "status": status,
            "detail": detail,
            "applied": self.applied,
        })
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match (&self.action, self.applied) {
            (Action::Complete(s), true) => format!("completed ({s})"),
            (Action::Complete(s), false) => format!("would complete ({s})"),
            (Action::Release, true) => "released".to_owned(),
            (Action::Release, false) => "would release".to_owned(),
            (Action::Leave(why), _) => format!("left: {why}"),
        };
        write!(
            f,
            "{:<11} {:<24} {:<36} fence {:<16} {action}",
            self.state.as_str(),
            self.key.scope.namespace(),
            self.key.key.as_str(),
            self.fence
        )?;
        if let Some(p) = self.key.scope.principal() {
            write!(f, " (principal {p})")?;
        }
        Ok(())
    }
}

/// Checks records against the routes' status webhooks and settles them.
pub struct Reconciler<S> {
    store: S,
    hooks: Vec<Hook>,
    settings: ReconcileSettings,
    actor: String,
}

impl<S> fmt::Debug for Reconciler<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("hooks", &self.hooks)
            .field("settings", &self.settings)
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Reconciler<S> {
    /// A reconciler over `store` for the routes of `settings` that have a `status_url`,
    /// recording its settlements with `actor`.
    ///
    /// # Errors
    /// Two routes of one namespace name different webhooks.
    pub fn new(settings: &Settings, store: S, actor: impl Into<String>) -> anyhow::Result<Self> {
        let mut hooks: Vec<Hook> = Vec::new();
        let mut clients = Clients::new(settings.reconcile.timeout, 1);
        for route in &settings.routes {
            let Some(template) = &route.policy.status_url else {
                continue;
            };
            let upstream = route.upstream.as_ref().or(settings.upstream.as_ref());
            let spec =
                if template.starts_with('/') {
                    upstream.cloned()
                } else {
                    Some(origin_spec(template).with_context(|| {
                        format!("route `{}`: status_url `{template}`", route.name)
                    })?)
                };
            let hook = Hook {
                route: route.name.clone(),
                namespace: route.policy.namespace.clone(),
                template: template.clone(),
                base: upstream.map(|u| u.uri.clone()),
                ttl: route.policy.engine.record_ttl(),
                client: spec.as_ref().map(|s| clients.get(s)),
            };
            match hooks.iter().find(|h| h.namespace == hook.namespace) {
                Some(other) if other.template != hook.template || other.base != hook.base => bail!(
                    "routes `{}` and `{}` share namespace `{}` but name different status webhooks",
                    other.route,
                    hook.route,
                    hook.namespace
                ),
                Some(_) => {}
                None => hooks.push(hook),
            }
        }
        Ok(Self {
            store,
            hooks,
            settings: settings.reconcile,
            actor: actor.into(),
        })
    }

    /// The namespaces this reconciler checks.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.hooks.iter().map(|h| h.namespace.as_str())
    }

    /// One pass over every namespace with a webhook: unknown records, then processing
    /// records older than `after`. With `apply` false nothing is changed.
    ///
    /// # Errors
    /// The store could not list records. Failures of single webhooks or resolves are
    /// reported on their items instead.
    pub async fn pass(&self, apply: bool) -> anyhow::Result<Vec<Item>> {
        let mut items = Vec::new();
        for hook in &self.hooks {
            for (state, older_than) in [
                (StateKind::Unknown, None),
                (StateKind::Processing, Some(self.settings.after)),
            ] {
                let filter = ListFilter {
                    namespace: Some(hook.namespace.clone()),
                    state: Some(state),
                    older_than,
                    limit: self.settings.limit,
                    ..ListFilter::default()
                };
                let records = self.store.list(&filter).await.map_err(|e| {
                    anyhow::anyhow!(
                        "listing {} records of `{}`: {e}",
                        state.as_str(),
                        hook.namespace
                    )
                })?;
                for record in records {
                    items.push(self.settle(hook, &record, apply).await);
                }
            }
        }
        Ok(items)
    }

    async fn settle(&self, hook: &Hook, record: &Record, apply: bool) -> Item {
        let state = record.state.kind();
        let mut item = Item {
            key: record.key.clone(),
            state,
            fence: record.fence,
            action: Action::Leave(String::new()),
            applied: false,
        };
        let resolution = match self.ask(hook, &record.key).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                item.action = Action::Leave("the upstream does not know yet".into());
                return item;
            }
            Err(why) => {
                item.action = Action::Leave(why);
                return item;
            }
        };
        item.action = match &resolution {
            Resolution::Complete { response, .. } => Action::Complete(response.status),
            _ => Action::Release,
        };
        if !apply {
            return item;
        }
        let resolved = audit::acting_as(self.actor.clone(), || {
            self.store.resolve(&record.key, &resolution)
        })
        .await;
        match resolved {
            Ok(ResolveOutcome::Resolved) => item.applied = true,
            Ok(ResolveOutcome::NotFound) => {
                item.action = Action::Leave("the record went away meanwhile".into());
            }
            Ok(ResolveOutcome::NotResolvable { state }) => {
                item.action = Action::Leave(match state {
                    StateKind::Processing => "still held under a live lease".into(),
                    other => format!("now {}", other.as_str()),
                });
            }
            Ok(_) => item.action = Action::Leave("not resolvable".into()),
            Err(e) => item.action = Action::Leave(format!("store failed: {e}")),
        }
        item
    }

    /// What the webhook says about `key`: a resolution, `None` for "unknown", or why it
    /// could not say.
    async fn ask(&self, hook: &Hook, key: &ScopedKey) -> Result<Option<Resolution>, String> {
        let url = webhook_url(hook, key)?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(url.clone())
            .header(http::header::ACCEPT, "application/json")
            .body(RequestBody::from(Bytes::new()))
            .map_err(|e| format!("webhook request: {e}"))?;
        let client = hook
            .client
            .as_ref()
            .ok_or_else(|| format!("route `{}` has no client for its webhook", hook.route))?;
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
        let (status, body) = tokio::time::timeout(self.settings.timeout, call)
            .await
            .map_err(|_| {
                format!(
                    "webhook {url}: no answer within {:?}",
                    self.settings.timeout
                )
            })??;
        if status != StatusCode::OK {
            return Err(format!("webhook {url} answered {status}"));
        }
        let answer: Value =
            serde_json::from_slice(&body).map_err(|e| format!("webhook {url}: not JSON: {e}"))?;
        if answer.get("outcome").and_then(Value::as_str) == Some("unknown") {
            return Ok(None);
        }
        let resolution =
            crate::admin::resolution(&body).map_err(|e| format!("webhook {url}: {e}"))?;
        Ok(Some(match resolution {
            // The route's record TTL unless the webhook named one.
            Resolution::Complete { response, .. } if answer.get("ttl").is_none() => {
                Resolution::Complete {
                    response,
                    ttl: hook.ttl,
                }
            }
            other => other,
        }))
    }

    /// Runs a pass every `every` until the task is aborted, logging what it settles.
    pub async fn run_every(self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.pass(true).await {
                Ok(items) => {
                    for item in items {
                        if item.applied {
                            tracing::info!(record = %item, "reconciled");
                        } else {
                            tracing::warn!(record = %item, "not reconciled");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = format!("{e:#}"), "reconcile pass failed"),
            }
        }
    }
}

/// The webhook URL for `key`: the template with its placeholders percent-encoded, on the
/// route's upstream when it is a path.
fn webhook_url(hook: &Hook, key: &ScopedKey) -> Result<Uri, String> {
    let filled = hook
        .template
        .replace("{key}", &encode(key.key.as_str()))
        .replace("{namespace}", &encode(key.scope.namespace()))
        .replace("{principal}", &encode(key.scope.principal().unwrap_or("")));
    let full = if filled.starts_with('/') {
        let base = hook.base.as_ref().ok_or_else(|| {
            format!(
                "route `{}` has no upstream for its status_url path",
                hook.route
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

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses a record key given on the command line or in a test: `namespace`, optional
/// principal, key.
pub fn scoped_key(
    namespace: &str,
    principal: Option<&str>,
    key: &str,
) -> anyhow::Result<ScopedKey> {
    let scope = Scope::new(namespace).map_err(|e| anyhow::anyhow!("{e}"))?;
    let scope = match principal {
        Some(p) => scope.with_principal(p),
        None => scope,
    };
    Ok(ScopedKey::new(
        scope,
        Key::new(key).map_err(|e| anyhow::anyhow!("{e}"))?,
    ))
}

/// `idem reconcile`: opens the configured store, runs one pass and prints what it did (or,
/// with `dry_run`, would do): a line per record, or one JSON object per line with `json`.
/// Answers the exit code: 0 when nothing is left unsettled, 3 when some record was left.
///
/// # Errors
/// The store cannot be opened or listed, or the webhooks are ambiguous.
pub async fn run_once(settings: &Settings, dry_run: bool, json: bool) -> anyhow::Result<u8> {
    if matches!(settings.store, crate::store::StoreSpec::Memory { .. }) {
        bail!(
            "the memory store lives inside `idem serve`, out of reach of this process: use `[reconcile] every` there"
        );
    }
    let store = crate::store::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
        None,
    )
    .await?;
    let reconciler = Reconciler::new(settings, store, "reconcile:cli")?;
    if reconciler.namespaces().next().is_none() {
        bail!("no route has a `status_url`: nothing to reconcile");
    }
    let items = reconciler.pass(!dry_run).await?;
    let left = items
        .iter()
        .filter(|i| matches!(i.action, Action::Leave(_)))
        .count();
    if json {
        for item in &items {
            println!("{}", item.json());
        }
    } else {
        if dry_run {
            println!("plan (dry run: nothing is changed)");
        }
        for item in &items {
            println!("{item}");
        }
        let settled = items.len() - left;
        let verb = if dry_run { "would settle" } else { "settled" };
        println!(
            "{} records checked, {verb} {settled}, left {left}",
            items.len()
        );
    }
    Ok(if left > 0 { 3 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_urls_encode_the_key_and_join_the_upstream() {
        let hook = Hook {
            route: "charge".into(),
            namespace: "payments".into(),
            template: "/charges?idempotency_key={key}&ns={namespace}".into(),
            base: Some("http://127.0.0.1:9000/api/".parse().expect("uri")),
            ttl: Duration::from_secs(60),
            client: None,
        };
        let key = scoped_key("payments", None, "a&c=d/?#").expect("key");
        assert_eq!(
            webhook_url(&hook, &key).expect("url").to_string(),
            "http://127.0.0.1:9000/api/charges?idempotency_key=a%26c%3Dd%2F%3F%23&ns=payments"
        );
        let absolute = Hook {
            template: "http://status.local/k/{key}".into(),
            base: None,
            ..hook
        };
        assert_eq!(
            webhook_url(&absolute, &key).expect("url").to_string(),
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
}

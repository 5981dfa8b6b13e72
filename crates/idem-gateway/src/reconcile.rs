//! Reconciliation: finds unknown records, and processing records stuck past a threshold,
//! asks the upstream's status webhook what became of each, and settles it from the answer.
//!
//! A route opts in with `status_url`, in the format of [`crate::webhook`]. Every settlement
//! goes through [`Store::resolve`] naming the fence of the record it asked about, so an answer
//! about one attempt never settles a later one; the store also refuses records that are
//! completed or held under a live lease. Each is recorded in the audit trail with the
//! reconciler as actor. A claim that finds a key unknown asks the same webhook first (see
//! [`crate::webhook`]); the reconciler settles what is left, such as keys nobody retried.
//! `idem reconcile` runs one pass (`--dry-run` asks the webhooks but changes nothing);
//! `[reconcile] every = "1m"` runs passes inside `idem serve`.

use std::fmt;
use std::time::Duration;

use anyhow::bail;
use idem_core::audit;
use idem_core::{
    Key, ListFilter, Record, Resolution, ResolveOutcome, Scope, ScopedKey, StateKind, Store,
};
use serde_json::{Value, json};

use crate::cli::visible::visible;
use crate::config::{ReconcileSettings, Settings};
use crate::upstream::Clients;
use crate::webhook::Webhook;

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

/// One line for a terminal or a log: stored strings (a principal is a JWT claim, any text)
/// and a webhook's words are shown through [`visible`], so none can steer the terminal;
/// [`Item::json`] is the exact form.
impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match (&self.action, self.applied) {
            (Action::Complete(s), true) => format!("completed ({s})"),
            (Action::Complete(s), false) => format!("would complete ({s})"),
            (Action::Release, true) => "released".to_owned(),
            (Action::Release, false) => "would release".to_owned(),
            (Action::Leave(why), _) => format!("left: {}", visible(why)),
        };
        write!(
            f,
            "{:<11} {:<24} {:<36} fence {:<16} {action}",
            self.state.as_str(),
            visible(self.key.scope.namespace()),
            visible(self.key.key.as_str()),
            self.fence
        )?;
        if let Some(p) = self.key.scope.principal() {
            write!(f, " (principal {})", visible(p))?;
        }
        Ok(())
    }
}

/// Checks records against the routes' status webhooks and settles them.
pub struct Reconciler<S> {
    store: S,
    hooks: Vec<Webhook>,
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
        let mut hooks: Vec<Webhook> = Vec::new();
        let mut clients = Clients::new(settings.reconcile.timeout, 1);
        for route in &settings.routes {
            let Some(hook) =
                Webhook::of_route(settings, route, &mut clients, settings.reconcile.timeout)?
            else {
                continue;
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

    async fn settle(&self, hook: &Webhook, record: &Record, apply: bool) -> Item {
        let state = record.state.kind();
        let mut item = Item {
            key: record.key.clone(),
            state,
            fence: record.fence,
            action: Action::Leave(String::new()),
            applied: false,
        };
        let resolution = match hook.ask(&record.key).await {
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
        // Named by its fence: the answer was about this attempt, not a later one.
        let resolved = audit::acting_as(self.actor.clone(), || {
            self.store
                .resolve(&record.key, &resolution, Some(record.fence))
        })
        .await;
        match resolved {
            Ok(ResolveOutcome::Resolved) => item.applied = true,
            Ok(ResolveOutcome::NotFound) => {
                item.action = Action::Leave("the record went away meanwhile".into());
            }
            Ok(ResolveOutcome::Fenced { fence }) => {
                item.action = Action::Leave(format!(
                    "claimed again meanwhile (fence {fence}): the answer was about an earlier attempt"
                ));
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

    // Regression: `idem reconcile` printed a stored principal (a JWT claim is any string) and
    // a webhook's words raw, so `ESC ] 0 ; … BEL`, a CR or a bidi override in them could
    // retitle the operator's terminal or disguise the line, as `idem admin` once did.
    #[test]
    fn lines_show_terminal_controls_instead_of_obeying_them() {
        let item = Item {
            key: scoped_key("payments", Some("alice\u{1b}]0;pwned\u{7}"), "order-1").expect("key"),
            state: StateKind::Unknown,
            fence: 7,
            action: Action::Leave("webhook answered\r\u{202e}settled".into()),
            applied: false,
        };
        let line = item.to_string();
        assert!(
            !line.chars().any(char::is_control) && !line.contains('\u{202e}'),
            "{line:?}"
        );
        assert!(
            line.ends_with(
                "left: webhook answered\\r\\u{202e}settled (principal alice\\x1b]0;pwned\\x07)"
            ),
            "{line:?}"
        );
        // `--json` stays the exact form.
        assert_eq!(item.json()["principal"], "alice\u{1b}]0;pwned\u{7}");
    }
}

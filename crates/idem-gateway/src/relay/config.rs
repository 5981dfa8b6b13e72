//! `[[relay]]` in the configuration file: what each relay consumes and where it posts.
//!
//! The configuration hands the relay its `[[relay]]` tables as they were written
//! ([`RawConfig::relay`](crate::config::RawConfig::relay)); they are read and checked here,
//! against the compiled routes.

use std::fmt;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use http::Uri;
use idem_core::key_source::KeySources;
use serde::{Deserialize, Serialize};

use crate::config::{Dur, RawTable, Route, RoutePolicy};

/// One relay as written in the file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRelay {
    /// A name for logs and metrics; it also scopes the relay's keys.
    pub(super) name: Option<String>,
    /// The broker: `amqp://user:pass@host:5672/%2f` (RabbitMQ) or `nats://host:4222`
    /// (JetStream).
    pub(super) broker: Option<String>,
    /// RabbitMQ: the queue to consume.
    pub(super) queue: Option<String>,
    /// JetStream: the stream.
    pub(super) stream: Option<String>,
    /// JetStream: the durable pull consumer (created with explicit acks if absent).
    pub(super) consumer: Option<String>,
    /// RabbitMQ: the routing key dead letters go to through the default exchange (default
    /// `<queue>.dead`); JetStream: the subject dead letters are published to (required).
    pub(super) dead_letter: Option<String>,
    /// The URL each message is POSTed to.
    pub(super) post: Option<String>,
    /// The route whose policy applies (namespace, failure policy, timeouts, record TTL);
    /// default: the only route.
    pub(super) route: Option<String>,
    /// Key sources tried in order, such as `["header:order-id", "{json.order.id}:pay"]`
    /// (default: the message id).
    pub(super) key: Option<Vec<String>>,
    /// Messages handed over before they are acknowledged (default 16).
    pub(super) prefetch: Option<u16>,
    /// Messages posted at once (default 16).
    pub(super) concurrency: Option<usize>,
    /// Attempts before a message is dead-lettered (default 5).
    pub(super) max_attempts: Option<u32>,
    /// Delay before the second attempt, doubled per attempt (default `200ms`).
    pub(super) backoff: Option<Dur>,
}

/// Where a relay consumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A RabbitMQ queue.
    Rabbit {
        /// `amqp://…`.
        url: String,
        /// The queue.
        queue: String,
        /// Dead letters' routing key (default exchange).
        dead_letter: String,
    },
    /// A JetStream durable pull consumer.
    Nats {
        /// `nats://…`.
        url: String,
        /// The stream.
        stream: String,
        /// The durable consumer.
        consumer: String,
        /// Dead letters' subject.
        dead_letter: String,
    },
}

/// One checked relay.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Its name.
    pub name: String,
    /// What it consumes.
    pub source: Source,
    /// Where it posts.
    pub post: Uri,
    /// The route it follows.
    pub route: String,
    /// That route's policy.
    pub policy: Arc<RoutePolicy>,
    /// Key sources; `None`: the message id.
    pub key: Option<KeySources>,
    /// Consumer settings.
    pub consumer: idem_mq::ConsumerConfig,
}

/// Reads and checks every `[[relay]]` table against the compiled routes.
///
/// # Errors
/// The first relay that has an unknown field or a wrongly typed value, is incomplete or
/// names a missing route.
pub fn compile(raw: &[RawTable], routes: &[Route]) -> anyhow::Result<Vec<RelaySettings>> {
    raw.iter()
        .enumerate()
        .map(|(i, table)| {
            read(table).and_then(|r| one(&r, routes)).with_context(|| {
                format!(
                    "relay #{} ({})",
                    i + 1,
                    table
                        .get("name")
                        .and_then(figment::value::Value::as_str)
                        .unwrap_or("unnamed")
                )
            })
        })
        .collect()
}

/// The relays among `relays` that follow `route`, as a risk names them after the route:
/// ` (and relay orders, refunds)`, or nothing.
pub fn following(relays: &[RelaySettings], route: &str) -> String {
    let names: Vec<&str> = relays
        .iter()
        .filter(|r| r.route == route)
        .map(|r| r.name.as_str())
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" (and relay {})", names.join(", "))
    }
}

/// One table as a [`RawRelay`]: unknown fields and wrongly typed values are refused, naming
/// the field (and for unknown ones, the fields there are).
fn read(table: &RawTable) -> anyhow::Result<RawRelay> {
    let figment = figment::Figment::from(figment::providers::Serialized::globals(table));
    figment.extract::<RawRelay>().map_err(|e| {
        // The path inside the relay's table (the provider, not the file, is the source).
        let field = e.path.join(".");
        anyhow::anyhow!("invalid configuration: {} for key `{field}`", e.kind)
    })
}

/// One relay, checked field by field: its name, source, target, route, keys and consumer.
fn one(r: &RawRelay, routes: &[Route]) -> anyhow::Result<RelaySettings> {
    let name = r.name.clone().context("`name` is required")?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        bail!("`name` must be letters, digits, `-`, `_` or `.`");
    }
    let source = source(r)?;
    let post = post(r)?;
    let route = route(r, routes)?;
    let key = match &r.key {
        None => None,
        Some(list) => {
            let texts: Vec<&str> = list.iter().map(String::as_str).collect();
            Some(KeySources::parse(&texts).context("`key`")?)
        }
    };
    let consumer = consumer(r, key.as_ref());
    Ok(RelaySettings {
        name,
        source,
        post,
        route: route.name.clone(),
        policy: Arc::clone(&route.policy),
        key,
        consumer,
    })
}

/// The broker and what to consume there: a RabbitMQ queue or a JetStream consumer.
fn source(r: &RawRelay) -> anyhow::Result<Source> {
    let broker = r.broker.clone().context("`broker` is required")?;
    Ok(
        if broker.starts_with("amqp://") || broker.starts_with("amqps://") {
            let queue = r
                .queue
                .clone()
                .context("`queue` is required for RabbitMQ")?;
            Source::Rabbit {
                url: broker,
                dead_letter: r
                    .dead_letter
                    .clone()
                    .unwrap_or_else(|| format!("{queue}.dead")),
                queue,
            }
        } else if broker.starts_with("nats://") {
            Source::Nats {
                url: broker,
                stream: r
                    .stream
                    .clone()
                    .context("`stream` is required for JetStream")?,
                consumer: r
                    .consumer
                    .clone()
                    .context("`consumer` is required for JetStream")?,
                dead_letter: r
                    .dead_letter
                    .clone()
                    .context("`dead_letter` (a subject) is required for JetStream")?,
            }
        } else {
            bail!("`broker` must be an amqp:// or nats:// URL");
        },
    )
}

/// The `http://` URL each message is POSTed to.
fn post(r: &RawRelay) -> anyhow::Result<Uri> {
    let post: Uri = r
        .post
        .as_deref()
        .context("`post` is required")?
        .parse()
        .context("`post` is not a URL")?;
    if post.scheme_str() != Some("http") || post.authority().is_none() {
        bail!("`post` must be an http:// URL");
    }
    Ok(post)
}

/// The protected route whose policy the relay follows: the named one, or the only one.
fn route<'a>(r: &RawRelay, routes: &'a [Route]) -> anyhow::Result<&'a Route> {
    let route = match (&r.route, routes) {
        (Some(n), _) => routes
            .iter()
            .find(|x| &x.name == n)
            .with_context(|| format!("no route is named `{n}`"))?,
        (None, [only]) => only,
        (None, _) => bail!("name the route whose policy applies: `route = \"…\"`"),
    };
    if !route.policy.idempotency {
        bail!(
            "route `{}` has idempotency off; a relay needs a protected route",
            route.name
        );
    }
    Ok(route)
}

/// The consumer's settings: idem-mq's defaults, overridden by the ones set (each at least 1).
fn consumer(r: &RawRelay, key: Option<&KeySources>) -> idem_mq::ConsumerConfig {
    let mut consumer = idem_mq::ConsumerConfig::default();
    if let Some(p) = r.prefetch {
        consumer.prefetch = p.max(1);
    }
    if let Some(c) = r.concurrency {
        consumer.concurrency = c.max(1);
    }
    if let Some(a) = r.max_attempts {
        consumer.max_attempts = a.max(1);
    }
    if let Some(b) = r.backoff {
        consumer.backoff = b.0;
    }
    consumer.key = key.cloned();
    consumer
}

impl fmt::Display for RelaySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Rabbit {
                queue, dead_letter, ..
            } => writeln!(
                f,
                "  {}: RabbitMQ queue `{queue}` -> POST {} (dead letters: `{dead_letter}`)",
                self.name, self.post
            )?,
            Source::Nats {
                stream,
                consumer,
                dead_letter,
                ..
            } => writeln!(
                f,
                "  {}: JetStream `{stream}`/`{consumer}` -> POST {} (dead letters: `{dead_letter}`)",
                self.name, self.post
            )?,
        }
        let key = match &self.key {
            Some(k) => k.to_string(),
            None => "the message id".to_owned(),
        };
        writeln!(
            f,
            "    key: {key}; route `{}` (namespace {}, upstream failures: {}); prefetch {}, concurrency {}, {} attempts",
            self.route,
            self.policy.namespace,
            match self.policy.upstream_failure {
                crate::config::UpstreamFailure::Hold => "hold",
                crate::config::UpstreamFailure::Retry => "retry",
            },
            self.consumer.prefetch,
            self.consumer.concurrency,
            self.consumer.max_attempts
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }\n\
                        upstream_failure = \"retry\"\n\
                        [[routes]]\nname = \"orders\"\npath = \"/orders\"\n\
                        [[routes]]\nname = \"refunds\"\npath = \"/refunds\"\n";

    fn relays(tables: &str) -> anyhow::Result<Vec<RelaySettings>> {
        let raw = crate::config::from_toml(&format!("{BASE}{tables}"))?;
        let settings = crate::config::compile(&raw)?;
        compile(raw.relay.as_deref().unwrap_or_default(), &settings.routes)
    }

    #[test]
    fn relays_are_read_from_their_tables_and_follow_their_route() {
        let r = relays(
            "[[relay]]\nname = \"o\"\nbroker = \"amqp://h\"\nqueue = \"q\"\npost = \"http://h/o\"\n\
             route = \"orders\"\nprefetch = 0\nbackoff = \"1s\"\nkey = [\"header:order-id\"]\n\
             [[relay]]\nname = \"n\"\nbroker = \"nats://h\"\nstream = \"s\"\nconsumer = \"c\"\n\
             dead_letter = \"dl\"\npost = \"http://h/n\"\nroute = \"orders\"\n",
        )
        .expect("valid");
        assert_eq!(
            r[0].source,
            Source::Rabbit {
                url: "amqp://h".into(),
                queue: "q".into(),
                dead_letter: "q.dead".into()
            }
        );
        assert_eq!(r[0].consumer.prefetch, 1);
        assert_eq!(r[0].consumer.backoff, std::time::Duration::from_secs(1));
        assert!(r[0].key.is_some() && r[0].consumer.key.is_some());
        assert!(matches!(r[1].source, Source::Nats { .. }));
        assert_eq!(following(&r, "orders"), " (and relay o, n)");
        assert_eq!(following(&r, "refunds"), "");
    }

    #[test]
    fn a_wrong_table_is_refused_naming_the_relay_and_the_field() {
        for (table, words) in [
            (
                "name = \"o\"\nbogus = 1",
                &["relay #1 (o)", "bogus", "`queue`"][..],
            ),
            (
                "name = \"o\"\nprefetch = \"x\"",
                &["relay #1 (o)", "prefetch"],
            ),
            (
                "name = \"o\"\nbroker = \"amqp://h\"\npost = \"http://h\"",
                &["`queue` is required"],
            ),
            (
                "name = \"o\"\nbroker = \"amqp://h\"\nqueue = \"q\"\npost = \"http://h\"",
                &["name the route"],
            ),
            (
                "broker = \"amqp://h\"",
                &["relay #1 (unnamed)", "`name` is required"],
            ),
        ] {
            let e = relays(&format!("[[relay]]\n{table}\n")).expect_err(table);
            let e = format!("{e:#}");
            for w in words {
                assert!(e.contains(w), "{table}: {e}");
            }
        }
    }
}

//! `idem relay`: the language-neutral consumer. Each `[[relay]]` of the configuration consumes
//! a RabbitMQ queue or a JetStream consumer and POSTs every message to its upstream with
//! `Idempotency-Key` = the message's key, through the same engine and store as `idem serve`:
//!
//! - a 2xx completes the key and acknowledges the message; a redelivery of a completed key is
//!   acknowledged without calling the upstream;
//! - 408, 409, 429 and 5xx (but 502/504), and connection failures, release the key and
//!   redeliver with backoff; a timeout, a reset after sending, 502 and 504 follow the route's
//!   `upstream_failure` (`hold`: the key becomes unknown and the message is dead-lettered;
//!   `retry`: released and redelivered);
//! - any other 4xx dead-letters the message (the key is left unknown for an operator);
//! - after `max_attempts` failed attempts the message is dead-lettered.
//!
//! The relay's keys live in the route's namespace under their own principal (the relay's name
//! through `Scope::with_credential`), so they never meet an HTTP caller's keys. Every message
//! is counted in `idem_requests_total{outcome}` and `idem_relay_messages_total{relay,
//! outcome, disposition}` and logged as one `message` line. `docs/consumers.md` has the
//! configuration and the failure table.

mod config;
mod work;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use idem_core::{BoxStore, Engine, Key, Scope};
use idem_mq::{Delivered, Disposition, Message, Observer, Processor};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use work::Post;

pub use config::{RelaySettings, Source, compile, following};

use crate::config::Settings;
use crate::metrics::RequestMetrics;
use crate::{proxy, store};

/// The tokens `--metrics-listen` takes, the gateway's own for its `/metrics`: the admin
/// token and the read-only `admin.metrics_token`.
///
/// # Errors
/// The configuration has no admin token: the metrics would be open to anyone who can reach
/// the address.
pub fn metrics_tokens(settings: &Settings) -> anyhow::Result<(String, Option<String>)> {
    match &settings.admin {
        Some(a) => Ok((a.token.clone(), a.metrics_token.clone())),
        None => anyhow::bail!(
            "`--metrics-listen` needs a token, as the gateway's `/metrics` does: set `admin.token` \
             (with `admin.listen`, which the relay does not serve) and, for a scraper, \
             `admin.metrics_token`"
        ),
    }
}

/// Runs every relay in `relays` (compiled by [`compile`] against `settings`' routes) until
/// SIGINT or SIGTERM, then lets each finish the messages in progress. Serves `/metrics` on
/// `metrics_listen` when given, to the holders of [`metrics_tokens`].
///
/// # Errors
/// No relay is configured, `metrics_listen` is given without a token, the store cannot be
/// opened, or a broker cannot be reached.
pub async fn run(
    settings: Settings,
    relays: Vec<RelaySettings>,
    metrics: Option<PrometheusHandle>,
    metrics_listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    if relays.is_empty() {
        anyhow::bail!("no [[relay]] is configured");
    }
    let tokens = metrics_listen
        .map(|_| metrics_tokens(&settings))
        .transpose()?;
    let backend = store::open(
        &settings.store,
        &settings.store_options,
        settings.store_timeout,
        settings.store_cache,
    )
    .await
    .with_context(|| format!("cannot open store {}", settings.store))?;
    if let (Some(handle), Some(addr), Some((admin, read))) = (metrics, metrics_listen, tokens) {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (metrics)"))?;
        println!("relay metrics on http://{}", listener.local_addr()?);
        let app = crate::health::metrics_only(handle, admin, read);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
    let (stop_tx, stop) = watch::channel(false);
    let mut clients = crate::upstream::Clients::new(
        settings.upstream_connect_timeout,
        settings.upstream_pool_max_idle,
    );
    // Relayed messages count in `idem_requests_total` with the relay's name as the route.
    let outcomes = RequestMetrics::new(relays.iter().map(|r| r.name.as_str()));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, relay) in relays.iter().enumerate() {
        let client = clients.get(&crate::upstream::UpstreamSpec::plain(relay.post.clone()));
        let probe = relay_webhook(&settings, relay, &mut clients)?;
        let running = start(
            relay,
            (backend.clone(), probe),
            client,
            (outcomes.clone(), index),
            stop.clone(),
        )
        .await
        .with_context(|| format!("relay `{}`", relay.name))?;
        tasks.spawn(running);
    }
    println!("idem relay running ({} relays)", relays.len());
    tracing::info!(relays = relays.len(), "relay running");
    let failed = tokio::select! {
        () = shutdown_signal() => None,
        done = tasks.join_next() => Some(done),
    };
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        if let Ok(Err(e)) = done {
            tracing::error!(error = format!("{e:#}"), "relay stopped");
        }
    }
    match failed {
        Some(Some(Ok(Err(e)))) => Err(e),
        Some(_) => anyhow::bail!("a relay stopped"),
        None => Ok(()),
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn observer(name: &str, (outcomes, index): (RequestMetrics, usize)) -> Observer {
    let name: Arc<str> = Arc::from(name);
    Arc::new(move |message: &Message, d: &Delivered, took: Duration| {
        outcomes.record(index, d.outcome, took);
        let disposition = match &d.disposition {
            Disposition::Ack => "ack",
            Disposition::Redeliver { .. } => "redeliver",
            Disposition::DeadLetter(_) => "dead_letter",
            _ => "other",
        };
        metrics::counter!(
            "idem_relay_messages_total",
            "relay" => name.to_string(),
            "outcome" => d.outcome.as_str(),
            "disposition" => disposition
        )
        .increment(1);
        tracing::info!(
            relay = &*name,
            key = d.key.as_ref().map_or("-", Key::as_str),
            attempt = message.attempt(),
            outcome = d.outcome.as_str(),
            detail = %d.outcome,
            disposition,
            micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            "message"
        );
    })
}

type Running = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// The status webhook of the route a relay follows, as its engine's probe: a message whose
/// key is unknown is settled from it before it is dead-lettered.
fn relay_webhook(
    settings: &Settings,
    relay: &RelaySettings,
    clients: &mut crate::upstream::Clients,
) -> anyhow::Result<Option<Arc<dyn idem_core::Probe>>> {
    let Some(route) = settings.routes.iter().find(|r| r.name == relay.route) else {
        return Ok(None);
    };
    let timeout = relay.policy.engine.probe_timeout();
    Ok(
        crate::webhook::Webhook::of_route(settings, route, clients, timeout)?
            .map(|hook| Arc::new(hook) as Arc<dyn idem_core::Probe>),
    )
}

/// What every delivery of `relay` runs through: the engine on the relay's store and policy,
/// the relay's internal scope, and the POST to its route.
fn worker(
    relay: &RelaySettings,
    store: BoxStore,
    probe: Option<Arc<dyn idem_core::Probe>>,
    client: proxy::HttpClient,
) -> anyhow::Result<(Engine<BoxStore>, Scope, Post)> {
    let policy = &relay.policy;
    let engine = Engine::new(store, policy.engine.clone());
    let engine = match probe {
        Some(probe) => engine.with_probe(probe),
        None => engine,
    };
    let scope = Scope::new(policy.namespace.clone())
        .context("namespace")?
        // An internal principal: no caller's credential or claim reaches the relay's keys.
        .with_internal("relay", &relay.name);
    // The route's upstream timeout, as `serve` uses it: the engine's handler timeout is that
    // plus a backstop, so the relay's timeout fires first and the route's failure policy
    // decides what an upstream that took too long leaves behind.
    let timeout = policy
        .engine
        .handler_timeout()
        .saturating_sub(crate::shared::HANDLER_BACKSTOP);
    let work = Post {
        client,
        target: relay.post.clone(),
        timeout,
        failure: policy.upstream_failure,
        max_stored: policy.max_stored_response,
        fence_header: policy.fence_header.clone(),
    };
    Ok((engine, scope, work))
}

async fn start(
    relay: &RelaySettings,
    (store, probe): (BoxStore, Option<Arc<dyn idem_core::Probe>>),
    client: proxy::HttpClient,
    outcomes: (RequestMetrics, usize),
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    let (engine, scope, work) = worker(relay, store, probe, client)?;
    let shutdown = async move {
        let mut stop = stop;
        let _ = stop.wait_for(|s| *s).await;
    };
    match &relay.source {
        Source::Rabbit {
            url,
            queue,
            dead_letter,
        } => {
            let keys = relay
                .key
                .clone()
                .unwrap_or_else(idem_mq::rabbitmq::default_keys);
            let processor = Processor::new(engine, scope, keys, relay.consumer.clone(), work)
                .observe(observer(&relay.name, outcomes.clone()));
            let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
                .await
                .context("cannot connect to RabbitMQ")?;
            let consumer = idem_mq::rabbitmq::RabbitConsumer::new(processor, queue.as_str())
                .dead_letter(idem_mq::rabbitmq::DeadLetterTarget {
                    exchange: String::new(),
                    routing_key: dead_letter.clone(),
                });
            Ok(Box::pin(async move {
                consumer
                    .run(&conn, shutdown)
                    .await
                    .context("RabbitMQ consumer failed")
            }))
        }
        Source::Nats {
            url,
            stream,
            consumer,
            dead_letter,
        } => {
            let keys = relay
                .key
                .clone()
                .unwrap_or_else(idem_mq::nats::default_keys);
            let processor = Processor::new(engine, scope, keys, relay.consumer.clone(), work)
                .observe(observer(&relay.name, outcomes.clone()));
            let client = async_nats::connect(url.as_str())
                .await
                .context("cannot connect to NATS")?;
            let js = async_nats::jetstream::new(client);
            let s = js
                .get_stream(stream)
                .await
                .with_context(|| format!("no stream `{stream}`"))?;
            let pull: async_nats::jetstream::consumer::PullConsumer = s
                .get_or_create_consumer(
                    consumer,
                    async_nats::jetstream::consumer::pull::Config {
                        durable_name: Some(consumer.clone()),
                        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                        max_deliver: -1,
                        max_ack_pending: i64::from(relay.consumer.prefetch),
                        ..Default::default()
                    },
                )
                .await
                .with_context(|| format!("cannot open consumer `{consumer}`"))?;
            let nc = idem_mq::nats::NatsConsumer::new(processor, dead_letter.clone());
            Ok(Box::pin(async move {
                nc.run(&js, &pull, shutdown)
                    .await
                    .map_err(|e| anyhow::anyhow!("JetStream consumer failed: {e}"))
            }))
        }
    }
}

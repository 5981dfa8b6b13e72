//! The store-outage scenario, written once for both brokers: the store down while messages
//! arrive means no effect and no ack, and after recovery every message takes effect once. A
//! consumer that papers over the store's failures breaks it in the same outage: running
//! anyway runs the duplicate twice; acking unrun loses every message.

use std::time::Duration;

use idem_core::Policy;
use idem_core::key_source::KeySources;
use idem_mq::{Processor, Stats, Work};
use idem_redis::RedisStore;

use super::Then;
use super::unguarded::OnStoreError;
use super::{
    PerKey, PrivateRedis, Running, WAIT, eventually, fast, per_payload, processor,
    redis_engine_with,
};

/// Published while the store is down: m-0, m-1, m-2, then m-0 again.
const DURING_OUTAGE: [&str; 4] = ["m-0", "m-1", "m-2", "m-0"];

/// What the scenario needs of a broker.
pub trait Broker {
    /// A queue or stream.
    type Source;
    /// A fresh source, and its name (the store prefix).
    async fn source(&self, what: &str) -> (Self::Source, String);
    /// Publishes one message with key `id` and payload `id`.
    async fn publish(&self, source: &Self::Source, id: &str);
    /// Where the consumer takes keys from.
    fn keys(&self) -> KeySources;
    /// Consumes `source` through `processor` in the background.
    async fn start<W: Work<RedisStore>>(
        &self,
        source: &Self::Source,
        processor: Processor<RedisStore, W>,
    ) -> Running;
    /// Messages the broker still holds for the consumer.
    async fn left(&self, source: &Self::Source) -> u64;
    /// Deletes what `source` made.
    async fn cleanup(&self, source: Self::Source);
}

/// Runs the scenario on `broker` against a private Redis.
pub async fn store_outage<B: Broker>(broker: &B) {
    let n = DURING_OUTAGE.len() as u64;
    let mut redis = PrivateRedis::start();
    let mut setups = Vec::new();
    for what in ["down_anyway", "down_unrun", "down_idem"] {
        let (source, name) = broker.source(what).await;
        // Each engine connects while the store is up.
        let engine = redis_engine_with(&redis.url(), &name, short_lease()).await;
        setups.push((engine, source, PerKey::default()));
    }
    let [
        (anyway_e, anyway_s, anyway),
        (unrun_e, unrun_s, unrun),
        (engine, source, seen),
    ] = <[_; 3]>::try_from(setups).ok().unwrap();
    redis.kill();

    let work = Then(per_payload(&anyway), OnStoreError::RunAnyway);
    let r = broker
        .start(
            &anyway_s,
            processor(anyway_e, broker.keys(), fast(4, 4), work),
        )
        .await;
    publish_all(broker, &anyway_s).await;
    assert!(eventually(WAIT, || async { Stats::get(&r.stats().acked) == n }).await);
    r.stop().await;
    assert_eq!(
        anyway.lock().unwrap().get("m-0"),
        Some(&2),
        "run anyway: the duplicate ran twice"
    );
    broker.cleanup(anyway_s).await;

    let work = Then(per_payload(&unrun), OnStoreError::AckUnrun);
    let r = broker
        .start(
            &unrun_s,
            processor(unrun_e, broker.keys(), fast(4, 4), work),
        )
        .await;
    publish_all(broker, &unrun_s).await;
    assert!(eventually(WAIT, || async { Stats::get(&r.stats().acked) == n }).await);
    r.stop().await;
    assert!(unrun.lock().unwrap().is_empty());
    assert_eq!(
        broker.left(&unrun_s).await,
        0,
        "ack unrun: all gone, none took effect"
    );
    broker.cleanup(unrun_s).await;

    let running = broker
        .start(
            &source,
            processor(engine, broker.keys(), fast(4, 4), per_payload(&seen)),
        )
        .await;
    publish_all(broker, &source).await;
    assert!(
        eventually(WAIT, || async {
            Stats::get(&running.stats().store_unavailable) >= 2 * n
        })
        .await
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing runs while the store is down"
    );
    assert_eq!(
        Stats::get(&running.stats().acked),
        0,
        "nothing is acknowledged"
    );
    redis.restart();
    // The store's connection comes back on its own reconnect schedule. A claim the server
    // applied after the client had given up on it (timed out while reconnecting) would hold
    // its key, and under `hold` turn unknown; the engine finds it in its own name and gives
    // the key back (nothing ran under it), so a redelivery runs the message once.
    let recovered = eventually(Duration::from_secs(60), || async {
        Stats::get(&running.stats().acked) >= n
    })
    .await;
    assert!(
        recovered,
        "acked {} of {n}",
        Stats::get(&running.stats().acked)
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.values().all(|k| *k == 1), "{seen:?}");
    assert_eq!(broker.left(&source).await, 0);
    running.stop().await;
    broker.cleanup(source).await;
}

async fn publish_all<B: Broker>(broker: &B, source: &B::Source) {
    for id in DURING_OUTAGE {
        broker.publish(source, id).await;
    }
}

/// The shortest lease a policy allows (1 s handler timeout plus the 15 s margin), so a claim
/// orphaned by the outage is taken over within the test's wait.
fn short_lease() -> Policy {
    Policy::builder()
        .handler_timeout(Duration::from_secs(1))
        .lease(Duration::from_secs(16))
        .renew_every(Duration::from_secs(5))
        .build()
        .unwrap()
}

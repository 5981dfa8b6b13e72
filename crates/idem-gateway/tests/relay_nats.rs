//! `idem relay` end to end from NATS JetStream: the real binary consumes a stream's durable
//! pull consumer (the stream its own, deleted at the end) and POSTs each message to an
//! orders service that counts what it executed, with a Redis store under a prefix of its own.

#![allow(clippy::unwrap_used)] // Tests may unwrap: a failure is a test failure.

mod common;
mod relay_kit;

use std::time::Duration;

use idem_testkit::brokers::JsStream;
use relay_kit::{Orders, Relay, config};

/// The duplicate window of the test streams.
const WINDOW: Duration = Duration::from_millis(300);

/// A stream of its own, and the relay's source settings that consume it through the durable
/// consumer, dead-lettering to its dead-letter subject.
async fn stream(what: &str) -> (JsStream, String) {
    let f = JsStream::create(what, WINDOW, Duration::from_secs(10)).await;
    let source = format!(
        "broker = \"nats://{}\"\nstream = \"{}\"\nconsumer = \"{}\"\ndead_letter = \"{}\"",
        idem_testkit::brokers::NATS_URL,
        f.name,
        JsStream::CONSUMER,
        f.dead()
    );
    (f, source)
}

/// A stream of its own and `idem relay` consuming it, posting to `upstream` under the
/// route's `failure` policy.
async fn relay_on(what: &str, upstream: &str, failure: &str) -> (JsStream, Relay) {
    let (f, source) = stream(what).await;
    let relay = Relay::start(&config(&f.name, upstream, "/orders", failure, &source));
    (f, relay)
}

/// As [`relay_on`] under `hold`, the relay running without the route's status webhook; also
/// the configuration with it, for `idem reconcile`.
async fn relay_without_webhook(what: &str, upstream: &str) -> (JsStream, String, Relay) {
    let (f, source) = stream(what).await;
    let with_webhook = config(&f.name, upstream, "/orders", "hold", &source);
    let relay = Relay::start(&relay_kit::without_webhook(&with_webhook));
    (f, with_webhook, relay)
}

/// Everything published has been acknowledged (or dead-lettered).
async fn drained(f: &JsStream) -> bool {
    let info = f.consumer().await.info().await.unwrap().clone();
    info.num_pending == 0 && info.num_ack_pending == 0
}

/// Waits (at most [`relay_kit::WAIT`]) until the relay has logged exactly one replay and everything
/// published is acknowledged: a redelivery settled from the store.
async fn one_replay_and_drained(relay: &Relay, f: &JsStream) {
    relay
        .until("one replay, the stream drained", || async {
            relay.logged("replayed") == 1 && drained(f).await
        })
        .await;
}

/// The same `Nats-Msg-Id` published many times: the stream drops the copies inside its
/// window but keeps one published after it, so the broker alone delivers the order twice;
/// through the relay the orders service executes it once, and the later copy is
/// acknowledged from the stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_within_and_beyond_the_window_execute_once() {
    let (upstream, orders) = Orders::start().await;
    let (f, relay) = relay_on("dups", &upstream, "hold").await;
    let dropped: usize = {
        let mut n = 0;
        for _ in 0..5 {
            n += usize::from(f.publish_id("order-1", r#"{"order":1}"#).await);
        }
        n
    };
    assert_eq!(dropped, 4, "inside the window the stream drops the repeats");
    tokio::time::sleep(WINDOW * 3).await;
    assert!(
        !f.publish_id("order-1", r#"{"order":1}"#).await,
        "after the window it keeps one"
    );
    assert!(f.publish_id("order-1", r#"{"order":1}"#).await);
    f.publish_id("order-2", r#"{"order":2}"#).await;
    assert_eq!(
        f.count_on(&f.subject()).await,
        3,
        "the broker holds order-1 twice"
    );

    relay
        .until("a replay, the stream drained", || async {
            relay.logged("replayed") >= 1 && drained(&f).await
        })
        .await;
    assert_eq!(orders.executed("order-1"), 1);
    assert_eq!(orders.executed("order-2"), 1);
    assert_eq!(relay.logged("executed"), 2, "{}", relay.log());
    assert_eq!(relay.logged("replayed"), 1);
    assert_eq!(f.count_on(&f.dead()).await, 0);
    drop(relay);
    f.cleanup().await;
}

/// An orders service that executes and then answers past the relay's timeout. Under
/// `upstream_failure = "retry"` each redelivery executes again (what `hold` prevents).
/// Under `hold` with the route's status webhook the message comes back and its key is settled
/// from the webhook: acknowledged as a replay, nothing dead-lettered. Without a webhook the
/// key is left unknown and the message dead-lettered after one execution; `idem reconcile`
/// (with the webhook) completes the record; a redelivery of the same id (published again
/// after the window) is then acknowledged from the store: still one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_times_out_after_acting_executes_once() {
    let (upstream, orders) = Orders::start().await;

    let (f, relay) = relay_on("slow_retry", &upstream, "retry").await;
    f.publish_id("slow-a", r#"{"order":"a"}"#).await;
    relay
        .until("retry: the redelivery executes again", || async {
            orders.executed("slow-a") >= 2
        })
        .await;
    drop(relay);
    f.cleanup().await;

    let (f, relay) = relay_on("slow_hold", &upstream, "hold").await;
    f.publish_id("slow-b", r#"{"order":"b"}"#).await;
    one_replay_and_drained(&relay, &f).await;
    assert_eq!(orders.executed("slow-b"), 1, "hold: executed once");
    assert_eq!(
        orders.calls("slow-b"),
        1,
        "settled without calling it again"
    );
    assert_eq!(f.count_on(&f.dead()).await, 0, "nothing dead-lettered");
    drop(relay);
    f.cleanup().await;

    let (f, with_webhook, relay) = relay_without_webhook("slow_bare", &upstream).await;
    f.publish_id("slow-c", r#"{"order":"c"}"#).await;
    relay
        .until("one dead letter", || async {
            f.count_on(&f.dead()).await == 1
        })
        .await;
    let letters = f.dead_letters().await;
    let reason = letters[0]
        .get("x-idem-reason")
        .map(|v| v.as_str().to_owned());
    assert_eq!(reason.as_deref(), Some("unknown"));
    assert_eq!(orders.executed("slow-c"), 1);

    let (code, out) = relay.reconcile_with(&with_webhook);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("slow-c"), "{out}");
    tokio::time::sleep(WINDOW * 3).await;
    assert!(!f.publish_id("slow-c", r#"{"order":"c"}"#).await);
    one_replay_and_drained(&relay, &f).await;
    assert_eq!(orders.executed("slow-c"), 1, "hold: executed once");
    assert_eq!(
        orders.calls("slow-c"),
        1,
        "the redelivery did not call the service"
    );
    assert_eq!(f.count_on(&f.dead()).await, 1);
    drop(relay);
    f.cleanup().await;
}

/// A 4xx other than 408/409/429 goes to the dead-letter subject at once; a 503 is
/// redelivered and succeeds once on the next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_error_dead_letters_server_error_redelivers() {
    let (upstream, orders) = Orders::start().await;
    let (f, relay) = relay_on("status", &upstream, "hold").await;
    f.publish_id("reject-1", r#"{"order":"r"}"#).await;
    f.publish_id("flaky-1", r#"{"order":"f"}"#).await;
    relay
        .until(
            "one dead letter, flaky-1 executed, the stream drained",
            || async {
                f.count_on(&f.dead()).await == 1
                    && orders.executed("flaky-1") == 1
                    && drained(&f).await
            },
        )
        .await;
    let letters = f.dead_letters().await;
    let reason = letters[0]
        .get("x-idem-reason")
        .map(|v| v.as_str().to_owned());
    assert_eq!(reason.as_deref(), Some("permanent"));
    let original = letters[0]
        .get("x-idem-original-id")
        .map(|v| v.as_str().to_owned());
    assert_eq!(original.as_deref(), Some("reject-1"));
    assert_eq!(orders.calls("reject-1"), 1, "not retried");
    assert_eq!(orders.calls("flaky-1"), 2, "503, then 201");
    assert_eq!(orders.executed("flaky-1"), 1);
    assert_eq!(orders.total(), 1);
    drop(relay);
    f.cleanup().await;
}

//! Several gateway processes on one shared store behave as one; crashes, store outages and
//! shutdown deadlines leave no lease behind. Needs Redis, PostgreSQL and MariaDB on their
//! standard local ports (a missing one fails under CI, and skips loudly otherwise).

mod cleanup;
mod common;

use std::time::{Duration, Instant};

use cleanup::{Sql, sql_table};
use common::{Gateway, Http, REDIS, Upstream, key, service_up};
use http::{Method, StatusCode};
use idem_testkit::redis_server::{Server, redis_server_available};

fn config(upstream: &str, store: &str, extra: &str) -> String {
    common::configs::with_admin(upstream, store, extra, r#"namespace = "shared""#, ROUTES)
}

/// The routes of [`config`]: one per takeover behaviour, and a catch-all.
const ROUTES: &str = r#"
[[routes]]
name = "reexecute"
path = "/re/*"
timeout = "1s"
takeover = "reexecute"

[[routes]]
name = "hold"
path = "/hold/*"
timeout = "1s"
takeover = "hold"

[[routes]]
name = "default"
path = "/*"
"#;

/// 200 concurrent duplicates, spread over two gateways on one store: one execution.
async fn two_gateways_one_execution(store: &str, extra: &str) {
    let up = Upstream::start().await;
    let a = Gateway::start(&config(&up.url(), store, extra), &[]);
    let b = Gateway::start(&config(&up.url(), store, extra), &[]);
    let http = Http::new();
    let k = key();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let url = if i % 2 == 0 {
            a.url("/charge?delay_ms=500")
        } else {
            b.url("/charge?delay_ms=500")
        };
        let (http, k) = (http.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            http.post(&url, Some(&k), r#"{"amount":5}"#).await
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for t in tasks {
        let r = t.await.expect("join");
        match r.status {
            StatusCode::CREATED => ok += 1,
            StatusCode::CONFLICT => {
                assert_eq!(r.problem_type(), "in-flight");
                busy += 1;
            }
            other => panic!("unexpected {other}: {:?}", String::from_utf8_lossy(&r.body)),
        }
    }
    assert_eq!(
        up.seen.count("/charge"),
        1,
        "exactly one of 200 reached the upstream"
    );
    assert!(ok >= 1 && ok + busy == 200);
    // Both gateways replay the one result.
    for gw in [&a, &b] {
        let r = http
            .post(&gw.url("/charge?delay_ms=500"), Some(&k), r#"{"amount":5}"#)
            .await;
        assert!(r.replayed());
    }
    assert_eq!(up.seen.count("/charge"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_run_one_of_200() {
    if !service_up(REDIS, "Redis").await {
        return;
    }
    two_gateways_one_execution("redis://127.0.0.1:6379", "store_prefix = \"idem-gw-test:\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_postgres_run_one_of_200() {
    if let Some((url, table, _drop)) = sql_table(Sql::Postgres, "idem_gw").await {
        two_gateways_one_execution(url, &format!("store_table = \"{table}\"")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_mariadb_run_one_of_200() {
    if let Some((url, table, _drop)) = sql_table(Sql::Mariadb, "idem_gw").await {
        two_gateways_one_execution(url, &format!("store_table = \"{table}\"")).await;
    }
}

/// Sends a payment taking `delay_ms` at the upstream through `gw` on the `reexecute` route
/// and another on the `hold` route, each under a fresh key, and returns once both are in
/// flight at `up`: their keys, in that order.
async fn pay_on_both_routes(
    up: &Upstream,
    http: &Http,
    gw: &Gateway,
    delay_ms: u64,
) -> (String, String) {
    let (kre, khold) = (key(), key());
    for (path, k) in [("/re/pay", &kre), ("/hold/pay", &khold)] {
        up.in_flight(http, gw.url(&format!("{path}?delay_ms={delay_ms}")), k)
            .await;
    }
    (kre, khold)
}

/// A gateway is SIGKILLed with a request in flight. Until the lease runs out, a retry
/// through the other gateway is told "in flight"; after it, the route's takeover policy
/// decides: `reexecute` runs the request again, `hold` answers outcome-unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sigkill_the_other_gateway_follows_the_takeover_policy() {
    if !service_up(REDIS, "Redis").await {
        return;
    }
    let up = Upstream::start().await;
    let cfg = config(
        &up.url(),
        "redis://127.0.0.1:6379",
        "store_prefix = \"idem-gw-test:\"",
    );
    let mut a = Gateway::start(&cfg, &[]);
    let b = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let (kre, khold) = pay_on_both_routes(&up, &http, &a, 800).await;
    a.kill();
    let claimed_by = Instant::now();

    // The dead gateway's leases are still live: the other gateway refuses to run.
    for (path, k) in [
        ("/re/pay?delay_ms=800", &kre),
        ("/hold/pay?delay_ms=800", &khold),
    ] {
        let r = http.post_keyed(&b.url(path), k).await;
        assert_eq!(
            (r.status, r.problem_type().as_str()),
            (StatusCode::CONFLICT, "in-flight"),
            "{path}"
        );
    }
    // Wait (bounded) for the lease to run out on the store's clock.
    let re = loop {
        let r = http.post_keyed(&b.url("/re/pay?delay_ms=800"), &kre).await;
        if r.status != StatusCode::CONFLICT {
            break r;
        }
        assert!(
            claimed_by.elapsed() < Duration::from_secs(40),
            "lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        claimed_by.elapsed() >= Duration::from_secs(15),
        "a live lease was taken over early"
    );
    assert_eq!(re.status, StatusCode::CREATED, "reexecute: the retry ran");
    assert_eq!(up.seen.count("/re/pay"), 2);
    retried_on_hold_is_unknown(&http, &b, 800, &khold).await;
    assert_eq!(up.seen.count("/hold/pay"), 1, "hold: nothing ran again");
}

/// Retries `key` on `gw`'s `hold` route (the upstream asked to wait `delay_ms`) and checks
/// that the record it left behind is answered as `409 outcome-unknown`.
async fn retried_on_hold_is_unknown(http: &Http, gw: &Gateway, delay_ms: u64, key: &str) {
    let hold = http
        .post_keyed(&gw.url(&format!("/hold/pay?delay_ms={delay_ms}")), key)
        .await;
    assert_eq!(
        (hold.status, hold.problem_type().as_str()),
        (StatusCode::CONFLICT, "outcome-unknown")
    );
}

/// A private `redis-server` of the test's own (one it may kill), or `None` when none can be
/// started (said loudly; a failure under CI).
fn private_redis() -> Option<Server> {
    redis_server_available().then(|| Server::start(&[]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_fails_closed_with_503() {
    let Some(redis) = private_redis() else {
        return;
    };
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &config(&up.url(), &redis.url(), "store_timeout = \"300ms\""),
        &[],
    );
    let http = Http::new();
    let r = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
    assert_eq!(r.status, StatusCode::CREATED);
    let ready = http.get(&gw.admin_url("/readyz")).await;
    assert_eq!(ready.status, StatusCode::OK);

    redis.kill();
    let r = http.post(&gw.url("/charge"), Some(&key()), "{}").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_type(), "store-unavailable");
    assert!(r.header("retry-after").is_some());
    assert_eq!(up.seen.count("/charge"), 1, "nothing ran without a claim");
    let ready = http.get(&gw.admin_url("/readyz")).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    // Unprotected requests still pass.
    assert_eq!(
        http.get(&gw.url("/charge")).await.status,
        StatusCode::CREATED
    );
    let metrics = http.admin(Method::GET, &gw.admin_url("/metrics"), "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("idem_store_errors_total{op=\"claim\"}"),
        "{text}"
    );
    assert!(
        text.contains("idem_requests_total{route=\"default\",outcome=\"store_unavailable\"} 1"),
        "{text}"
    );
}

/// SIGTERM with a request that outlives `shutdown_grace`: the claim is settled before exit
/// (unknown under `hold`, released under `reexecute`), so another gateway need not wait for the
/// lease to expire. Without the settle step in `server::drain`, both retries below answer 409
/// in-flight for the rest of the lease (shown by commenting out `release_all`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deadline_settles_leases() {
    let Some(redis) = private_redis() else {
        return;
    };
    let up = Upstream::start().await;
    let cfg = config(&up.url(), &redis.url(), "shutdown_grace = \"300ms\"");
    let mut a = Gateway::start(&cfg.replace("timeout = \"1s\"", "timeout = \"10s\""), &[]);
    let b = Gateway::start(&cfg, &[]);
    let http = Http::new();
    let (kre, khold) = pay_on_both_routes(&up, &http, &a, 5000).await;
    a.term();
    assert!(
        a.wait_exit(Duration::from_secs(5)).await,
        "exited after the grace period"
    );

    // reexecute: released, so the same request runs again at once through the other gateway
    // (whose 1 s upstream timeout then answers 504; what matters is that it ran).
    let re = http.post_keyed(&b.url("/re/pay?delay_ms=5000"), &kre).await;
    re.assert_status(StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(up.seen.count("/re/pay"), 2);
    // hold: unknown at once, not in flight.
    retried_on_hold_is_unknown(&http, &b, 5000, &khold).await;
    assert_eq!(up.seen.count("/hold/pay"), 1);
    assert!(
        a.logs().contains("released claims still in flight"),
        "{}",
        a.logs()
    );
}

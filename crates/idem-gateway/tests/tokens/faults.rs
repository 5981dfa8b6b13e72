//! A token store failing during the consume, through the gateway's data plane in this
//! process (the token store is swapped for one that fails on demand).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};
use idem_core::{BoxStore, MemoryStore};
use idem_gateway::app::App;
use idem_gateway::claims::TrackedStore;
use idem_gateway::metrics::MeteredStore;
use idem_gateway::tokens::GatewayTokens;
use idem_gateway::upstream::Clients;

use super::common::{Http, Reply, Upstream, in_process};
use super::{config, problem};

/// A token store whose consume fails on demand: before touching the token (`FAIL_BEFORE`), or
/// after consuming it, as when the answer is lost on the way back (`FAIL_AFTER`).
struct Flaky {
    inner: idem_core::token::MemoryTokens,
    mode: Arc<AtomicU8>,
}

const WORKS: u8 = 0;
const FAIL_BEFORE: u8 = 1;
const FAIL_AFTER: u8 = 2;

impl idem_core::token::TokenStore for Flaky {
    async fn issue(
        &self,
        req: &idem_core::token::IssueRequest,
    ) -> Result<idem_core::token::Issued, idem_core::StoreError> {
        self.inner.issue(req).await
    }

    async fn consume(
        &self,
        scope: &idem_core::Scope,
        token: &idem_core::token::Token,
        presented: Option<&[u8]>,
    ) -> Result<idem_core::token::ConsumeOutcome, idem_core::StoreError> {
        let injected = || idem_core::StoreError::unavailable("injected failure");
        match self.mode.load(Ordering::SeqCst) {
            FAIL_BEFORE => Err(injected()),
            FAIL_AFTER => {
                let _ = self.inner.consume(scope, token, presented).await;
                Err(injected())
            }
            _ => self.inner.consume(scope, token, presented).await,
        }
    }

    async fn inspect(
        &self,
        scope: &idem_core::Scope,
        token: &idem_core::token::Token,
    ) -> Result<idem_core::token::TokenState, idem_core::StoreError> {
        self.inner.inspect(scope, token).await
    }
}

/// The gateway's data plane in this process over a [`Flaky`] token store.
async fn flaky_gateway(upstream: &str, mode: Arc<AtomicU8>) -> SocketAddr {
    let raw = idem_gateway::config::from_toml(&config(upstream, "memory:", "")).expect("toml");
    let settings = idem_gateway::config::compile(&raw).expect("valid");
    let store = TrackedStore::new(BoxStore::new(MeteredStore::new(BoxStore::new(
        MemoryStore::new(10_000),
    ))));
    let tokens = GatewayTokens::from_store(
        Flaky {
            inner: idem_core::token::MemoryTokens::new(10_000),
            mode,
        },
        Duration::from_secs(1),
    );
    let mut clients = Clients::new(Duration::from_secs(1), 8);
    let app = App::with_tokens(
        &settings,
        store,
        settings.upstream.as_ref(),
        &mut clients,
        Some(&tokens),
    )
    .expect("app");
    in_process::serve(app).await
}

/// A store failure during the consume forwards nothing and releases the claim: a retry with
/// the same token runs if the token was not used, and gets 409 token-used if it was (the
/// token may be spent, so it is treated as used; never run twice, never run unrecorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_consume_forwards_nothing_and_a_retry_is_judged_by_the_token() {
    let up = Upstream::start().await;
    let mode = Arc::new(AtomicU8::new(WORKS));
    let addr = flaky_gateway(&up.url(), Arc::clone(&mode)).await;
    let http = Http::new();
    let url = |p: &str| format!("http://{addr}{p}");
    let headers = |t: &str| {
        [
            ("x-api-key", "alice".to_owned()),
            ("idempotency-token", t.to_owned()),
        ]
    };
    let send = |t: String| {
        let (http, u) = (http.clone(), url("/checkout/pay"));
        async move {
            let h = headers(&t);
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            http.send(Method::POST, &u, &h, "{}").await
        }
    };
    let store_unavailable = |r: &Reply| {
        problem(
            r,
            StatusCode::SERVICE_UNAVAILABLE,
            "token-store-unavailable",
        )
    };
    let token = || async {
        let r = http
            .send(
                Method::POST,
                &url("/checkout/token"),
                &[("x-api-key", "alice")],
                "",
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        r.json()["token"].as_str().expect("token").to_owned()
    };

    // Failed before the token was touched: 503, nothing forwarded; the retry runs once.
    let t = token().await;
    mode.store(FAIL_BEFORE, Ordering::SeqCst);
    let r = send(t.clone()).await;
    store_unavailable(&r);
    assert!(r.header("retry-after").is_some());
    assert_eq!(up.seen.total(), 0);
    mode.store(WORKS, Ordering::SeqCst);
    let r = send(t.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(up.seen.total(), 1);

    // Failed after the token was consumed: 503, nothing forwarded; the retry is refused as
    // used, and the upstream never runs for it.
    let t = token().await;
    mode.store(FAIL_AFTER, Ordering::SeqCst);
    let r = send(t.clone()).await;
    store_unavailable(&r);
    mode.store(WORKS, Ordering::SeqCst);
    let r = send(t).await;
    problem(&r, StatusCode::CONFLICT, "token-used");
    assert_eq!(up.seen.total(), 1);
}

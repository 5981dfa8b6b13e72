//! The one-time token conformance suite against the shared local Redis and a private
//! 3-master Redis Cluster. Every harness writes under its own random key prefix.

mod common;

use std::time::Duration;

use idem_redis::{RedisConfig, RedisTokens};
use idem_testkit::tokens::TokenHarness;

struct Tokens {
    tokens: RedisTokens,
}

impl Tokens {
    async fn at(url: &str) -> Self {
        let config = RedisConfig::from_url(url)
            .and_then(|c| c.prefix(common::unique_prefix()))
            .and_then(|c| c.op_timeout(Duration::from_millis(500)))
            .expect("config");
        Self {
            tokens: RedisTokens::connect(config).await.expect("connect"),
        }
    }
}

impl TokenHarness for Tokens {
    type Store = RedisTokens;

    fn store(&self) -> impl std::future::Future<Output = RedisTokens> + Send {
        std::future::ready(self.tokens.clone())
    }

    fn advance(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
        idem_testkit::sleep_for(d)
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(600)
    }
}

mod single {
    use super::*;

    idem_testkit::token_conformance_tests!(if common::local_redis_up() {
        Tokens::at(common::LOCAL_URL).await
    } else {
        return;
    });
}

mod cluster {
    use super::*;

    idem_testkit::token_conformance_tests!(if common::redis_server_available() {
        let url = tokio::task::spawn_blocking(|| common::shared_cluster().url())
            .await
            .expect("start cluster");
        Tokens::at(&url).await
    } else {
        return;
    });
}

/// The stored value never holds the token: a dump of the key space gives nobody a usable one.
#[tokio::test]
async fn redis_keeps_no_token_text() {
    if !common::local_redis_up() {
        return;
    }
    let prefix = common::unique_prefix();
    let config = RedisConfig::from_url(common::LOCAL_URL)
        .and_then(|c| c.prefix(prefix.clone()))
        .expect("config");
    let tokens = RedisTokens::connect(config).await.expect("connect");
    let scope = idem_core::Scope::new("tok.leak").expect("scope");
    let req =
        idem_core::token::IssueRequest::new(scope.clone(), Duration::from_secs(60)).expect("req");
    let issued = idem_core::token::TokenStore::issue(&tokens, &req)
        .await
        .expect("issue");
    let key = tokens.token_key(&scope, &issued.token);
    assert!(key.starts_with(&prefix) && !key.contains(issued.token.as_str()));
    let server = redis::Client::open(common::LOCAL_URL).expect("client");
    let mut conn = server
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let value: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("get");
    assert!(
        !value
            .windows(64)
            .any(|w| w == issued.token.as_str().as_bytes())
    );
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    assert!(pttl > 60_000, "kept past expiry for the retention: {pttl}");
}

/// A consume marks the token with `SET … KEEPTTL GET` before it judges it, so every refusal
/// must put the old value back: a refused consume (wrong payload, expired, already used)
/// leaves the value byte for byte and its expiry, and an unknown token leaves no key. The
/// unguarded variant, a script that marks and judges but never restores (it lives here, not
/// in the library), burns a token on a wrong payload: the right payload is then refused.
#[tokio::test]
async fn refused_consumes_leave_the_token_as_it_was() {
    use idem_core::token::{ConsumeOutcome, IssueRequest, Token, TokenStore};
    if !common::local_redis_up() {
        return;
    }
    let config = RedisConfig::from_url(common::LOCAL_URL)
        .and_then(|c| c.prefix(common::unique_prefix()))
        .expect("config");
    let tokens = RedisTokens::connect(config).await.expect("connect");
    let mut raw = redis::Client::open(common::LOCAL_URL)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("conn");
    let scope = idem_core::Scope::new("tok.restore").expect("scope");
    let bound = IssueRequest::new(scope.clone(), Duration::from_secs(60))
        .and_then(|r| r.bind(&b"cart-1"[..]))
        .expect("req");
    let mut snapshot = async |key: &str| -> (Option<Vec<u8>>, i64) {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut raw)
            .await
            .expect("get");
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut raw)
            .await
            .expect("pttl");
        (value, pttl)
    };

    // Wrong payload, then no payload: refused, value and expiry untouched.
    let issued = tokens.issue(&bound).await.expect("issue");
    let key = tokens.token_key(&scope, &issued.token);
    let (live, ttl) = snapshot(&key).await;
    assert!(live.is_some() && ttl > 0);
    for presented in [Some(&b"cart-2"[..]), None] {
        let out = tokens
            .consume(&scope, &issued.token, presented)
            .await
            .expect("consume");
        assert_eq!(out, ConsumeOutcome::Mismatch);
        let (after, left) = snapshot(&key).await;
        assert_eq!(after, live);
        assert!(left > 0 && left <= ttl, "expiry kept: {left} of {ttl}");
    }

    // Consumed, then consumed again: the marker and its expiry stay.
    let out = tokens
        .consume(&scope, &issued.token, Some(b"cart-1"))
        .await
        .expect("consume");
    assert!(
        matches!(out, ConsumeOutcome::Consumed { payload: Some(ref p) } if p == &b"cart-1"[..])
    );
    let (marker, ttl) = snapshot(&key).await;
    assert!(marker.as_deref().is_some_and(|m| m.starts_with(b"C")) && ttl > 0);
    let again = tokens
        .consume(&scope, &issued.token, Some(b"cart-1"))
        .await
        .expect("consume");
    assert_eq!(again, ConsumeOutcome::AlreadyConsumed);
    let (after, left) = snapshot(&key).await;
    assert_eq!(after, marker);
    assert!(left > 0 && left <= ttl);

    // Expired: refused, still live-shaped (so it keeps answering "expired").
    let short = IssueRequest::new(scope.clone(), Duration::from_millis(30)).expect("req");
    let issued = tokens.issue(&short).await.expect("issue");
    let key = tokens.token_key(&scope, &issued.token);
    let (live, _) = snapshot(&key).await;
    idem_testkit::sleep_for(Duration::from_millis(80)).await;
    let out = tokens
        .consume(&scope, &issued.token, None)
        .await
        .expect("consume");
    assert_eq!(out, ConsumeOutcome::Expired);
    assert_eq!(snapshot(&key).await.0, live);

    // Unknown: no key is left behind.
    let unknown = Token::generate().expect("token");
    let out = tokens
        .consume(&scope, &unknown, None)
        .await
        .expect("consume");
    assert_eq!(out, ConsumeOutcome::Unknown);
    let key = tokens.token_key(&scope, &unknown);
    assert_eq!(snapshot(&key).await, (None, -2));

    // The unguarded variant: mark, judge, never restore.
    let unguarded = redis::Script::new(
        "local v = redis.call('SET', KEYS[1], 'C0', 'KEEPTTL', 'GET')
         if not v then return 0 end
         if string.byte(v, 2) == 49 and ARGV[1] ~= string.sub(v, 14) then return 3 end
         return v",
    );
    let issued = tokens.issue(&bound).await.expect("issue");
    let key = tokens.token_key(&scope, &issued.token);
    let refused: i64 = unguarded
        .key(&key)
        .arg(&b"cart-2"[..])
        .invoke_async(&mut raw)
        .await
        .expect("unguarded");
    assert_eq!(refused, 3);
    let out = tokens
        .consume(&scope, &issued.token, Some(b"cart-1"))
        .await
        .expect("consume");
    assert_eq!(
        out,
        ConsumeOutcome::AlreadyConsumed,
        "without the restore, a refused consume burns the token"
    );
}

/// On a single node, concurrent consumes share script calls (fewer `EVALSHA` than consumes,
/// counted on a private server), each still applied on its own: of 200 consumers of one token
/// exactly one wins, every other token consumed once is consumed, and a corrupt value fails
/// its own consume alone, left as it was.
#[tokio::test]
async fn concurrent_consumes_share_calls_and_fail_alone() {
    use idem_core::token::{ConsumeOutcome, IssueRequest, TokenStore};
    if !common::redis_server_available() {
        return;
    }
    let server = common::Server::start(&[]);
    let config = common::private_config(&server);
    let tokens = RedisTokens::connect(config).await.expect("connect");
    let scope = idem_core::Scope::new("tok.batch").expect("scope");
    let req = IssueRequest::new(scope.clone(), Duration::from_secs(60)).expect("req");
    let shared = tokens.issue(&req).await.expect("issue");
    let mut own = Vec::new();
    for _ in 0..50 {
        own.push(tokens.issue(&req).await.expect("issue").token);
    }
    let corrupt = tokens.issue(&req).await.expect("issue").token;
    let corrupt_key = tokens.token_key(&scope, &corrupt);
    assert_eq!(
        server
            .cli(&["SET", &corrupt_key, "Xnot-a-token"])
            .as_deref(),
        Some("OK")
    );
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"]).as_deref(), Some("OK"));

    let mut calls = Vec::new();
    for _ in 0..200 {
        let (t, s, tok) = (tokens.clone(), scope.clone(), shared.token.clone());
        calls.push(tokio::spawn(async move { t.consume(&s, &tok, None).await }));
    }
    for tok in own {
        let (t, s) = (tokens.clone(), scope.clone());
        calls.push(tokio::spawn(async move { t.consume(&s, &tok, None).await }));
    }
    let (t, s) = (tokens.clone(), scope.clone());
    let bad = tokio::spawn(async move { t.consume(&s, &corrupt, None).await });

    let mut won = 0;
    for (i, call) in calls.into_iter().enumerate() {
        let out = call.await.expect("task").expect("consume");
        match out {
            ConsumeOutcome::Consumed { .. } => won += 1,
            ConsumeOutcome::AlreadyConsumed if i < 200 => {}
            other => panic!("consume {i}: {other:?}"),
        }
    }
    assert_eq!(
        won,
        1 + 50,
        "one winner of the shared token, and each own token"
    );
    assert!(
        bad.await.expect("task").is_err(),
        "the corrupt value fails its consume"
    );
    assert_eq!(
        server.cli(&["GET", &corrupt_key]).as_deref(),
        Some("Xnot-a-token")
    );
    let evalsha = server.listed_calls("evalsha").expect("evalsha calls");
    eprintln!("{evalsha} script calls for 251 consumes");
    assert!(evalsha < 251, "{evalsha} script calls for 251 consumes");
}

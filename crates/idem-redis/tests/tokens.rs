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
        let url = tokio::task::spawn_blocking(|| common::Cluster::shared().url())
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

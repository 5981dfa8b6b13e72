//! The one-time token conformance suite: every rule of the [`TokenStore`] contract, run by
//! each token store with one line, like the record store's suite:
//!
//! ```no_run
//! idem_testkit::token_conformance_tests!(idem_testkit::tokens::MemoryTokenHarness::new());
//! # fn main() {}
//! ```
//!
//! Every rule works in its own namespace, so a harness may share one store (one Redis, one
//! table) between rules.

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use idem_core::token::{
    ConsumeOutcome, IssueRequest, Issued, MemoryTokens, Token, TokenState, TokenStore,
};
use idem_core::{ManualClock, Scope, Timestamp};

use crate::ctx::unique_namespace;

/// Gives the token suite stores to test and a way to let store time pass.
pub trait TokenHarness: Send + Sync + 'static {
    /// The store under test.
    type Store: TokenStore + Clone;

    /// A store to test (fresh or shared).
    fn store(&self) -> impl Future<Output = Self::Store> + Send;

    /// Lets at least `d` of store time pass: advances a manual clock, or sleeps.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;

    /// The short TTL the expiry rules issue with; the suite waits 1.5 times it. A real-server
    /// harness picks one that comfortably exceeds a few round trips (300 ms to 1 s).
    fn ttl(&self) -> Duration;
}

/// [`MemoryTokens`] on one shared [`ManualClock`].
#[derive(Clone, Debug)]
pub struct MemoryTokenHarness {
    clock: ManualClock,
}

impl MemoryTokenHarness {
    /// A harness on a manual clock.
    pub fn new() -> Self {
        Self {
            clock: ManualClock::new(Timestamp(1_767_225_600_000)),
        }
    }
}

impl Default for MemoryTokenHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenHarness for MemoryTokenHarness {
    type Store = MemoryTokens;

    fn store(&self) -> impl Future<Output = MemoryTokens> + Send {
        std::future::ready(MemoryTokens::with_clock(100_000, self.clock.clone()))
    }

    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(60)
    }
}

/// Concurrent consumers of one token in [`race_one_consumer_wins`].
pub const CONSUMERS: usize = 200;

/// TTL for tokens no rule lets expire.
const LONG: Duration = Duration::from_secs(3600);

struct Ctx<S> {
    store: S,
    ns: String,
}

impl<S: TokenStore + Clone> Ctx<S> {
    async fn new<H: TokenHarness<Store = S>>(h: &H, label: &str) -> Self {
        Self {
            store: h.store().await,
            ns: unique_namespace(&format!("tok-{label}")),
        }
    }

    fn scope(&self) -> Scope {
        Scope::new(self.ns.clone()).expect("namespace")
    }

    async fn issue(&self, scope: &Scope, ttl: Duration, payload: Option<&[u8]>) -> Issued {
        let mut req = IssueRequest::new(scope.clone(), ttl).expect("request");
        if let Some(p) = payload {
            req = req.bind(p.to_vec()).expect("payload");
        }
        self.store
            .issue(&req)
            .await
            .unwrap_or_else(|e| panic!("issue in {scope:?}: store error: {e}"))
    }

    async fn consume(&self, scope: &Scope, token: &Token, p: Option<&[u8]>) -> ConsumeOutcome {
        self.store
            .consume(scope, token, p)
            .await
            .unwrap_or_else(|e| panic!("consume {token:?}: store error: {e}"))
    }

    async fn inspect(&self, scope: &Scope, token: &Token) -> TokenState {
        self.store
            .inspect(scope, token)
            .await
            .unwrap_or_else(|e| panic!("inspect {token:?}: store error: {e}"))
    }
}

/// An issued token is live, consumed once with its payload, and every later consume is
/// [`ConsumeOutcome::AlreadyConsumed`]; a consumed token is never live again.
pub async fn consume_once<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "once").await;
    let scope = c.scope();
    let issued = c.issue(&scope, LONG, Some(b"cart:42")).await;
    match c.inspect(&scope, &issued.token).await {
        TokenState::Live {
            expires_at,
            payload,
        } => {
            assert_eq!(expires_at, issued.expires_at, "inspect names the expiry");
            assert_eq!(payload.as_deref(), Some(&b"cart:42"[..]));
        }
        other => panic!("fresh token: expected Live, got {other:?}"),
    }
    assert_eq!(
        c.consume(&scope, &issued.token, Some(b"cart:42")).await,
        ConsumeOutcome::Consumed {
            payload: Some(b"cart:42".to_vec().into())
        }
    );
    for _ in 0..3 {
        assert_eq!(
            c.consume(&scope, &issued.token, Some(b"cart:42")).await,
            ConsumeOutcome::AlreadyConsumed,
            "a consumed token must stay consumed"
        );
    }
    assert!(
        matches!(
            c.inspect(&scope, &issued.token).await,
            TokenState::Consumed { .. }
        ),
        "inspect after consume"
    );
}

/// A token never issued is [`ConsumeOutcome::Unknown`], and consuming it stores nothing.
pub async fn unknown_is_unknown<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "unknown").await;
    let scope = c.scope();
    let never = Token::generate().expect("rng");
    assert_eq!(
        c.consume(&scope, &never, None).await,
        ConsumeOutcome::Unknown
    );
    assert_eq!(
        c.consume(&scope, &never, None).await,
        ConsumeOutcome::Unknown
    );
    assert_eq!(c.inspect(&scope, &never).await, TokenState::Unknown);
}

/// A token past its TTL is [`ConsumeOutcome::Expired`], distinct from unknown, and stays
/// expired (an expired consume does not use it up or forget it); a token issued at the same
/// time with a long TTL is still usable.
pub async fn expired_is_not_unknown<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "expired").await;
    let scope = c.scope();
    let ttl = h.ttl();
    let short = c.issue(&scope, ttl, None).await;
    let long = c.issue(&scope, LONG, None).await;
    h.advance(ttl + ttl / 2).await;
    assert_eq!(
        c.consume(&scope, &short.token, None).await,
        ConsumeOutcome::Expired
    );
    assert_eq!(
        c.consume(&scope, &short.token, None).await,
        ConsumeOutcome::Expired,
        "expired stays expired"
    );
    assert_eq!(
        c.inspect(&scope, &short.token).await,
        TokenState::Expired {
            at: short.expires_at
        }
    );
    assert!(matches!(
        c.consume(&scope, &long.token, None).await,
        ConsumeOutcome::Consumed { .. }
    ));
}

/// A token lives in its scope: another principal, no principal, or another namespace get
/// [`ConsumeOutcome::Unknown`], and the token stays usable by its owner.
pub async fn scoped_by_principal<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "scope").await;
    let alice = c.scope().with_credential(b"alice-api-key");
    let bob = c.scope().with_credential(b"bob-api-key");
    let other_ns = Scope::new(format!("{}.other", c.ns))
        .expect("namespace")
        .with_credential(b"alice-api-key");
    let issued = c.issue(&alice, LONG, None).await;
    for stranger in [&bob, &c.scope(), &other_ns] {
        assert_eq!(
            c.consume(stranger, &issued.token, None).await,
            ConsumeOutcome::Unknown,
            "{stranger:?} must not see alice's token"
        );
        assert_eq!(
            c.inspect(stranger, &issued.token).await,
            TokenState::Unknown
        );
    }
    assert!(matches!(
        c.consume(&alice, &issued.token, None).await,
        ConsumeOutcome::Consumed { .. }
    ));
}

/// A token bound to a payload refuses other bytes, and no bytes, with
/// [`ConsumeOutcome::Mismatch`] and stays usable; the right bytes consume it. A token with no
/// payload accepts any.
pub async fn bound_payload_must_match<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "bound").await;
    let scope = c.scope();
    let bound = c.issue(&scope, LONG, Some(b"cart:aaa")).await;
    assert_eq!(
        c.consume(&scope, &bound.token, Some(b"cart:bbb")).await,
        ConsumeOutcome::Mismatch
    );
    assert_eq!(
        c.consume(&scope, &bound.token, None).await,
        ConsumeOutcome::Mismatch
    );
    assert!(matches!(
        c.inspect(&scope, &bound.token).await,
        TokenState::Live { .. }
    ));
    assert_eq!(
        c.consume(&scope, &bound.token, Some(b"cart:aaa")).await,
        ConsumeOutcome::Consumed {
            payload: Some(b"cart:aaa".to_vec().into())
        }
    );
    let binary = [0u8, 255, b':', 0, b'\n'];
    let bin = c.issue(&scope, LONG, Some(&binary)).await;
    assert_eq!(
        c.consume(&scope, &bin.token, Some(&binary[..4])).await,
        ConsumeOutcome::Mismatch,
        "a prefix of a binary payload is not the payload"
    );
    assert_eq!(
        c.consume(&scope, &bin.token, Some(&binary)).await,
        ConsumeOutcome::Consumed {
            payload: Some(binary.to_vec().into())
        }
    );
    let free = c.issue(&scope, LONG, None).await;
    assert_eq!(
        c.consume(&scope, &free.token, Some(b"anything")).await,
        ConsumeOutcome::Consumed { payload: None }
    );
}

/// Every issue hands out a different token of at least 128 bits.
pub async fn tokens_are_fresh<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "fresh").await;
    let scope = c.scope();
    let mut seen = HashSet::new();
    for _ in 0..200 {
        let t = c.issue(&scope, LONG, None).await.token;
        assert!(
            t.as_str().len() * 4 >= 128,
            "token too short: {}",
            t.as_str().len()
        );
        assert!(seen.insert(t.as_str().to_owned()), "token issued twice");
    }
}

/// [`CONSUMERS`] tasks consume one token at once: exactly one wins, every other one is told
/// the token was already used.
pub async fn race_one_consumer_wins<H: TokenHarness>(h: &H) {
    let c = Ctx::new(h, "race").await;
    let scope = c.scope();
    for round in 0..3 {
        let issued = c.issue(&scope, LONG, Some(b"p")).await;
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(CONSUMERS));
        let tasks: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (store, scope, token, start) = (
                    c.store.clone(),
                    scope.clone(),
                    issued.token.clone(),
                    start.clone(),
                );
                tokio::spawn(async move {
                    start.wait().await;
                    store.consume(&scope, &token, Some(b"p")).await
                })
            })
            .collect();
        let (mut won, mut lost) = (0, 0);
        for t in tasks {
            match t.await.expect("task") {
                Ok(ConsumeOutcome::Consumed { .. }) => won += 1,
                Ok(ConsumeOutcome::AlreadyConsumed) => lost += 1,
                other => panic!("round {round}: unexpected {other:?}"),
            }
        }
        assert_eq!(
            (won, lost),
            (1, CONSUMERS - 1),
            "round {round}: winners and losers"
        );
    }
}

/// Every token rule's name, in the order [`token_conformance_tests!`](crate::token_conformance_tests) runs them.
pub const ALL: &[&str] = &[
    "consume_once",
    "unknown_is_unknown",
    "expired_is_not_unknown",
    "scoped_by_principal",
    "bound_payload_must_match",
    "tokens_are_fresh",
    "race_one_consumer_wins",
];

/// Expands to one `#[test]` per token rule for a [`TokenHarness`] expression (which may
/// `.await` and may `return` to skip when a server is missing).
#[macro_export]
macro_rules! token_conformance_tests {
    ($harness:expr $(,)?) => {
        $crate::token_conformance_tests!(@rules { $harness }
            consume_once, unknown_is_unknown, expired_is_not_unknown, scoped_by_principal,
            bound_payload_must_match, tokens_are_fresh, race_one_consumer_wins);
    };
    (@rules { $harness:expr } $($rule:ident),+) => {
        $(
            #[test]
            fn $rule() {
                $crate::__private::run(async {
                    let harness = $harness;
                    $crate::tokens::$rule(&harness).await;
                });
            }
        )+
    };
}

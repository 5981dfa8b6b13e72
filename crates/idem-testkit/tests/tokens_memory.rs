//! The one-time token conformance suite against the memory token store on a manual clock.

idem_testkit::token_conformance_tests!(idem_testkit::tokens::MemoryTokenHarness::new());

/// A token store whose consume reads, yields, then writes (a `GET` then a `SET`, not one
/// atomic step). The race rule must catch it: several consumers see the token live.
mod racy {
    use std::time::Duration;

    use idem_core::token::{
        ConsumeOutcome, IssueRequest, Issued, MemoryTokens, Token, TokenState, TokenStore,
    };
    use idem_core::{Scope, StoreError};
    use idem_testkit::tokens::TokenHarness;

    #[derive(Clone, Debug)]
    struct RacyTokens(MemoryTokens);

    impl TokenStore for RacyTokens {
        async fn issue(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
            self.0.issue(req).await
        }

        async fn consume(
            &self,
            scope: &Scope,
            token: &Token,
            presented: Option<&[u8]>,
        ) -> Result<ConsumeOutcome, StoreError> {
            match self.0.inspect(scope, token).await? {
                TokenState::Live { payload, .. } => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let _ = self.0.consume(scope, token, presented).await?;
                    Ok(ConsumeOutcome::Consumed { payload })
                }
                _ => self.0.consume(scope, token, presented).await,
            }
        }

        async fn inspect(&self, scope: &Scope, token: &Token) -> Result<TokenState, StoreError> {
            self.0.inspect(scope, token).await
        }
    }

    struct Racy;

    impl TokenHarness for Racy {
        type Store = RacyTokens;

        fn store(&self) -> impl std::future::Future<Output = RacyTokens> + Send {
            std::future::ready(RacyTokens(MemoryTokens::new(10_000)))
        }

        fn advance(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
            tokio::time::sleep(d)
        }

        fn ttl(&self) -> Duration {
            Duration::from_millis(100)
        }
    }

    #[test]
    #[should_panic(expected = "winners and losers")]
    fn race_rule_catches_a_read_then_write_consume() {
        idem_testkit::__private::run(idem_testkit::tokens::race_one_consumer_wins(&Racy));
    }
}

//! The one-time token conformance suite against PostgreSQL and MariaDB, each harness on its
//! own table, dropped with the harness. MariaDB runs it twice: with the issue statement the
//! server's version picks (`INSERT … RETURNING`), and with MySQL 8's portable spelling
//! (insert, then read back, in one transaction) forced.

mod common;

use std::time::Duration;

use idem_sql::{SqlTokens, TokenDialect};
use idem_testkit::tokens::TokenHarness;

struct Tokens<D: TokenDialect> {
    tokens: SqlTokens<D>,
    drop_with: fn(String),
}

impl<D: TokenDialect> TokenHarness for Tokens<D> {
    type Store = SqlTokens<D>;

    fn store(&self) -> impl std::future::Future<Output = SqlTokens<D>> + Send {
        std::future::ready(self.tokens.clone())
    }

    fn advance(&self, d: Duration) -> impl std::future::Future<Output = ()> + Send {
        idem_testkit::sleep_for(d)
    }

    fn ttl(&self) -> Duration {
        common::LEASE
    }
}

impl<D: TokenDialect> Drop for Tokens<D> {
    fn drop(&mut self) {
        (self.drop_with)(self.tokens.table().to_owned());
    }
}

/// Drops `table` on a fresh connection of `url`'s kind, from a thread of its own: the
/// harness's pool belongs to the test's runtime, which is blocked in this drop.
fn drop_table<C>(url: String, table: String)
where
    C: sqlx::Connection,
    for<'c> &'c mut C: sqlx::Executor<'c>,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(async move {
                if let Ok(mut c) = C::connect(&url).await {
                    let sql = format!("DROP TABLE IF EXISTS {table}");
                    let _ = sqlx::raw_sql(&sql).execute(&mut c).await;
                }
            });
        }
    })
    .join();
}

async fn pg() -> Option<Tokens<sqlx::Postgres>> {
    let pool = common::pg_pool(16).await?;
    let tokens = SqlTokens::with_table(pool, &common::unique_table("idem_tok")).expect("table");
    tokens.migrate().await.expect("migrate");
    Some(Tokens {
        tokens,
        drop_with: |t| drop_table::<sqlx::PgConnection>(common::pg_url(), t),
    })
}

async fn mysql() -> Option<Tokens<sqlx::MySql>> {
    mysql_with(|t| t).await
}

async fn mysql_with(
    spell: fn(SqlTokens<sqlx::MySql>) -> SqlTokens<sqlx::MySql>,
) -> Option<Tokens<sqlx::MySql>> {
    let pool = common::mysql_pool(16).await?;
    let tokens =
        spell(SqlTokens::with_table(pool, &common::unique_table("idem_tok")).expect("table"));
    tokens.migrate().await.expect("migrate");
    Some(Tokens {
        tokens,
        drop_with: |t| drop_table::<sqlx::MySqlConnection>(common::mysql_url(), t),
    })
}

mod postgres {
    use super::*;

    idem_testkit::token_conformance_tests!(match pg().await {
        Some(h) => h,
        None => return,
    });
}

mod mariadb {
    use super::*;

    idem_testkit::token_conformance_tests!(match mysql().await {
        Some(h) => h,
        None => return,
    });
}

mod mariadb_portable_issue {
    use super::*;

    idem_testkit::token_conformance_tests!(
        match mysql_with(SqlTokens::with_issue_then_read).await {
            Some(h) => h,
            None => return,
        }
    );
}

/// Rows past their retention are purged; rows within it are kept.
#[tokio::test]
async fn purge_forgets_only_rows_past_retention() {
    let Some(h) = pg().await else { return };
    let short = h.tokens.clone().retention(Duration::from_millis(1));
    let scope = idem_core::Scope::new("tok.purge").expect("scope");
    let req =
        idem_core::token::IssueRequest::new(scope.clone(), Duration::from_millis(50)).expect("req");
    let gone = idem_core::token::TokenStore::issue(&short, &req)
        .await
        .expect("issue");
    let kept = idem_core::token::TokenStore::issue(&h.tokens, &req)
        .await
        .expect("issue");
    idem_testkit::sleep_for(Duration::from_millis(100)).await;
    assert_eq!(h.tokens.purge().await.expect("purge"), 1);
    use idem_core::token::{TokenState, TokenStore};
    assert_eq!(
        h.tokens
            .inspect(&scope, &gone.token)
            .await
            .expect("inspect"),
        TokenState::Unknown
    );
    assert!(matches!(
        h.tokens
            .inspect(&scope, &kept.token)
            .await
            .expect("inspect"),
        TokenState::Expired { .. }
    ));
}

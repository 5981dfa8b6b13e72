//! Fenced writes against PostgreSQL and MariaDB: a write with an older (or equal) fence than
//! the row's is refused and changes nothing; a newer one lands and raises the row's fence.

mod common;

use idem_sql::backstop::{FencedError, FencedUpdate, fenced};
use sqlx::Connection as _;

/// On connection `$c`: creates table `$t` with `$create`, writes the fences 10, 5, 10 and 11
/// in turn through `fenced` (`$query` is the statement for value `$v` at fence `$f`), asserts
/// that the stale ones were refused and the last one landed, and drops the table. A macro
/// because the statement borrows the connection inside `fenced`'s closure.
macro_rules! assert_stale_fences_refused {
    ($c:ident, $t:expr, $create:expr, |$v:ident, $f:ident| $query:expr) => {{
        sqlx::raw_sql(&$create)
            .execute(&mut $c)
            .await
            .expect("table");
        let mut outcomes = Vec::new();
        for (fence, $v) in [
            (10u64, "ten"),
            (5, "five"),
            (10, "ten again"),
            (11, "eleven"),
        ] {
            let r = fenced(fence, |$f| {
                let q = $query;
                let c = &mut $c;
                async move { q.execute(c).await.map(|r| r.rows_affected()) }
            })
            .await;
            outcomes.push(matches!(r, Err(FencedError::Stale { .. })));
        }
        assert_eq!(outcomes, [false, true, true, false], "stale writes refused");
        let (v, fence): (String, i64) =
            sqlx::query_as(&format!("SELECT v, fence FROM {} WHERE id = 'a'", $t))
                .fetch_one(&mut $c)
                .await
                .expect("read");
        assert_eq!((v.as_str(), fence), ("eleven", 11));
        let _ = sqlx::raw_sql(&format!("DROP TABLE {}", $t))
            .execute(&mut $c)
            .await;
    }};
}

#[tokio::test]
async fn postgres_refuses_stale_fences() {
    let mut c = match sqlx::PgConnection::connect(&common::pg_url()).await {
        Ok(c) => c,
        Err(e) => return common::missing("PostgreSQL", &e),
    };
    let t = common::unique_table("idem_fenced");
    let create = format!(
        "CREATE TABLE {t} (id text PRIMARY KEY, v text NOT NULL, fence bigint NOT NULL);
         INSERT INTO {t} VALUES ('a', 'initial', 0);"
    );
    let sql = FencedUpdate::new(&t, "id", "fence")
        .and_then(|u| u.postgres(&["v"]))
        .expect("sql");
    assert_stale_fences_refused!(c, t, create, |v, f| sqlx::query(&sql)
        .bind(v)
        .bind("a")
        .bind(f));
}

#[tokio::test]
async fn mariadb_refuses_stale_fences() {
    let mut c = match sqlx::MySqlConnection::connect(&common::mysql_url()).await {
        Ok(c) => c,
        Err(e) => return common::missing("MariaDB", &e),
    };
    let t = common::unique_table("idem_fenced");
    let create = format!(
        "CREATE TABLE {t} (id VARCHAR(64) PRIMARY KEY, v TEXT NOT NULL, fence BIGINT NOT NULL);
         INSERT INTO {t} VALUES ('a', 'initial', 0);"
    );
    let sql = FencedUpdate::new(&t, "id", "fence")
        .and_then(|u| u.positional(&["v"]))
        .expect("sql");
    assert_stale_fences_refused!(c, t, create, |v, f| sqlx::query(&sql)
        .bind(v)
        .bind(f)
        .bind("a")
        .bind(f));
}

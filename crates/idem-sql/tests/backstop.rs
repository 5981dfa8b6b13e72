//! The backstop toolkit against real databases: duplicates recognised precisely and answered
//! with the live earlier row, guarded transitions, optimistic locking.

mod common;

use std::sync::Arc;

use idem_sql::backstop::{
    Applied, InsertOnce, InsertOnceError, Liveness, OptimisticError, TransitionError, Transitions,
    Versioned, insert_once, is_unique_violation, optimistic, unique_violation,
};
use sqlx::{PgPool, Row};
use tokio::sync::Barrier;

type Order = (i64, bool, String);

fn machine() -> Transitions {
    Transitions::new()
        .allow("pending", "paid")
        .allow("paid", "completed")
        .allow("pending", "cancelled")
}

fn liveness(row: &Order) -> Liveness {
    match row {
        (_, true, _) => Liveness::Gone("soft-deleted"),
        (_, _, state) if state == "cancelled" => Liveness::Gone("cancelled"),
        _ => Liveness::Live,
    }
}

mod postgres {
    use super::*;

    struct Db {
        pool: PgPool,
        users: String,
        orders: String,
    }

    impl Db {
        async fn new() -> Option<Self> {
            let pool = match PgPool::connect(&common::pg_url()).await {
                Ok(p) => p,
                Err(e) => {
                    common::missing("PostgreSQL", &e);
                    return None;
                }
            };
            let users = common::unique_table("bs_users");
            let orders = common::unique_table("bs_orders");
            sqlx::raw_sql(&format!(
                "CREATE TABLE {users} (id bigint PRIMARY KEY);
                 INSERT INTO {users} VALUES (1), (2);
                 CREATE TABLE {orders} (
                     id bigserial PRIMARY KEY,
                     user_id bigint NOT NULL REFERENCES {users} (id),
                     idem_key text NOT NULL,
                     amount bigint NOT NULL,
                     state text NOT NULL DEFAULT 'pending',
                     deleted boolean NOT NULL DEFAULT false,
                     version bigint NOT NULL DEFAULT 0,
                     CONSTRAINT {orders}_uq UNIQUE (user_id, idem_key))"
            ))
            .execute(&pool)
            .await
            .expect("schema");
            Some(Self {
                pool,
                users,
                orders,
            })
        }

        async fn insert(
            &self,
            user: i64,
            key: &str,
            amount: Option<i64>,
        ) -> Result<InsertOnce<Order>, InsertOnceError<Order>> {
            let o = &self.orders;
            insert_once(
                &format!("{o}_uq"),
                || async move {
                    let row = sqlx::query(&format!(
                        "INSERT INTO {o} (user_id, idem_key, amount) VALUES ($1, $2, $3) RETURNING id, deleted, state"
                    ))
                    .bind(user)
                    .bind(key)
                    .bind(amount)
                    .fetch_one(&self.pool)
                    .await?;
                    Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
                },
                || async move {
                    let row = sqlx::query(&format!("SELECT id, deleted, state FROM {o} WHERE user_id = $1 AND idem_key = $2"))
                        .bind(user)
                        .bind(key)
                        .fetch_optional(&self.pool)
                        .await?;
                    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).transpose()
                },
                liveness,
            )
            .await
        }

        async fn count(&self, user: i64, key: &str) -> i64 {
            sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {} WHERE user_id = $1 AND idem_key = $2",
                self.orders
            ))
            .bind(user)
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .expect("count")
        }
    }

    impl Drop for Db {
        fn drop(&mut self) {
            let (url, sql) = (
                common::pg_url(),
                format!(
                    "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {}",
                    self.orders, self.users
                ),
            );
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("rt");
                rt.block_on(async move {
                    if let Ok(pool) = PgPool::connect(&url).await {
                        let _ = sqlx::raw_sql(&sql).execute(&pool).await;
                    }
                });
            })
            .join()
            .expect("teardown");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_duplicates_leave_one_row_and_return_it() {
        let Some(db) = Db::new().await else { return };
        let db = Arc::new(db);
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(async move {
                    db.insert(1, "order-1", Some(100))
                        .await
                        .expect("insert once")
                })
            })
            .collect();
        let mut inserted = 0;
        let mut ids = Vec::new();
        for t in tasks {
            let r = t.await.expect("task");
            inserted += usize::from(r.inserted());
            ids.push(r.into_inner().0);
        }
        assert_eq!(inserted, 1, "exactly one caller inserts");
        assert!(
            ids.iter().all(|id| *id == ids[0]),
            "every caller gets the same row: {ids:?}"
        );
        assert_eq!(db.count(1, "order-1").await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn soft_deleted_or_cancelled_row_is_not_success() {
        let Some(db) = Db::new().await else { return };
        let first = db
            .insert(1, "k", Some(5))
            .await
            .expect("first")
            .into_inner();
        sqlx::query(&format!(
            "UPDATE {} SET deleted = true WHERE id = $1",
            db.orders
        ))
        .bind(first.0)
        .execute(&db.pool)
        .await
        .expect("soft delete");
        match db.insert(1, "k", Some(5)).await {
            Err(InsertOnceError::NotLive { existing, reason }) => {
                assert_eq!(existing.0, first.0);
                assert_eq!(reason, "soft-deleted");
            }
            other => panic!("a soft-deleted row must not be returned as success: {other:?}"),
        }
        assert_eq!(db.count(1, "k").await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreign_key_and_not_null_violations_are_not_duplicates() {
        let Some(db) = Db::new().await else { return };
        // User 99 does not exist: a foreign-key violation (23503).
        match db.insert(99, "k", Some(1)).await {
            Err(InsertOnceError::Insert(e)) => assert!(!is_unique_violation(&e), "{e}"),
            other => panic!("expected the FK error, got {other:?}"),
        }
        // amount NULL: a NOT NULL violation (23502).
        match db.insert(1, "k", None).await {
            Err(InsertOnceError::Insert(e)) => assert!(unique_violation(&e).is_none(), "{e}"),
            other => panic!("expected the NOT NULL error, got {other:?}"),
        }
        // A real duplicate names its constraint.
        db.insert(2, "dup", Some(1)).await.expect("first");
        let err = sqlx::query(&format!(
            "INSERT INTO {} (user_id, idem_key, amount) VALUES (2, 'dup', 1)",
            db.orders
        ))
        .execute(&db.pool)
        .await
        .expect_err("duplicate");
        let v = unique_violation(&err).expect("a unique violation");
        assert!(v.is_on(&format!("{}_uq", db.orders)), "{v:?}");
        assert!(!v.is_on("some_other_index"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transitions_repeat_idempotently_and_refuse_illegal_moves() {
        let Some(db) = Db::new().await else { return };
        let (id, ..) = db
            .insert(1, "t", Some(1))
            .await
            .expect("insert")
            .into_inner();
        let m = machine();
        let mut conn = db.pool.acquire().await.expect("conn");
        let apply = |to: &'static str| {
            let m = m.clone();
            let orders = db.orders.clone();
            let pool = db.pool.clone();
            async move {
                let mut conn = pool.acquire().await.expect("conn");
                m.apply_pg(&mut conn, &orders, "id", "state", id, to).await
            }
        };
        // Eight concurrent "pay" requests: one moves the row, the rest find it already paid.
        let results = futures::future::join_all((0..8).map(|_| apply("paid"))).await;
        let moved = results
            .iter()
            .filter(|r| matches!(r, Ok(Applied::Moved)))
            .count();
        let repeated = results
            .iter()
            .filter(|r| matches!(r, Ok(Applied::AlreadyThere)))
            .count();
        assert_eq!((moved, repeated), (1, 7), "{results:?}");
        assert!(matches!(
            m.apply_pg(&mut conn, &db.orders, "id", "state", id, "cancelled").await,
            Err(TransitionError::Illegal { ref from, ref to }) if from == "paid" && to == "cancelled"
        ));
        assert!(matches!(
            m.apply_pg(&mut conn, &db.orders, "id", "state", id, "completed")
                .await,
            Ok(Applied::Moved)
        ));
        assert!(matches!(
            m.apply_pg(&mut conn, &db.orders, "id", "state", id, "completed")
                .await,
            Ok(Applied::AlreadyThere)
        ));
        assert!(matches!(
            m.apply_pg(&mut conn, &db.orders, "id", "state", id, "pending")
                .await,
            Err(TransitionError::Illegal { .. })
        ));
        assert!(matches!(
            m.apply_pg(&mut conn, &db.orders, "id", "state", 424_242_i64, "paid")
                .await,
            Err(TransitionError::NotFound)
        ));
        assert!(matches!(
            m.apply_pg(&mut conn, "orders; drop", "id", "state", id, "paid")
                .await,
            Err(TransitionError::Name(_))
        ));
    }

    /// Each of `n` tasks reads the counter, waits until every task has read (the worst
    /// interleaving, made certain), then writes `read + 1`.
    async fn increments(db: &Arc<Db>, id: i64, n: usize, guarded: bool) -> i64 {
        let barrier = Arc::new(Barrier::new(n));
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (db, barrier) = (db.clone(), barrier.clone());
                tokio::spawn(async move {
                    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
                    let read = || async {
                        let row = sqlx::query(&format!("SELECT amount, version FROM {} WHERE id = $1", db.orders))
                            .bind(id)
                            .fetch_one(&db.pool)
                            .await?;
                        let v = Versioned { value: row.try_get::<i64, _>(0)?, version: row.try_get(1)? };
                        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                            barrier.wait().await;
                        }
                        Ok::<_, sqlx::Error>(v)
                    };
                    let write = |v: Versioned<i64>| {
                        let db = db.clone();
                        async move {
                        let sql = if guarded {
                            format!("UPDATE {} SET amount = $1, version = version + 1 WHERE id = $2 AND version = $3", db.orders)
                        } else {
                            // The unguarded variant: last writer wins.
                            format!("UPDATE {} SET amount = $1, version = version + 1 WHERE id = $2 AND $3 = $3", db.orders)
                        };
                        let done = sqlx::query(&sql).bind(v.value + 1).bind(id).bind(v.version).execute(&db.pool).await?;
                        Ok((done.rows_affected(), v.value + 1))
                        }
                    };
                    optimistic(n as u32 + 1, read, write).await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("increment");
        }
        sqlx::query_scalar(&format!("SELECT amount FROM {} WHERE id = $1", db.orders))
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .expect("read")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn optimistic_lock_prevents_the_lost_updates_of_the_unguarded_variant() {
        let Some(db) = Db::new().await else { return };
        let db = Arc::new(db);
        let (a, ..) = db
            .insert(1, "counter-a", Some(0))
            .await
            .expect("insert")
            .into_inner();
        let (b, ..) = db
            .insert(1, "counter-b", Some(0))
            .await
            .expect("insert")
            .into_inner();
        assert_eq!(
            increments(&db, a, 8, true).await,
            8,
            "every increment lands under the version check"
        );
        let unguarded = increments(&db, b, 8, false).await;
        assert!(
            unguarded < 8,
            "the unguarded variant must lose updates here, got {unguarded}"
        );

        // Bounded: a writer that always loses gives up with a conflict.
        let always_conflict = optimistic(
            3,
            || async {
                Ok::<_, sqlx::Error>(Versioned {
                    value: 0_i64,
                    version: 0,
                })
            },
            |_v| async { Ok((0_u64, 0_i64)) },
        )
        .await;
        assert!(matches!(
            always_conflict,
            Err(OptimisticError::Conflict { attempts: 3 })
        ));
    }
}

mod sqlite {
    use super::*;
    use sqlx::SqlitePool;
    use sqlx::sqlite::SqliteConnectOptions;

    async fn db() -> (SqlitePool, common::SqliteHarness) {
        let h = common::SqliteHarness::new().await;
        let options = SqliteConnectOptions::new()
            .filename(&h.path)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePool::connect_with(options).await.expect("open");
        sqlx::raw_sql(
            "CREATE TABLE users (id INTEGER PRIMARY KEY);
             INSERT INTO users VALUES (1);
             CREATE TABLE orders (
                 id INTEGER PRIMARY KEY,
                 user_id INTEGER NOT NULL REFERENCES users (id),
                 idem_key TEXT NOT NULL,
                 amount INTEGER NOT NULL,
                 state TEXT NOT NULL DEFAULT 'pending',
                 deleted INTEGER NOT NULL DEFAULT 0,
                 UNIQUE (user_id, idem_key))",
        )
        .execute(&pool)
        .await
        .expect("schema");
        (pool, h)
    }

    async fn insert(
        pool: &SqlitePool,
        user: i64,
        key: &str,
        amount: Option<i64>,
    ) -> Result<InsertOnce<Order>, InsertOnceError<Order>> {
        insert_once(
            "orders.user_id, orders.idem_key",
            || async move {
                let row = sqlx::query("INSERT INTO orders (user_id, idem_key, amount) VALUES (?1, ?2, ?3) RETURNING id, deleted, state")
                    .bind(user)
                    .bind(key)
                    .bind(amount)
                    .fetch_one(pool)
                    .await?;
                Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
            },
            || async move {
                let row = sqlx::query("SELECT id, deleted, state FROM orders WHERE user_id = ?1 AND idem_key = ?2")
                    .bind(user)
                    .bind(key)
                    .fetch_optional(pool)
                    .await?;
                row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).transpose()
            },
            liveness,
        )
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn duplicates_fk_not_null_and_soft_delete() {
        let (pool, _h) = db().await;
        let results =
            futures::future::join_all((0..8).map(|_| insert(&pool, 1, "k", Some(3)))).await;
        let rows: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("insert once"))
            .collect();
        assert_eq!(rows.iter().filter(|r| r.inserted()).count(), 1);
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&pool)
            .await
            .expect("count");
        assert_eq!(count, 1);

        for (user, amount) in [(9, Some(1)), (1, None)] {
            match insert(&pool, user, "other", amount).await {
                Err(InsertOnceError::Insert(e)) => assert!(!is_unique_violation(&e), "{e}"),
                other => panic!("FK / NOT NULL must not count as duplicates: {other:?}"),
            }
        }
        sqlx::query("UPDATE orders SET deleted = 1")
            .execute(&pool)
            .await
            .expect("soft delete");
        assert!(matches!(
            insert(&pool, 1, "k", Some(3)).await,
            Err(InsertOnceError::NotLive {
                reason: "soft-deleted",
                ..
            })
        ));

        let m = machine();
        let mut conn = pool.acquire().await.expect("conn");
        let id = rows[0].clone().into_inner().0;
        assert!(matches!(
            m.apply_sqlite(&mut conn, "orders", "id", "state", id, "paid")
                .await,
            Ok(Applied::Moved)
        ));
        assert!(matches!(
            m.apply_sqlite(&mut conn, "orders", "id", "state", id, "paid")
                .await,
            Ok(Applied::AlreadyThere)
        ));
        assert!(matches!(
            m.apply_sqlite(&mut conn, "orders", "id", "state", id, "cancelled")
                .await,
            Err(TransitionError::Illegal { .. })
        ));
    }
}

mod mysql {
    use super::*;
    use sqlx::MySqlPool;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn duplicates_fk_not_null_and_transitions() {
        let pool = match MySqlPool::connect(&common::mysql_url()).await {
            Ok(p) => p,
            Err(e) => return common::missing("MariaDB", &e),
        };
        let (users, orders) = (
            common::unique_table("bs_users"),
            common::unique_table("bs_orders"),
        );
        sqlx::raw_sql(&format!(
            "CREATE TABLE {users} (id BIGINT PRIMARY KEY) ENGINE = InnoDB;
             INSERT INTO {users} VALUES (1);
             CREATE TABLE {orders} (
                 id BIGINT AUTO_INCREMENT PRIMARY KEY,
                 user_id BIGINT NOT NULL,
                 idem_key VARCHAR(64) NOT NULL,
                 amount BIGINT NOT NULL,
                 state VARCHAR(16) NOT NULL DEFAULT 'pending',
                 deleted BOOLEAN NOT NULL DEFAULT false,
                 CONSTRAINT {orders}_uq UNIQUE (user_id, idem_key),
                 CONSTRAINT {orders}_fk FOREIGN KEY (user_id) REFERENCES {users} (id)) ENGINE = InnoDB"
        ))
        .execute(&pool)
        .await
        .expect("schema");
        let insert = |user: i64, key: &'static str, amount: Option<i64>| {
            let (pool, orders) = (pool.clone(), orders.clone());
            async move {
                let (p1, p2, o1, o2) = (pool.clone(), pool.clone(), orders.clone(), orders.clone());
                insert_once(
                    &format!("{orders}_uq"),
                    move || {
                        let (p, o) = (p1.clone(), o1.clone());
                        async move {
                            let done = sqlx::query(&format!("INSERT INTO {o} (user_id, idem_key, amount) VALUES (?, ?, ?)"))
                                .bind(user)
                                .bind(key)
                                .bind(amount)
                                .execute(&p)
                                .await?;
                            Ok((done.last_insert_id() as i64, false, "pending".to_owned()))
                        }
                    },
                    move || {
                        let (p, o) = (p2.clone(), o2.clone());
                        async move {
                            let row = sqlx::query(&format!("SELECT id, deleted, state FROM {o} WHERE user_id = ? AND idem_key = ?"))
                                .bind(user)
                                .bind(key)
                                .fetch_optional(&p)
                                .await?;
                            row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).transpose()
                        }
                    },
                    liveness,
                )
                .await
            }
        };
        let results = futures::future::join_all((0..8).map(|_| insert(1, "k", Some(1)))).await;
        let rows: Vec<_> = results
            .into_iter()
            .map(|r| r.expect("insert once"))
            .collect();
        assert_eq!(rows.iter().filter(|r| r.inserted()).count(), 1);
        let id = rows[0].clone().into_inner().0;
        assert!(rows.iter().all(|r| r.clone().into_inner().0 == id));
        for (user, amount) in [(9, Some(1)), (1, None)] {
            match insert(user, "other", amount).await {
                Err(InsertOnceError::Insert(e)) => assert!(!is_unique_violation(&e), "{e}"),
                other => panic!("FK / NOT NULL must not count as duplicates: {other:?}"),
            }
        }
        let m = machine();
        let mut conn = pool.acquire().await.expect("conn");
        assert!(matches!(
            m.apply_mysql(&mut conn, &orders, "id", "state", id, "paid")
                .await,
            Ok(Applied::Moved)
        ));
        assert!(matches!(
            m.apply_mysql(&mut conn, &orders, "id", "state", id, "paid")
                .await,
            Ok(Applied::AlreadyThere)
        ));
        assert!(matches!(
            m.apply_mysql(&mut conn, &orders, "id", "state", id, "cancelled")
                .await,
            Err(TransitionError::Illegal { .. })
        ));
        sqlx::query(&format!("UPDATE {orders} SET deleted = true"))
            .execute(&pool)
            .await
            .expect("soft delete");
        assert!(matches!(
            insert(1, "k", Some(1)).await,
            Err(InsertOnceError::NotLive { .. })
        ));
        drop(conn);
        sqlx::raw_sql(&format!("DROP TABLE {orders}; DROP TABLE {users}"))
            .execute(&pool)
            .await
            .expect("drop");
    }
}

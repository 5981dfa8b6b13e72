//! Removes what a test put in the shared Redis and PostgreSQL servers when it is dropped, so
//! the records go also when the test fails half-way (the guard drops while it unwinds).
#![allow(dead_code, unreachable_pub)]

use std::process::{Command, Stdio};

/// What to remove when dropped.
pub enum StoreGuard {
    /// Nothing: an in-memory store, or a private server that goes with its test.
    Nothing,
    /// Every Redis key under this prefix (records, tombstones, audit streams).
    Redis(String),
    /// This PostgreSQL table (in database `test`) and its audit and token tables.
    Postgres(String),
    /// This MariaDB table (in database `test`) and its audit and token tables.
    Mysql(String),
}

impl Drop for StoreGuard {
    fn drop(&mut self) {
        let mut cmd = match self {
            Self::Nothing => return,
            Self::Redis(prefix) => {
                let mut c = Command::new("redis-cli");
                c.args(["-h", "127.0.0.1", "-p", "6379", "EVAL"])
                    .arg("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end")
                    .arg("0")
                    .arg(format!("{prefix}*"));
                c
            }
            Self::Postgres(table) => {
                let mut c = Command::new("psql");
                c.args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-d",
                    "test",
                    "-q",
                    "-c",
                ])
                .arg(format!(
                    "DROP TABLE IF EXISTS {table}, {table}_audit, {table}_tokens"
                ));
                c
            }
            Self::Mysql(table) => {
                let mut c = Command::new("mysql");
                c.args(["-h", "127.0.0.1", "-u", "root", "test", "-e"])
                    .arg(format!(
                        "DROP TABLE IF EXISTS {table}, {table}_audit, {table}_tokens"
                    ));
                c
            }
        };
        let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// A shared SQL server the store variants of a test run on.
#[derive(Clone, Copy)]
pub enum Sql {
    /// PostgreSQL on 5432, database `test`.
    Postgres,
    /// MariaDB on 3306, database `test`.
    Mariadb,
}

/// A table of its own on `sql`'s shared server, named from `tag`: the store URL, the table,
/// and the guard that drops it (with its audit and token tables) when the test ends, passed
/// or not. `None` when the server is not running (a failure under CI, a loud skip elsewhere).
pub async fn sql_table(sql: Sql, tag: &str) -> Option<(&'static str, String, StoreGuard)> {
    use super::common::{MYSQL, MYSQL_URL, PG_URL, POSTGRES, service_up};
    let (addr, name, url, guard): (_, _, _, fn(String) -> StoreGuard) = match sql {
        Sql::Postgres => (POSTGRES, "PostgreSQL", PG_URL, StoreGuard::Postgres),
        Sql::Mariadb => (MYSQL, "MariaDB", MYSQL_URL, StoreGuard::Mysql),
    };
    if !service_up(addr, name).await {
        return None;
    }
    let table = format!("{tag}_{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    Some((url, table.clone(), guard(table)))
}

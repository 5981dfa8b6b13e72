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

/// A table name of its own, starting with `tag`, and `guard` over it: the table (with its
/// audit and token tables) is dropped when the guard is, passed or not.
pub fn fresh_table(tag: &str, guard: fn(String) -> StoreGuard) -> (String, StoreGuard) {
    let table = format!("{tag}_{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    (table.clone(), guard(table))
}

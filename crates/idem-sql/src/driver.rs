//! The sqlx plumbing every statement goes through: binding parameters, running a statement on
//! a pool or on the caller's connection, and reading cells.
//!
//! [`Driver`] is implemented once, for every sqlx database whose driver handles the Rust types
//! the store uses, so the generic store needs no encode/decode bounds of its own.

use futures::future::BoxFuture;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use crate::statements::{Param, Stmt};

/// A parameter value.
#[derive(Debug, Clone, Copy)]
pub enum Value<'q> {
    /// A `BLOB` / `bytea`.
    Bytes(&'q [u8]),
    OptBytes(Option<&'q [u8]>),
    /// Text.
    Text(&'q str),
    /// Text or `NULL`.
    OptText(Option<&'q str>),
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit integer or `NULL`.
    OptInt(Option<i64>),
    /// A 16-bit integer or `NULL`.
    OptSmall(Option<i16>),
    /// A boolean.
    Bool(bool),
}

/// The values one run of a statement binds, by parameter.
pub(crate) type Args<'q> = [(Param, Value<'q>)];

/// Where a statement runs.
#[derive(Debug)]
pub enum On<'a, D: Database> {
    /// On a connection of one of the store's pools; the statement commits on its own.
    Pool(&'a Pool<D>),
    /// On the caller's connection (same-database mode), inside whatever transaction it holds.
    Conn(&'a mut D::Connection),
}

/// Runs statements and reads cells for one database.
pub trait Driver: Database {
    /// Runs `stmt` with `args`; its first row, if any.
    fn fetch_optional<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>>;

    /// Runs `stmt` with `args`; all its rows.
    fn fetch_all<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>>;

    /// Runs `stmt` with `args`; what it reported.
    fn execute<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `sql`, possibly several statements, without parameters.
    fn execute_raw<'a>(on: On<'a, Self>, sql: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Reads column `i` as `T`.
    fn get<T>(row: &Self::Row, i: usize) -> Result<T, sqlx::Error>
    where
        T: for<'r> Decode<'r, Self> + Type<Self>;

    /// Reads column `i` as a 64-bit integer.
    fn int(row: &Self::Row, i: usize) -> Result<i64, sqlx::Error>;

    /// Reads column `i` as a 16-bit integer.
    fn small(row: &Self::Row, i: usize) -> Result<i16, sqlx::Error>;

    /// Reads column `i` as a boolean.
    fn flag(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error>;

    /// Reads column `i` as bytes, `None` for `NULL`.
    fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

impl<D> Driver for D
where
    D: Database,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> D::Arguments<'q>: IntoArguments<'q, D>,
    usize: ColumnIndex<D::Row>,
    for<'q> &'q [u8]: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q [u8]>: Encode<'q, D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D>,
    for<'q> i64: Encode<'q, D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> Option<i16>: Encode<'q, D>,
    for<'q> bool: Encode<'q, D>,
    for<'r> i64: Decode<'r, D> + Type<D>,
    for<'r> i16: Decode<'r, D> + Type<D>,
    for<'r> bool: Decode<'r, D> + Type<D>,
    for<'r> Vec<u8>: Decode<'r, D> + Type<D>,
{
    fn fetch_optional<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>> {
        let query = bind(stmt, args);
        match on {
            On::Pool(pool) => pool.fetch_optional(query),
            On::Conn(conn) => conn.fetch_optional(query),
        }
    }

    fn fetch_all<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        let query = bind(stmt, args);
        match on {
            On::Pool(pool) => pool.fetch_all(query),
            On::Conn(conn) => conn.fetch_all(query),
        }
    }

    fn execute<'a>(
        on: On<'a, Self>,
        stmt: &'a Stmt,
        args: &'a Args<'a>,
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>> {
        let query = bind(stmt, args);
        match on {
            On::Pool(pool) => pool.execute(query),
            On::Conn(conn) => conn.execute(query),
        }
    }

    fn execute_raw<'a>(on: On<'a, Self>, sql: &'a str) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        let done = match on {
            On::Pool(pool) => pool.execute(sqlx::raw_sql(sql)),
            On::Conn(conn) => conn.execute(sqlx::raw_sql(sql)),
        };
        Box::pin(async move { done.await.map(drop) })
    }

    fn get<T>(row: &Self::Row, i: usize) -> Result<T, sqlx::Error>
    where
        T: for<'r> Decode<'r, Self> + Type<Self>,
    {
        row.try_get(i)
    }

    fn int(row: &Self::Row, i: usize) -> Result<i64, sqlx::Error> {
        row.try_get(i)
    }

    fn small(row: &Self::Row, i: usize) -> Result<i16, sqlx::Error> {
        row.try_get(i)
    }

    fn flag(row: &Self::Row, i: usize) -> Result<bool, sqlx::Error> {
        row.try_get(i)
    }

    fn bytes(row: &Self::Row, i: usize) -> Result<Option<Vec<u8>>, sqlx::Error> {
        row.try_get(i)
    }
}

/// `stmt` with its parameters bound from `args`, in the order the statement's text uses them.
fn bind<'a, D>(stmt: &'a Stmt, args: &'a Args<'a>) -> Query<'a, D, D::Arguments<'a>>
where
    D: Database,
    for<'q> &'q [u8]: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q [u8]>: Encode<'q, D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> Option<&'q str>: Encode<'q, D>,
    for<'q> i64: Encode<'q, D>,
    for<'q> Option<i64>: Encode<'q, D>,
    for<'q> Option<i16>: Encode<'q, D>,
    for<'q> bool: Encode<'q, D>,
    i64: Type<D>,
    i16: Type<D>,
    bool: Type<D>,
{
    let mut query = sqlx::query(stmt.sql());
    for param in stmt.binds() {
        // A statement names only parameters its operation supplies (unit-tested for every
        // dialect); were one missing, the database would refuse the parameter count.
        let value = args.iter().find_map(|(p, v)| (p == param).then_some(*v));
        debug_assert!(value.is_some(), "no value for parameter {param:?}");
        query = match value {
            Some(Value::Bytes(v)) => query.bind(v),
            Some(Value::OptBytes(v)) => query.bind(v),
            Some(Value::Text(v)) => query.bind(v),
            Some(Value::OptText(v)) => query.bind(v),
            Some(Value::Int(v)) => query.bind(v),
            Some(Value::OptInt(v)) => query.bind(v),
            Some(Value::OptSmall(v)) => query.bind(v),
            Some(Value::Bool(v)) => query.bind(v),
            None => query,
        };
    }
    query
}

//! Recognising a unique violation, and nothing else, as a duplicate.

/// A unique-constraint violation, as reported by the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueViolation {
    /// The constraint (or unique index) that was violated, when the database names it:
    /// PostgreSQL reports it, MySQL/MariaDB name the key in the message (`for key 'name'`,
    /// MySQL 8 as `table.name`: the table part is dropped). SQLite names no constraint but the
    /// columns: `"orders.user_id, orders.idem_key"`.
    pub constraint: Option<String>,
}

impl UniqueViolation {
    /// True when this violation is of `name`: the constraint/index name (PostgreSQL,
    /// MySQL/MariaDB) or the `table.column, …` list SQLite reports. A violation that names
    /// nothing matches nothing.
    pub fn is_on(&self, name: &str) -> bool {
        self.constraint.as_deref() == Some(name)
    }
}

/// True when `err` is a unique violation: PostgreSQL SQLSTATE `23505`, MySQL/MariaDB error
/// `1062` (`ER_DUP_ENTRY`), SQLite extended codes `2067` (`SQLITE_CONSTRAINT_UNIQUE`) or
/// `1555` (`SQLITE_CONSTRAINT_PRIMARYKEY`).
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    unique_violation(err).is_some()
}

/// The unique violation in `err`, if that is what it is. Only the codes listed at
/// [`is_unique_violation`] count: foreign-key, `NOT NULL` and check violations, lost
/// connections and every other error give `None`.
pub fn unique_violation(err: &sqlx::Error) -> Option<UniqueViolation> {
    let sqlx::Error::Database(db) = err else {
        return None;
    };
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return (pg.code() == "23505").then(|| UniqueViolation {
            constraint: pg.constraint().map(str::to_owned),
        });
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return (my.number() == 1062).then(|| UniqueViolation {
            constraint: mysql_key(my.message()),
        });
    }
    #[cfg(feature = "sqlite")]
    if let Some(lite) = db.try_downcast_ref::<sqlx::sqlite::SqliteError>() {
        use sqlx::error::DatabaseError as _;
        let code = lite.code();
        return matches!(code.as_deref(), Some("2067" | "1555")).then(|| UniqueViolation {
            constraint: sqlite_columns(lite.message()),
        });
    }
    None
}

/// `Duplicate entry 'x' for key 'name'` → `name` (`table.name` on MySQL 8 → `name`).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
fn mysql_key(message: &str) -> Option<String> {
    let key = message.rsplit_once(" for key '")?.1.strip_suffix('\'')?;
    Some(
        key.rsplit_once('.')
            .map_or(key, |(_, name)| name)
            .to_owned(),
    )
}

/// `UNIQUE constraint failed: orders.user_id, orders.idem_key` → the column list.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn sqlite_columns(message: &str) -> Option<String> {
    message
        .split_once("constraint failed: ")
        .map(|(_, cols)| cols.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_from_messages() {
        assert_eq!(
            mysql_key("Duplicate entry '7-k' for key 'orders_user_key_uq'").as_deref(),
            Some("orders_user_key_uq")
        );
        assert_eq!(
            mysql_key("Duplicate entry '7-k' for key 'orders.orders_user_key_uq'").as_deref(),
            Some("orders_user_key_uq")
        );
        assert_eq!(mysql_key("Cannot add or update a child row"), None);
        assert_eq!(
            sqlite_columns("UNIQUE constraint failed: o.a, o.b").as_deref(),
            Some("o.a, o.b")
        );
        assert!(!is_unique_violation(&sqlx::Error::RowNotFound));
        assert!(!is_unique_violation(&sqlx::Error::PoolTimedOut));
    }
}

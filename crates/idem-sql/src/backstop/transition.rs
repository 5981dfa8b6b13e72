//! Guarded state transitions: a declared state machine applied with one conditional `UPDATE`.

use std::collections::BTreeSet;

use thiserror::Error;

use super::identifier;

/// A declared state machine over a text column, e.g. `pending → paid → completed`,
/// `pending → cancelled`.
///
/// [`Transitions::apply_pg`] (and the MySQL / SQLite twins) moves a row to a target state
/// with `UPDATE t SET state = $to WHERE id = $id AND state IN (every allowed source of $to)`:
/// the database decides, so two concurrent requests can never both make the move. A row
/// already in the target state is a no-op success ([`Applied::AlreadyThere`]): repeating a
/// transition is safe. Anything else is [`TransitionError::Illegal`].
#[derive(Clone, Debug, Default)]
pub struct Transitions {
    edges: BTreeSet<(String, String)>,
}

/// A transition that succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// This call moved the row.
    Moved,
    /// The row was already in the target state (a repeated transition): nothing changed.
    AlreadyThere,
}

/// A transition that did not happen.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// No declared transition leads from the row's state to the target.
    #[error("illegal transition from {from:?} to {to:?}")]
    Illegal {
        /// The row's current state.
        from: String,
        /// The requested state.
        to: String,
    },
    /// No row has this id.
    #[error("no such row")]
    NotFound,
    /// A table or column name is not a plain identifier.
    #[error(transparent)]
    Name(#[from] crate::TableNameError),
    /// The database failed.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

impl Transitions {
    /// An empty machine: nothing is allowed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `from → to`.
    #[must_use]
    pub fn allow(mut self, from: impl Into<String>, to: impl Into<String>) -> Self {
        self.edges.insert((from.into(), to.into()));
        self
    }

    /// True when `from → to` is declared.
    pub fn allows(&self, from: &str, to: &str) -> bool {
        self.edges.iter().any(|(f, t)| f == from && t == to)
    }

    /// The states `to` may be reached from.
    pub fn sources(&self, to: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|(_, t)| t == to)
            .map(|(f, _)| f.as_str())
            .collect()
    }

    /// What a row found in `current` after the guarded update changed nothing means.
    /// `None`: the row is in an allowed source after all (it moved back meanwhile): run again.
    fn after_miss(
        &self,
        current: Option<String>,
        to: &str,
    ) -> Option<Result<Applied, TransitionError>> {
        let Some(current) = current else {
            return Some(Err(TransitionError::NotFound));
        };
        if current == to {
            return Some(Ok(Applied::AlreadyThere));
        }
        if self.allows(&current, to) {
            return None;
        }
        Some(Err(TransitionError::Illegal {
            from: current,
            to: to.to_owned(),
        }))
    }
}

/// Generates `apply_*` for one backend: the guarded update, then (when it changed nothing) a
/// read of the current state to tell "already there" from "illegal".
macro_rules! apply_for {
    ($feature:literal, $name:ident, $db:ty, $conn:ty) => {
        #[cfg(feature = $feature)]
        impl Transitions {
            /// Moves row `id` of `table` to state `to` if a declared transition allows it; see
            /// [`Transitions`]. `id_col` and `state_col` name the key and the state column.
            ///
            /// # Errors
            /// [`TransitionError`]: illegal move, missing row, bad identifier, database failure.
            pub async fn $name<I>(
                &self,
                conn: &mut $conn,
                table: &str,
                id_col: &str,
                state_col: &str,
                id: I,
                to: &str,
            ) -> Result<Applied, TransitionError>
            where
                I: for<'q> sqlx::Encode<'q, $db> + sqlx::Type<$db> + Clone + Send,
            {
                let (table, id_col, state_col) = (
                    identifier(table)?,
                    identifier(id_col)?,
                    identifier(state_col)?,
                );
                let sources = self.sources(to);
                for _ in 0..8 {
                    if !sources.is_empty() {
                        let mut update = sqlx::QueryBuilder::<$db>::new(format!(
                            "UPDATE {table} SET {state_col} = "
                        ));
                        update
                            .push_bind(to)
                            .push(format!(" WHERE {id_col} = "))
                            .push_bind(id.clone());
                        update.push(format!(" AND {state_col} IN ("));
                        let mut list = update.separated(", ");
                        for s in &sources {
                            list.push_bind(*s);
                        }
                        update.push(")");
                        if update.build().execute(&mut *conn).await?.rows_affected() > 0 {
                            return Ok(Applied::Moved);
                        }
                    }
                    let mut read = sqlx::QueryBuilder::<$db>::new(format!(
                        "SELECT {state_col} FROM {table} WHERE {id_col} = "
                    ));
                    read.push_bind(id.clone());
                    let current: Option<String> =
                        read.build_query_scalar().fetch_optional(&mut *conn).await?;
                    if let Some(answer) = self.after_miss(current, to) {
                        return answer;
                    }
                }
                Err(TransitionError::Database(sqlx::Error::Protocol(
                    "state kept changing under the transition".into(),
                )))
            }
        }
    };
}

apply_for!("postgres", apply_pg, sqlx::Postgres, sqlx::PgConnection);
apply_for!("mysql", apply_mysql, sqlx::MySql, sqlx::MySqlConnection);
apply_for!("sqlite", apply_sqlite, sqlx::Sqlite, sqlx::SqliteConnection);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_misses() {
        let m = Transitions::new()
            .allow("pending", "paid")
            .allow("paid", "completed")
            .allow("pending", "cancelled");
        assert_eq!(m.sources("paid"), vec!["pending"]);
        assert!(m.sources("pending").is_empty());
        assert!(matches!(
            m.after_miss(Some("paid".into()), "paid"),
            Some(Ok(Applied::AlreadyThere))
        ));
        assert!(matches!(
            m.after_miss(Some("cancelled".into()), "paid"),
            Some(Err(TransitionError::Illegal { .. }))
        ));
        assert!(matches!(
            m.after_miss(None, "paid"),
            Some(Err(TransitionError::NotFound))
        ));
        assert!(m.after_miss(Some("pending".into()), "paid").is_none());
    }
}

//! Fenced writes: a write that lands only if its fence is newer than the one stored with the
//! row, so a lock holder that paused past its lease cannot overwrite the next holder's work.
//!
//! The row keeps the fence of its last writer in a column. A write sets the new value and
//! the fence together, under `WHERE key = … AND fence < <this writer's fence>`; a late
//! writer with an older fence matches no row and is refused. Seed new rows with fence 0.

use std::future::Future;

use thiserror::Error;

use super::identifier;
use crate::TableNameError;

/// Why [`fenced`] did not write.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FencedError<E> {
    /// The row holds a fence at least as new as this writer's (or the row is missing): the
    /// write was refused and nothing changed.
    #[error("write refused: fence {fence} is not newer than the stored one")]
    Stale {
        /// The refused writer's fence.
        fence: u64,
    },
    /// The fence does not fit a signed 64-bit column.
    #[error("fence {0} does not fit a BIGINT column")]
    TooLarge(u64),
    /// The write itself failed.
    #[error("fenced write failed")]
    Failed(#[source] E),
}

/// Runs a fenced write: `write` gets the fence as a column value, runs the statement from
/// [`FencedUpdate`] (or its own with the same `fence < $fence` guard) and returns the rows it
/// changed. One or more: written. None: a newer fence already wrote, [`FencedError::Stale`].
///
/// # Errors
/// [`FencedError::Stale`], [`FencedError::TooLarge`], or [`FencedError::Failed`] with the
/// write's own error.
pub async fn fenced<E, W, WF>(fence: u64, write: W) -> Result<u64, FencedError<E>>
where
    W: FnOnce(i64) -> WF,
    WF: Future<Output = Result<u64, E>>,
{
    let column = i64::try_from(fence).map_err(|_| FencedError::TooLarge(fence))?;
    match write(column).await.map_err(FencedError::Failed)? {
        0 => Err(FencedError::Stale { fence }),
        rows => Ok(rows),
    }
}

/// Builds the fenced `UPDATE` for a table whose rows keep their last writer's fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencedUpdate {
    table: String,
    key: String,
    fence: String,
}

impl FencedUpdate {
    /// The update of `table`, rows picked by `key_column`, fence kept in `fence_column`.
    ///
    /// # Errors
    /// [`TableNameError`] when a name is not a plain identifier.
    pub fn new(table: &str, key_column: &str, fence_column: &str) -> Result<Self, TableNameError> {
        Ok(Self {
            table: identifier(table)?.to_owned(),
            key: identifier(key_column)?.to_owned(),
            fence: identifier(fence_column)?.to_owned(),
        })
    }

    /// PostgreSQL: `UPDATE t SET c1 = $1, …, cN = $N, fence = $N+2 WHERE key = $N+1 AND
    /// fence < $N+2`. Bind the N values, then the key, then the fence.
    ///
    /// # Errors
    /// [`TableNameError`] when a column is not a plain identifier.
    pub fn postgres(&self, columns: &[&str]) -> Result<String, TableNameError> {
        let n = columns.len();
        let mut set = Vec::with_capacity(n + 1);
        for (i, c) in columns.iter().enumerate() {
            set.push(format!("{} = ${}", identifier(c)?, i + 1));
        }
        set.push(format!("{} = ${}", self.fence, n + 2));
        Ok(format!(
            "UPDATE {} SET {} WHERE {} = ${} AND {} < ${}",
            self.table,
            set.join(", "),
            self.key,
            n + 1,
            self.fence,
            n + 2
        ))
    }

    /// MariaDB, MySQL, SQLite: `UPDATE t SET c1 = ?, …, fence = ? WHERE key = ? AND fence < ?`.
    /// Bind the values, the fence, the key, and the fence again.
    ///
    /// # Errors
    /// [`TableNameError`] when a column is not a plain identifier.
    pub fn positional(&self, columns: &[&str]) -> Result<String, TableNameError> {
        let mut set = Vec::with_capacity(columns.len() + 1);
        for c in columns {
            set.push(format!("{} = ?", identifier(c)?));
        }
        set.push(format!("{} = ?", self.fence));
        Ok(format!(
            "UPDATE {} SET {} WHERE {} = ? AND {} < ?",
            self.table,
            set.join(", "),
            self.key,
            self.fence
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_guard_on_the_fence() {
        let u = FencedUpdate::new("accounts", "id", "fence").expect("names");
        assert_eq!(
            u.postgres(&["balance", "note"]).expect("sql"),
            "UPDATE accounts SET balance = $1, note = $2, fence = $4 WHERE id = $3 AND fence < $4"
        );
        assert_eq!(
            u.positional(&["balance"]).expect("sql"),
            "UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence < ?"
        );
        assert!(u.postgres(&["x; DROP TABLE y"]).is_err());
        assert!(FencedUpdate::new("t", "id", "f-1").is_err());
    }

    #[tokio::test]
    async fn zero_rows_is_stale() {
        let r: Result<u64, FencedError<()>> = fenced(5, |f| async move {
            assert_eq!(f, 5);
            Ok(0)
        })
        .await;
        assert!(matches!(r, Err(FencedError::Stale { fence: 5 })));
        let r: Result<u64, FencedError<()>> = fenced(u64::MAX, |_| async { Ok(1) }).await;
        assert!(matches!(r, Err(FencedError::TooLarge(_))));
        let r: Result<u64, FencedError<()>> = fenced(6, |_| async { Ok(1) }).await;
        assert_eq!(r.expect("written"), 1);
    }
}

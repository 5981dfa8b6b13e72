//! Insert once, protected by a unique index; on a duplicate, re-read and check the row.

use std::future::Future;

use thiserror::Error;

use super::unique::unique_violation;

/// Whether an existing row may answer a repeated request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// The row stands: return it as the earlier result.
    Live,
    /// The row exists but must not be returned as success (soft-deleted, cancelled, still
    /// pending, …); the reason is reported.
    Gone(&'static str),
}

/// What [`insert_once`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InsertOnce<T> {
    /// This call inserted the row.
    Inserted(T),
    /// The row was there already (a duplicate request) and is live: the earlier result.
    Existing(T),
}

impl<T> InsertOnce<T> {
    /// The row, whichever way it came.
    pub fn into_inner(self) -> T {
        match self {
            Self::Inserted(t) | Self::Existing(t) => t,
        }
    }

    /// True when this call inserted the row.
    pub fn inserted(&self) -> bool {
        matches!(self, Self::Inserted(_))
    }
}

/// Why [`insert_once`] could not answer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InsertOnceError<R> {
    /// The insert failed for a reason other than a violation of the expected unique
    /// constraint (a foreign key, `NOT NULL`, another unique index, the connection, …).
    #[error("insert failed")]
    Insert(#[source] sqlx::Error),
    /// The re-read after a duplicate failed.
    #[error("re-reading the existing row failed")]
    Reread(#[source] sqlx::Error),
    /// A duplicate exists but must not be returned as success.
    #[error("a row with this key exists but is not live: {reason}")]
    NotLive {
        /// The existing row.
        existing: R,
        /// Why it is not live.
        reason: &'static str,
    },
    /// The insert kept meeting a duplicate that the re-read could not find (deleted in
    /// between, every time).
    #[error("duplicate reported but the existing row kept disappearing")]
    Vanished,
}

/// Inserts a business row protected by the unique constraint `constraint` (e.g.
/// `UNIQUE(user_id, idempotency_key)`; for SQLite give the `table.col, table.col` list it
/// reports).
///
/// `insert` runs the `INSERT` and returns the new row (as `fetch` would read it). When, and only when, it fails with a
/// unique violation of `constraint`, `fetch` re-reads the existing row by the same key and
/// `check` decides whether that row answers the request ([`Liveness::Live`]) or not (soft
/// deleted, in a state that must not be replayed). Any other error is returned as is: it is
/// never mistaken for a duplicate.
///
/// Run it in autocommit mode or inside a savepoint: on PostgreSQL a failed statement aborts
/// the surrounding transaction. The unique index makes a concurrent duplicate wait for the
/// first insert to commit, so the re-read finds a committed row.
///
/// # Errors
/// See [`InsertOnceError`].
pub async fn insert_once<R, I, IF, F, FF, C>(
    constraint: &str,
    mut insert: I,
    mut fetch: F,
    check: C,
) -> Result<InsertOnce<R>, InsertOnceError<R>>
where
    I: FnMut() -> IF,
    IF: Future<Output = Result<R, sqlx::Error>>,
    F: FnMut() -> FF,
    FF: Future<Output = Result<Option<R>, sqlx::Error>>,
    C: Fn(&R) -> Liveness,
{
    // A duplicate whose row is hard-deleted before the re-read: insert again (bounded).
    for _ in 0..3 {
        let err = match insert().await {
            Ok(row) => return Ok(InsertOnce::Inserted(row)),
            Err(e) => e,
        };
        if !unique_violation(&err).is_some_and(|v| v.is_on(constraint)) {
            return Err(InsertOnceError::Insert(err));
        }
        match fetch().await.map_err(InsertOnceError::Reread)? {
            Some(existing) => {
                return match check(&existing) {
                    Liveness::Live => Ok(InsertOnce::Existing(existing)),
                    Liveness::Gone(reason) => Err(InsertOnceError::NotLive { existing, reason }),
                };
            }
            None => continue,
        }
    }
    Err(InsertOnceError::Vanished)
}

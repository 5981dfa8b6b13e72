//! Optimistic locking: a version-checked update with bounded retries.

use std::future::Future;

use thiserror::Error;

/// A value read together with its version column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// Its version when read.
    pub version: i64,
}

/// Why [`optimistic`] gave up.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OptimisticError<E> {
    /// Every attempt found the version changed under it (0 rows affected).
    #[error("version conflict after {attempts} attempts")]
    Conflict {
        /// Attempts made.
        attempts: u32,
    },
    /// The read, the change or the write failed.
    #[error("optimistic update failed")]
    Failed(#[source] E),
}

/// Read–modify–write under a version check, retried up to `attempts` times.
///
/// `read` loads the value and its version; `write` gets them and runs `UPDATE … SET …,
/// version = version + 1 WHERE id = … AND version = <read version>`, returning the number of
/// rows it affected. One row: done, the value `write` was given is returned. Zero rows: someone
/// else updated in between (a lost update averted), so read again and retry. More than one row
/// means the `WHERE` is not a key, and is reported as a failure by the caller's `write`.
///
/// # Errors
/// [`OptimisticError::Conflict`] when every attempt lost; [`OptimisticError::Failed`] with the
/// first error of `read` or `write`.
pub async fn optimistic<T, E, R, RF, W, WF>(
    attempts: u32,
    mut read: R,
    mut write: W,
) -> Result<T, OptimisticError<E>>
where
    R: FnMut() -> RF,
    RF: Future<Output = Result<Versioned<T>, E>>,
    W: FnMut(Versioned<T>) -> WF,
    WF: Future<Output = Result<(u64, T), E>>,
{
    let attempts = attempts.max(1);
    for _ in 0..attempts {
        let current = read().await.map_err(OptimisticError::Failed)?;
        let (rows, written) = write(current).await.map_err(OptimisticError::Failed)?;
        if rows > 0 {
            return Ok(written);
        }
    }
    Err(OptimisticError::Conflict { attempts })
}

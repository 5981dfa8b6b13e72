//! What every lock backend shares: the error a guarded run ends with and the lease its work
//! receives. The locks themselves live with their backends (`idem_redis::RedisLock`, a lease
//! lock; `idem_sql::PgLock`, PostgreSQL advisory locks).
//!
//! A lock gives mutual exclusion for as long as its holder is known to hold it; it does not
//! make an operation idempotent (a retry after the lock is released runs again). Fences make
//! a late holder's writes harmless: hand [`LockLease::fence`] to every write and let the
//! target refuse older fences.

use thiserror::Error;
use tokio::sync::watch;

use crate::store::StoreError;

/// Longest lock name any backend accepts, in bytes.
pub const MAX_LOCK_NAME: usize = 200;

/// `name` if it is a lock name every backend accepts: 1 to [`MAX_LOCK_NAME`] printable ASCII
/// characters, no braces (a Redis key puts the name inside a `{…}` hash tag).
///
/// # Errors
/// [`LockError::BadName`] for any other name.
pub fn check_lock_name(name: &str) -> Result<&str, LockError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_LOCK_NAME
        && name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'{' && b != b'}');
    ok.then_some(name).ok_or(LockError::BadName)
}

/// Why a lock call did not run its work to the end.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LockError {
    /// Someone else holds the lock (and kept it for as long as the call was willing to wait).
    #[error("lock is held by another owner")]
    Busy,
    /// The lock could no longer be confirmed, so the work was cancelled: another holder may
    /// already have the lock. The work may have had effects before it was dropped.
    #[error("lock lease lost")]
    Lost,
    /// The lock name was refused.
    #[error("lock name must be 1-200 printable ASCII characters without braces")]
    BadName,
    /// The lock backend failed or timed out before the lock was held; the work never started.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What guarded work receives: its fence, and a signal raised when the lock is lost.
#[derive(Debug, Clone)]
pub struct LockLease {
    /// Strictly greater than every fence handed out earlier for this lock.
    pub fence: u64,
    lost: watch::Receiver<bool>,
}

impl LockLease {
    /// A lease with `fence`, and the sender that raises its loss signal.
    pub fn new(fence: u64) -> (Self, LossSignal) {
        let (tx, rx) = watch::channel(false);
        (Self { fence, lost: rx }, LossSignal(tx))
    }

    /// True once the lock was given up.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the lock is given up (never, if the work finishes first).
    pub async fn lost(&mut self) {
        // An error means the signal's owner is gone, which happens only after the work ended.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }
}

/// Raises a [`LockLease`]'s loss signal.
#[derive(Debug)]
pub struct LossSignal(watch::Sender<bool>);

impl LossSignal {
    /// Tells every clone of the lease that the lock is lost.
    pub fn raise(&self) {
        let _ = self.0.send(true);
    }
}

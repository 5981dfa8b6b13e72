//! Claims whose answer never came back.
//!
//! A claim that timed out or lost its connection may still have been applied: the store can
//! hold a processing record in this engine's name that nobody will ever run. Under `hold`
//! such a record would turn unknown when its lease runs out, and wait for a probe or an
//! operator, although this engine knows for certain that nothing ran under it: the handler
//! starts only after a claim's answer is seen. So the engine looks for it in the background
//! and gives the key back.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lease::timed_op;
use crate::key::ScopedKey;
use crate::record::{OwnerId, RecordState, ReleaseKind};
use crate::store::{Hold, Store};

/// Watches `key` from `sent_at` until the claim by `owner` could no longer matter (its lease
/// and two store timeouts later): if the store shows a record held by `owner`, processing or
/// marked unknown in its name, it is released as retryable. A record of anyone else, or a
/// completed one, ends the watch at once: it is not this engine's to touch.
pub(super) fn release_unseen_claim<S: Store>(
    store: Arc<S>,
    key: ScopedKey,
    owner: OwnerId,
    sent_at: Instant,
    lease: Duration,
    store_timeout: Duration,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let until = sent_at + lease + store_timeout * 2;
        let mut nap = Duration::from_millis(200);
        while Instant::now() < until {
            tokio::time::sleep(nap).await;
            nap = (nap * 2).min(Duration::from_secs(2));
            let record = match timed_op(store_timeout, store.get(&key)).await {
                Ok(Some(record)) => record,
                // Not there (yet): a claim still on its way may land later.
                Ok(None) => continue,
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "looking for an unseen claim failed; trying again");
                    continue;
                }
            };
            let ours = match &record.state {
                RecordState::Processing { owner: held, .. } => *held == owner,
                RecordState::Unknown { owner: held, .. } => *held == Some(owner),
                RecordState::Completed { .. } => false,
            };
            if !ours {
                return;
            }
            let hold = Hold::new(&key, owner, record.fence);
            let release = store.release(&hold, ReleaseKind::Retryable);
            match timed_op(store_timeout, release).await {
                Ok(_) => {
                    tracing::info!(key = %key, fence = record.fence, "released a claim whose answer was lost; nothing ran under it");
                    return;
                }
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "releasing an unseen claim failed; trying again");
                }
            }
        }
    });
}

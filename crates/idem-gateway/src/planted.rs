//! Deliberately broken gateways, for the fault suite to show it catches what it claims to.
//!
//! Only in builds with the `planted-bugs` feature, which no release enables. The variable
//! `CHAOS_PLANTED_BUG` names the bug; the store the gateway opens is wrapped to have it:
//!
//! | value | the bug | what the suite must see |
//! |---|---|---|
//! | `claim-skips-fencing` | a claim that finds the key held or unknown runs the handler anyway | two executions of one key |
//! | `answer-before-durable` | the completion is written in the background, after the answer | an answered key later found in flight, unknown or run again |
//! | `store-timeout-runs` | a claim the store failed (timeout, unreachable) runs the handler anyway | executions without a claim (no fence), doubles while the store is frozen |
//!
//! A bug's fake claim has fence 0, which no store grants.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Completion, Hold, StoreError};
use idem_core::{
    BoxStore, ClaimOutcome, ClaimRequest, Lease, OwnerId, SettleOutcome, Store, Timestamp,
};

/// The variable that names the planted bug.
pub(crate) const VARIABLE: &str = "CHAOS_PLANTED_BUG";

/// A planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bug {
    /// See the module table.
    ClaimSkipsFencing,
    /// See the module table.
    AnswerBeforeDurable,
    /// See the module table.
    StoreTimeoutRuns,
}

impl Bug {
    /// The bug `CHAOS_PLANTED_BUG` names, if any.
    ///
    /// # Errors
    /// An unknown name: a typo must not run a test against a sound gateway.
    pub(crate) fn from_env() -> anyhow::Result<Option<Self>> {
        match std::env::var(VARIABLE).ok().as_deref() {
            None | Some("") => Ok(None),
            Some("claim-skips-fencing") => Ok(Some(Self::ClaimSkipsFencing)),
            Some("answer-before-durable") => Ok(Some(Self::AnswerBeforeDurable)),
            Some("store-timeout-runs") => Ok(Some(Self::StoreTimeoutRuns)),
            Some(other) => anyhow::bail!("{VARIABLE}: no planted bug `{other}`"),
        }
    }
}

/// `store` with the bug `CHAOS_PLANTED_BUG` names, or as it is.
///
/// # Errors
/// See [`Bug::from_env`].
pub(crate) fn wrap(store: BoxStore) -> anyhow::Result<BoxStore> {
    Ok(match Bug::from_env()? {
        Some(bug) => {
            tracing::error!(
                ?bug,
                "this gateway has a planted bug: for the fault suite only"
            );
            BoxStore::new(Planted {
                inner: Arc::new(store),
                bug,
            })
        }
        None => store,
    })
}

/// A store with one planted bug.
#[derive(Clone, Debug)]
struct Planted {
    inner: Arc<BoxStore>,
    bug: Bug,
}

/// A claim no store granted: fence 0, a lease long enough to run anything.
fn fake_claim() -> ClaimOutcome {
    ClaimOutcome::Claimed {
        lease: Lease {
            owner: OwnerId::random(),
            fence: 0,
            deadline: Timestamp(u64::MAX / 2),
        },
        takeover: false,
    }
}

impl Store for Planted {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(req).await;
        match (self.bug, outcome) {
            (
                Bug::ClaimSkipsFencing,
                Ok(ClaimOutcome::Busy { .. } | ClaimOutcome::Unknown { .. }),
            ) => Ok(fake_claim()),
            (Bug::StoreTimeoutRuns, Err(_)) => Ok(fake_claim()),
            (_, other) => other,
        }
    }

    async fn complete(&self, completion: &Completion<'_>) -> Result<SettleOutcome, StoreError> {
        if self.bug != Bug::AnswerBeforeDurable {
            return self.inner.complete(completion).await;
        }
        let Completion {
            hold,
            response,
            ttl,
        } = *completion;
        let (owner, fence) = (hold.owner, hold.fence);
        let (inner, key, response) = (Arc::clone(&self.inner), hold.key.clone(), response.clone());
        tokio::spawn(async move {
            // Long enough for a kill to land between the answer and the write.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let _ = inner
                .complete(&Completion::new(
                    Hold::new(&key, owner, fence),
                    &response,
                    ttl,
                ))
                .await;
        });
        Ok(SettleOutcome::Settled)
    }

    idem_core::forward_store!(|p| &*p.inner; renew, release, get, list, resolve, delete, audit);
}

//! Races: many tasks claiming one key at once.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::Hold;
use idem_core::{ClaimOutcome, OwnerId, RecordState, ScopedKey, SettleOutcome, StoredResponse};
use tokio::sync::Barrier;

use crate::ctx::{Ctx, fp};
use crate::harness::Harness;

/// How many tasks the race rules start.
pub const RACERS: usize = 64;

async fn race<H: Harness>(
    c: &Ctx<'_, H>,
    key: &ScopedKey,
    lease: Duration,
) -> Vec<(idem_core::ClaimRequest, ClaimOutcome)> {
    race_with(c, key, lease, |_| fp(1)).await
}

/// Starts `RACERS` claims of `key` at once; racer `i` sends fingerprint `fingerprint(i)`.
async fn race_with<H: Harness>(
    c: &Ctx<'_, H>,
    key: &ScopedKey,
    lease: Duration,
    fingerprint: impl Fn(usize) -> idem_core::Fingerprint,
) -> Vec<(idem_core::ClaimRequest, ClaimOutcome)> {
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut tasks = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let store = c.store.clone();
        let barrier = barrier.clone();
        let mut req = c.req(key, fingerprint(i));
        req.lease = lease;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let outcome = idem_core::Store::claim(&store, &req).await;
            (req, outcome)
        }));
    }
    let mut out = Vec::with_capacity(RACERS);
    for t in tasks {
        let (req, outcome) = t.await.expect("racer panicked");
        out.push((req, outcome.expect("store error in race")));
    }
    out
}

fn one_winner(
    results: &[(idem_core::ClaimRequest, ClaimOutcome)],
    takeover: bool,
) -> (OwnerId, u64) {
    let winners: Vec<_> = results
        .iter()
        .filter_map(|(req, o)| match o {
            ClaimOutcome::Claimed { lease, takeover: t } => Some((req.owner, lease.fence, *t)),
            _ => None,
        })
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {RACERS} racing claims may win, {} did: {winners:?}",
        winners.len()
    );
    assert_eq!(winners[0].2, takeover, "the winner's takeover flag");
    let losers = results
        .iter()
        .filter(|(_, o)| matches!(o, ClaimOutcome::Busy { .. }))
        .count();
    assert_eq!(losers, RACERS - 1, "every other racer must be busy");
    (winners[0].0, winners[0].1)
}

/// `RACERS` tasks claim one absent key at once: exactly one is `Claimed`, every other `Busy`,
/// and the record names the winner.
pub async fn race_one_claim_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race").await;
    // A race may by luck not interleave; three rounds on fresh keys give a broken store three
    // chances to show it.
    for round in ["r0", "r1"] {
        let k = c.key(round);
        one_winner(&race(&c, &k, c.lease * 10).await, false);
    }
    let k = c.key("k");
    let results = race(&c, &k, c.lease * 10).await;
    let (owner, fence) = one_winner(&results, false);
    let rec = c.record(&k).await;
    assert_eq!(rec.fence, fence);
    assert!(matches!(rec.state, RecordState::Processing { owner: o, .. } if o == owner));

    // Once the winner completes, every racer replays the same response.
    let response = StoredResponse::new(201, "the one execution");
    assert_eq!(
        c.complete_as(Hold::new(&k, owner, fence), &response).await,
        SettleOutcome::Settled
    );
    for (_, outcome) in race(&c, &k, c.lease * 10).await {
        assert_eq!(
            outcome,
            ClaimOutcome::Done {
                response: response.clone()
            }
        );
    }
}

/// `RACERS` tasks claim one absent key at once with two different fingerprints: exactly one
/// is `Claimed`; every racer with the winner's fingerprint is `Busy`, every other a
/// `Mismatch` naming the winner's fingerprint.
pub async fn race_mixed_fingerprints_one_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race-mixed").await;
    let k = c.key("k");
    let results = race_with(&c, &k, c.lease * 10, |i| fp(1 + (i % 2) as u8)).await;
    let winners: Vec<_> = results
        .iter()
        .filter(|(_, o)| matches!(o, ClaimOutcome::Claimed { .. }))
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one racing claim may win: {winners:?}"
    );
    let won_with = winners[0].0.fingerprint;
    for (req, outcome) in &results {
        match outcome {
            ClaimOutcome::Claimed { .. } => {}
            ClaimOutcome::Busy { .. } => {
                assert_eq!(req.fingerprint, won_with, "busy for another request")
            }
            ClaimOutcome::Mismatch { stored } => {
                assert_ne!(
                    req.fingerprint, won_with,
                    "mismatch for the winner's own request"
                );
                assert_eq!(
                    *stored, won_with,
                    "mismatch must name the winner's fingerprint"
                );
            }
            other => panic!("racing claim answered {other:?}"),
        }
    }
    assert_eq!(c.record(&k).await.fingerprint, won_with);
}

/// `RACERS` tasks claim one key whose lease has run out: exactly one takes it over.
pub async fn race_one_takeover_wins<H: Harness>(h: &H) {
    let c = Ctx::new(h, "race-takeover").await;
    let k = c.key("k");
    let a = c.claimed(&k).await;
    c.wait_out_lease().await;
    let results = race(&c, &k, c.lease * 10).await;
    let (owner, fence) = one_winner(&results, true);
    assert!(fence > a.fence);
    let rec = c.record(&k).await;
    assert!(matches!(rec.state, RecordState::Processing { owner: o, .. } if o == owner));
}

//! One case in progress: applying an operation to the store and the model, and checking
//! the store's answer against the model's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, Lease, OwnerId, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, TakeoverPolicy,
};

use super::coverage::claim_branch;
use super::ensure;
use super::ops::{Forge, Op, ResolveFence, response};
use super::reference::{Model, ModelClaim, ModelRecord, ModelState};
use crate::ctx::fp;
use crate::harness::Harness;

/// A lease the store granted during a case.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    key: u8,
    owner: OwnerId,
    fence: u64,
}

/// One case in progress: the store, the model, and what is needed to relate them.
pub(super) struct Case<'h, H: Harness> {
    pub(super) h: &'h H,
    pub(super) store: H::Store,
    pub(super) model: Model,
    pub(super) keys: Vec<ScopedKey>,
    pub(super) ns: String,
    pub(super) step_ms: u64,
    /// Store-clock milliseconds at model time 0, learned from the first lease.
    pub(super) origin: Option<i128>,
    /// How far store timestamps may run ahead of the model's (real-server latency).
    pub(super) slack_ms: i128,
    /// When the case started: a real-clock case whose latency outgrows the slack is
    /// inconclusive rather than failed.
    pub(super) started: std::time::Instant,
    pub(super) holders: Vec<Held>,
    /// Highest fence the store ever granted per key.
    pub(super) high_fence: BTreeMap<u8, u64>,
    pub(super) log: String,
    /// How often each branch of the contract was exercised.
    pub(super) hits: BTreeMap<&'static str, u64>,
}

/// A check's verdict: the disagreement, if any.
pub(super) type Checked = Result<(), String>;

/// A store failure, as a case's failure.
pub(super) fn store_error(e: impl std::fmt::Display) -> String {
    format!("store error: {e}")
}

impl<'h, H: Harness> Case<'h, H> {
    pub(super) fn steps(&self, n: u64) -> Duration {
        Duration::from_millis(self.step_ms * n)
    }

    /// Checks a store timestamp against model time `at` (in steps), learning the origin from
    /// the first one.
    pub(super) fn time(&mut self, what: &str, got: idem_core::Timestamp, at: u64) -> Checked {
        let predicted_offset = i128::from(at) * i128::from(self.step_ms);
        let got = i128::from(got.as_millis());
        let origin = *self.origin.get_or_insert(got - predicted_offset);
        let drift = got - (origin + predicted_offset);
        ensure!(
            (0..=self.slack_ms).contains(&drift),
            "{what}: store time is {drift} ms off the model's (model step {at}, allowed 0..={} ms)",
            self.slack_ms
        );
        Ok(())
    }

    /// Whether real time has run ahead of model time by more than the slack: then store
    /// timestamps, and outcomes near a deadline, may no longer match the model.
    pub(super) fn too_slow(&self) -> bool {
        if self.h.time_travel() {
            return false;
        }
        let model_ms = u128::from(self.step_ms) * u128::from(self.model.now);
        let lag = self.started.elapsed().as_millis().saturating_sub(model_ms);
        lag > u128::try_from(self.slack_ms).unwrap_or(0)
    }

    fn hit(&mut self, branch: &'static str) {
        *self.hits.entry(branch).or_default() += 1;
    }

    /// The model's record of `key` as stored, expired or not.
    fn snapshot(&self, key: u8) -> Option<ModelRecord> {
        self.model.records.get(&key).cloned()
    }

    fn settle_branches(
        &mut self,
        forge: Forge,
        pre: Option<&ModelRecord>,
        settled: bool,
        branch: &'static str,
    ) {
        self.hit(branch);
        if forge != Forge::Genuine {
            self.hit("forged holder");
        }
        let lease_over = pre.is_some_and(
            |r| matches!(r.state, ModelState::Processing { lease_until, .. } if lease_until <= self.model.now),
        );
        if settled && lease_over {
            self.hit("late holder settles");
        }
    }

    fn holder(&self, index: u8, forge: Forge) -> Held {
        let Some(held) = self
            .holders
            .len()
            .checked_sub(1 + usize::from(index) % self.holders.len().max(1))
            .map(|i| self.holders[i])
        else {
            return Held {
                key: 0,
                owner: OwnerId::random(),
                fence: 1,
            };
        };
        match forge {
            Forge::Genuine => held,
            Forge::OtherOwner => Held {
                owner: OwnerId::random(),
                ..held
            },
            Forge::FenceUp => Held {
                fence: held.fence + 1,
                ..held
            },
            Forge::FenceDown => Held {
                fence: held.fence.saturating_sub(1),
                ..held
            },
        }
    }

    /// Applies one operation to the store and the model and checks the store's answer.
    pub(super) async fn apply(&mut self, op: &Op) -> Checked {
        match *op {
            Op::Claim {
                key,
                fp: f,
                hold,
                lease,
                ttl,
                request_id,
            } => {
                self.apply_claim(key, f, hold, lease, ttl, request_id)
                    .await?
            }
            Op::Renew {
                holder,
                forge,
                lease,
            } => self.apply_renew(holder, forge, lease).await?,
            Op::Complete {
                holder,
                forge,
                response: r,
                ttl,
            } => self.apply_complete(holder, forge, r, ttl).await?,
            Op::Release {
                holder,
                forge,
                unknown,
            } => self.apply_release(holder, forge, unknown).await?,
            Op::Resolve {
                key,
                complete,
                fence,
            } => self.apply_resolve(key, complete, fence).await?,
            Op::Delete { key } => self.apply_delete(key).await?,
            Op::Get { key } => {
                self.hit("get");
                self.compare(key).await?;
            }
            Op::List { state, limit } => {
                self.hit(if limit == 0 { "list" } else { "list: limited" });
                self.compare_list(state, limit).await?;
            }
            Op::Advance { steps } => {
                self.h.advance(self.steps(steps.into())).await;
                self.model.now += u64::from(steps);
            }
        }
        Ok(())
    }

    /// Claims `key` in the store and the model and checks the store's outcome.
    async fn apply_claim(
        &mut self,
        key: u8,
        f: u8,
        hold: bool,
        lease: u8,
        ttl: u8,
        request_id: bool,
    ) -> Checked {
        let owner = OwnerId::random();
        let request_id = request_id.then(|| format!("req-{}", self.holders.len()));
        let req = ClaimRequest {
            key: self.keys[usize::from(key)].clone(),
            fingerprint: fp(f),
            owner,
            lease: self.steps(lease.into()),
            ttl: self.steps(ttl.into()),
            takeover: if hold {
                TakeoverPolicy::Hold
            } else {
                TakeoverPolicy::Reexecute
            },
            request_id: request_id.clone(),
        };
        let got = self.store.claim(&req).await.map_err(store_error)?;
        let pre = self.snapshot(key);
        let want = self
            .model
            .claim(key, f, owner, hold, lease.into(), ttl.into(), request_id);
        self.hit(claim_branch(&want, pre.as_ref(), self.model.now));
        let _ = write!(self.log, " => {got:?}");
        self.check_claim(key, owner, lease, &want, &got)
    }

    /// Checks a claim's outcome in the store against the model's.
    fn check_claim(
        &mut self,
        key: u8,
        owner: OwnerId,
        lease: u8,
        want: &ModelClaim,
        got: &ClaimOutcome,
    ) -> Checked {
        match (want, got) {
            (
                ModelClaim::Claimed { takeover: w },
                ClaimOutcome::Claimed {
                    lease: l,
                    takeover: g,
                },
            ) => {
                ensure!(w == g, "claim: takeover flag {g}, model says {w}");
                self.check_granted(key, owner, lease, l)?;
            }
            (ModelClaim::Busy { steps }, ClaimOutcome::Busy { retry_after }) => {
                let want_ms = i128::from(self.step_ms * steps);
                let got_ms = i128::try_from(retry_after.as_millis()).unwrap_or(i128::MAX);
                ensure!(
                    got_ms <= want_ms && got_ms >= want_ms - self.slack_ms && got_ms > 0,
                    "busy: retry_after {got_ms} ms, model says {want_ms} ms"
                );
            }
            (ModelClaim::Done { response: r }, ClaimOutcome::Done { response: got_r }) => {
                ensure!(
                    *got_r == response(*r),
                    "done: replayed response differs from response #{r}"
                );
            }
            (
                ModelClaim::Unknown { fence: w, age },
                ClaimOutcome::Unknown {
                    fence: g,
                    age: got_age,
                },
            ) => {
                ensure!(w == g, "unknown: fence {g}, model says {w}");
                // The store's age may run ahead of the model's by the case's slack
                // (its created_at does), never behind it.
                let want_ms = i128::from(self.step_ms * age);
                let got_ms = i128::try_from(got_age.as_millis()).unwrap_or(i128::MAX);
                ensure!(
                    got_ms <= want_ms + self.slack_ms && got_ms >= want_ms - self.slack_ms,
                    "unknown: attempt age {got_ms} ms, model says {want_ms} ms"
                );
            }
            (ModelClaim::Mismatch { stored }, ClaimOutcome::Mismatch { stored: s }) => {
                ensure!(
                    *s == fp(*stored),
                    "mismatch: reports another stored fingerprint"
                );
            }
            _ => {
                return Err(format!(
                    "claim: store answered {got:?}, model says {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// Checks a lease the store granted for `key` and records it as a holder.
    fn check_granted(&mut self, key: u8, owner: OwnerId, lease: u8, l: &Lease) -> Checked {
        ensure!(l.owner == owner, "claim: lease names another owner");
        let high = self.high_fence.get(&key).copied().unwrap_or(0);
        ensure!(
            l.fence > high,
            "claim: fence {} is not above the key's earlier fence {high}",
            l.fence
        );
        self.high_fence.insert(key, l.fence);
        self.model.granted(key, l.fence);
        self.holders.push(Held {
            key,
            owner,
            fence: l.fence,
        });
        self.time(
            "claim: lease deadline",
            l.deadline,
            self.model.now + u64::from(lease),
        )
    }

    /// Renews a holder's lease in the store and the model and checks the store's outcome.
    async fn apply_renew(&mut self, holder: u8, forge: Forge, lease: u8) -> Checked {
        let held = self.holder(holder, forge);
        let key = &self.keys[usize::from(held.key)];
        let got = self
            .store
            .renew(
                &Hold::new(key, held.owner, held.fence),
                self.steps(lease.into()),
            )
            .await
            .map_err(store_error)?;
        let _ = write!(self.log, " [{held:?}] => {got:?}");
        let pre = self.snapshot(held.key);
        let want = self
            .model
            .renew(held.key, held.owner, held.fence, lease.into());
        self.settle_branches(
            forge,
            pre.as_ref(),
            want,
            if want {
                "renew: renewed"
            } else {
                "renew: lost"
            },
        );
        match got {
            RenewOutcome::Renewed { deadline } if want => {
                self.time(
                    "renew: deadline",
                    deadline,
                    self.model.now + u64::from(lease),
                )?;
            }
            RenewOutcome::Lost if !want => {}
            _ => {
                return Err(format!(
                    "renew: store answered {got:?}, model says renewed={want}"
                ));
            }
        }
        Ok(())
    }

    /// Completes as a holder in the store and the model and checks the store's outcome.
    async fn apply_complete(&mut self, holder: u8, forge: Forge, r: u8, ttl: u8) -> Checked {
        let held = self.holder(holder, forge);
        let key = &self.keys[usize::from(held.key)];
        let got = self
            .store
            .complete(&Completion::new(
                Hold::new(key, held.owner, held.fence),
                &response(r),
                self.steps(ttl.into()),
            ))
            .await
            .map_err(store_error)?;
        let _ = write!(self.log, " [{held:?}] => {got:?}");
        let pre = self.snapshot(held.key);
        let want = self
            .model
            .complete(held.key, held.owner, held.fence, r, ttl.into());
        self.settle_branches(
            forge,
            pre.as_ref(),
            want,
            if want {
                "complete: settled"
            } else {
                "complete: fenced"
            },
        );
        ensure!(
            (got == SettleOutcome::Settled) == want,
            "complete: store answered {got:?}, model says settled={want}"
        );
        Ok(())
    }

    /// Releases as a holder in the store and the model and checks the store's outcome.
    async fn apply_release(&mut self, holder: u8, forge: Forge, unknown: bool) -> Checked {
        let held = self.holder(holder, forge);
        let key = &self.keys[usize::from(held.key)];
        let kind = if unknown {
            ReleaseKind::Unknown
        } else {
            ReleaseKind::Retryable
        };
        let got = self
            .store
            .release(&Hold::new(key, held.owner, held.fence), kind)
            .await
            .map_err(store_error)?;
        let _ = write!(self.log, " [{held:?}] => {got:?}");
        let pre = self.snapshot(held.key);
        let want = self
            .model
            .release(held.key, held.owner, held.fence, unknown);
        let branch = match (want, unknown) {
            (false, _) => "release: fenced",
            (true, false) => "release: retryable",
            (true, true) => "release: unknown",
        };
        self.settle_branches(forge, pre.as_ref(), want, branch);
        ensure!(
            (got == SettleOutcome::Settled) == want,
            "release: store answered {got:?}, model says settled={want}"
        );
        Ok(())
    }

    /// Resolves `key` in the store and the model and checks the store's outcome.
    async fn apply_resolve(
        &mut self,
        key: u8,
        complete: Option<(u8, u8)>,
        fence: Option<ResolveFence>,
    ) -> Checked {
        let resolution = match complete {
            Some((r, ttl)) => Resolution::Complete {
                response: response(r),
                ttl: self.steps(ttl.into()),
            },
            None => Resolution::Release,
        };
        let latest = self.high_fence.get(&key).copied().unwrap_or(1);
        let fence = fence.map(|f| match f {
            ResolveFence::Current => latest,
            ResolveFence::Stale => latest.saturating_sub(1),
        });
        let got = self
            .store
            .resolve(&self.keys[usize::from(key)], &resolution, fence)
            .await
            .map_err(store_error)?;
        let _ = write!(self.log, " => {got:?}");
        let pre = self.snapshot(key);
        let want = self
            .model
            .resolve(key, complete.map(|(r, ttl)| (r, u64::from(ttl))), fence);
        self.hit(resolve_branch(want, pre.as_ref(), complete.is_some()));
        ensure!(
            got == want,
            "resolve: store answered {got:?}, model says {want:?}"
        );
        Ok(())
    }

    /// Deletes `key` in the store and the model and checks the store's answer.
    async fn apply_delete(&mut self, key: u8) -> Checked {
        let got = self
            .store
            .delete(&self.keys[usize::from(key)])
            .await
            .map_err(store_error)?;
        let _ = write!(self.log, " => {got:?}");
        let want = self.model.delete(key);
        self.hit(if want {
            "delete: existed"
        } else {
            "delete: absent"
        });
        ensure!(
            got == want,
            "delete: store answered {got}, model says {want}"
        );
        Ok(())
    }
}

/// The contract branch a resolve exercised, from the model's outcome and its record before.
fn resolve_branch(
    want: ResolveOutcome,
    pre: Option<&ModelRecord>,
    completes: bool,
) -> &'static str {
    match (want, completes) {
        (ResolveOutcome::Fenced { .. }, _) => "resolve: fenced",
        (ResolveOutcome::Resolved, _)
            if matches!(pre.map(|r| &r.state), Some(ModelState::Processing { .. })) =>
        {
            "resolve: expired lease"
        }
        (ResolveOutcome::Resolved, true) => "resolve: unknown completed",
        (ResolveOutcome::Resolved, false) => "resolve: unknown released",
        (ResolveOutcome::NotFound, _) => "resolve: not found",
        _ => "resolve: not resolvable",
    }
}

//! Comparing what the store holds with what the model holds.

use std::collections::BTreeSet;

use idem_core::{ListFilter, Record, RecordState, StateKind, Store};

use super::case::{Case, Checked, store_error};
use super::ensure;
use super::ops::response;
use super::reference::{Model, ModelRecord, ModelState};
use crate::ctx::fp;
use crate::harness::Harness;

impl<H: Harness> Case<'_, H> {
    pub(super) async fn compare(&mut self, key: u8) -> Checked {
        let got = self
            .store
            .get(&self.keys[usize::from(key)])
            .await
            .map_err(store_error)?;
        let want = self.model.live(key).cloned();
        match (got, want) {
            (None, None) => Ok(()),
            (Some(g), Some(w)) => self.compare_record(key, &g, &w),
            (g, w) => Err(format!("get k{key}: store has {g:?}, model has {w:?}")),
        }
    }

    pub(super) fn compare_record(&mut self, key: u8, g: &Record, w: &ModelRecord) -> Checked {
        ensure!(
            g.key == self.keys[usize::from(key)],
            "k{key}: record names key {}",
            g.key
        );
        ensure!(
            g.fingerprint == fp(w.fp),
            "k{key}: fingerprint differs (model: #{})",
            w.fp
        );
        ensure!(
            g.fence == w.fence,
            "k{key}: fence {} but the latest grant was {}",
            g.fence,
            w.fence
        );
        ensure!(
            g.request_id == w.request_id,
            "k{key}: request id {:?}, model {:?}",
            g.request_id,
            w.request_id
        );
        self.time(&format!("k{key}: created_at"), g.created_at, w.created)?;
        self.time(&format!("k{key}: expires_at"), g.expires_at, w.expires)?;
        match (&g.state, &w.state) {
            (
                RecordState::Processing { owner, lease_until },
                ModelState::Processing {
                    owner: o,
                    lease_until: l,
                },
            ) => {
                ensure!(owner == o, "k{key}: processing owner differs");
                self.time(&format!("k{key}: lease_until"), *lease_until, *l)?;
            }
            (
                RecordState::Completed {
                    response: r,
                    completed_at,
                },
                ModelState::Completed { response: i, at },
            ) => {
                ensure!(
                    *r == response(*i),
                    "k{key}: stored response differs from #{i}"
                );
                self.time(&format!("k{key}: completed_at"), *completed_at, *at)?;
            }
            (RecordState::Unknown { since, owner }, ModelState::Unknown { since: s, owner: o }) => {
                ensure!(
                    owner == o,
                    "k{key}: unknown names holder {owner:?}, model {o:?}"
                );
                self.time(&format!("k{key}: unknown since"), *since, *s)?;
            }
            (g, w) => return Err(format!("k{key}: store state {g:?}, model state {w:?}")),
        }
        Ok(())
    }

    pub(super) async fn compare_list(&mut self, state: Option<StateKind>, limit: u8) -> Checked {
        let filter = ListFilter {
            namespace: Some(self.ns.clone()),
            state,
            limit: usize::from(limit),
            ..ListFilter::default()
        };
        let got = self.store.list(&filter).await.map_err(store_error)?;
        ensure!(
            got.windows(2).all(|w| w[0].created_at <= w[1].created_at),
            "list: not ordered oldest first"
        );
        let want = self.model.list(state);
        let mut seen = BTreeSet::new();
        for rec in &got {
            let Some(k) = self.keys.iter().position(|k| *k == rec.key) else {
                return Err(format!("list: foreign record {}", rec.key));
            };
            let k = u8::try_from(k).unwrap_or(u8::MAX);
            ensure!(seen.insert(k), "list: k{k} listed twice");
            let Some(w) = self.model.live(k).cloned() else {
                return Err(format!(
                    "list {state:?}: store lists k{k}, model has no record"
                ));
            };
            self.compare_record(k, rec, &w)?;
        }
        if limit == 0 || want.len() <= usize::from(limit) {
            ensure!(
                seen == want,
                "list {state:?}: store lists {seen:?}, model {want:?}"
            );
            return Ok(());
        }
        // Limited: the `limit` oldest (ties in model time may go either way).
        ensure!(
            seen.len() == usize::from(limit),
            "list {state:?} limit {limit}: store lists {seen:?} of {want:?}"
        );
        let created = |m: &mut Model, k: u8| m.live(k).map_or(0, |r| r.created);
        let newest_listed = seen.iter().map(|&k| created(&mut self.model, k)).max();
        let oldest_left = want
            .difference(&seen)
            .map(|&k| created(&mut self.model, k))
            .min();
        ensure!(
            newest_listed <= oldest_left,
            "list {state:?} limit {limit}: store lists {seen:?}, not the oldest of {want:?}"
        );
        Ok(())
    }
}

//! Deleting expired rows (tombstones included): one pass, or a background task.

use std::time::Duration;

use idem_core::StoreError;

use crate::SqlStore;
use crate::dialect::{Dialect, Written};
use crate::driver::{On, Value};
use crate::statements::Param;

impl<D: Dialect> SqlStore<D> {
    /// Deletes expired rows (tombstones included), `batch` at a time, until a batch comes back
    /// short. Each batch is its own short statement, so other writers wait at most one batch
    /// (PostgreSQL skips rows another statement holds). Then deletes audit events older than
    /// the audit retention, in batches the same way. Returns how many record rows were
    /// deleted.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database failed; rows deleted before stay deleted.
    pub async fn reap(&self, batch: u32) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let args = [(Param::Limit, Value::Int(i64::from(batch)))];
        let mut total = 0;
        loop {
            let done = D::execute(On::Pool(&self.writer), &self.sql.reap, &args)
                .await
                .map_err(StoreError::unavailable)?
                .rows();
            total += done;
            if done < u64::from(batch) {
                break;
            }
        }
        let args = [
            (Param::Age, Value::Int(crate::record::ms(self.audit_age))),
            (Param::Limit, Value::Int(i64::from(batch))),
        ];
        loop {
            let done = D::execute(On::Pool(&self.writer), &self.sql.audit_reap, &args)
                .await
                .map_err(StoreError::unavailable)?
                .rows();
            if done < u64::from(batch) {
                return Ok(total);
            }
        }
    }

    /// Runs [`SqlStore::reap`] every `every` on the current tokio runtime, until the handle is
    /// aborted. Failures are logged and retried on the next tick.
    pub fn spawn_reaper(&self, every: Duration, batch: u32) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let table = store.table();
                match store.reap(batch).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(reaped = n, table = %table, "idem-sql reaper"),
                    Err(e) => tracing::warn!(error = %e, table = %table, "idem-sql reaper failed"),
                }
            }
        })
    }
}

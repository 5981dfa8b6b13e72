//! What the three backends share: the table name, the row shape, and how a returned row
//! becomes an outcome.

use std::fmt;

use idem_core::decide::{self, Change};
use idem_core::fingerprint::Fingerprint;
use idem_core::record::CodecError;
use idem_core::{
    ClaimOutcome, ClaimRequest, Key, Lease, OwnerId, Record, RecordState, ResolveOutcome, Scope,
    ScopedKey, StateKind, StoreError, StoredResponse, Timestamp,
};
use thiserror::Error;

/// The table used when none is configured.
pub const DEFAULT_TABLE: &str = "idem_records";

/// Longest table name accepted: leaves room for the suffixes of index and migration tables
/// within PostgreSQL's 63-byte identifier limit.
const MAX_TABLE_LEN: usize = 48;

/// A validated table name: an ASCII letter or `_`, then letters, digits or `_`, at most 48
/// characters. It is spliced into SQL, so nothing else is ever accepted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

/// A table name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "invalid table name {0:?}: use 1-48 ASCII letters, digits or '_', not starting with a digit"
)]
pub struct TableNameError(pub String);

impl TableName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`TableNameError`] unless `name` is 1–48 characters of `[A-Za-z0-9_]`, not starting
    /// with a digit.
    pub fn new(name: impl Into<String>) -> Result<Self, TableNameError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_TABLE_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !name.as_bytes()[0].is_ascii_digit();
        if ok {
            Ok(Self(name))
        } else {
            Err(TableNameError(name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(DEFAULT_TABLE.to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({})", self.0)
    }
}

/// `state` column values.
pub(crate) const PROCESSING: i16 = 0;
pub(crate) const COMPLETED: i16 = 1;
pub(crate) const UNKNOWN: i16 = 2;

/// `verdict` column values: what the last claim statement did to the row (1 is a fresh
/// claim, 0 no write).
pub(crate) const VERDICT_TAKEOVER: i16 = 2;
pub(crate) const VERDICT_HOLD: i16 = 3;

/// Columns every read returns, in this order (decoded by position: see `raw_record!`).
pub(crate) const COLUMNS: &str = "namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until, \
     response, state_at, request_id, created_at, expires_at, verdict";

/// How many columns [`COLUMNS`] names.
#[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
pub(crate) const COLUMN_COUNT: usize = 14;

/// Replaces `{t}` in a statement template with the table name.
pub(crate) fn sql(template: &str, table: &TableName) -> String {
    template.replace("{t}", table.as_str())
}

pub(crate) fn state_code(kind: StateKind) -> i16 {
    match kind {
        StateKind::Processing => PROCESSING,
        StateKind::Completed => COMPLETED,
        _ => UNKNOWN,
    }
}

/// One row as the database returns it.
#[derive(Debug)]
pub(crate) struct RawRecord {
    pub(crate) namespace: String,
    pub(crate) principal: Option<String>,
    pub(crate) key: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) fence: i64,
    pub(crate) state: i16,
    pub(crate) owner: Option<Vec<u8>>,
    pub(crate) lease_until: i64,
    pub(crate) response: Option<Vec<u8>>,
    pub(crate) state_at: i64,
    pub(crate) request_id: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) expires_at: i64,
    pub(crate) verdict: i16,
}

/// Decodes the [`COLUMNS`] of a row, starting at column `offset`. By position: MariaDB
/// reports no column names when preparing `INSERT … RETURNING`. With `bytes`, text columns are
/// read as bytes (MySQL: sqlx refuses `String` for binary-collated text, which the table uses
/// so that keys compare byte for byte).
macro_rules! raw_record {
    ($row:expr, $offset:expr) => {{
        use ::sqlx::Row as _;
        let row = $row;
        let at: usize = $offset;
        (|| -> Result<$crate::common::RawRecord, ::sqlx::Error> {
            Ok($crate::common::RawRecord {
                namespace: row.try_get(at)?,
                principal: row.try_get(at + 1)?,
                key: row.try_get(at + 2)?,
                fingerprint: row.try_get(at + 3)?,
                fence: row.try_get(at + 4)?,
                state: row.try_get(at + 5)?,
                owner: row.try_get(at + 6)?,
                lease_until: row.try_get(at + 7)?,
                response: row.try_get(at + 8)?,
                state_at: row.try_get(at + 9)?,
                request_id: row.try_get(at + 10)?,
                created_at: row.try_get(at + 11)?,
                expires_at: row.try_get(at + 12)?,
                verdict: row.try_get(at + 13)?,
            })
        })()
        .map_err(::idem_core::StoreError::unavailable)
    }};
    ($row:expr, $offset:expr, bytes) => {{
        use ::sqlx::Row as _;
        let row = $row;
        let at: usize = $offset;
        (|| -> Result<$crate::common::RawRecord, ::sqlx::Error> {
            Ok($crate::common::RawRecord {
                namespace: $crate::common::text(row.try_get(at)?)?,
                principal: $crate::common::opt_text(row.try_get(at + 1)?)?,
                key: $crate::common::text(row.try_get(at + 2)?)?,
                fingerprint: row.try_get(at + 3)?,
                fence: row.try_get(at + 4)?,
                state: row.try_get(at + 5)?,
                owner: row.try_get(at + 6)?,
                lease_until: row.try_get(at + 7)?,
                response: row.try_get(at + 8)?,
                state_at: row.try_get(at + 9)?,
                request_id: $crate::common::opt_text(row.try_get(at + 10)?)?,
                created_at: row.try_get(at + 11)?,
                expires_at: row.try_get(at + 12)?,
                verdict: row.try_get(at + 13)?,
            })
        })()
        .map_err(::idem_core::StoreError::unavailable)
    }};
}
pub(crate) use raw_record;

#[allow(dead_code)]
pub(crate) fn text(raw: Vec<u8>) -> Result<String, sqlx::Error> {
    String::from_utf8(raw).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

#[allow(dead_code)]
pub(crate) fn opt_text(raw: Option<Vec<u8>>) -> Result<Option<String>, sqlx::Error> {
    raw.map(text).transpose()
}

pub(crate) fn ts(ms: i64) -> Timestamp {
    Timestamp(u64::try_from(ms).unwrap_or(0))
}

pub(crate) fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(idem_core::record::duration_ms(d)).unwrap_or(i64::MAX)
}

/// A fence as stored (BIGINT); fences come from the clock in microseconds, far below 2^63.
pub(crate) fn fence_param(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

fn codec(what: &'static str) -> StoreError {
    StoreError::Codec(CodecError(what))
}

impl RawRecord {
    pub(crate) fn into_record(self) -> Result<Record, StoreError> {
        let scope = Scope::new(self.namespace).map_err(|_| codec("stored namespace is invalid"))?;
        let scope = match self.principal {
            Some(p) => scope.with_principal(p),
            None => scope,
        };
        let key = Key::new(self.key).map_err(|_| codec("stored key is invalid"))?;
        let fingerprint = Fingerprint::from_bytes(&self.fingerprint)
            .map_err(|_| codec("stored fingerprint is invalid"))?;
        let fence = u64::try_from(self.fence).map_err(|_| codec("stored fence is negative"))?;
        let state = match self.state {
            PROCESSING => {
                let owner = self
                    .owner
                    .as_deref()
                    .and_then(owner_id)
                    .ok_or_else(|| codec("processing record without owner"))?;
                RecordState::Processing {
                    owner,
                    lease_until: ts(self.lease_until),
                }
            }
            COMPLETED => {
                let raw = self
                    .response
                    .ok_or_else(|| codec("completed record without response"))?;
                RecordState::Completed {
                    response: StoredResponse::decode(&raw)?,
                    completed_at: ts(self.state_at),
                }
            }
            UNKNOWN => RecordState::Unknown {
                since: ts(self.state_at),
            },
            _ => return Err(codec("unknown state code")),
        };
        Ok(Record {
            key: ScopedKey::new(scope, key),
            fingerprint,
            fence,
            request_id: self.request_id,
            created_at: ts(self.created_at),
            expires_at: ts(self.expires_at),
            state,
        })
    }
}

pub(crate) fn owner_id(raw: &[u8]) -> Option<OwnerId> {
    let bytes: [u8; 16] = raw.try_into().ok()?;
    Some(OwnerId(u128::from_be_bytes(bytes)))
}

/// What a claim statement's answer means. `wrote` says the row came back from the write
/// (its `verdict` says which write); otherwise `row` is the record as the statement read it
/// (or `None`: absent).
///
/// `Ok(None)` means the read saw a claimable record that the write did not take: a
/// concurrent writer got there in between, and the caller runs the statement again.
pub(crate) fn claim_outcome(
    req: &ClaimRequest,
    wrote: bool,
    row: Option<RawRecord>,
    now: Timestamp,
) -> Result<Option<ClaimOutcome>, StoreError> {
    if wrote {
        let row = row.ok_or_else(|| codec("write returned no row"))?;
        return Ok(Some(match row.verdict {
            VERDICT_HOLD => ClaimOutcome::Unknown,
            verdict => ClaimOutcome::Claimed {
                lease: Lease {
                    owner: req.owner,
                    fence: u64::try_from(row.fence)
                        .map_err(|_| codec("stored fence is negative"))?,
                    deadline: ts(row.lease_until),
                },
                takeover: verdict == VERDICT_TAKEOVER,
            },
        }));
    }
    // An expired row (a tombstone included) counts as absent: the write is needed.
    let Some(row) = row.filter(|r| ts(r.expires_at) > now) else {
        return Ok(None);
    };
    let previous = row.into_record()?;
    // The contract's own decision on what the statement saw: any answer that needs no write
    // is linearised at that read.
    let t = decide::claim(now, Some(&previous), req, 1);
    Ok(match t.change {
        Change::Keep => Some(t.outcome),
        _ => None,
    })
}

/// What a failed resolve found, or `None` when the record was resolvable after all (it
/// changed between the update and the read; run again).
pub(crate) fn unresolved(now: Timestamp, state: Option<(i16, i64, i64)>) -> Option<ResolveOutcome> {
    let Some((state, lease_until, expires_at)) = state else {
        return Some(ResolveOutcome::NotFound);
    };
    if ts(expires_at) <= now {
        return Some(ResolveOutcome::NotFound);
    }
    match state {
        COMPLETED => Some(ResolveOutcome::NotResolvable {
            state: StateKind::Completed,
        }),
        PROCESSING if ts(lease_until) > now => Some(ResolveOutcome::NotResolvable {
            state: StateKind::Processing,
        }),
        _ => None,
    }
}

/// How many times a statement is run again after losing a race before giving up. Each
/// retry needs another writer to have changed the same row in between, so this is never
/// reached in practice.
pub(crate) const MAX_RACES: usize = 64;

pub(crate) fn too_many_races() -> StoreError {
    StoreError::unavailable(
        "record kept changing under the statement; gave up after repeated races",
    )
}

/// `get`, `list`, `resolve` and `delete` of a `Store` impl, which PostgreSQL and SQLite share
/// word for word but for their pools (SQLite reads on its reader pool and writes on its single
/// writer; PostgreSQL uses one pool for both). Expanded inside `impl Store for …`.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! shared_queries {
    (reader: $reader:ident, writer: $writer:ident) => {
        async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
            let row = sqlx::query(&self.sql.get)
                .bind(key.digest().to_vec())
                .fetch_optional(&self.$reader)
                .await
                .map_err(StoreError::unavailable)?;
            row.map(|row| raw_record!(&row, 0).and_then(RawRecord::into_record))
                .transpose()
        }

        async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
            let rows = sqlx::query(&self.sql.list)
                .bind(filter.namespace.as_deref())
                .bind(filter.principal.as_deref())
                .bind(filter.state.map(state_code))
                .bind(filter.older_than.map(ms))
                .bind(i64::try_from(filter.effective_limit()).unwrap_or(100))
                .fetch_all(&self.$reader)
                .await
                .map_err(StoreError::unavailable)?;
            rows.iter()
                .map(|row| raw_record!(row, 0).and_then(RawRecord::into_record))
                .collect()
        }

        async fn resolve(
            &self,
            key: &ScopedKey,
            resolution: &Resolution,
        ) -> Result<ResolveOutcome, StoreError> {
            let id = key.digest().to_vec();
            for _ in 0..MAX_RACES {
                let query = match resolution {
                    Resolution::Complete { response, ttl } => {
                        sqlx::query(&self.sql.resolve_complete)
                            .bind(&id)
                            .bind(response.encode())
                            .bind(ms(*ttl))
                    }
                    _ => sqlx::query(&self.sql.resolve_release).bind(&id),
                };
                if query
                    .execute(&self.$writer)
                    .await
                    .map_err(StoreError::unavailable)?
                    .rows_affected()
                    == 1
                {
                    return Ok(ResolveOutcome::Resolved);
                }
                let row = sqlx::query(&self.sql.resolve_probe)
                    .bind(&id)
                    .fetch_optional(&self.$reader)
                    .await
                    .map_err(StoreError::unavailable)?;
                let (now, state) = match row {
                    Some(row) => {
                        let get =
                            |c: &str| row.try_get::<i64, _>(c).map_err(StoreError::unavailable);
                        let state: i16 = row.try_get("state").map_err(StoreError::unavailable)?;
                        (
                            get("now_ms")?,
                            Some((state, get("lease_until")?, get("expires_at")?)),
                        )
                    }
                    None => (0, None),
                };
                if let Some(outcome) = unresolved(ts(now), state) {
                    return Ok(outcome);
                }
            }
            Err(too_many_races())
        }

        async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
            let done = sqlx::query(&self.sql.delete)
                .bind(key.digest().to_vec())
                .execute(&self.$writer)
                .await
                .map_err(StoreError::unavailable)?;
            Ok(done.rows_affected() == 1)
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use shared_queries;

/// A backend whose expired rows a background task deletes (see [`spawn_reaper`]).
pub(crate) trait Reap: Clone + Send + Sync + 'static {
    /// The table, for the reaper's log lines.
    fn table_name(&self) -> &TableName;
    /// One reaping pass: deletes expired rows `batch` at a time until none is left.
    fn reap_pass(&self, batch: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// Runs `step` (one `DELETE` of at most `batch` expired rows, answering how many it deleted)
/// until a batch comes back short, and returns how many rows were deleted in all. Each batch
/// is its own short statement, so other writers wait at most one batch.
pub(crate) async fn reap_in_batches<F, Fut>(batch: u32, mut step: F) -> Result<u64, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<u64, sqlx::Error>>,
{
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let done = step(batch).await.map_err(StoreError::unavailable)?;
        total += done;
        if done < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Runs `store`'s reaping pass every `every` on the current tokio runtime, until the handle is
/// aborted. Failures are logged and retried on the next tick.
pub(crate) fn spawn_reaper<S: Reap>(
    store: &S,
    every: std::time::Duration,
    batch: u32,
) -> tokio::task::JoinHandle<()> {
    let store = store.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let table = store.table_name();
            match store.reap_pass(batch).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(reaped = n, table = %table, "idem-sql reaper"),
                Err(e) => tracing::warn!(error = %e, table = %table, "idem-sql reaper failed"),
            }
        }
    })
}

/// A settling statement's answer: it changed the row (settled) or matched none (fenced).
pub(crate) fn settled(rows: u64) -> idem_core::SettleOutcome {
    if rows == 1 {
        idem_core::SettleOutcome::Settled
    } else {
        idem_core::SettleOutcome::Fenced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_count_matches_the_list() {
        assert_eq!(COLUMNS.split(',').count(), COLUMN_COUNT);
    }

    #[test]
    fn table_names_are_identifiers_only() {
        assert!(TableName::new("idem_records").is_ok());
        assert!(TableName::new("_t1").is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a;drop table x",
            "a b",
            "\"x\"",
            "a.b",
            &"x".repeat(49),
        ] {
            assert!(TableName::new(bad).is_err(), "{bad:?} accepted");
        }
    }
}

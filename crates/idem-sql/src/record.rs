//! The row shape: how a returned row is decoded, becomes a [`Record`], and answers a claim.

use idem_core::decide::{self, Change};
use idem_core::fingerprint::Fingerprint;
use idem_core::record::CodecError;
use idem_core::{
    ClaimOutcome, ClaimRequest, Key, Lease, OwnerId, Record, RecordState, ResolveOutcome, Scope,
    ScopedKey, SettleOutcome, StateKind, StoreError, StoredResponse, Timestamp,
};

use crate::dialect::Sql;

/// `state` column values.
pub(crate) const PROCESSING: i16 = 0;
pub(crate) const COMPLETED: i16 = 1;
pub(crate) const UNKNOWN: i16 = 2;

/// `verdict` column values: what the last claim statement did to the row (1, or 11 at the
/// default audit level, is a fresh claim; 0 no write).
const VERDICT_TAKEOVER: i16 = 2;
const VERDICT_HOLD: i16 = 3;

/// Columns every read returns, in this order (decoded by position: MariaDB reports no column
/// names when preparing `INSERT … RETURNING`).
pub(crate) const COLUMNS: &str = "namespace, principal, idem_key, fingerprint, fence, state, owner, lease_until, \
     response, state_at, request_id, created_at, expires_at, verdict";

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
    namespace: String,
    principal: Option<String>,
    key: String,
    fingerprint: Vec<u8>,
    fence: i64,
    state: i16,
    owner: Option<Vec<u8>>,
    lease_until: i64,
    response: Option<Vec<u8>>,
    state_at: i64,
    request_id: Option<String>,
    created_at: i64,
    expires_at: i64,
    verdict: i16,
}

/// A claim statement's row: whether it wrote, the database clock, and the record.
#[derive(Debug)]
pub(crate) struct ClaimRow {
    wrote: bool,
    now: Timestamp,
    record: RawRecord,
}

pub(crate) fn text<D: Sql>(row: &D::Row, i: usize) -> Result<String, sqlx::Error> {
    D::get::<D::Text>(row, i).map(Into::into)
}

pub(crate) fn opt_text<D: Sql>(row: &D::Row, i: usize) -> Result<Option<String>, sqlx::Error> {
    Ok(D::get::<Option<D::Text>>(row, i)?.map(Into::into))
}

fn required<T>(value: Option<T>) -> Result<T, sqlx::Error> {
    value.ok_or_else(|| sqlx::Error::Decode(Box::new(sqlx::error::UnexpectedNullError)))
}

impl RawRecord {
    /// Decodes the [`COLUMNS`] of `row`, starting at column `at`.
    pub(crate) fn decode<D: Sql>(row: &D::Row, at: usize) -> Result<Self, StoreError> {
        (|| {
            Ok::<_, sqlx::Error>(Self {
                namespace: text::<D>(row, at)?,
                principal: opt_text::<D>(row, at + 1)?,
                key: text::<D>(row, at + 2)?,
                fingerprint: required(D::bytes(row, at + 3)?)?,
                fence: D::int(row, at + 4)?,
                state: D::small(row, at + 5)?,
                owner: D::bytes(row, at + 6)?,
                lease_until: D::int(row, at + 7)?,
                response: D::bytes(row, at + 8)?,
                state_at: D::int(row, at + 9)?,
                request_id: opt_text::<D>(row, at + 10)?,
                created_at: D::int(row, at + 11)?,
                expires_at: D::int(row, at + 12)?,
                verdict: D::small(row, at + 13)?,
            })
        })()
        .map_err(StoreError::unavailable)
    }

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
            // The holder a claim under `hold` marked it for, who may still settle it; none
            // when its holder released it as unknown (and on rows from before holders were
            // named).
            UNKNOWN => RecordState::Unknown {
                since: ts(self.state_at),
                owner: match self.owner.as_deref() {
                    None => None,
                    Some(raw) => Some(
                        owner_id(raw)
                            .ok_or_else(|| codec("unknown record with a malformed owner"))?,
                    ),
                },
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

impl ClaimRow {
    /// Decodes `wrote, now_ms, {cols}`.
    pub(crate) fn decode<D: Sql>(row: &D::Row) -> Result<Self, StoreError> {
        Ok(Self {
            wrote: D::flag(row, 0).map_err(StoreError::unavailable)?,
            now: ts(D::int(row, 1).map_err(StoreError::unavailable)?),
            record: RawRecord::decode::<D>(row, 2)?,
        })
    }

    /// What the claim statement's answer means for `req`.
    ///
    /// `Ok(None)` means the statement saw a claimable record that it did not take (a read
    /// alone, or a concurrent writer got there in between): the caller runs it again.
    pub(crate) fn outcome(self, req: &ClaimRequest) -> Result<Option<ClaimOutcome>, StoreError> {
        let row = self.record;
        if self.wrote {
            let fence = u64::try_from(row.fence).map_err(|_| codec("stored fence is negative"))?;
            return Ok(Some(match row.verdict {
                // The statement marked the row unknown at its own clock reading (`state_at`,
                // which is also what the MySQL upsert-then-read path needs: its read runs
                // later), keeping the attempt's `created_at`.
                VERDICT_HOLD => ClaimOutcome::Unknown {
                    fence,
                    age: ts(row.state_at).since(ts(row.created_at)),
                },
                verdict => ClaimOutcome::Claimed {
                    lease: Lease {
                        owner: req.owner,
                        fence,
                        deadline: ts(row.lease_until),
                    },
                    takeover: verdict == VERDICT_TAKEOVER,
                },
            }));
        }
        // An expired row (a tombstone included) counts as absent: the write is needed.
        if ts(row.expires_at) <= self.now {
            return Ok(None);
        }
        let previous = row.into_record()?;
        // The contract's own decision on what the statement saw: any answer that needs no
        // write is linearised at that read.
        let t = decide::claim(self.now, Some(&previous), req, 1);
        Ok(match t.change {
            Change::Keep => Some(t.outcome),
            _ => None,
        })
    }
}

/// What the resolve probe (`state, lease_until, expires_at, now_ms, fence`, or no row) says
/// about a failed resolve that named `fence` (if any), or `None` when the record was
/// resolvable after all (it changed between the update and the read; run again). Judged in
/// the contract's order: absent, then the fence, then the state.
pub(crate) fn unresolved<D: Sql>(
    row: Option<&D::Row>,
    fence: Option<u64>,
) -> Result<Option<ResolveOutcome>, StoreError> {
    let Some(row) = row else {
        return Ok(Some(ResolveOutcome::NotFound));
    };
    let int = |i| D::int(row, i).map_err(StoreError::unavailable);
    let state = D::small(row, 0).map_err(StoreError::unavailable)?;
    let (lease_until, expires_at, now) = (ts(int(1)?), ts(int(2)?), ts(int(3)?));
    if expires_at <= now {
        return Ok(Some(ResolveOutcome::NotFound));
    }
    let stored = u64::try_from(int(4)?).map_err(|_| codec("stored fence is negative"))?;
    if fence.is_some_and(|f| f != stored) {
        return Ok(Some(ResolveOutcome::Fenced { fence: stored }));
    }
    Ok(match state {
        COMPLETED => Some(ResolveOutcome::NotResolvable {
            state: StateKind::Completed,
        }),
        PROCESSING if lease_until > now => Some(ResolveOutcome::NotResolvable {
            state: StateKind::Processing,
        }),
        _ => None,
    })
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

fn owner_id(raw: &[u8]) -> Option<OwnerId> {
    let bytes: [u8; 16] = raw.try_into().ok()?;
    Some(OwnerId(u128::from_be_bytes(bytes)))
}

/// A settling statement's answer: it changed the row (settled) or matched none (fenced).
pub(crate) fn settled(rows: u64) -> SettleOutcome {
    if rows == 1 {
        SettleOutcome::Settled
    } else {
        SettleOutcome::Fenced
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_the_fourteen_decoded() {
        assert_eq!(COLUMNS.split(',').count(), 14);
    }
}

//! The audit trail of a SQL store: the table `<table>_audit` next to the records, written in
//! the same statement or transaction as each change.
//!
//! - Claims, completions and releases: triggers on the records table. Each of those
//!   statements sets the row's `verdict` to say what it did (1 fresh claim, 2 takeover,
//!   3 held → unknown, 4 completed, 5 released, 6 released as unknown); the trigger writes the
//!   matching event, so the store keeps one statement per operation. At the default
//!   [`AuditLevel`](idem_core::AuditLevel) a fresh claim leaves 11 and a completion of a
//!   processing row 12, which the triggers do not record: a first request writes no event
//!   row. The level is compiled into the statements; the triggers are the same at both.
//! - Resolves and deletes: the update and its event (with the actor) in one transaction
//!   (verdicts 7, 8, 9, which the triggers leave alone).
//! - Expiry: the reaper's `DELETE` fires a trigger that records `expired` for every row that
//!   was not already gone (a release or delete leaves a tombstone whose event is written).
//! - Fenced settles change nothing; their event is one insert after the refused update.
//!
//! Renewals set verdict 10, which records nothing. The reaper also deletes events older than
//! the store's audit retention.

use idem_core::audit::{AuditEvent, AuditKind, AuditQuery};
use idem_core::record::Timestamp;
use idem_core::{OwnerId, ScopedKey, StoreError};

use crate::dialect::Sql;
use crate::driver::{On, Value};
use crate::record::{opt_text, text};
use crate::statements::Param;
use crate::{Dialect, SqlStore};

/// Columns of the audit table, in the order the triggers and inserts write them.
pub(crate) const AUDIT_COLUMNS: &str =
    "at_ms, namespace, principal, idem_key, event, fence, request_id, outcome, head, owner, actor";

/// The event row a claim's `INSERT` writes (always a fresh claim).
const ON_INSERT: &str = "SELECT {now}, NEW.namespace, COALESCE(NEW.principal, ''), NEW.idem_key, 1, \
    NEW.fence, NEW.request_id, NULL, {null_blob}, NEW.owner, NULL{dual} WHERE NEW.verdict = 1";

/// The event row an `UPDATE` with verdict 1-6 writes. A held record names the expired
/// holder's owner; completions keep the response's first three bytes (codec version and
/// status).
const ON_UPDATE: &str = "SELECT {now}, NEW.namespace, COALESCE(NEW.principal, ''), NEW.idem_key, \
    CASE NEW.verdict WHEN 1 THEN 1 WHEN 2 THEN 5 WHEN 4 THEN 2 WHEN 5 THEN 3 ELSE 4 END, \
    NEW.fence, NEW.request_id, \
    CASE NEW.verdict WHEN 3 THEN 'lease_expired' WHEN 5 THEN 'retryable' WHEN 6 THEN 'ambiguous' END, \
    CASE WHEN NEW.verdict = 4 THEN {head} END, \
    CASE WHEN NEW.verdict IN (1, 2) THEN NEW.owner ELSE OLD.owner END, NULL{dual} \
    WHERE NEW.verdict BETWEEN 1 AND 6";

/// The event row the reaper's `DELETE` writes: `expired`, unless the row was a tombstone
/// (released, resolved by release, deleted), whose event is already written.
const ON_DELETE: &str = "SELECT OLD.expires_at, OLD.namespace, COALESCE(OLD.principal, ''), OLD.idem_key, 9, \
    OLD.fence, OLD.request_id, NULL, {null_blob}, {null_blob}, NULL{dual} WHERE OLD.verdict NOT IN (5, 8, 9)";

/// Fills in the trigger row templates.
pub(crate) fn expand_rows(template: &str) -> String {
    template
        .replace("{on_insert}", ON_INSERT)
        .replace("{on_update}", ON_UPDATE)
        .replace("{on_delete}", ON_DELETE)
        .replace("{acols}", AUDIT_COLUMNS)
}

/// The event a resolve or delete writes in its transaction, from the row it changed.
pub(crate) const SETTLED_EVENT: &str = "INSERT INTO {t}_audit ({acols}) \
    SELECT {now}, namespace, COALESCE(principal, ''), idem_key, :event, fence, request_id, :outcome, :head, \
    :owner, :actor FROM {t} WHERE id = :id";

/// A fenced settle's event: nothing changed, so nothing to read from the row.
pub(crate) const FENCED_EVENT: &str = "INSERT INTO {t}_audit ({acols}) \
    VALUES ({now}, :namespace, :principal, :key, 6, :fence, NULL, :outcome, {null_blob}, :owner, NULL)";

/// Reads events, newest first.
pub(crate) const QUERY: &str = "SELECT {acols} FROM {t}_audit WHERE \
    ({text_null:namespace} OR namespace = :namespace) \
    AND ({text_null:principal} OR principal = :principal) \
    AND ({text_null:key} OR idem_key = :key) \
    AND ({int_null:event} OR event = :event) \
    AND ({int_null:since} OR at_ms >= :since) \
    AND ({int_null:until} OR at_ms <= :until) \
    ORDER BY seq DESC LIMIT :limit";

/// Rewrites `{text_null:p}` / `{int_null:p}` as the dialect's test for a NULL parameter.
pub(crate) fn expand_nulls<D: Sql>(template: &str) -> String {
    let mut out = template.to_owned();
    for p in ["namespace", "principal", "key"] {
        out = out.replace(
            &format!("{{text_null:{p}}}"),
            &D::TEXT_NULL.replace("{p}", p),
        );
    }
    for p in ["event", "since", "until"] {
        out = out.replace(&format!("{{int_null:{p}}}"), &D::INT_NULL.replace("{p}", p));
    }
    out
}

/// The first three bytes of an encoded response: codec version and status.
pub(crate) fn head(encoded: &[u8]) -> &[u8] {
    &encoded[..encoded.len().min(3)]
}

fn status_of(head: Option<&[u8]>) -> Option<u16> {
    match head? {
        [_, hi, lo, ..] => Some(u16::from_be_bytes([*hi, *lo])),
        _ => None,
    }
}

fn instance_of(owner: Option<&[u8]>) -> Option<String> {
    let owner: [u8; 16] = owner?.try_into().ok()?;
    Some(idem_core::audit::instance_of(OwnerId(u128::from_be_bytes(
        owner,
    ))))
}

fn decode<D: Sql>(row: &D::Row) -> Result<AuditEvent, StoreError> {
    let raw = (|| {
        Ok::<_, sqlx::Error>((
            D::int(row, 0)?,
            text::<D>(row, 1)?,
            text::<D>(row, 2)?,
            text::<D>(row, 3)?,
            D::small(row, 4)?,
            D::int(row, 5)?,
            opt_text::<D>(row, 6)?,
            opt_text::<D>(row, 7)?,
            D::bytes(row, 8)?,
            D::bytes(row, 9)?,
            opt_text::<D>(row, 10)?,
        ))
    })()
    .map_err(StoreError::unavailable)?;
    let (at, namespace, scope, key, event, fence, request_id, outcome, head, owner, actor) = raw;
    let kind = AuditKind::from_code(i64::from(event)).ok_or(StoreError::Codec(
        idem_core::record::CodecError("unknown audit event code"),
    ))?;
    Ok(AuditEvent {
        at: Timestamp(u64::try_from(at).unwrap_or(0)),
        namespace,
        scope,
        key,
        kind,
        fence: u64::try_from(fence).unwrap_or(0),
        request_id,
        outcome,
        status: status_of(head.as_deref()),
        instance: instance_of(owner.as_deref()),
        actor,
    })
}

impl<D: Dialect> SqlStore<D> {
    /// Reads the trail (see [`idem_core::Store::audit`]).
    pub(crate) async fn audit_query(
        &self,
        query: &AuditQuery,
    ) -> Result<Vec<AuditEvent>, StoreError> {
        let ms = |t: Option<Timestamp>| t.map(|t| i64::try_from(t.0).unwrap_or(i64::MAX));
        let args = [
            (Param::Namespace, Value::OptText(query.namespace.as_deref())),
            (Param::Principal, Value::OptText(query.scope.as_deref())),
            (Param::Key, Value::OptText(query.key.as_deref())),
            (
                Param::Event,
                Value::OptInt(query.kind.map(|k| i64::from(k.code()))),
            ),
            (Param::Since, Value::OptInt(ms(query.since))),
            (Param::Until, Value::OptInt(ms(query.until))),
            (
                Param::Limit,
                Value::Int(i64::try_from(query.effective_limit()).unwrap_or(100)),
            ),
        ];
        let rows = D::fetch_all(On::Pool(&self.reader), &self.sql.audit_query, &args)
            .await
            .map_err(StoreError::unavailable)?;
        rows.iter().map(decode::<D>).collect()
    }

    /// Records that `owner` at `fence` was refused `op` (`complete` or `release`) on `key`.
    /// Nothing changed, so this is its own statement; a failure to record it is logged, not
    /// returned, since the refusal itself stands.
    pub(crate) async fn audit_fenced(&self, key: &ScopedKey, owner: OwnerId, fence: u64, op: &str) {
        let owner = owner.to_bytes();
        let args = [
            (Param::Namespace, Value::Text(key.scope.namespace())),
            (
                Param::Principal,
                Value::Text(key.scope.principal().unwrap_or_default()),
            ),
            (Param::Key, Value::Text(key.key.as_str())),
            (
                Param::Fence,
                Value::Int(i64::try_from(fence).unwrap_or(i64::MAX)),
            ),
            (Param::Outcome, Value::OptText(Some(op))),
            (Param::Owner, Value::Bytes(&owner)),
        ];
        if let Err(e) = D::execute(On::Pool(&self.writer), &self.sql.audit_fenced, &args).await {
            tracing::warn!(key = %key, error = %e, "could not record a fenced settle in the audit trail");
        }
    }
}

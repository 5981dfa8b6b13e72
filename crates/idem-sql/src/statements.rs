//! The statements of one store, compiled once per table from its dialect's templates (see
//! [`crate::dialect`] for the template syntax), and the statements every dialect shares.

use idem_core::audit::AuditLevel;

use crate::audit;
use crate::dialect::{Placeholders, Renewal, Sql};
use crate::record::COLUMNS;
use crate::table::TableName;

/// A statement parameter, written `:name` in the templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The row id: the scoped key's digest.
    Id,
    /// The key's namespace.
    Namespace,
    /// The key's principal, if any.
    Principal,
    /// The key itself.
    Key,
    /// The request fingerprint.
    Fingerprint,
    /// The claim's owner id.
    Owner,
    /// The holder's fence.
    Fence,
    /// The lease, in milliseconds.
    Lease,
    /// How long the record lives, in milliseconds.
    Ttl,
    /// Whether an expired lease is held (marked unknown) rather than taken over.
    Hold,
    /// The request id, if any.
    RequestId,
    /// An encoded response.
    Response,
    /// A list filter: the state code.
    State,
    /// A list filter: minimum age in milliseconds.
    Age,
    /// How many rows at most.
    Limit,
    /// A one-time token's bound payload.
    Payload,
    /// Whether a one-time token has a bound payload (0 or 1).
    Bound,
    /// How long a spent one-time token is remembered past its expiry, in milliseconds.
    Retention,
    /// An audit event's kind code.
    Event,
    /// An audit event's outcome.
    Outcome,
    /// An audit event's response head (codec version and status).
    Head,
    /// Who asked for a change.
    Actor,
    /// An audit query's earliest instant (ms).
    Since,
    /// An audit query's latest instant (ms).
    Until,
    /// An outbox message's id.
    MessageId,
    /// An outbox message's destination (routing key or subject).
    Destination,
    /// An outbox message's aggregate, if any.
    Aggregate,
    /// An outbox message's headers (a JSON object), if any.
    Headers,
    /// An outbox row's position.
    Seq,
    /// How long until an outbox row is due again, in milliseconds.
    Delay,
    /// Whether a failed outbox row is parked for an operator.
    Park,
    /// Why an outbox row failed.
    Reason,
}

impl Param {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "id" => Self::Id,
            "namespace" => Self::Namespace,
            "principal" => Self::Principal,
            "key" => Self::Key,
            "fingerprint" => Self::Fingerprint,
            "owner" => Self::Owner,
            "fence" => Self::Fence,
            "lease" => Self::Lease,
            "ttl" => Self::Ttl,
            "hold" => Self::Hold,
            "request_id" => Self::RequestId,
            "response" => Self::Response,
            "state" => Self::State,
            "age" => Self::Age,
            "limit" => Self::Limit,
            "payload" => Self::Payload,
            "bound" => Self::Bound,
            "retention" => Self::Retention,
            "event" => Self::Event,
            "outcome" => Self::Outcome,
            "head" => Self::Head,
            "actor" => Self::Actor,
            "since" => Self::Since,
            "until" => Self::Until,
            "message_id" => Self::MessageId,
            "destination" => Self::Destination,
            "aggregate" => Self::Aggregate,
            "headers" => Self::Headers,
            "seq" => Self::Seq,
            "delay" => Self::Delay,
            "park" => Self::Park,
            "reason" => Self::Reason,
            _ => return None,
        })
    }
}

/// The guard of a renewal: the row is live, processing, and held by this owner and fence.
const HOLDER: &str =
    "id = :id AND owner = :owner AND fence = :fence AND state = 0 AND expires_at > {now}";

/// The guard of a completion or release: the row is live and held by this owner and fence,
/// processing or unknown naming that holder (a claim under `hold` marked it on an expired
/// lease). Completed rows and rows released as unknown name no owner, so `owner = :owner`
/// alone rules them out; the state test says so.
const HELD: &str =
    "id = :id AND owner = :owner AND fence = :fence AND state IN (0, 2) AND expires_at > {now}";

/// A live record that is unknown, or processing under a lease that ran out, with the fence
/// the resolve names (`:fence` NULL names none).
const RESOLVABLE: &str = "id = :id AND expires_at > {now} AND fence = COALESCE(:fence, fence) \
     AND (state = 2 OR (state = 0 AND lease_until <= {now}))";

/// The table and its indexes, for the dialects whose columns differ only in type names.
const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS {t} (
    id          {blob}     PRIMARY KEY,
    namespace   TEXT       NOT NULL,
    principal   TEXT,
    idem_key    TEXT       NOT NULL,
    fingerprint {blob}     NOT NULL,
    fence       {bigint}   NOT NULL,
    state       {smallint} NOT NULL,
    owner       {blob},
    lease_until {bigint}   NOT NULL,
    response    {blob},
    state_at    {bigint}   NOT NULL,
    request_id  TEXT,
    created_at  {bigint}   NOT NULL,
    expires_at  {bigint}   NOT NULL,
    verdict     {smallint} NOT NULL
);
CREATE INDEX IF NOT EXISTS {t}_expires_idx ON {t} (expires_at);
CREATE INDEX IF NOT EXISTS {t}_created_idx ON {t} (created_at);
";

/// The claim's upsert for the dialects with `INSERT … ON CONFLICT` (PostgreSQL, SQLite): `r`
/// is the existing row and `excluded.state_at` is "now". The `WHERE` re-checks the latest row
/// version (absent or expired: fresh claim; same fingerprint with an expired lease: takeover,
/// or hold → unknown) and leaves any other row alone. A fresh claim and a takeover date the
/// new attempt (`created_at` = now); hold keeps the attempt's `created_at` and names its
/// holder (`owner` kept).
const ON_CONFLICT: &str = "ON CONFLICT (id) DO UPDATE SET
    verdict = CASE WHEN r.expires_at <= excluded.state_at THEN {claimed} WHEN :hold THEN 3 ELSE 2 END,
    namespace = excluded.namespace,
    principal = excluded.principal,
    idem_key = excluded.idem_key,
    fingerprint = excluded.fingerprint,
    fence = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN r.fence
                 ELSE {greatest}(r.fence + 1, excluded.fence) END,
    state = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN 2 ELSE 0 END,
    owner = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN r.owner ELSE excluded.owner END,
    lease_until = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN 0 ELSE excluded.lease_until END,
    response = NULL,
    state_at = excluded.state_at,
    request_id = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN r.request_id ELSE excluded.request_id END,
    created_at = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN r.created_at ELSE excluded.created_at END,
    expires_at = CASE WHEN r.expires_at > excluded.state_at AND :hold THEN r.expires_at ELSE excluded.expires_at END
WHERE r.expires_at <= excluded.state_at
   OR (r.fingerprint = excluded.fingerprint AND r.state = 0 AND r.lease_until <= excluded.state_at)";

// The `verdict` each writing statement leaves says what it did, for the audit triggers (see
// `crate::audit`). `{claimed}` and `{completed}` are the verdicts of a fresh claim and of a
// completion at the store's audit level (see `verdicts`); a completion sets it first, while
// `state` still reads the old value under MySQL's left-to-right assignments.
//
// Completions and releases accept a row held as processing or as unknown naming the caller
// (`{held}`). A release as unknown leaves an unknown row as it is (owner and `state_at`
// kept) and makes a processing one unknown naming nobody; its assignments read the old
// `state` before the last one sets it, as MySQL evaluates them left to right.
const COMPLETE: &str = "UPDATE {t} SET verdict = {completed}, state = 1, response = :response, owner = NULL, \
     lease_until = 0, state_at = {now}, expires_at = {now} + :ttl WHERE {held}";
const RELEASE_RETRYABLE: &str =
    "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 5 WHERE {held}";
const RELEASE_UNKNOWN: &str = "UPDATE {t} SET owner = CASE WHEN state = 0 THEN NULL ELSE owner END, \
     state_at = CASE WHEN state = 0 THEN {now} ELSE state_at END, lease_until = 0, verdict = 6, \
     state = 2 WHERE {held}";
const GET: &str = "SELECT {cols} FROM {t} WHERE id = :id AND expires_at > {now}";
const RESOLVE_COMPLETE: &str = "UPDATE {t} SET state = 1, response = :response, owner = NULL, lease_until = 0, \
     state_at = {now}, expires_at = {now} + :ttl, verdict = 7 WHERE {resolvable}";
const RESOLVE_RELEASE: &str = "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 8 \
     WHERE {resolvable}";
/// Returns `state, lease_until, expires_at, now_ms, fence`.
const RESOLVE_PROBE: &str =
    "SELECT state, lease_until, expires_at, {now} AS now_ms, fence FROM {t} WHERE id = :id";
const DELETE: &str = "UPDATE {t} SET expires_at = {now}, owner = NULL, response = NULL, verdict = 9 \
     WHERE id = :id AND expires_at > {now}";
const DROP: &str = "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_audit{drop_audit_fn}";

/// One statement in its dialect's spelling, and the parameters it binds, in order.
#[derive(Debug)]
pub struct Stmt {
    sql: String,
    binds: Vec<Param>,
}

impl Stmt {
    /// The statement's text.
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// The parameters to bind, in order.
    pub(crate) fn binds(&self) -> &[Param] {
        &self.binds
    }
}

/// Every statement of a store, for its dialect and table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim_read: Option<Stmt>,
    pub(crate) claim: Stmt,
    /// The claim without `RETURNING` and the read after it, where the dialect has them.
    pub(crate) claim_then_read: Option<(Stmt, Stmt)>,
    /// `SELECT VERSION()`, asked before the first claim where `claim_then_read` exists.
    pub(crate) version: Stmt,
    pub(crate) renew: Renewal<Stmt>,
    pub(crate) complete: Stmt,
    pub(crate) release_retryable: Stmt,
    pub(crate) release_unknown: Stmt,
    pub(crate) get: Stmt,
    pub(crate) list: Stmt,
    pub(crate) resolve_complete: Stmt,
    pub(crate) resolve_release: Stmt,
    pub(crate) resolve_probe: Stmt,
    pub(crate) delete: Stmt,
    pub(crate) reap: Stmt,
    /// Reads the session's `LAST_INSERT_ID()` after a renewal that reports none.
    pub(crate) renew_read: Option<Stmt>,
    pub(crate) audit_query: Stmt,
    pub(crate) audit_fenced: Stmt,
    pub(crate) audit_settled: Stmt,
    pub(crate) audit_reap: Stmt,
    /// The grouped claim and completion ([`crate::dialect::Grouping::Statement`]), bound by
    /// position (`$1`…) with arrays.
    pub(crate) claim_many: Option<String>,
    pub(crate) complete_many: Option<String>,
    /// Parameterless: run as is.
    pub(crate) migrate: String,
    /// Parameterless: run as is.
    pub(crate) drop: String,
}

/// The `verdict`s a fresh claim and a completion leave at `level`. The triggers record 1
/// (claimed) and 4 (completed) and leave 11 and 12 alone, so the level changes the
/// statements only, never the schema. At the default level a completion of an unknown row
/// (its holder came back after a claim under `hold` marked it) is still 4.
fn verdicts(level: AuditLevel) -> (&'static str, &'static str) {
    match level {
        AuditLevel::All => ("1", "4"),
        _ => ("11", "CASE WHEN state = 2 THEN 4 ELSE 12 END"),
    }
}

impl Statements {
    /// `D`'s statements on `table`, recording the changes `level` names.
    pub(crate) fn new<D: Sql>(table: &TableName, level: AuditLevel) -> Self {
        let (claimed, completed) = verdicts(level);
        let text = |template: &str| {
            expand::<D>(template, table)
                .replace("{claimed}", claimed)
                .replace("{completed}", completed)
        };
        let stmt = |template: &str| compile(&text(template), D::PLACEHOLDERS);
        Self {
            claim_read: D::CLAIM_READ.map(stmt),
            claim: stmt(D::CLAIM),
            claim_then_read: D::CLAIM_THEN_READ.map(|(write, read)| (stmt(write), stmt(read))),
            version: stmt("SELECT VERSION()"),
            renew: D::RENEW.map(stmt),
            complete: stmt(COMPLETE),
            release_retryable: stmt(RELEASE_RETRYABLE),
            release_unknown: stmt(RELEASE_UNKNOWN),
            get: stmt(GET),
            list: stmt(D::LIST),
            resolve_complete: stmt(RESOLVE_COMPLETE),
            resolve_release: stmt(RESOLVE_RELEASE),
            resolve_probe: stmt(RESOLVE_PROBE),
            delete: stmt(DELETE),
            reap: stmt(D::REAP),
            renew_read: match D::RENEW {
                Renewal::LastInsertId(_) => Some(stmt("SELECT CAST(LAST_INSERT_ID() AS SIGNED)")),
                Renewal::Returning(_) => None,
            },
            audit_query: stmt(&audit::expand_nulls::<D>(audit::QUERY)),
            audit_fenced: stmt(audit::FENCED_EVENT),
            audit_settled: stmt(audit::SETTLED_EVENT),
            audit_reap: stmt(D::AUDIT_REAP),
            claim_many: D::CLAIM_MANY.map(text),
            complete_many: D::COMPLETE_MANY.map(text),
            migrate: format!(
                "{};\n{}",
                expand::<D>(D::MIGRATE, table)
                    .trim_end()
                    .trim_end_matches(';'),
                expand::<D>(D::AUDIT_MIGRATE, table)
            ),
            drop: expand::<D>(DROP, table),
        }
    }
}

/// Fills in a template's fragments, clocks, columns and table.
pub(crate) fn expand<D: Sql>(template: &str, table: &TableName) -> String {
    audit::expand_rows(template)
        .replace("{head}", D::HEAD)
        .replace("{dual}", D::DUAL)
        .replace("{null_blob}", D::NULL_BLOB)
        .replace("{drop_audit_fn}", D::DROP_AUDIT_FN)
        .replace("{create_table}", CREATE_TABLE)
        .replace("{blob}", D::BLOB)
        .replace("{bigint}", D::BIGINT)
        .replace("{smallint}", D::SMALLINT)
        .replace("{on_conflict}", ON_CONFLICT)
        .replace("{holder}", HOLDER)
        .replace("{held}", HELD)
        .replace("{resolvable}", RESOLVABLE)
        .replace("{greatest}", D::GREATEST)
        .replace("{now_us}", D::NOW_US)
        .replace("{now}", D::NOW_MS)
        .replace("{cur_cols}", &prefixed("cur"))
        .replace("{cols}", COLUMNS)
        .replace("{t}", table.as_str())
}

/// The record columns, each qualified with `alias`.
fn prefixed(alias: &str) -> String {
    COLUMNS
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rewrites each `:name` parameter as a placeholder of `style`, and lists what to bind in
/// order. Text in single quotes and `::` casts are copied as they are.
pub(crate) fn compile(sql: &str, style: Placeholders) -> Stmt {
    let mut out = String::with_capacity(sql.len());
    let mut binds: Vec<Param> = Vec::new();
    let mut rest = sql;
    while let Some(at) = rest.find([':', '\'']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(quoted) = tail.strip_prefix('\'') {
            let end = quoted.find('\'').map_or(quoted.len(), |e| e + 1);
            out.push_str(&tail[..=end]);
            rest = &quoted[end..];
            continue;
        }
        let name_len = tail[1..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len() - 1);
        let param = (!tail.starts_with("::"))
            .then(|| Param::named(&tail[1..=name_len]))
            .flatten();
        let Some(param) = param else {
            // A cast (`::`) or a colon that names no parameter: copied as is.
            let skip = if tail.starts_with("::") { 2 } else { 1 };
            out.push_str(&tail[..skip]);
            rest = &tail[skip..];
            continue;
        };
        match style {
            Placeholders::Numbered(prefix) => {
                let n = match binds.iter().position(|p| *p == param) {
                    Some(i) => i + 1,
                    None => {
                        binds.push(param);
                        binds.len()
                    }
                };
                out.push_str(prefix);
                out.push_str(&n.to_string());
            }
            Placeholders::Positional => {
                binds.push(param);
                out.push('?');
            }
        }
        rest = &tail[1 + name_len..];
    }
    out.push_str(rest);
    Stmt { sql: out, binds }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_are_bound_once_each() {
        let s = compile(
            "a = :id AND b = :fence AND c = :id AND d::text = 'x:y'",
            Placeholders::Numbered("$"),
        );
        assert_eq!(s.sql, "a = $1 AND b = $2 AND c = $1 AND d::text = 'x:y'");
        assert_eq!(s.binds, [Param::Id, Param::Fence]);
    }

    #[test]
    fn positional_parameters_are_bound_at_each_use() {
        let s = compile(
            "a = :id AND b = :fence AND c = :id AND t = '00:00'",
            Placeholders::Positional,
        );
        assert_eq!(s.sql, "a = ? AND b = ? AND c = ? AND t = '00:00'");
        assert_eq!(s.binds, [Param::Id, Param::Fence, Param::Id]);
    }

    #[test]
    fn unknown_names_and_casts_are_left_alone() {
        let s = compile(":id::text :nope", Placeholders::Numbered("?"));
        assert_eq!(s.sql, "?1::text :nope");
    }

    /// Every dialect's statements name only known parameters, and only those their operation
    /// supplies (see `SqlStore`).
    fn check<D: Sql>() {
        for level in AuditLevel::ALL {
            check_at::<D>(level);
        }
    }

    /// What each operation supplies to its statements.
    const CLAIM: &[Param] = &[
        Param::Id,
        Param::Namespace,
        Param::Principal,
        Param::Key,
        Param::Fingerprint,
        Param::Owner,
        Param::Lease,
        Param::Ttl,
        Param::Hold,
        Param::RequestId,
    ];
    const SETTLE: &[Param] = &[Param::Id, Param::Owner, Param::Fence];
    const RENEW: &[Param] = &[Param::Id, Param::Owner, Param::Fence, Param::Lease];
    const COMPLETE: &[Param] = &[
        Param::Id,
        Param::Owner,
        Param::Fence,
        Param::Response,
        Param::Ttl,
    ];
    const LIST: &[Param] = &[
        Param::Namespace,
        Param::Principal,
        Param::State,
        Param::Age,
        Param::Limit,
    ];
    const RESOLVE_COMPLETE: &[Param] = &[Param::Id, Param::Response, Param::Ttl, Param::Fence];
    const AUDIT_QUERY: &[Param] = &[
        Param::Namespace,
        Param::Principal,
        Param::Key,
        Param::Event,
        Param::Since,
        Param::Until,
        Param::Limit,
    ];
    const AUDIT_FENCED: &[Param] = &[
        Param::Namespace,
        Param::Principal,
        Param::Key,
        Param::Fence,
        Param::Outcome,
        Param::Owner,
    ];
    const AUDIT_SETTLED: &[Param] = &[
        Param::Id,
        Param::Event,
        Param::Outcome,
        Param::Head,
        Param::Owner,
        Param::Actor,
    ];

    fn check_at<D: Sql>(level: AuditLevel) {
        let all = Statements::new::<D>(&TableName::default(), level);
        let renew = match &all.renew {
            Renewal::Returning(s) | Renewal::LastInsertId(s) => s,
        };
        let (then_write, then_read) = match &all.claim_then_read {
            Some((w, r)) => (w, r),
            None => (&all.claim, &all.claim),
        };
        let uses: [(&Stmt, &[Param]); 19] = [
            (all.claim_read.as_ref().unwrap_or(&all.claim), CLAIM),
            (&all.claim, CLAIM),
            (then_write, CLAIM),
            (then_read, CLAIM),
            (renew, RENEW),
            (&all.complete, COMPLETE),
            (&all.release_retryable, SETTLE),
            (&all.release_unknown, SETTLE),
            (&all.get, &[Param::Id]),
            (&all.list, LIST),
            (&all.resolve_complete, RESOLVE_COMPLETE),
            (&all.resolve_release, &[Param::Id, Param::Fence]),
            (&all.resolve_probe, &[Param::Id]),
            (&all.delete, &[Param::Id]),
            (&all.reap, &[Param::Limit]),
            (&all.audit_query, AUDIT_QUERY),
            (&all.audit_fenced, AUDIT_FENCED),
            (&all.audit_settled, AUDIT_SETTLED),
            (&all.audit_reap, &[Param::Age, Param::Limit]),
        ];
        for (stmt, supplied) in uses {
            assert!(!stmt.binds.is_empty(), "{}", stmt.sql);
            for p in &stmt.binds {
                assert!(supplied.contains(p), "{p:?} not supplied to {}", stmt.sql);
            }
            for leftover in ["{", ":id", ":lease", ":limit"] {
                assert!(!stmt.sql.contains(leftover), "{leftover} in {}", stmt.sql);
            }
        }
        assert!(!all.migrate.contains('{') && !all.drop.contains('{'));
        for grouped in [&all.claim_many, &all.complete_many].into_iter().flatten() {
            assert!(
                !grouped.contains('{') && !grouped.contains(":id"),
                "{grouped}"
            );
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_statements_compile() {
        check::<sqlx::Postgres>();
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_statements_compile() {
        check::<sqlx::MySql>();
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_statements_compile() {
        check::<sqlx::Sqlite>();
    }
}

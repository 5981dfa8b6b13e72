//! [`PgStore`]: records in a PostgreSQL table.
//!
//! Every operation is one statement judged on `statement_timestamp()`:
//!
//! - **claim** is one `WITH … INSERT … ON CONFLICT (id) DO UPDATE … WHERE … RETURNING`. Its
//!   first CTE reads the row; when the read already decides the answer without a write
//!   (replay, busy, unknown, mismatch) the insert gets no input row, so a replay takes no row
//!   lock. Otherwise the upsert's `WHERE` re-checks the *latest* row version (fresh claim on an
//!   absent or expired record, takeover, or hold → unknown), and the statement returns either
//!   the written row or the row it read. In the rare case where the read saw a claimable record
//!   but a concurrent claim won the upsert, the statement is run again (bounded).
//! - **renew / complete / release / delete** are one guarded `UPDATE` each.
//! - **group commit**: claims that arrive while every connection is busy are one
//!   `INSERT … SELECT FROM unnest(…) ON CONFLICT (id) DO NOTHING`, which also returns the rows
//!   that were already there (a replay is answered by the same statement), and completions are
//!   one `UPDATE … FROM unnest(…)`; see [`crate::SqlStore::with_group_commit`].
//! - **resolve** is a guarded `UPDATE`, then a read to say why it did not apply.
//!
//! Use `READ COMMITTED` (PostgreSQL's default) for same-database mode: under `REPEATABLE
//! READ` a concurrent claim of the same key makes the upsert fail with a serialization error.

use futures::future::BoxFuture;
use sqlx::postgres::PgQueryResult;
use sqlx::{Pool, Postgres};

use super::{ClaimColumns, CompleteColumns, Grouping, OnePool, Placeholders, Sql, Written};

/// Records in a PostgreSQL table. Cheap to clone (the pool is shared).
pub type PgStore = crate::SqlStore<Postgres>;

impl OnePool for Postgres {}

impl Sql for Postgres {
    const STORE: &'static str = "PgStore";
    const PLACEHOLDERS: Placeholders = Placeholders::Numbered("$");
    type Text = String;
    const NOW_MS: &'static str = "((extract(epoch FROM statement_timestamp()) * 1000)::bigint)";
    const NOW_US: &'static str = "((extract(epoch FROM statement_timestamp()) * 1000000)::bigint)";
    const BLOB: &'static str = "bytea";

    /// The advisory lock serialises concurrent migrations of the same table.
    const MIGRATE: &'static str =
        "SELECT pg_advisory_xact_lock(hashtext('idem-sql:{t}')); {create_table}";

    /// `cur` reads the row; `ins` gets an input row only when that read does not already
    /// decide a read-only answer, and its upsert re-checks the latest row version.
    const CLAIM: &'static str = r"
WITH clk AS (
    SELECT us, us / 1000 AS ms FROM (SELECT {now_us} AS us) c
), cur AS (
    SELECT {cols} FROM {t} WHERE id = :id
), ins AS (
    INSERT INTO {t} AS r (id, {cols})
    SELECT :id, :namespace, :principal, :key, :fingerprint, clk.us, 0, :owner, clk.ms + :lease, NULL, clk.ms,
           :request_id, clk.ms, clk.ms + GREATEST(:lease, :ttl), {claimed}
    FROM clk
    WHERE NOT EXISTS (
        SELECT 1 FROM cur WHERE cur.expires_at > clk.ms
           AND (cur.fingerprint <> :fingerprint OR cur.state <> 0 OR cur.lease_until > clk.ms))
    {on_conflict}
    RETURNING {cols}
)
SELECT true AS wrote, clk.ms AS now_ms, ins.* FROM ins, clk
UNION ALL
SELECT false, clk.ms, cur.* FROM cur, clk WHERE NOT EXISTS (SELECT 1 FROM ins)
";

    const GROUPING: Grouping = Grouping::Statement;

    /// `v` holds the claims (sorted by id by the caller, so concurrent statements take their
    /// row locks in one order); `ins` inserts those without a row; the rest are read from the
    /// snapshot the statement started with (rows it waited on are not in it: those keys are
    /// claimed again alone).
    const CLAIM_MANY: Option<&'static str> = Some(
        r"
WITH clk AS (
    SELECT us, us / 1000 AS ms FROM (SELECT {now_us} AS us) c
), v AS (
    SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::bytea[],
                         $6::bytea[], $7::bigint[], $8::bigint[], $9::text[])
        WITH ORDINALITY AS v(id, namespace, principal, idem_key, fingerprint, owner, lease, ttl,
                             request_id, n)
), ins AS (
    INSERT INTO {t} AS r (id, {cols})
    SELECT v.id, v.namespace, v.principal, v.idem_key, v.fingerprint, clk.us, 0, v.owner,
           clk.ms + v.lease, NULL, clk.ms, v.request_id, clk.ms,
           clk.ms + GREATEST(v.lease, v.ttl), {claimed}
    FROM v, clk ORDER BY v.n
    ON CONFLICT (id) DO NOTHING
    RETURNING {cols}, id
)
SELECT true AS wrote, clk.ms AS now_ms, ins.* FROM ins, clk
UNION ALL
SELECT false, clk.ms, {cur_cols}, cur.id FROM {t} cur, clk
WHERE cur.id IN (SELECT id FROM v) AND cur.id NOT IN (SELECT id FROM ins)
",
    );

    const COMPLETE_MANY: Option<&'static str> = Some(
        r"
UPDATE {t} AS r SET verdict = {completed}, state = 1, response = v.response, owner = NULL,
    lease_until = 0, state_at = {now}, expires_at = {now} + v.ttl
FROM unnest($1::bytea[], $2::bytea[], $3::bigint[], $4::bytea[], $5::bigint[])
    AS v(id, owner, fence, response, ttl)
WHERE r.id = v.id AND r.owner = v.owner AND r.fence = v.fence AND r.state IN (0, 2)
  AND r.expires_at > {now}
RETURNING r.id
",
    );

    fn claim_many<'a>(
        pool: &'a Pool<Self>,
        sql: &'a str,
        c: ClaimColumns,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(sql)
                .bind(c.id)
                .bind(c.namespace)
                .bind(c.principal)
                .bind(c.key)
                .bind(c.fingerprint)
                .bind(c.owner)
                .bind(c.lease)
                .bind(c.ttl)
                .bind(c.request_id)
                .fetch_all(pool)
                .await
        })
    }

    fn complete_many<'a>(
        pool: &'a Pool<Self>,
        sql: &'a str,
        c: CompleteColumns,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(sql)
                .bind(c.id)
                .bind(c.owner)
                .bind(c.fence)
                .bind(c.response)
                .bind(c.ttl)
                .fetch_all(pool)
                .await
        })
    }

    const AUDIT_MIGRATE: &'static str = r"
CREATE TABLE IF NOT EXISTS {t}_audit (
    seq        bigint   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at_ms      bigint   NOT NULL,
    namespace  text     NOT NULL,
    principal  text     NOT NULL,
    idem_key   text     NOT NULL,
    event      smallint NOT NULL,
    fence      bigint   NOT NULL,
    request_id text,
    outcome    text,
    head       bytea,
    owner      bytea,
    actor      text
);
CREATE INDEX IF NOT EXISTS {t}_audit_key_idx ON {t}_audit (namespace, idem_key, seq);
CREATE INDEX IF NOT EXISTS {t}_audit_at_idx ON {t}_audit (at_ms);
CREATE OR REPLACE FUNCTION {t}_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {t}_audit ({acols}) {on_insert};
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {t}_audit ({acols}) {on_update};
    ELSE
        INSERT INTO {t}_audit ({acols}) {on_delete};
    END IF;
    RETURN NULL;
END
$body$;
CREATE OR REPLACE TRIGGER {t}_audit_trg AFTER INSERT OR UPDATE OR DELETE ON {t}
    FOR EACH ROW EXECUTE FUNCTION {t}_audit_fn();
";
    const TEXT_NULL: &'static str = ":{p}::text IS NULL";
    const INT_NULL: &'static str = ":{p}::bigint IS NULL";
    const NULL_BLOB: &'static str = "NULL::bytea";
    const DROP_AUDIT_FN: &'static str = "; DROP FUNCTION IF EXISTS {t}_audit_fn()";
    const HEAD: &'static str = "substring(NEW.response from 1 for 3)";

    /// Typed `NULL` tests: PostgreSQL cannot infer an untyped parameter's type from `IS NULL`.
    const LIST: &'static str = "SELECT {cols} FROM {t} WHERE expires_at > {now} \
        AND (:namespace::text IS NULL OR namespace = :namespace) \
        AND (:principal::text IS NULL OR principal = :principal) \
        AND (:state::smallint IS NULL OR state = :state) \
        AND (:age::bigint IS NULL OR created_at <= {now} - :age) \
        ORDER BY created_at, id LIMIT :limit";

    /// `SKIP LOCKED`: rows another statement holds wait for the next pass.
    const REAP: &'static str = "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE expires_at <= {now} \
         ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED) AND expires_at <= {now}";
}

impl Written for PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

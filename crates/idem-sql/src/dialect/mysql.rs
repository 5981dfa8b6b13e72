//! [`MySqlStore`]: records in a MariaDB 10.5+ or MySQL 8 table.
//!
//! Every operation is one statement judged on the server clock (`UTC_TIMESTAMP(6)`, fixed
//! for the statement and independent of the session time zone):
//!
//! - **claim** is one `INSERT … ON DUPLICATE KEY UPDATE … RETURNING` (MariaDB returns the row
//!   as it stands after the statement, written or not). The first assignment computes a
//!   `verdict` from the existing row — keep (0), fresh claim of an absent or expired record (1,
//!   or 11 when the audit level leaves it out), takeover (2), or hold → unknown (3) — and
//!   every later assignment reads that freshly
//!   assigned `verdict`, which relies on MySQL's left-to-right evaluation of assignments. The
//!   store's own pool strips MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode, which would break that;
//!   callers of `claim_in` on their own connections must not enable it. A replay therefore
//!   takes the row lock briefly, unlike PostgreSQL and SQLite. `RETURNING` on `INSERT` is
//!   MariaDB syntax (10.5+): on MySQL, and older MariaDB, the store runs the same upsert
//!   without it, then `SELECT … FOR UPDATE` of the row, in one transaction (the caller's in
//!   same-database mode). The upsert holds the row's exclusive lock until commit, so the read
//!   sees the row as the upsert left it. The store picks the path from `SELECT VERSION()`
//!   before its first claim.
//! - **renew** is one guarded `UPDATE` that hands the new deadline back through
//!   `LAST_INSERT_ID(expr)` (no `UPDATE … RETURNING` before MariaDB 11);
//!   **complete / release / delete** are one guarded `UPDATE` each; **resolve** is a guarded
//!   `UPDATE`, then a read to say why it did not apply.
//!
//! The pool's sessions run at `READ COMMITTED`, so the reaper's batched deletes take no gap
//! locks. A claim on the store's pool that loses an InnoDB deadlock (SQLSTATE 40001) is run
//! again.

use sqlx::error::BoxDynError;
use sqlx::mysql::{MySqlQueryResult, MySqlTypeInfo, MySqlValueRef};
use sqlx::{Decode, MySql, Type};

use super::{OnePool, Placeholders, Renewal, Sql, Written};

/// The claim's upsert; the first assignment computes `verdict` from the existing row and
/// every later one reads it.
macro_rules! claim_upsert {
    () => {
        r"
INSERT INTO {t} (id, {cols})
VALUES (:id, :namespace, :principal, :key, :fingerprint, {now_us}, 0, :owner, {now} + :lease, NULL, {now},
        :request_id, {now}, {now} + GREATEST(:lease, :ttl), {claimed})
ON DUPLICATE KEY UPDATE
    verdict = CASE WHEN expires_at <= {now} THEN {claimed}
                   WHEN fingerprint <> VALUES(fingerprint) OR state <> 0 OR lease_until > {now} THEN 0
                   WHEN :hold THEN 3 ELSE 2 END,
    fence = IF(verdict IN ({claimed}, 2), GREATEST(fence + 1, VALUES(fence)), fence),
    state = CASE verdict WHEN 0 THEN state WHEN 3 THEN 2 ELSE 0 END,
    owner = IF(verdict IN ({claimed}, 2), VALUES(owner), owner),
    lease_until = CASE verdict WHEN 0 THEN lease_until WHEN 3 THEN 0 ELSE VALUES(lease_until) END,
    response = IF(verdict = 0, response, NULL),
    state_at = IF(verdict = 0, state_at, VALUES(state_at)),
    request_id = IF(verdict IN ({claimed}, 2), VALUES(request_id), request_id),
    created_at = IF(verdict IN ({claimed}, 2), VALUES(created_at), created_at),
    expires_at = IF(verdict IN ({claimed}, 2), VALUES(expires_at), expires_at),
    namespace = IF(verdict = {claimed}, VALUES(namespace), namespace),
    principal = IF(verdict = {claimed}, VALUES(principal), principal),
    idem_key = IF(verdict = {claimed}, VALUES(idem_key), idem_key),
    fingerprint = IF(verdict = {claimed}, VALUES(fingerprint), fingerprint)
"
    };
}

/// Records in a MariaDB or MySQL table. Cheap to clone (the pool is shared). The pool's sessions must
/// not use the `SIMULTANEOUS_ASSIGNMENT` SQL mode (`MySqlStore::connect` makes sure).
pub type MySqlStore = crate::SqlStore<MySql>;

impl OnePool for MySql {}

impl Sql for MySql {
    const STORE: &'static str = "MySqlStore";
    const PLACEHOLDERS: Placeholders = Placeholders::Positional;
    type Text = Utf8;
    const NOW_MS: &'static str =
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";
    const NOW_US: &'static str =
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

    /// Binary collation: keys compare byte for byte.
    const MIGRATE: &'static str = r"
CREATE TABLE IF NOT EXISTS {t} (
    id          BINARY(32)    NOT NULL PRIMARY KEY,
    namespace   VARCHAR(255)  NOT NULL,
    principal   TEXT          NULL,
    idem_key    VARCHAR(255)  NOT NULL,
    fingerprint VARBINARY(34) NOT NULL,
    fence       BIGINT        NOT NULL,
    state       SMALLINT      NOT NULL,
    owner       BINARY(16)    NULL,
    lease_until BIGINT        NOT NULL,
    response    LONGBLOB      NULL,
    state_at    BIGINT        NOT NULL,
    request_id  TEXT          NULL,
    created_at  BIGINT        NOT NULL,
    expires_at  BIGINT        NOT NULL,
    verdict     SMALLINT      NOT NULL,
    KEY {t}_expires_idx (expires_at),
    KEY {t}_created_idx (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
";

    /// The update trigger runs its insert only for the verdicts it records: an insert of no
    /// rows inside the trigger would still reset the renewal's `LAST_INSERT_ID`.
    const AUDIT_MIGRATE: &'static str = r"
CREATE TABLE IF NOT EXISTS {t}_audit (
    seq        BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms      BIGINT        NOT NULL,
    namespace  VARCHAR(255)  NOT NULL,
    principal  TEXT          NOT NULL,
    idem_key   VARCHAR(255)  NOT NULL,
    event      SMALLINT      NOT NULL,
    fence      BIGINT        NOT NULL,
    request_id TEXT          NULL,
    outcome    TEXT          NULL,
    head       VARBINARY(3)  NULL,
    owner      BINARY(16)    NULL,
    actor      TEXT          NULL,
    KEY {t}_audit_key_idx (namespace, idem_key, seq),
    KEY {t}_audit_at_idx (at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TRIGGER IF NOT EXISTS {t}_audit_ins AFTER INSERT ON {t}
    FOR EACH ROW INSERT INTO {t}_audit ({acols}) {on_insert};
CREATE TRIGGER IF NOT EXISTS {t}_audit_upd AFTER UPDATE ON {t}
    FOR EACH ROW BEGIN
        IF NEW.verdict BETWEEN 1 AND 6 THEN
            INSERT INTO {t}_audit ({acols}) {on_update};
        END IF;
    END;
CREATE TRIGGER IF NOT EXISTS {t}_audit_del AFTER DELETE ON {t}
    FOR EACH ROW INSERT INTO {t}_audit ({acols}) {on_delete};
";
    const AUDIT_REAP: &'static str =
        "DELETE FROM {t}_audit WHERE at_ms < {now} - :age ORDER BY seq LIMIT :limit";
    const DUAL: &'static str = " FROM DUAL";
    const HEAD: &'static str = "LEFT(NEW.response, 3)";

    /// Every assignment after the first reads the `verdict` it set (left to right).
    const CLAIM: &'static str = concat!(
        claim_upsert!(),
        "RETURNING verdict <> 0 AS wrote, {now} AS now_ms, {cols}\n"
    );

    /// MySQL 8 (and MariaDB before 10.5) have no `INSERT … RETURNING`: the same upsert, then
    /// a locking read of the row in the same transaction. The upsert holds the row's
    /// exclusive lock until commit, so the read sees exactly what the upsert left.
    const CLAIM_THEN_READ: Option<(&'static str, &'static str)> = Some((
        claim_upsert!(),
        "SELECT verdict <> 0 AS wrote, {now} AS now_ms, {cols} FROM {t} WHERE id = :id FOR UPDATE",
    ));

    /// MariaDB 10.5 and later; not MySQL.
    fn claim_returning(version: &str) -> bool {
        mariadb_with_returning(version)
    }

    const RENEW: Renewal<&'static str> = Renewal::LastInsertId(
        "UPDATE {t} SET lease_until = LAST_INSERT_ID({now} + :lease), \
         expires_at = GREATEST(expires_at, {now} + :lease), verdict = 10 WHERE {holder}",
    );

    const REAP: &'static str =
        "DELETE FROM {t} WHERE expires_at <= {now} ORDER BY expires_at LIMIT :limit";

    const SESSION: &'static [&'static str] = &[
        "SET SESSION sql_mode = REPLACE(@@SESSION.sql_mode, 'SIMULTANEOUS_ASSIGNMENT', '')",
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    ];

    /// InnoDB deadlock: the statement was rolled back.
    const CLAIM_RETRY_CODES: &'static [&'static str] = &["40001"];
}

/// Whether `version` (`SELECT VERSION()`) is MariaDB 10.5 or later, which accepts
/// `INSERT … RETURNING`.
fn mariadb_with_returning(version: &str) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (10, 5)
}

impl Written for MySqlQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }

    fn last_insert_id(&self) -> Option<u64> {
        Some(MySqlQueryResult::last_insert_id(self))
    }
}

/// Text from a binary-collated column, which MariaDB flags as binary: sqlx refuses to decode
/// it as `String`, so it is read as bytes and checked to be UTF-8.
#[derive(Debug)]
pub struct Utf8(String);

impl From<Utf8> for String {
    fn from(text: Utf8) -> Self {
        text.0
    }
}

impl Type<MySql> for Utf8 {
    fn type_info() -> MySqlTypeInfo {
        <Vec<u8> as Type<MySql>>::type_info()
    }

    fn compatible(ty: &MySqlTypeInfo) -> bool {
        <Vec<u8> as Type<MySql>>::compatible(ty)
    }
}

impl<'r> Decode<'r, MySql> for Utf8 {
    fn decode(value: MySqlValueRef<'r>) -> Result<Self, BoxDynError> {
        let bytes = <Vec<u8> as Decode<'r, MySql>>::decode(value)?;
        Ok(Self(String::from_utf8(bytes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::mariadb_with_returning;

    #[test]
    fn returning_by_server_version() {
        assert!(mariadb_with_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(mariadb_with_returning("10.5.0-MariaDB"));
        assert!(mariadb_with_returning("11.4.2-MariaDB-log"));
        assert!(!mariadb_with_returning("10.4.34-MariaDB"));
        assert!(!mariadb_with_returning("8.0.36"));
        assert!(!mariadb_with_returning("8.4.0-commercial"));
        assert!(!mariadb_with_returning(""));
    }
}

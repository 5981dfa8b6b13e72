//! [`SqlStore`]: the one store, generic over its [`Dialect`], and its [`Store`] impl.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use idem_core::audit::{AuditEvent, AuditKind, AuditLevel, AuditQuery, AuditRetention};
use idem_core::store::{Completion, Hold};
use idem_core::{
    ClaimOutcome, ClaimRequest, ListFilter, OwnerId, Record, ReleaseKind, RenewOutcome, Resolution,
    ResolveOutcome, ScopedKey, SettleOutcome, Store, StoreError,
};
use sqlx::Pool;
use sqlx::pool::PoolOptions;

use idem_core::store::coalesce;

use crate::audit;
use crate::dialect::{Dialect, Grouping, OnePool, Renewal, Sql, Written};
use crate::driver::{On, Value};
use crate::group::{self, Answer, Encoded, Group};
use crate::record::{
    ClaimRow, MAX_RACES, RawRecord, fence_param, ms, settled, state_code, too_many_races, ts,
    unresolved,
};
use crate::statements::{Param, Statements, Stmt};
use crate::table::{TableName, TableNameError};

/// Records in one table of a SQL database: [`crate::PgStore`], [`crate::MySqlStore`] or
/// [`crate::SqliteStore`]. Cheap to clone (the pools are shared).
///
/// Every operation is one atomic statement judged on the database clock, compiled once per
/// table from the dialect's SQL (`docs/sql-stores.md` lists them).
pub struct SqlStore<D: Dialect> {
    /// Runs the writes (and, for all but SQLite, the reads too).
    pub(crate) writer: Pool<D>,
    /// Runs the reads.
    pub(crate) reader: Pool<D>,
    pub(crate) table: TableName,
    pub(crate) sql: Arc<Statements>,
    /// Events older than this are deleted by the reaper.
    pub(crate) audit_age: Duration,
    /// Which changes the statements record (compiled into `sql`).
    pub(crate) audit_level: AuditLevel,
    /// Which claim the server takes: [`CLAIM_UNKNOWN`] until the first claim asks the server
    /// (dialects with [`crate::dialect::Sql::CLAIM_THEN_READ`] only), then
    /// [`CLAIM_RETURNING`] or [`CLAIM_THEN_READ`].
    pub(crate) claim_mode: Arc<AtomicU8>,
    /// Whether concurrent claims and completions share commits (on by default).
    grouping: bool,
    /// How many claims, completions or groups of them are in flight at once.
    group_slots: usize,
    /// The group-commit queue, where the dialect groups and `grouping` is on.
    group: Option<Arc<Group<D>>>,
}

/// Claims and completions in flight at once under group commit, by default.
const GROUP_SLOTS: usize = 2;

/// Bounds one grouped call (the callers bound their own waits too).
const GROUP_LIMIT: Duration = Duration::from_secs(30);

pub(crate) const CLAIM_UNKNOWN: u8 = 0;
pub(crate) const CLAIM_RETURNING: u8 = 1;
pub(crate) const CLAIM_THEN_READ: u8 = 2;

/// Whether a server needs a write without `RETURNING` and a read after it (MySQL 8, MariaDB
/// before 10.5): asks `SELECT VERSION()` (`version_sql`) once, and keeps the answer in `mode`
/// ([`CLAIM_UNKNOWN`] until then, [`CLAIM_RETURNING`] or [`CLAIM_THEN_READ`] after), which
/// every clone of the store shares. `what` names the statement in the debug log.
pub(crate) async fn then_read<D: Sql>(
    mode: &AtomicU8,
    pool: &Pool<D>,
    version_sql: &Stmt,
    what: &'static str,
) -> Result<bool, StoreError> {
    let known = match mode.load(Ordering::Relaxed) {
        CLAIM_UNKNOWN => {
            let row = D::fetch_optional(On::Pool(pool), version_sql, &[])
                .await
                .map_err(StoreError::unavailable)?
                .ok_or_else(|| StoreError::unavailable("SELECT VERSION() returned no row"))?;
            let version: String = D::get::<D::Text>(&row, 0)
                .map_err(StoreError::unavailable)?
                .into();
            let known = if D::claim_returning(&version) {
                CLAIM_RETURNING
            } else {
                CLAIM_THEN_READ
            };
            tracing::debug!(%version, then_read = known == CLAIM_THEN_READ, "{what} statement chosen");
            mode.store(known, Ordering::Relaxed);
            known
        }
        known => known,
    };
    Ok(known == CLAIM_THEN_READ)
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        Self {
            writer: self.writer.clone(),
            reader: self.reader.clone(),
            table: self.table.clone(),
            sql: self.sql.clone(),
            audit_age: self.audit_age,
            audit_level: self.audit_level,
            claim_mode: self.claim_mode.clone(),
            grouping: self.grouping,
            group_slots: self.group_slots,
            group: self.group.clone(),
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(D::STORE)
            .field("table", &self.table)
            .field("audit", &self.audit_level)
            .finish_non_exhaustive()
    }
}

/// The parameters of a claim.
struct ClaimArgs {
    id: [u8; 32],
    fingerprint: [u8; idem_core::fingerprint::FINGERPRINT_LEN],
    owner: [u8; 16],
}

impl<D: Dialect> SqlStore<D> {
    /// A store reading through `reader` and writing through `writer`, on `table`.
    pub(crate) fn with_pools(writer: Pool<D>, reader: Pool<D>, table: TableName) -> Self {
        let audit_level = AuditLevel::default();
        let sql = Arc::new(Statements::new::<D>(&table, audit_level));
        let mode = if sql.claim_then_read.is_some() {
            CLAIM_UNKNOWN
        } else {
            CLAIM_RETURNING
        };
        Self {
            writer,
            reader,
            table,
            sql,
            audit_age: AuditRetention::default().max_age,
            audit_level,
            claim_mode: Arc::new(AtomicU8::new(mode)),
            grouping: true,
            group_slots: GROUP_SLOTS,
            group: None,
        }
        .regrouped()
    }

    /// Lets concurrent claims and completions on the store's own pools share commits (on by
    /// default; `false` commits each one on its own). An operation that finds a writer
    /// connection free runs at once, alone; those that arrive while every connection is busy
    /// are sent together: on PostgreSQL as one statement for the claims and one for the
    /// completions, on SQLite as one transaction. The guards, and so the guarantees, are a
    /// lone operation's; MariaDB commits each operation on its own either way. Same-database
    /// mode (`claim_in`, `complete_in`) runs on the caller's transaction and never groups.
    #[must_use]
    pub fn with_group_commit(mut self, on: bool) -> Self {
        self.grouping = on;
        self.regrouped()
    }

    /// How many claims and completions (alone, or a group of them) the store runs at once
    /// under group commit (default 2, at most the writer's connections; at least 1). More
    /// slots run more statements side by side and so make smaller groups: worth it on a
    /// database server with many cores. On a 2-core PostgreSQL with 64 concurrent requests,
    /// 2 and 3 slots served about 0.8 to 0.95 of a plain insert loop's rate, 16 slots 0.5.
    #[must_use]
    pub fn with_group_slots(mut self, slots: usize) -> Self {
        self.group_slots = slots.max(1);
        self.regrouped()
    }

    /// The store with a group-commit queue for its current settings (a new one: clones made
    /// before keep theirs).
    fn regrouped(mut self) -> Self {
        self.group = None;
        if self.grouping && D::GROUPING != Grouping::Off {
            let inner = self.clone();
            self.group = Some(Arc::new(Group::new(inner, self.group_slots, GROUP_LIMIT)));
        }
        self
    }

    /// What the dialect's claim read says on the readers, when that alone answers `req`.
    async fn read_answer(&self, req: &ClaimRequest) -> Result<Option<ClaimOutcome>, StoreError> {
        let Some(read) = &self.sql.claim_read else {
            return Ok(None);
        };
        let claim = ClaimArgs {
            id: req.key.digest(),
            fingerprint: req.fingerprint.to_bytes(),
            owner: req.owner.to_bytes(),
        };
        let args = claim.values(req);
        let row = D::fetch_optional(On::Pool(&self.reader), read, &args)
            .await
            .map_err(StoreError::unavailable)?;
        match row {
            Some(row) => ClaimRow::decode::<D>(&row)?.outcome(req),
            None => Ok(None),
        }
    }

    /// Runs one operation of a batch alone.
    pub(crate) async fn alone(&self, op: &group::Op) -> Result<Answer, StoreError> {
        match op {
            group::Op::Claim(req) => self.claim_on(None, req).await.map(Answer::Claim),
            group::Op::Complete(c) => self.complete_alone(c).await.map(Answer::Settle),
        }
    }

    /// A completion on the writer, its fencing audited.
    async fn complete_alone(&self, c: &Encoded) -> Result<SettleOutcome, StoreError> {
        let outcome = self.complete_encoded(On::Pool(&self.writer), c).await?;
        if outcome == SettleOutcome::Fenced {
            self.audit_fenced(&c.key, c.owner, c.fence, "complete")
                .await;
        }
        Ok(outcome)
    }

    /// Claims with the portable upsert-then-read transaction even where the server accepts
    /// the one-statement claim (MariaDB 10.5+), as on MySQL 8. For tests of that path; a
    /// dialect without it ignores this.
    pub fn with_claim_then_read(self) -> Self {
        let mode = if self.sql.claim_then_read.is_some() {
            CLAIM_THEN_READ
        } else {
            CLAIM_RETURNING
        };
        Self {
            claim_mode: Arc::new(AtomicU8::new(mode)),
            ..self
        }
        .regrouped()
    }

    /// Whether claims take the upsert-then-read path: asks the server its version once.
    async fn claims_then_read(&self) -> Result<bool, StoreError> {
        then_read(&self.claim_mode, &self.writer, &self.sql.version, "claim").await
    }

    /// The claim's write and the row it left, without `RETURNING`: on the caller's connection
    /// (inside its transaction), or in a transaction of the store's own.
    async fn claim_then_read(
        &self,
        conn: Option<&mut D::Connection>,
        args: &crate::driver::Args<'_>,
    ) -> Result<Option<D::Row>, sqlx::Error> {
        let Some((write, read)) = &self.sql.claim_then_read else {
            return Ok(None);
        };
        match conn {
            Some(c) => {
                D::execute(On::Conn(&mut *c), write, args).await?;
                D::fetch_optional(On::Conn(c), read, args).await
            }
            None => {
                let mut tx = self.begin().await?;
                D::execute(On::Conn(&mut *tx), write, args).await?;
                let row = D::fetch_optional(On::Conn(&mut *tx), read, args).await?;
                tx.commit().await?;
                Ok(row)
            }
        }
    }

    /// Keeps audit events for `max_age` (default 30 days): the reaper deletes older ones.
    /// SQL stores bound the trail by age only.
    #[must_use]
    pub fn with_audit_retention(mut self, max_age: Duration) -> Self {
        self.audit_age = max_age;
        self.regrouped()
    }

    /// Records the changes `level` names in the audit table (by default
    /// [`AuditLevel::Operator`]: a fresh claim and its completion write no event row, as the
    /// row itself tells them). The level is in the statements, not the schema: stores at
    /// different levels may share a table.
    #[must_use]
    pub fn with_audit_level(mut self, level: AuditLevel) -> Self {
        if level != self.audit_level {
            self.sql = Arc::new(Statements::new::<D>(&self.table, level));
            self.audit_level = level;
        }
        self.regrouped()
    }

    /// Applies a resolve or delete (`stmt` on `args`) and writes its event in the same
    /// transaction. True when the statement changed the row.
    async fn settle_audited(
        &self,
        stmt: &Stmt,
        args: &[(Param, Value<'_>)],
        event: AuditKind,
        outcome: Option<&str>,
        head: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin().await.map_err(StoreError::unavailable)?;
        let done = D::execute(On::Conn(&mut *tx), stmt, args)
            .await
            .map_err(StoreError::unavailable)?;
        if done.rows() != 1 {
            tx.rollback().await.map_err(StoreError::unavailable)?;
            return Ok(false);
        }
        let id = args
            .iter()
            .find(|(p, _)| *p == Param::Id)
            .map(|(_, v)| *v)
            .ok_or_else(|| StoreError::unavailable("settling statement without an id"))?;
        let instance = OwnerId::random().to_bytes();
        let actor = idem_core::audit::current_actor();
        let event_args = [
            (Param::Id, id),
            (Param::Event, Value::Int(i64::from(event.code()))),
            (Param::Outcome, Value::OptText(outcome)),
            (Param::Head, Value::OptBytes(head)),
            (Param::Owner, Value::Bytes(&instance)),
            (Param::Actor, Value::OptText(actor.as_deref())),
        ];
        D::execute(On::Conn(&mut *tx), &self.sql.audit_settled, &event_args)
            .await
            .map_err(StoreError::unavailable)?;
        tx.commit().await.map_err(StoreError::unavailable)?;
        Ok(true)
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Creates the table and its indexes if they do not exist (idempotent; on PostgreSQL,
    /// concurrent callers are serialised by an advisory lock).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.begin().await.map_err(StoreError::unavailable)?;
        D::execute_raw(On::Conn(&mut *tx), &self.sql.migrate)
            .await
            .map_err(StoreError::unavailable)?;
        tx.commit().await.map_err(StoreError::unavailable)
    }

    /// Drops the table. For tests and teardown.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database refused.
    pub async fn drop_table(&self) -> Result<(), StoreError> {
        D::execute_raw(On::Pool(&self.writer), &self.sql.drop)
            .await
            .map_err(StoreError::unavailable)
    }

    /// Begins a transaction of the store's own on the writer.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, D>, sqlx::Error> {
        match D::BEGIN {
            Some(statement) => self.writer.begin_with(statement).await,
            None => self.writer.begin().await,
        }
    }

    /// Claims `req` on `conn` (same-database mode), or on the store's pools when `None`.
    ///
    /// Runs the dialect's read first when it has one, then the claim statement, again after a
    /// lost race (bounded); on its own pools a claim rolled back by the database
    /// ([`crate::dialect::Sql::CLAIM_RETRY_CODES`]) runs again too.
    pub(crate) async fn claim_on(
        &self,
        mut conn: Option<&mut D::Connection>,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let claim = ClaimArgs {
            id: req.key.digest(),
            fingerprint: req.fingerprint.to_bytes(),
            owner: req.owner.to_bytes(),
        };
        let args = claim.values(req);
        let autocommit = conn.is_none();
        let then_read = self.claims_then_read().await?;
        for _ in 0..MAX_RACES {
            if let Some(read) = &self.sql.claim_read {
                let on = match conn.as_deref_mut() {
                    Some(c) => On::Conn(c),
                    None => On::Pool(&self.reader),
                };
                let row = D::fetch_optional(on, read, &args)
                    .await
                    .map_err(StoreError::unavailable)?;
                if let Some(row) = row
                    && let Some(outcome) = ClaimRow::decode::<D>(&row)?.outcome(req)?
                {
                    return Ok(outcome);
                }
            }
            let written = if then_read {
                self.claim_then_read(conn.as_deref_mut(), &args).await
            } else {
                let on = match conn.as_deref_mut() {
                    Some(c) => On::Conn(c),
                    None => On::Pool(&self.writer),
                };
                D::fetch_optional(on, &self.sql.claim, &args).await
            };
            match written {
                Ok(Some(row)) => {
                    if let Some(outcome) = ClaimRow::decode::<D>(&row)?.outcome(req)? {
                        return Ok(outcome);
                    }
                }
                // No row: a concurrent claim holds the key's insert; run again to see it.
                Ok(None) => {}
                Err(e) if autocommit && rolled_back::<D>(&e) => {}
                Err(e) => return Err(StoreError::unavailable(e)),
            }
        }
        Err(too_many_races())
    }

    /// Runs `completion` on `on`.
    pub(crate) async fn complete_on(
        &self,
        on: On<'_, D>,
        completion: &Completion<'_>,
    ) -> Result<SettleOutcome, StoreError> {
        self.complete_encoded(on, &Encoded::new(completion)).await
    }

    /// Runs the completion `c` on `on`.
    pub(crate) async fn complete_encoded(
        &self,
        on: On<'_, D>,
        c: &Encoded,
    ) -> Result<SettleOutcome, StoreError> {
        let (id, owner) = (c.key.digest(), c.owner.to_bytes());
        let args = [
            (Param::Id, Value::Bytes(&id)),
            (Param::Owner, Value::Bytes(&owner)),
            (Param::Fence, Value::Int(fence_param(c.fence))),
            (Param::Response, Value::Bytes(&c.response)),
            (Param::Ttl, Value::Int(ms(c.ttl))),
        ];
        self.settle(on, &self.sql.complete, &args).await
    }

    /// Runs a settling statement: settled when it changed the row, fenced otherwise.
    async fn settle(
        &self,
        on: On<'_, D>,
        stmt: &Stmt,
        args: &[(Param, Value<'_>)],
    ) -> Result<SettleOutcome, StoreError> {
        let done = D::execute(on, stmt, args)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(settled(done.rows()))
    }
}

impl ClaimArgs {
    fn values<'a>(&'a self, req: &'a ClaimRequest) -> [(Param, Value<'a>); 10] {
        [
            (Param::Id, Value::Bytes(&self.id)),
            (Param::Namespace, Value::Text(req.key.scope.namespace())),
            (Param::Principal, Value::OptText(req.key.scope.principal())),
            (Param::Key, Value::Text(req.key.key.as_str())),
            (Param::Fingerprint, Value::Bytes(&self.fingerprint)),
            (Param::Owner, Value::Bytes(&self.owner)),
            (Param::Lease, Value::Int(ms(req.lease))),
            (Param::Ttl, Value::Int(ms(req.ttl))),
            (
                Param::Hold,
                Value::Bool(matches!(req.takeover, idem_core::TakeoverPolicy::Hold)),
            ),
            (Param::RequestId, Value::OptText(req.request_id.as_deref())),
        ]
    }
}

/// The database rolled the statement back whole, so on the store's own pool it can run again.
fn rolled_back<D: Dialect>(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| D::CLAIM_RETRY_CODES.contains(&code.as_ref())))
}

impl<D: OnePool> SqlStore<D> {
    /// A store on `pool`, using the table [`crate::DEFAULT_TABLE`]. The pool's sessions must
    /// be set up as [`SqlStore::connect`] sets them up (MariaDB: no `SIMULTANEOUS_ASSIGNMENT`).
    pub fn new(pool: Pool<D>) -> Self {
        Self::with_table_name(pool, TableName::default())
    }

    /// A store on `pool` using `table`.
    pub fn with_table_name(pool: Pool<D>, table: TableName) -> Self {
        Self::with_pools(pool.clone(), pool, table)
    }

    /// A store on `pool` using the table named `table`.
    ///
    /// # Errors
    /// [`TableNameError`] when the name is not a plain identifier.
    pub fn with_table(pool: Pool<D>, table: &str) -> Result<Self, TableNameError> {
        Ok(Self::with_table_name(pool, TableName::new(table)?))
    }

    /// Connects a pool of up to `max_connections` to `url` (`postgres://…`, `mysql://…`).
    /// MariaDB sessions get `READ COMMITTED` and left-to-right assignments.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the URL is malformed or the server is unreachable.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: <D::Connection as sqlx::Connection>::Options =
            url.parse().map_err(StoreError::unavailable)?;
        let pool = PoolOptions::<D>::new()
            .max_connections(max_connections.max(1))
            .after_connect(|conn, _meta| {
                Box::pin(async move {
                    for statement in D::SESSION {
                        D::execute_raw(On::Conn(conn), statement).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(Self::new(pool))
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<D> {
        &self.writer
    }
}

impl<D: Dialect> Store for SqlStore<D> {
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let Some(group) = &self.group else {
            return self.claim_on(None, req).await;
        };
        // A transaction of the group runs on the one writer: a claim the dialect's read
        // answers (a replay, a busy or mismatched key) is answered on the readers instead.
        if D::GROUPING == Grouping::Transaction
            && let Some(outcome) = self.read_answer(req).await?
        {
            return Ok(outcome);
        }
        coalesce::submit(group, group::Op::Claim(req.clone()))
            .await?
            .claim()
    }

    async fn renew(&self, hold: &Hold<'_>, lease: Duration) -> Result<RenewOutcome, StoreError> {
        let (id, owner) = (hold.key.digest(), hold.owner.to_bytes());
        let args = [
            (Param::Id, Value::Bytes(&id)),
            (Param::Owner, Value::Bytes(&owner)),
            (Param::Fence, Value::Int(fence_param(hold.fence))),
            (Param::Lease, Value::Int(ms(lease))),
        ];
        let deadline = match &self.sql.renew {
            Renewal::Returning(stmt) => {
                let row = D::fetch_optional(On::Pool(&self.writer), stmt, &args)
                    .await
                    .map_err(StoreError::unavailable)?;
                row.map(|row| D::int(&row, 0))
                    .transpose()
                    .map_err(StoreError::unavailable)?
            }
            Renewal::LastInsertId(stmt) => {
                // One connection for both statements: `LAST_INSERT_ID()` is per session.
                let mut conn = self
                    .writer
                    .acquire()
                    .await
                    .map_err(StoreError::unavailable)?;
                let done = D::execute(On::Conn(&mut *conn), stmt, &args)
                    .await
                    .map_err(StoreError::unavailable)?;
                // The pool reports matched rows, so a renewal within the same millisecond
                // still counts.
                if done.rows() == 1 {
                    match done.last_insert_id().filter(|&id| id > 0) {
                        Some(id) => Some(i64::try_from(id).unwrap_or(i64::MAX)),
                        // The audit trigger (a sub-statement) clears the id the server
                        // reports with the update; the session still has it.
                        None => {
                            let read = self.sql.renew_read.as_ref().ok_or_else(|| {
                                StoreError::unavailable("the renewal reported no LAST_INSERT_ID")
                            })?;
                            let row = D::fetch_optional(On::Conn(&mut *conn), read, &[])
                                .await
                                .map_err(StoreError::unavailable)?
                                .ok_or_else(|| StoreError::unavailable("no LAST_INSERT_ID"))?;
                            Some(D::int(&row, 0).map_err(StoreError::unavailable)?)
                        }
                    }
                } else {
                    None
                }
            }
        };
        Ok(match deadline {
            Some(deadline) => RenewOutcome::Renewed {
                deadline: ts(deadline),
            },
            None => RenewOutcome::Lost,
        })
    }

    async fn complete(&self, completion: &Completion<'_>) -> Result<SettleOutcome, StoreError> {
        let c = Encoded::new(completion);
        match &self.group {
            Some(group) => coalesce::submit(group, group::Op::Complete(c))
                .await?
                .settle(),
            None => self.complete_alone(&c).await,
        }
    }

    async fn release(
        &self,
        hold: &Hold<'_>,
        kind: ReleaseKind,
    ) -> Result<SettleOutcome, StoreError> {
        let &Hold { key, owner, fence } = hold;
        let stmt = match kind {
            ReleaseKind::Retryable => &self.sql.release_retryable,
            _ => &self.sql.release_unknown,
        };
        let (id, owner_bytes) = (key.digest(), owner.to_bytes());
        let args = [
            (Param::Id, Value::Bytes(&id)),
            (Param::Owner, Value::Bytes(&owner_bytes)),
            (Param::Fence, Value::Int(fence_param(fence))),
        ];
        let outcome = self.settle(On::Pool(&self.writer), stmt, &args).await?;
        if outcome == SettleOutcome::Fenced {
            self.audit_fenced(key, owner, fence, "release").await;
        }
        Ok(outcome)
    }

    async fn get(&self, key: &ScopedKey) -> Result<Option<Record>, StoreError> {
        let id = key.digest();
        let args = [(Param::Id, Value::Bytes(&id))];
        let row = D::fetch_optional(On::Pool(&self.reader), &self.sql.get, &args)
            .await
            .map_err(StoreError::unavailable)?;
        row.map(|row| RawRecord::decode::<D>(&row, 0)?.into_record())
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.effective_limit()).unwrap_or(100);
        let args = [
            (
                Param::Namespace,
                Value::OptText(filter.namespace.as_deref()),
            ),
            (
                Param::Principal,
                Value::OptText(filter.principal.as_deref()),
            ),
            (Param::State, Value::OptSmall(filter.state.map(state_code))),
            (Param::Age, Value::OptInt(filter.older_than.map(ms))),
            (Param::Limit, Value::Int(limit)),
        ];
        let rows = D::fetch_all(On::Pool(&self.reader), &self.sql.list, &args)
            .await
            .map_err(StoreError::unavailable)?;
        rows.iter()
            .map(|row| RawRecord::decode::<D>(row, 0)?.into_record())
            .collect()
    }

    async fn resolve(
        &self,
        key: &ScopedKey,
        resolution: &Resolution,
        fence: Option<u64>,
    ) -> Result<ResolveOutcome, StoreError> {
        let id = key.digest();
        let body;
        let mut args = vec![
            (Param::Id, Value::Bytes(&id)),
            (Param::Fence, Value::OptInt(fence.map(fence_param))),
        ];
        let (stmt, outcome, head) = match resolution {
            Resolution::Complete { response, ttl } => {
                body = response.encode();
                args.push((Param::Response, Value::Bytes(&body)));
                args.push((Param::Ttl, Value::Int(ms(*ttl))));
                (
                    &self.sql.resolve_complete,
                    "complete",
                    Some(audit::head(&body)),
                )
            }
            _ => (&self.sql.resolve_release, "release", None),
        };
        for _ in 0..MAX_RACES {
            let resolved = self
                .settle_audited(stmt, &args, AuditKind::Resolved, Some(outcome), head)
                .await?;
            if resolved {
                return Ok(ResolveOutcome::Resolved);
            }
            // The probe binds only the id; the fence is compared here.
            let probe = D::fetch_optional(On::Pool(&self.reader), &self.sql.resolve_probe, &args)
                .await
                .map_err(StoreError::unavailable)?;
            if let Some(outcome) = unresolved::<D>(probe.as_ref(), fence)? {
                return Ok(outcome);
            }
        }
        Err(too_many_races())
    }

    async fn delete(&self, key: &ScopedKey) -> Result<bool, StoreError> {
        let id = key.digest();
        let args = [(Param::Id, Value::Bytes(&id))];
        self.settle_audited(&self.sql.delete, &args, AuditKind::Deleted, None, None)
            .await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEvent>, StoreError> {
        self.audit_query(query).await
    }
}

//! The token store behind the gateway's token routes, chosen by the record store's URL:
//! `memory:` keeps tokens in this process ([`MemoryTokens`]), Redis in the same server and key
//! prefix ([`idem_redis::RedisTokens`]), PostgreSQL and MySQL in a table next to the records'
//! ([`idem_sql::SqlTokens`], `<store_table>_tokens`, or `idem_tokens`). SQLite keeps no tokens;
//! `check-config` refuses token routes on it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use idem_core::token::{ConsumeOutcome, IssueRequest, Issued, MemoryTokens, Token, TokenStore};
use idem_core::{Scope, StoreError};

use crate::store::{StoreOptions, StoreSpec};

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// [`TokenStore`] without its generic futures, so any backend fits behind one pointer.
trait AnyTokens: Send + Sync + 'static {
    fn issue<'a>(&'a self, req: &'a IssueRequest) -> Boxed<'a, Issued>;
    fn consume<'a>(&'a self, scope: &'a Scope, token: &'a Token) -> Boxed<'a, ConsumeOutcome>;
}

impl<T: TokenStore> AnyTokens for T {
    fn issue<'a>(&'a self, req: &'a IssueRequest) -> Boxed<'a, Issued> {
        Box::pin(TokenStore::issue(self, req))
    }

    fn consume<'a>(&'a self, scope: &'a Scope, token: &'a Token) -> Boxed<'a, ConsumeOutcome> {
        // The gateway binds no payload at issue, so none is presented.
        Box::pin(TokenStore::consume(self, scope, token, None))
    }
}

/// The gateway's token store: any backend, every call bounded by the store timeout. Cheap to
/// clone.
#[derive(Clone)]
pub struct GatewayTokens {
    inner: Arc<dyn AnyTokens>,
    timeout: Duration,
    kind: &'static str,
}

impl std::fmt::Debug for GatewayTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayTokens")
            .field("kind", &self.kind)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// Connections the token table's pool keeps (tokens are one short statement each).
const SQL_TOKEN_POOL: u32 = 4;
#[cfg(any(feature = "postgres", feature = "mysql"))]
/// How often tokens past their retention are deleted from a SQL table.
const PURGE_EVERY: Duration = Duration::from_secs(60);

impl GatewayTokens {
    /// Tokens in process memory, at most `capacity` of them.
    pub fn memory(capacity: usize, timeout: Duration) -> Self {
        Self::wrap(MemoryTokens::new(capacity), timeout, "memory")
    }

    /// Tokens kept by `store`, every call bounded by `timeout` ([`GatewayTokens::open`]
    /// picks the store from the gateway's store URL; this is for embedding and tests).
    pub fn from_store(store: impl TokenStore, timeout: Duration) -> Self {
        Self::wrap(store, timeout, "custom")
    }

    fn wrap(store: impl TokenStore, timeout: Duration, kind: &'static str) -> Self {
        Self {
            inner: Arc::new(store),
            timeout,
            kind,
        }
    }

    /// Opens the token store that goes with the record store `spec`.
    ///
    /// # Errors
    /// A store kind without tokens (SQLite), a backend not compiled in, or a store that
    /// cannot be reached or set up.
    pub async fn open(
        spec: &StoreSpec,
        options: &StoreOptions,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        crate::store::available(spec)?;
        match tokio::time::timeout(
            timeout.max(Duration::from_secs(10)),
            open(spec, options, timeout),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => bail!("token store {spec}: no answer while connecting"),
        }
    }

    /// Issues a token.
    ///
    /// # Errors
    /// The store failed or did not answer within the timeout; no token was handed out.
    pub async fn issue(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
        match tokio::time::timeout(self.timeout, self.inner.issue(req)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Consumes `token` in `scope`.
    ///
    /// # Errors
    /// The store failed or did not answer within the timeout: the token may or may not be
    /// consumed, so it must be treated as used.
    pub async fn consume(
        &self,
        scope: &Scope,
        token: &Token,
    ) -> Result<ConsumeOutcome, StoreError> {
        match tokio::time::timeout(self.timeout, self.inner.consume(scope, token)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

#[allow(unused_variables)] // `options` is unused when every remote backend is left out
async fn open(
    spec: &StoreSpec,
    options: &StoreOptions,
    timeout: Duration,
) -> anyhow::Result<GatewayTokens> {
    match spec {
        StoreSpec::Memory { capacity } => Ok(GatewayTokens::memory(*capacity, timeout)),
        #[cfg(feature = "redis")]
        StoreSpec::Redis { url, .. } => {
            let mut config = idem_redis::RedisConfig::from_url(url)?.op_timeout(timeout)?;
            if let Some(prefix) = &options.prefix {
                config = config.prefix(prefix.clone())?;
            }
            if let Some(tls) = &options.tls {
                let crate::store::StorePem { ca, client } = tls.read()?;
                config = config.tls(idem_redis::TlsPem { ca, client })?;
            }
            let tokens = idem_redis::RedisTokens::connect(config)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok(GatewayTokens::wrap(tokens, timeout, "redis"))
        }
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres { url } => {
            let store = idem_sql::PgStore::connect(url, SQL_TOKEN_POOL)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let tokens = idem_sql::SqlTokens::with_table(store.pool().clone(), &table(options))?;
            tokens.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            spawn_purge(tokens.clone());
            Ok(GatewayTokens::wrap(tokens, timeout, "postgres"))
        }
        #[cfg(feature = "mysql")]
        StoreSpec::Mysql { url } => {
            let store = idem_sql::MySqlStore::connect(url, SQL_TOKEN_POOL)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let tokens = idem_sql::SqlTokens::with_table(store.pool().clone(), &table(options))?;
            tokens.migrate().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            spawn_purge(tokens.clone());
            Ok(GatewayTokens::wrap(tokens, timeout, "mysql"))
        }
        StoreSpec::Sqlite { .. } => bail!(
            "store `sqlite` keeps no tokens: token routes need memory:, redis://, postgres:// or mysql://"
        ),
        #[allow(unreachable_patterns)]
        other => bail!("store `{}` is not available in this build", other.kind()),
    }
}

/// The token table: the record table's name with `_tokens` appended, or `idem_tokens`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn table(options: &StoreOptions) -> String {
    match &options.table {
        Some(t) => format!("{t}_tokens"),
        None => idem_sql::DEFAULT_TOKEN_TABLE.to_owned(),
    }
}

/// Deletes tokens past their retention every [`PURGE_EVERY`], for as long as the process
/// runs.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn spawn_purge<D: idem_sql::TokenDialect>(tokens: idem_sql::SqlTokens<D>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PURGE_EVERY);
        loop {
            tick.tick().await;
            match tokens.purge().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(purged = n, "spent tokens deleted"),
                Err(e) => tracing::warn!(error = %e, "token purge failed; retried later"),
            }
        }
    });
}

//! idem's Redis store, for a single node and for Redis Cluster.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use idem_core::{Engine, Fingerprint, Key, Answer, Policy, Scope, ScopedKey, Settlement, StoredResponse};
//! use idem_redis::{RedisConfig, RedisStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // `redis+cluster://h1:p1,h2:p2` reaches a cluster; `rediss://` needs the `tls` feature.
//! let config = RedisConfig::from_url("redis://127.0.0.1:6379")?
//!     .prefix("shop:idem:")?
//!     .op_timeout(Duration::from_millis(250))?;
//! let store = RedisStore::connect(config).await?;
//! let engine = Engine::new(store, Policy::default());
//!
//! let key = ScopedKey::new(Scope::new("payments.charge")?.with_principal("user-7"), Key::new("order-42")?);
//! let fp = Fingerprint::of_bytes(1, b"amount=100");
//! let outcome = engine
//!     .run(&key, &fp, |lease| async move {
//!         // `lease.fence` is the write token for downstream systems.
//!         Settlement::complete(lease.fence, StoredResponse::new(200, "charged"))
//!     })
//!     .await?;
//! match outcome {
//!     Answer::Executed { .. } => println!("charged now"),
//!     Answer::Replayed(response) => println!("replayed {:?}", response.body),
//!     other => println!("not run: {other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # How records are kept
//!
//! - **One key per record**, `<prefix>{<blake3 of scope and key>}`. The braces are a hash tag:
//!   every key a record needs shares its slot, so the scripts are cluster-safe.
//! - **One Lua script per write** (claim, renew, complete, release, resolve, delete), run with
//!   `EVALSHA` and re-sent on `NOSCRIPT` after a restart or failover ([`script`]). `get` is a
//!   single `GET`. `list` is for operators: it `SCAN`s every master for the prefix (no index
//!   to keep in step, no extra command on the hot path) and filters and sorts in the client.
//! - **Server clock.** Leases and expiry are judged with `TIME` inside the scripts; records
//!   expire with `PXAT`.
//! - **Fences** are `max(previous + 1, server time in µs)`: they keep growing after a record
//!   expired, with no counter kept forever. A release or delete leaves a short-lived
//!   tombstone holding the fence, so an immediate re-claim cannot repeat it even within one
//!   microsecond. Owner and fence are both checked by every settling script, so a fence that
//!   repeats after a clock step back still cannot be used by another holder.
//! - **Responses** are stored in idem-core's compact binary encoding after a short text
//!   header (see `codec`), never JSON.
//! - **Round trips**: a first request costs two scripts (claim, complete), a replay one, a
//!   replay through [`idem_core::CachedStore`] none. Inside the scripts a replay runs one
//!   `GET`; a claim that finds an unknown record `GET`, `TIME` (for the attempt's age); a
//!   fresh claim `GET`, `TIME`, `SET`.
//! - **Audit trail**: a capped stream per namespace, written by the same script as the
//!   change. At the default [`idem_core::AuditLevel::Operator`] a fresh claim and its
//!   completion write nothing to it (the record tells them); releases, unknowns,
//!   takeovers, fenced settles, resolves and deletes do. [`RedisConfig::audit_level`] with
//!   `AuditLevel::All` adds an `XADD` to every claim and completion.
//! - **Batching** (single node, on by default, [`RedisConfig::batching`]): claims and
//!   completions that arrive while a script call is in flight queue up and leave together as
//!   one `EVALSHA` of a batch script, which applies each of them in order with the same Lua
//!   function as its own script (`lua/claim.lua`, `lua/complete.lua`) and answers each
//!   separately; two operations on one key in one batch behave as two calls in a row. An
//!   operation that finds the store idle runs its own script at once, so the round trips
//!   above hold for a lone request and an idle store adds no latency. Each operation keeps
//!   its own timeout; a failed batch fails each of its operations. A batch reads `TIME`
//!   once. On a Redis Cluster every operation runs its own script (see the crate README).
//! - **Timeouts**: every operation is bounded (250 ms by default) and reports
//!   [`idem_core::StoreError::Timeout`]; the connection reconnects in the background.
//! - **Durability**: [`RedisConfig::durability`] makes claims and completions `WAIT` for
//!   replicas; a short acknowledgement is [`idem_core::StoreError::Uncertain`] (a claim is
//!   then given back and its handler never runs). With batching, one `WAIT` after a batch
//!   covers all its writes, and a short acknowledgement makes every claim and completion in
//!   it uncertain. `WAIT` blocks the shared multiplexed connection while it waits, so use it
//!   with replicas that keep up.
//!
//! # TLS
//!
//! The `tls` feature enables `rediss://` through redis-rs's rustls support without choosing a
//! crypto provider: the program using it must install a process-wide rustls provider. The
//! `idem` gateway does not enable this feature yet, so `rediss://` does not work there.

mod audit;
mod batch;
mod coalesce;
mod codec;
pub mod config;
pub mod lock;
pub mod script;
mod store;
pub mod tokens;

/// The record codec's entry points for the fuzz targets (`fuzz/`), behind the `fuzzing`
/// feature: not part of the API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    use idem_core::Record;
    use idem_core::record::CodecError;

    /// Decodes a stored value as the store reads it: a record, `None` for a tombstone.
    ///
    /// # Errors
    /// The value is not a stored record.
    pub fn decode_record(value: &[u8]) -> Result<Option<Record>, CodecError> {
        crate::codec::decode_record(value)
    }

    /// The stored form of `record`, as the Lua scripts write it; `None` for a state it has
    /// no form for.
    pub fn encode_record(record: &Record) -> Option<Vec<u8>> {
        crate::codec::encode_record(record)
    }
}

pub use config::{Durability, RedisConfig, RedisConfigError, Target, TlsPem};
pub use lock::{Held, LockError, LockLease, RedisLock};
pub use store::RedisStore;
pub use tokens::RedisTokens;

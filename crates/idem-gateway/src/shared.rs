//! What the gateway's carriers (the data plane, the status endpoint, the token routes, the
//! relay and the admin API) share: the store as they use it, and how long an engine's handler
//! runs past the upstream timeout.

use std::time::Duration;

use idem_core::BoxStore;

use crate::claims::TrackedStore;

/// The store as the gateway uses it, with the claims this process holds tracked for
/// shutdown. [`crate::server`] puts any backend behind it, measured
/// ([`MeteredStore`](crate::metrics::MeteredStore)) and, if configured, behind the local
/// cache of completed responses.
pub(crate) type GatewayStore = TrackedStore<BoxStore>;

/// The engine's handler timeout is the proxy's plus this, so the proxy's own timeout (and its
/// 504, handled per `upstream_failure`) always fires first.
pub(crate) const HANDLER_BACKSTOP: Duration = Duration::from_secs(1);

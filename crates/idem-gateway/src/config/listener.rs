//! How the listeners accept: TLS certificates and the resource limits that keep a slow or
//! greedy client from starving the others.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

use idem_http::buffer::BodyPace;

use super::{ByteSize, Dur};
use crate::tls::TlsFiles;

/// A listener's certificate, as written by a user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// PEM file with the certificate chain, leaf first.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

/// Resource limits of the data listener, as written by a user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Most connections open at once; past it the listener stops accepting (default 10000).
    pub max_connections: Option<usize>,
    /// Most requests in progress at once; past it requests get 503 (default 1024).
    pub max_concurrent_requests: Option<usize>,
    /// Longest a client may take to send a request's headers (default `10s`).
    pub header_read_timeout: Option<Dur>,
    /// Longest a connection may stay open with nothing sent either way (default `60s`).
    pub idle_timeout: Option<Dur>,
    /// Longest a protected request's body may take to arrive in full (default `30s`).
    pub body_timeout: Option<Dur>,
    /// Least average rate of a protected request's body once its first 2 s are over, per
    /// second (default `16KiB`); `0` checks no rate.
    pub min_body_rate: Option<ByteSize>,
    /// Longest an upgraded connection (a WebSocket) may stay open with nothing sent either
    /// way (default `5m`).
    pub tunnel_idle_timeout: Option<Dur>,
}

/// Resource limits of the data listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most requests in progress at once.
    pub max_concurrent_requests: usize,
    /// Longest a client may take to send a request's headers.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open with nothing sent either way.
    pub idle_timeout: Duration,
    /// How fast a protected request's body must arrive.
    pub body_pace: BodyPace,
    /// Longest an upgraded connection may stay open with nothing sent either way.
    pub tunnel_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_concurrent_requests: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_pace: BodyPace::default(),
            // WebSocket peers that keep a connection open ping every 30 to 60 s: a live
            // tunnel is never quiet this long, and one its client left is closed in minutes.
            tunnel_idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Checks a `tls` table: both files named, readable, and a usable certificate and key.
///
/// # Errors
/// A message naming the missing or unusable file.
pub(super) fn tls(raw: Option<&RawTls>, field: &str) -> anyhow::Result<Option<TlsFiles>> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let files = match (&raw.cert_file, &raw.key_file) {
        (Some(cert), Some(key)) => TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => bail!("`{field}` needs both `cert_file` and `key_file`"),
    };
    crate::tls::server_config(&files).with_context(|| format!("`{field}`"))?;
    Ok(Some(files))
}

/// Checks the `limits` table and fills in the defaults.
///
/// # Errors
/// A zero limit.
pub(super) fn limits(raw: Option<&RawLimits>) -> anyhow::Result<Limits> {
    let d = Limits::default();
    let Some(raw) = raw else {
        return Ok(d);
    };
    let count = |v: Option<usize>, default: usize, name: &str| match v {
        Some(0) => bail!("`limits.{name}` must be greater than zero"),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let time = |v: Option<Dur>, default: Duration, name: &str| match v {
        Some(d) if d.0.is_zero() => bail!("`limits.{name}` must be greater than zero"),
        Some(d) => Ok(d.0),
        None => Ok(default),
    };
    Ok(Limits {
        max_connections: count(raw.max_connections, d.max_connections, "max_connections")?,
        max_concurrent_requests: count(
            raw.max_concurrent_requests,
            d.max_concurrent_requests,
            "max_concurrent_requests",
        )?,
        header_read_timeout: time(
            raw.header_read_timeout,
            d.header_read_timeout,
            "header_read_timeout",
        )?,
        idle_timeout: time(raw.idle_timeout, d.idle_timeout, "idle_timeout")?,
        body_pace: BodyPace {
            timeout: time(raw.body_timeout, d.body_pace.timeout, "body_timeout")?,
            min_rate: raw.min_body_rate.map_or(d.body_pace.min_rate, |r| r.0),
        },
        tunnel_idle_timeout: time(
            raw.tunnel_idle_timeout,
            d.tunnel_idle_timeout,
            "tunnel_idle_timeout",
        )?,
    })
}

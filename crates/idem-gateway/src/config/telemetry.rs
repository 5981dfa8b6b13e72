//! Trace export settings: where the gateway sends its request spans over OTLP, if anywhere.

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// `[otel]` as written by a user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtel {
    /// The OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`; unset means no export.
    pub endpoint: Option<String>,
    /// `service.name` on every exported span (default `idem`).
    pub service_name: Option<String>,
}

/// Where request spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The OTLP/gRPC collector URL.
    pub endpoint: String,
    /// `service.name` on every span.
    pub service_name: String,
}

/// Checks `[otel]`: an `http://` or `https://` endpoint, and a build that can export.
pub(super) fn compile(raw: Option<&RawOtel>) -> anyhow::Result<Option<OtelSettings>> {
    let Some(raw) = raw else { return Ok(None) };
    let Some(endpoint) = raw.endpoint.as_deref().map(str::trim) else {
        if raw.service_name.is_some() {
            bail!("`otel.service_name` is set but no `otel.endpoint`");
        }
        return Ok(None);
    };
    let url = url::Url::parse(endpoint).map_err(|e| anyhow::anyhow!("`otel.endpoint`: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        bail!(
            "`otel.endpoint` must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:4317"
        );
    }
    if !cfg!(feature = "otlp") {
        bail!(
            "`otel.endpoint` is set but this build has no OTLP export (cargo feature `otlp` of idem-gateway)"
        );
    }
    let service_name = raw.service_name.as_deref().unwrap_or("idem").trim();
    if service_name.is_empty() {
        bail!("`otel.service_name` must not be empty");
    }
    Ok(Some(OtelSettings {
        endpoint: endpoint.to_owned(),
        service_name: service_name.to_owned(),
    }))
}

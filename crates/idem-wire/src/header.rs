//! The header (and gRPC metadata) names idem reads and writes, and the two time values it
//! parses: `Retry-After` and `grpc-timeout`.

use std::time::Duration;

use http::{HeaderName, HeaderValue};

/// `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header); the gRPC metadata key too.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `X-Idempotency-Key`, an opt-in alias.
pub const X_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("x-idempotency-key");
/// `X-Request-ID`, an opt-in alias (some clients reuse it as the key).
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// `Idempotency-Fence`: the claim's fence, forwarded to the upstream with the key so it can
/// refuse a stale or second effect.
pub const IDEMPOTENCY_FENCE: HeaderName = HeaderName::from_static("idempotency-fence");
/// `Idempotent-Replayed: true` marks a replayed answer (a header, or gRPC metadata).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// `grpc-status`: a gRPC answer's code, in its trailers or a trailers-only head.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-timeout`: a gRPC call's deadline, relative to when it was sent.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// Whether `headers` (a request's or an answer's) are gRPC's: a `content-type` of
/// `application/grpc`, `application/grpc+proto`, `application/grpc; …` (any letter case).
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers.get(http::header::CONTENT_TYPE).is_some_and(|v| {
        let ct = v.as_bytes().trim_ascii_start();
        let grpc = b"application/grpc";
        ct.len() >= grpc.len()
            && ct[..grpc.len()].eq_ignore_ascii_case(grpc)
            && matches!(ct.get(grpc.len()), None | Some(b'+' | b';'))
    })
}

/// The `Retry-After` value for a wait of `d`: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

/// The wait a `Retry-After` value names in delta-seconds (`"2"`); `None` for anything else
/// (an HTTP date is left to the caller's own backoff).
pub fn retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The duration a `grpc-timeout` value names (up to 8 digits and a unit: `H`, `M`, `S`, `m`,
/// `u`, `n`), or `None` when it is malformed.
pub fn grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let raw = value.to_str().ok()?;
    let (digits, unit) = raw.split_at_checked(raw.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_both_ways() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after("-1"), None);
    }

    #[test]
    fn grpc_content_types() {
        let mut h = http::HeaderMap::new();
        assert!(!is_grpc(&h), "no content-type");
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC; charset=x", true),
            (" application/grpc", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&h), grpc, "{ct}");
        }
    }

    #[test]
    fn grpc_timeouts() {
        let t = |v: &'static str| grpc_timeout(&HeaderValue::from_static(v));
        assert_eq!(t("5S"), Some(Duration::from_secs(5)));
        assert_eq!(t("250m"), Some(Duration::from_millis(250)));
        assert_eq!(t("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(t("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "S", "123456789S", "5s", "-5S", "5 S", "5"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }
}

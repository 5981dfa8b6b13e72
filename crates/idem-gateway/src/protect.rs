//! How a protected route configures idem-http's layer: the route's principal source, its
//! fingerprint settings and its status policy, as the layer's plug-in traits.

use std::time::Duration;

use http::HeaderName;
use http::StatusCode;
use http::request::Parts;
use idem_core::Fingerprint;
use idem_core::fingerprint::canonical_json_filtered;
use idem_core::key_source::KeySource;
use idem_grpc::StoreDeterministic;
use idem_http::policy::{
    AmbiguousBody, AnswerHead, FingerprintRequest, HeaderKey, StoreDecision, StorePolicy,
};
use idem_http::{IdempotencyConfig, RouteConfigError, SourceKey, StreamingResponses};
use idem_wire::Reason;

use crate::config::{FingerprintBody, FingerprintSettings, RoutePolicy, UpstreamFailure};

/// The layer configuration of one protected route.
///
/// # Errors
/// An invalid namespace (already refused when the configuration was compiled).
pub(crate) fn layer_config(p: &RoutePolicy) -> Result<IdempotencyConfig, RouteConfigError> {
    let config = IdempotencyConfig::new(p.namespace.clone())?;
    // A lone header is read by the header extractor (aliases, echo); anything else by the
    // general one.
    let config = match p.key.sources() {
        [KeySource::Header(name)] => match HeaderName::from_bytes(name.as_bytes()) {
            Ok(name) => config.key(HeaderKey::names([name])),
            Err(_) => config.key(SourceKey::new(p.key.clone())),
        },
        _ => config.key(SourceKey::new(p.key.clone())),
    };
    Ok(config
        .key_required(p.key_required)
        .principal(p.principal.clone())
        .fingerprint(GatewayFingerprint(p.fingerprint.clone()))
        .store_policy(GatewayStorePolicy {
            policy: StatusPolicy::from(p),
            grpc: StoreDeterministic::new(),
        })
        .policy(p.engine.clone())
        .max_request_body(p.max_request_body)
        .max_stored_response(p.max_stored_response)
        .replay_headers(p.replay_headers.iter().cloned())
        .streaming(StreamingResponses::Buffer)
        .store_retry_after(Duration::from_secs(1)))
}

/// Method + path and query + selected headers + the body (canonical JSON, raw or ignored).
#[derive(Debug)]
struct GatewayFingerprint(FingerprintSettings);

impl FingerprintRequest for GatewayFingerprint {
    fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Result<Fingerprint, AmbiguousBody> {
        let route = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let mut fp = Fingerprint::builder(1)
            .part("method", parts.method.as_str().as_bytes())
            .part("route", route.as_bytes());
        for name in &self.0.headers {
            fp = fp.part("header", name.as_str().as_bytes());
            for value in parts.headers.get_all(name) {
                fp = fp.part("value", value.as_bytes());
            }
        }
        let fp = match self.0.body {
            FingerprintBody::Ignore => fp,
            FingerprintBody::Raw => fp.part("body", body),
            FingerprintBody::Json if body.is_empty() => fp.part("body", body),
            FingerprintBody::Json => match canonical_json_filtered(body, &self.0.fields) {
                Ok(canonical) => fp.part("json", &canonical),
                // A member named twice: the upstream may read the other one. Refused (400).
                Err(e) => match AmbiguousBody::from_json_error(&e) {
                    Some(ambiguous) => return Err(ambiguous),
                    None => fp.part("body", body),
                },
            },
        };
        Ok(fp.finish())
    }
}

#[derive(Debug, Clone)]
struct StatusPolicy {
    store: crate::config::StatusSet,
    release: crate::config::StatusSet,
    upstream_failure: UpstreamFailure,
}

impl From<&RoutePolicy> for StatusPolicy {
    fn from(p: &RoutePolicy) -> Self {
        Self {
            store: p.store_statuses.clone(),
            release: p.release_statuses.clone(),
            upstream_failure: p.upstream_failure,
        }
    }
}

/// A gRPC answer (HTTP 200, `content-type: application/grpc…`) by its `grpc-status`, as
/// idem-grpc's [`StoreDeterministic`] decides; an upstream failure that sent nothing (TLS
/// refused) released, so a retry runs; any other answer by its HTTP status: the configured
/// statuses stored, 502 and 504 (the upstream may have acted) per `upstream_failure`,
/// everything else released so a retry runs again.
#[derive(Debug)]
struct GatewayStorePolicy {
    policy: StatusPolicy,
    grpc: StoreDeterministic,
}

impl StorePolicy for GatewayStorePolicy {
    fn decide(&self, answer: &AnswerHead<'_>) -> StoreDecision {
        let retry = StoreDecision::Release(idem_core::ReleaseKind::Retryable);
        if answer.reason() == Some(Reason::UpstreamTls) {
            return retry;
        }
        if answer.status == StatusCode::OK
            && answer.is_grpc()
            && let Some(code) = answer.grpc_status()
        {
            return self.grpc.decide_code(code);
        }
        let p = &self.policy;
        match answer.status.as_u16() {
            502 | 504 => StoreDecision::Release(p.upstream_failure.release_kind()),
            s if s < 200 => retry,
            s if p.store.contains(s) && !p.release.contains(s) => StoreDecision::Store,
            _ => retry,
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderName;

    use super::*;

    use crate::test_support::parts;

    #[test]
    fn fingerprints_follow_the_settings() {
        let json = GatewayFingerprint(FingerprintSettings {
            body: FingerprintBody::Json,
            fields: idem_core::JsonFields::all().exclude(["client_time"]),
            headers: vec![HeaderName::from_static("x-tenant")],
        });
        let p = parts("POST", "/charge", &[("x-tenant", "a")]);
        let a = json.fingerprint(&p, br#"{"amount":1,"client_time":5}"#);
        assert_eq!(
            a,
            json.fingerprint(&p, br#"{ "client_time": 6, "amount": 1 }"#)
        );
        assert_ne!(a, json.fingerprint(&p, br#"{"amount":2}"#));
        assert_ne!(
            a,
            json.fingerprint(
                &parts("POST", "/charge", &[("x-tenant", "b")]),
                br#"{"amount":1}"#
            )
        );
        assert_ne!(
            a,
            json.fingerprint(
                &parts("PUT", "/charge", &[("x-tenant", "a")]),
                br#"{"amount":1}"#
            )
        );
        // Regression: of a member named twice the last counted, an upstream may take the first.
        assert!(json.fingerprint(&p, br#"{"amount":1,"amount":9}"#).is_err());
        assert_ne!(
            json.fingerprint(&p, br#"{"amount":10000000000000000000001}"#),
            json.fingerprint(&p, br#"{"amount":10000000000000000000002}"#)
        );
        let ignore = GatewayFingerprint(FingerprintSettings {
            body: FingerprintBody::Ignore,
            fields: idem_core::JsonFields::all(),
            headers: vec![],
        });
        assert_eq!(
            ignore.fingerprint(&p, b"one"),
            ignore.fingerprint(&p, b"two")
        );
    }

    /// The settings of a default route's configuration, and its store policy.
    fn default_policy() -> (crate::config::Settings, GatewayStorePolicy) {
        let s = crate::config::compile(
            &crate::config::from_toml(
                "upstream = \"http://x\"\n[defaults]\nprincipal = { from = \"none\" }",
            )
            .expect("toml"),
        )
        .expect("valid");
        let hold = GatewayStorePolicy {
            policy: StatusPolicy::from(&*s.routes[0].policy),
            grpc: StoreDeterministic::new(),
        };
        (s, hold)
    }

    fn of(code: u16) -> StatusCode {
        StatusCode::from_u16(code).expect("status")
    }

    #[test]
    fn statuses_decide_what_is_kept() {
        let (s, hold) = default_policy();
        let (none, no_notes) = (http::HeaderMap::new(), http::Extensions::new());
        let kind = |code: u16| hold.decide(&AnswerHead::new(of(code), &none, &no_notes));
        assert_eq!(kind(201), StoreDecision::Store);
        assert_eq!(kind(422), StoreDecision::Store);
        assert_eq!(
            kind(429),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(500),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(503),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            kind(504),
            StoreDecision::Release(idem_core::ReleaseKind::Unknown)
        );
        let retry = GatewayStorePolicy {
            policy: StatusPolicy {
                upstream_failure: UpstreamFailure::Retry,
                ..StatusPolicy::from(&*s.routes[0].policy)
            },
            grpc: StoreDeterministic::new(),
        };
        assert_eq!(
            retry.decide(&AnswerHead::new(of(502), &none, &no_notes)),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );

        // A TLS handshake the upstream refused sent nothing: released even where a 502 is
        // held, by the typed reason on the answer.
        let mut tls = http::Extensions::new();
        tls.insert(idem_http::Problem::new(Reason::UpstreamTls, "d"));
        assert_eq!(
            hold.decide(&AnswerHead::new(of(502), &none, &tls)),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        let mut failed = http::Extensions::new();
        failed.insert(idem_http::Problem::new(Reason::UpstreamFailed, "d"));
        assert_eq!(
            hold.decide(&AnswerHead::new(of(502), &none, &failed)),
            StoreDecision::Release(idem_core::ReleaseKind::Unknown),
            "a request that was sent may have acted"
        );
    }

    #[test]
    fn grpc_answers_are_decided_by_their_grpc_status() {
        let (_, hold) = default_policy();
        let (none, no_notes) = (http::HeaderMap::new(), http::Extensions::new());
        // By the trailers, or by the code the proxy read from the trailers it holds.
        let mut grpc = http::HeaderMap::new();
        grpc.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        let mut trailers = http::HeaderMap::new();
        for (code, decision) in [
            ("0", StoreDecision::Store),
            ("5", StoreDecision::Store),
            (
                "14",
                StoreDecision::Release(idem_core::ReleaseKind::Retryable),
            ),
            (
                "13",
                StoreDecision::Release(idem_core::ReleaseKind::Retryable),
            ),
            (
                "4",
                StoreDecision::Release(idem_core::ReleaseKind::Retryable),
            ),
        ] {
            trailers.insert("grpc-status", http::HeaderValue::from_static(code));
            let answer = AnswerHead::new(of(200), &grpc, &no_notes).with_trailers(&trailers);
            assert_eq!(hold.decide(&answer), decision, "grpc-status {code}");
        }
        let mut noted = http::Extensions::new();
        noted.insert(idem_wire::GrpcCode::Unavailable);
        assert_eq!(
            hold.decide(&AnswerHead::new(of(200), &grpc, &noted)),
            StoreDecision::Release(idem_core::ReleaseKind::Retryable)
        );
        assert_eq!(
            hold.decide(&AnswerHead::new(of(200), &none, &noted)),
            StoreDecision::Store,
            "not a gRPC answer: its HTTP status decides"
        );
    }
}

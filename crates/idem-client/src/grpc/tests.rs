//! The layer against a scripted server with a paused clock: classification, one key per
//! call, the status query after an ambiguous failure, deadlines.

use idem_wire::Reason;
use tonic_types::{ErrorDetails, StatusExt as _};

use super::*;
use crate::decide::kind;

fn answer(status: Status, replayed: bool) -> GrpcAnswer {
    let mut head = Response::new(()).into_parts().0;
    if replayed {
        head.headers
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    let mut trailers = HeaderMap::new();
    status.add_header(&mut trailers).expect("status headers");
    GrpcAnswer::new(head, Bytes::new(), Some(trailers))
}

fn with(code: Code, details: ErrorDetails) -> Status {
    Status::with_error_details(code, "m", details)
}

#[test]
fn statuses_are_classified_by_the_table() {
    let retry = || ErrorDetails::with_retry_info(Some(Duration::from_millis(300)));
    let info = |reason: &str| ErrorDetails::with_error_info(reason, "idem.dev", []);
    for (status, replayed, expect) in [
        (Status::ok(""), false, "final"),
        (Status::invalid_argument("bad"), false, "final"),
        (Status::permission_denied("no"), false, "final"),
        (Status::internal("boom"), false, "final"),
        (Status::unavailable("down"), false, "unavailable"),
        (with(Code::Aborted, retry()), false, "in_flight"),
        (Status::aborted("conflict"), false, "final"),
        (with(Code::ResourceExhausted, retry()), false, "throttled"),
        (Status::resource_exhausted("too large"), false, "final"),
        (
            with(Code::FailedPrecondition, info("OUTCOME_UNKNOWN")),
            false,
            "unknown",
        ),
        (
            with(Code::FailedPrecondition, info("KEY_REUSED")),
            false,
            "final",
        ),
        (Status::deadline_exceeded("slow"), false, "ambiguous"),
        (Status::cancelled("gone"), false, "ambiguous"),
        // A replay is the answer, whatever its code.
        (Status::unavailable("stored"), true, "final"),
    ] {
        let label = format!("{:?} replayed={replayed}", status.code());
        assert_eq!(kind(&classify(answer(status, replayed))), expect, "{label}");
    }
    let a = classify(answer(with(Code::Aborted, retry()), false));
    assert!(matches!(
        a,
        Attempt::Retryable { retry_after: Some(d), .. } if d == Duration::from_millis(300)
    ));
    // idem's own answers are read from their `ErrorInfo`, whichever server made them: an
    // unknown outcome stops, in flight is waited out (with or without a delay).
    let idem = |reason: Reason, retry: Option<Duration>| reason.status("m", Some("k"), retry);
    assert_eq!(
        kind(&classify(answer(idem(Reason::OutcomeUnknown, None), false))),
        "unknown"
    );
    let a = classify(answer(
        idem(Reason::InFlight, Some(Duration::from_secs(1))),
        false,
    ));
    assert!(matches!(
        a,
        Attempt::Retryable { why: Later::InFlight, retry_after: Some(d), .. } if d == Duration::from_secs(1)
    ));
    assert_eq!(
        kind(&classify(answer(idem(Reason::InFlight, None), false))),
        "in_flight"
    );
    assert_eq!(
        kind(&classify(answer(idem(Reason::KeyReused, None), false))),
        "final"
    );
    assert_eq!(
        kind(&classify(answer(
            idem(Reason::StoreUnavailable, None),
            false
        ))),
        "unavailable"
    );
    // The same reason in another domain, or only in the message, is the service's own.
    let theirs = with(
        Code::FailedPrecondition,
        ErrorDetails::with_error_info("OUTCOME_UNKNOWN", "example.com", []),
    );
    assert_eq!(kind(&classify(answer(theirs, false))), "final");
    let message_only = Status::failed_precondition("idem outcome-unknown: resolve key k first");
    assert_eq!(kind(&classify(answer(message_only, false))), "final");
    // No status anywhere: the answer is broken, not final.
    let head = Response::new(()).into_parts().0;
    assert_eq!(
        kind(&classify(GrpcAnswer::new(head, Bytes::new(), None))),
        "ambiguous"
    );
}

#[test]
fn details_that_are_not_base64_are_dropped_not_a_panic() {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("14"));
    trailers.insert("grpc-message", HeaderValue::from_static("busy"));
    trailers.insert(
        "grpc-status-details-bin",
        HeaderValue::from_static("not base64 at all!"),
    );
    let head = Response::new(()).into_parts().0;
    let a = GrpcAnswer::new(head, Bytes::new(), Some(trailers));
    let status = a.status().expect("the code and message survive");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "busy");
    assert!(status.details().is_empty());
    // Valid details, with or without padding, are kept.
    let real = with(
        Code::Aborted,
        ErrorDetails::with_error_info("IN_FLIGHT", "idem.dev", []),
    );
    let mut trailers = HeaderMap::new();
    real.add_header(&mut trailers).expect("status headers");
    let unpadded = trailers
        .get("grpc-status-details-bin")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim_end_matches('=').to_owned())
        .expect("details");
    trailers.insert(
        "grpc-status-details-bin",
        HeaderValue::from_str(&unpadded).expect("header"),
    );
    let head = Response::new(()).into_parts().0;
    let a = GrpcAnswer::new(head, Bytes::new(), Some(trailers));
    assert_eq!(a.status().map(|s| s.details().is_empty()), Some(false));
}

#[test]
fn refused_connections_are_not_sent() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(kind(&transport_failure::<GrpcAnswer>(&refused)), "not_sent");
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    assert_eq!(kind(&transport_failure::<GrpcAnswer>(&reset)), "ambiguous");
}

/// What the scripted server answers to one attempt.
enum Reply {
    Status(Status),
    Message(&'static str),
    Reset,
}

type Seen = Arc<std::sync::Mutex<Vec<HeaderMap>>>;

/// A gRPC server stand-in answering `script` in order and recording each attempt's
/// metadata.
fn server(
    script: Vec<Reply>,
) -> (
    impl Service<Request<Body>, Response = Response<Body>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static,
    Seen,
) {
    let seen: Seen = Arc::default();
    let script = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(
        script,
    )));
    let record = Arc::clone(&seen);
    let svc = tower::service_fn(move |req: Request<Body>| {
        record.lock().expect("lock").push(req.headers().clone());
        let next = script.lock().expect("lock").pop_front();
        async move {
            match next {
                Some(Reply::Status(status)) => Ok(status.into_http()),
                Some(Reply::Message(text)) => Ok(message(text, false)),
                Some(Reply::Reset) | None => Err(Box::new(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                )) as BoxError),
            }
        }
    });
    (svc, seen)
}

/// An OK answer carrying `text` as its (unframed, for the test) message.
fn message(text: &'static str, replayed: bool) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    Status::ok("")
        .add_header(&mut trailers)
        .expect("status headers");
    let mut head = Response::new(()).into_parts().0;
    if replayed {
        head.headers
            .insert(REPLAYED, HeaderValue::from_static("true"));
    }
    GrpcAnswer::new(head, Bytes::from_static(text.as_bytes()), Some(trailers)).into_response()
}

/// A status service stand-in that says the key completed with `text`.
#[derive(Clone)]
struct Completed(&'static str);

impl StatusLookup for Completed {
    fn lookup(&self, _: String, _: String, _: HeaderMap, _: Duration) -> LookupFuture {
        let text = self.0;
        Box::pin(async move {
            let (head, body) = message(text, true).into_parts();
            let collected = body.collect().await.expect("body");
            let trailers = collected.trailers().cloned();
            Ok(Some(KeyState::Completed(GrpcAnswer::new(
                head,
                collected.to_bytes(),
                trailers,
            ))))
        })
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .jitter(crate::policy::Jitter::None)
        .initial_backoff(Duration::from_millis(1))
}

fn call() -> Request<Body> {
    let mut req = Request::new(Body::new(http_body_util::Full::new(Bytes::from_static(
        b"charge",
    ))));
    *req.uri_mut() = "http://svc/pkg.Payments/Charge".parse().expect("uri");
    req
}

async fn body_of(res: Response<Body>) -> (Bytes, Option<HeaderMap>) {
    let collected = res.into_body().collect().await.expect("body");
    let trailers = collected.trailers().cloned();
    (collected.to_bytes(), trailers)
}

#[tokio::test(start_paused = true)]
async fn one_key_for_every_attempt_of_a_call() {
    let (svc, seen) = server(vec![
        Reply::Status(Status::unavailable("store down")),
        Reply::Message("charged"),
    ]);
    let svc = GrpcRetryLayer::new(policy()).layer(svc);
    let res = svc.oneshot(call()).await.expect("an answer");
    let (body, trailers) = body_of(res).await;
    assert_eq!(body, "charged");
    assert_eq!(trailers.expect("trailers")["grpc-status"], "0");
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0][IDEMPOTENCY_KEY], seen[1][IDEMPOTENCY_KEY]);
    assert_eq!(seen[0]["x-request-id"], seen[1]["x-request-id"]);
    // The server is told what is left of the operation's deadline (30 s), not the
    // attempt timeout (10 s): a slow run is left to finish and found by the status query.
    assert_eq!(seen[0][GRPC_TIMEOUT], "30000m");
    assert_eq!(seen[1][GRPC_TIMEOUT], "29999m", "one backoff of 1 ms later");
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_deadline_bounds_the_operation() {
    let (svc, seen) = server(vec![
        Reply::Status(Status::unavailable("store down")),
        Reply::Status(Status::unavailable("store down")),
        Reply::Status(Status::unavailable("store down")),
    ]);
    let mut req = call();
    req.headers_mut()
        .insert(GRPC_TIMEOUT, HeaderValue::from_static("2S"));
    // Backoffs of 1.5 s then 3 s (no jitter): the second wait would pass the caller's 2 s.
    let policy = policy().initial_backoff(Duration::from_millis(1500));
    let err = GrpcRetryLayer::new(policy)
        .layer(svc)
        .oneshot(req)
        .await
        .expect_err("past the caller's deadline");
    assert_eq!(
        err.downcast::<Status>().expect("a status").code(),
        Code::DeadlineExceeded
    );
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2, "no attempt past the caller's deadline");
    assert_eq!(
        seen[0][GRPC_TIMEOUT], "2000m",
        "the caller's deadline, not the policy's"
    );
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_failure_asks_the_status_service() {
    let (svc, seen) = server(vec![Reply::Reset, Reply::Message("second run")]);
    let layer = GrpcRetryLayer::new(policy()).status(Completed("first run"));
    let res = layer.layer(svc).oneshot(call()).await.expect("an answer");
    assert_eq!(
        body_of(res).await.0,
        "first run",
        "the stored answer, not a rerun"
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);

    // Without a status service the caller is told the outcome cannot be known.
    let (svc, seen) = server(vec![Reply::Reset, Reply::Message("second run")]);
    let err = GrpcRetryLayer::new(policy())
        .layer(svc)
        .oneshot(call())
        .await
        .expect_err("ambiguous");
    let status = err.downcast::<Status>().expect("a status");
    let source = std::error::Error::source(&*status).expect("source");
    assert!(matches!(
        source.downcast_ref::<ClientError>(),
        Some(ClientError::Ambiguous { .. })
    ));
    assert_eq!(seen.lock().expect("lock").len(), 1, "not sent again");
}

#[tokio::test(start_paused = true)]
async fn unknown_outcomes_and_final_answers_are_not_retried() {
    let unknown = Status::with_error_details(
        Code::FailedPrecondition,
        "unknown",
        ErrorDetails::with_error_info("OUTCOME_UNKNOWN", "idem.dev", []),
    );
    let (svc, seen) = server(vec![Reply::Status(unknown), Reply::Message("never")]);
    let err = GrpcRetryLayer::new(policy())
        .layer(svc)
        .oneshot(call())
        .await
        .expect_err("unknown");
    assert_eq!(
        err.downcast::<Status>().expect("a status").code(),
        Code::FailedPrecondition
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);

    let (svc, seen) = server(vec![
        Reply::Status(Status::invalid_argument("bad amount")),
        Reply::Message("never"),
    ]);
    let res = GrpcRetryLayer::new(policy())
        .layer(svc)
        .oneshot(call())
        .await
        .expect("the answer");
    let status = Status::from_header_map(res.headers()).expect("trailers-only status");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(seen.lock().expect("lock").len(), 1);
}

#[test]
fn errors_become_statuses_that_carry_them() {
    let s = status_for(ClientError::OutcomeUnknown { key: "k".into() });
    assert_eq!(s.code(), Code::FailedPrecondition);
    let source = std::error::Error::source(&s).expect("source");
    assert!(matches!(
        source.downcast_ref::<ClientError>(),
        Some(ClientError::OutcomeUnknown { .. })
    ));
    assert_eq!(grpc_timeout(Duration::from_secs(2)), "2000m");
    for (v, d) in [
        ("2S", Some(Duration::from_secs(2))),
        ("1500m", Some(Duration::from_millis(1500))),
        ("1H", Some(Duration::from_secs(3600))),
        ("123456789m", None),
        ("S", None),
        ("5x", None),
        ("-1S", None),
    ] {
        assert_eq!(
            idem_wire::header::grpc_timeout(&HeaderValue::from_static(v)),
            d,
            "{v}"
        );
    }
}

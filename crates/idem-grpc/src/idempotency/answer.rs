//! What to keep of the handler's answer, and the answer each caller gets.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body::Body;
use idem_core::{
    Answer, Engine, EngineError, Key, Outcome, Refusal, ReleaseKind, Settlement, Store,
    StoredResponse,
};
use idem_http::buffer::{Collected, collect_body, fields_size, header_map, stored_fields};
use idem_http::{
    AnswerHead, BoxError, IDEMPOTENT_REPLAYED, NEVER_REPLAYED, ResponseBody, StoreDecision,
};
use idem_wire::GrpcCode;

use super::status_response;
use crate::codes::Reason;
use crate::config::MethodConfig;

/// What the handler closure hands back through the engine.
pub(super) type Handled<B, E> = Result<Response<ResponseBody<B>>, E>;

/// Longest retry delay suggested for an in-flight duplicate: the store's answer is the time
/// left on the holder's lease, which only bounds a crashed holder; a live one usually
/// finishes much sooner.
const IN_FLIGHT_RETRY_CAP: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads the handler's whole answer and decides what the record keeps.
///
/// The answer is read in full even past the stored-response cap: its status comes last, in
/// the trailers, and only the status says whether the answer may be stored at all.
pub(super) async fn settle<B, E>(
    config: &MethodConfig,
    key: &Key,
    res: Response<B>,
) -> Settlement<Handled<B, E>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (head, body) = res.into_parts();
    if head.status != StatusCode::OK {
        // Not a gRPC answer (an HTTP-level failure): nothing is known about the call.
        return Settlement::release(
            Ok(Response::from_parts(head, ResponseBody::inner(body))),
            ReleaseKind::Retryable,
        );
    }
    let (bytes, trailers) = match collect_body(body, usize::MAX).await {
        Collected::Whole { body, trailers } => (body, trailers),
        Collected::TooLarge { prefix, rest } => {
            // Unreachable with no cap; released rather than half-stored all the same.
            return Settlement::release(
                Ok(Response::from_parts(
                    head,
                    ResponseBody::prefixed(prefix, rest),
                )),
                ReleaseKind::Retryable,
            );
        }
        failed => {
            if let Collected::Failed(e) = failed {
                tracing::warn!(key = %key, error = %e, "handler's answer failed; claim released");
            }
            let s = Reason::ResponseFailed.status(
                "the handler's answer failed while being read; the claim was released",
                Some(key.as_str()),
                None,
            );
            return Settlement::release(
                Ok(status_response(
                    s,
                    Outcome::Executed(idem_core::Kept::Released(ReleaseKind::Retryable)),
                )),
                ReleaseKind::Retryable,
            );
        }
    };
    let answered = AnswerHead::of(&head).with_trailers(&trailers);
    let decision = config.protection.store_policy.decide(&answered);
    // An answer without a `grpc-status` is malformed, and counts as `UNKNOWN`.
    let code = answered.grpc_status().unwrap_or(GrpcCode::Unknown).number();
    let this_caller = |head, bytes, trailers| {
        Ok(Response::from_parts(
            head,
            ResponseBody::full_with_trailers(bytes, trailers),
        ))
    };
    if let StoreDecision::Release(kind) = decision {
        return Settlement::release(this_caller(head, bytes, trailers), kind);
    }
    let headers = stored_fields(&head.headers, |name| config.replay_metadata.contains(name));
    let kept_trailers = stored_fields(&trailers, |name| !NEVER_REPLAYED.contains(name));
    let size = fields_size(&headers) + bytes.len() + fields_size(&kept_trailers);
    let stored = if size > config.protection.max_stored_response {
        // This caller gets all of it; the record keeps the status alone.
        StoredResponse {
            status: code as u16,
            headers: Vec::new(),
            body: Bytes::new(),
            trailers: Vec::new(),
            body_omitted: true,
        }
    } else {
        StoredResponse {
            status: code as u16,
            headers,
            body: bytes.clone(),
            trailers: kept_trailers,
            body_omitted: false,
        }
    };
    let mut head = head;
    head.extensions.insert(ToBeKept);
    Settlement::complete(this_caller(head, bytes, trailers), stored)
}

/// Marks an answer the engine was asked to keep, so one whose recording failed is not handed
/// out as if it were kept.
#[derive(Clone, Copy, Debug)]
struct ToBeKept;

/// Whether the engine was asked to release, not keep, this answer.
fn released<B>(res: &Response<B>) -> bool {
    res.extensions().get::<ToBeKept>().is_none()
}

/// Turns the engine's answer into the response for this caller, with its [`Outcome`].
pub(super) fn answer<B, E, St: Store>(
    engine: &Engine<St>,
    config: &MethodConfig,
    key: &Key,
    answer: Result<Answer<Handled<B, E>>, EngineError>,
) -> Handled<B, E> {
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "idempotent call failed");
            let outcome = e.outcome(engine.policy().interrupted_release());
            return Ok(status_response(engine_error(key, &e, config), outcome));
        }
    };
    let outcome = answer.outcome();
    let s = match answer {
        Answer::Executed {
            output,
            settled: idem_core::Settled::Failed(e),
            ..
        } if !matches!(output, Ok(ref res) if released(res)) => {
            // Ran, but its answer is not recorded yet: handing it out would let a retry find
            // the key in flight or unknown. The engine keeps trying to record it.
            output?;
            tracing::warn!(key = %key, error = %e, "answer not recorded; the caller is told to retry");
            Reason::AnswerNotRecorded.status(
                "the call ran, but the idempotency store failed to record its answer; retry with the same key to get it once it is recorded",
                Some(key.as_str()),
                Some(config.protection.store_retry_after),
            )
        }
        Answer::Executed { output, .. } => {
            let mut res = output?;
            res.extensions_mut().insert(outcome);
            return Ok(res);
        }
        Answer::Replayed(stored) => return Ok(replay(stored, key)),
        Answer::InFlight { retry_after } => Reason::InFlight.status(
            "a call with this key is being processed; retry after the delay in RetryInfo",
            Some(key.as_str()),
            Some(retry_after.min(IN_FLIGHT_RETRY_CAP)),
        ),
        Answer::Mismatch => Reason::KeyReused.status(
            "this key was used with a different request (method or message); nothing ran",
            Some(key.as_str()),
            None,
        ),
        Answer::Unknown => Reason::OutcomeUnknown.status(
            "an earlier call with this key may or may not have taken effect; it awaits resolution",
            Some(key.as_str()),
            None,
        ),
        _ => Reason::Internal.status("the call could not be completed", Some(key.as_str()), None),
    };
    Ok(status_response(s, outcome))
}

fn engine_error(key: &Key, e: &EngineError, config: &MethodConfig) -> tonic::Status {
    let retry = Some(config.protection.store_retry_after);
    match e {
        EngineError::Store(_) => Reason::StoreUnavailable.status(
            "the idempotency store failed or timed out; nothing ran",
            Some(key.as_str()),
            retry,
        ),
        EngineError::LeaseLost => Reason::LeaseLost.status(
            "the claim on this key was lost while the handler ran, so it was cancelled; ask the status service or retry",
            Some(key.as_str()),
            retry,
        ),
        EngineError::HandlerTimedOut(after) => Reason::HandlerTimeout.status(
            format!("the handler did not finish within {after:?} and was cancelled"),
            Some(key.as_str()),
            None,
        ),
        EngineError::HandlerPanicked => Reason::HandlerPanicked.status(
            "the handler panicked; the claim was released and a retry runs again",
            Some(key.as_str()),
            None,
        ),
        _ => Reason::Internal.status(
            "the call could not be completed",
            Some(key.as_str()),
            None,
        ),
    }
}

fn replay<B>(stored: StoredResponse, key: &Key) -> Response<ResponseBody<B>> {
    if stored.body_omitted {
        let s = Reason::ResponseNotStored.status(
            format!(
                "the call with this key completed with status {}, but its answer was too large to keep",
                stored.status
            ),
            Some(key.as_str()),
            None,
        );
        return status_response(s, Outcome::Refused(Refusal::ResponseNotStored));
    }
    let mut res = Response::new(ResponseBody::full_with_trailers(
        stored.body,
        header_map(stored.trailers),
    ));
    *res.headers_mut() = header_map(stored.headers);
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res.extensions_mut().insert(Outcome::Replayed);
    res
}

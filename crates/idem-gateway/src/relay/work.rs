//! One relayed message: a POST to the upstream under the engine's claim, its answer turned
//! into what the engine records and what becomes of the message.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::BodyExt;
use idem_core::{Engine, ScopedKey, Store, StoredResponse};
use idem_http::RequestBody;
use idem_mq::{HandlerError, Job, Message, RunResult, Work, settle};

use crate::config::UpstreamFailure;
use crate::proxy::HttpClient;

/// Posts each message to one URL with `Idempotency-Key` = the message's key.
#[derive(Debug)]
pub(super) struct Post {
    pub(super) client: HttpClient,
    pub(super) target: Uri,
    /// Longer than this, the upstream is treated as timed out (after acting, perhaps).
    pub(super) timeout: Duration,
    pub(super) failure: UpstreamFailure,
    pub(super) max_stored: usize,
    /// The header the claim's fence goes in, beside `Idempotency-Key`.
    pub(super) fence_header: http::HeaderName,
}

/// What an upstream answer means for the message.
fn judge(status: u16, failure: UpstreamFailure) -> Result<(), HandlerError> {
    match status {
        200..=299 => Ok(()),
        // Asked to come back later, or the upstream failed before acting.
        408 | 409 | 429 | 500 | 501 | 503 | 505..=599 => {
            Err(HandlerError::Retry(format!("upstream answered {status}")))
        }
        // A gateway error in front of the upstream: it may have acted.
        502 | 504 => Err(ambiguous(failure, format!("upstream answered {status}"))),
        _ => Err(HandlerError::Permanent(format!(
            "upstream answered {status}"
        ))),
    }
}

/// A failure after the request may have reached the upstream, as the route's policy says.
fn ambiguous(failure: UpstreamFailure, why: String) -> HandlerError {
    match failure {
        UpstreamFailure::Hold => HandlerError::Unknown(why),
        UpstreamFailure::Retry => HandlerError::Retry(why),
    }
}

impl<S: Store> Work<S> for Post {
    async fn run(&self, engine: &Engine<S>, job: &Job<'_>) -> RunResult {
        let (key, fingerprint, message) = (job.key, job.fingerprint, job.message);
        engine
            .run(key, fingerprint, |lease| async move {
                // An answer the failure table refuses is settled as that refusal.
                let answered = self
                    .post(key, message, lease.fence)
                    .await
                    .and_then(|response| judge(response.status, self.failure).map(|()| response));
                settle(answered)
            })
            .await
    }
}

impl Post {
    async fn post(
        &self,
        key: &ScopedKey,
        message: &Message,
        fence: u64,
    ) -> Result<StoredResponse, HandlerError> {
        let content_type = message
            .headers()
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
            .map_or(Bytes::from_static(b"application/json"), |(_, v)| v.clone());
        let request = Request::post(self.target.clone())
            .header("idempotency-key", key.key.as_str())
            .header(&self.fence_header, fence)
            .header("content-type", content_type.as_ref())
            .body(RequestBody::from(message.payload().clone()))
            .map_err(|e| HandlerError::Permanent(format!("cannot build the request: {e}")))?;
        let sent = tokio::time::timeout(self.timeout, async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts.status.as_u16(), body))
        })
        .await;
        match sent {
            Ok(Ok((status, body))) => {
                let body = if body.len() <= self.max_stored {
                    body
                } else {
                    Bytes::new()
                };
                Ok(StoredResponse::new(status, body))
            }
            Ok(Err(e)) if is_connect(&*e) => {
                // Never reached the upstream: nothing happened.
                Err(HandlerError::Retry(format!("cannot connect: {e}")))
            }
            Ok(Err(e)) => Err(ambiguous(self.failure, format!("upstream failed: {e}"))),
            Err(_) => Err(ambiguous(
                self.failure,
                format!("upstream timed out after {:?}", self.timeout),
            )),
        }
    }
}

fn is_connect(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect)
}

#[cfg(test)]
mod tests {
    use idem_core::ReleaseKind;

    use super::*;

    #[test]
    fn statuses_map_to_the_failure_table() {
        assert!(judge(201, UpstreamFailure::Hold).is_ok());
        for s in [408, 409, 429, 500, 503] {
            assert!(
                matches!(judge(s, UpstreamFailure::Hold), Err(HandlerError::Retry(_))),
                "{s}"
            );
        }
        for s in [400, 404, 422] {
            assert!(
                matches!(
                    judge(s, UpstreamFailure::Retry),
                    Err(HandlerError::Permanent(_))
                ),
                "{s}"
            );
        }
        assert!(matches!(
            judge(504, UpstreamFailure::Hold),
            Err(HandlerError::Unknown(_))
        ));
        assert!(matches!(
            judge(504, UpstreamFailure::Retry),
            Err(HandlerError::Retry(_))
        ));
        assert_eq!(
            HandlerError::Unknown(String::new()).release_kind(),
            ReleaseKind::Unknown
        );
    }
}

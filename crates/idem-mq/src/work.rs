//! What runs for a message: the user's handler on the store's engine ([`Handled`]), the
//! handler inside the inbox's own database transaction ([`InTx`]), or any other [`Work`] (the
//! gateway's relay posts to an upstream).

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use idem_core::{
    Answer, Engine, EngineError, Fingerprint, ReleaseKind, ScopedKey, Settlement, Store,
    StoredResponse, TxStore,
};
use thiserror::Error;

use crate::message::Message;

/// Why a handler did not take effect.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerError {
    /// Nothing happened and a later attempt may succeed: released and redelivered with
    /// backoff, dead-lettered after the last attempt.
    #[error("retryable: {0}")]
    Retry(String),
    /// Nothing happened and no attempt will succeed: dead-lettered now.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The effect may or may not have happened (an upstream timed out after acting): the
    /// record is left unknown for an operator and the message dead-lettered; nothing re-runs.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

impl HandlerError {
    /// What the claim is released as: unknown only when the effect may have happened.
    pub fn release_kind(&self) -> ReleaseKind {
        match self {
            Self::Unknown(_) => ReleaseKind::Unknown,
            Self::Retry(_) | Self::Permanent(_) => ReleaseKind::Retryable,
        }
    }
}

/// What the engine records for a handler's outcome: `response` when it took effect, else a
/// release of the kind its error calls for ([`HandlerError::release_kind`]).
pub fn settle(
    outcome: Result<StoredResponse, HandlerError>,
) -> Settlement<Result<(), HandlerError>> {
    match outcome {
        Ok(response) => Settlement::complete(Ok(()), response),
        Err(e) => {
            let kind = e.release_kind();
            Settlement::release(Err(e), kind)
        }
    }
}

/// What a run handed back: the engine's answer, the handler's error inside it.
pub type RunResult = Result<Answer<Result<(), HandlerError>>, EngineError>;

/// One message to run: the key the consumer derived for it, the fingerprint of its payload,
/// and the message.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    /// The key, in the consumer's scope.
    pub key: &'a ScopedKey,
    /// The fingerprint of the payload.
    pub fingerprint: &'a Fingerprint,
    /// The message.
    pub message: &'a Message,
}

/// Runs one message through the engine.
pub trait Work<S: Store>: Send + Sync + 'static {
    /// Claims the job's key, runs, settles; answers what the engine decided.
    fn run(&self, engine: &Engine<S>, job: &Job<'_>) -> impl Future<Output = RunResult> + Send;
}

/// A handler run under the store's claim: the answer is recorded in the store after the
/// handler returns `Ok`, and the message acknowledged after that.
///
/// Between the handler's effect and the completion a crash leaves the claim processing; when
/// its lease runs out the policy's takeover decides (`hold` leaves it unknown, `reexecute`
/// runs it again). Use [`InTx`] when the effect is a database write.
pub struct Handled<H>(pub H);

impl<H> std::fmt::Debug for Handled<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Handled(..)")
    }
}

impl<S, H, Fut> Work<S> for Handled<H>
where
    S: Store,
    H: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send,
{
    async fn run(&self, engine: &Engine<S>, job: &Job<'_>) -> RunResult {
        let (key, fingerprint, message) = (job.key, job.fingerprint, job.message);
        let message = message.clone();
        engine
            .run(key, fingerprint, |_lease| async move {
                settle((self.0)(message).await.map(|()| StoredResponse::new(0, "")))
            })
            .await
    }
}

/// A handler that writes inside the inbox's transaction (same-transaction mode): its writes,
/// the claim and the completion commit together, and the message is acknowledged after the
/// commit. A crash before the commit leaves nothing; after it, the redelivery is skipped.
pub struct InTx<S: TxStore> {
    handler: Arc<TxHandler<S::Tx>>,
}

impl<S: TxStore> std::fmt::Debug for InTx<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InTx(..)")
    }
}

/// The handler of [`InTx`]: writes on the open transaction.
pub type TxHandler<Tx> = dyn for<'c> Fn(&'c mut Tx, &'c Message) -> BoxFuture<'c, Result<(), HandlerError>>
    + Send
    + Sync;

impl<S: TxStore> InTx<S> {
    /// Wraps `handler`, which writes on the transaction it is given.
    pub fn new<H>(handler: H) -> Self
    where
        H: for<'c> Fn(&'c mut S::Tx, &'c Message) -> BoxFuture<'c, Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    {
        Self {
            handler: Arc::new(handler),
        }
    }
}

impl<S: TxStore> Work<S> for InTx<S> {
    async fn run(&self, engine: &Engine<S>, job: &Job<'_>) -> RunResult {
        let (key, fingerprint, message) = (job.key, job.fingerprint, job.message);
        let handler = Arc::clone(&self.handler);
        let message = message.clone();
        engine
            .run_in_tx(key, fingerprint, None, move |tx, _lease| {
                Box::pin(async move {
                    handler(tx, &message).await?;
                    Ok(((), StoredResponse::new(0, "")))
                })
            })
            .await
    }
}

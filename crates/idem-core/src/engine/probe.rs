//! Settling an unknown key by asking the downstream system what became of it.
//!
//! A claim that finds an unknown record (a holder crashed or was paused past its lease under
//! `hold`, or its handler ended ambiguously) asks the engine's [`Probe`], within the policy's
//! probe timeout, before it answers:
//!
//! | the probe says | the attempt (age < handler timeout) | the engine |
//! |---|---|---|
//! | done, with the answer | either | stores that answer (a resolve naming the record's fence) and replays it |
//! | not done | over | releases the record (naming its fence) and claims the key again: the handler runs |
//! | not done, or cannot say | may still be running | answers in flight, retry after the rest of the attempt's time |
//! | cannot say | over | answers unknown |
//!
//! An engine without a probe answers unknown at once: nothing it could learn later would
//! settle the key.
//!
//! "Not done" is believed only once the attempt can no longer be running: the handler is
//! cancelled at its timeout, counted from before the claim was sent, so past that age on the
//! store's clock it no longer acts. That assumes the downstream system does not act on a
//! request later than the handler timeout after it was sent (a request stuck in a queue, or
//! sent by a process paused between its claim and its send); a system that checks the fence
//! it is handed refuses such a request anyway.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::key::ScopedKey;
use crate::record::StoredResponse;

/// What the downstream system says became of a key's attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeAnswer {
    /// The effect happened, and this is its answer: stored and replayed.
    Done(StoredResponse),
    /// The effect did not happen, and (once the attempt's time is over) will not.
    NotDone,
    /// It cannot say (yet), or could not be asked; the text says why.
    Unknown(String),
}

/// A boxed probe answer.
pub type ProbeFuture<'a> = Pin<Box<dyn Future<Output = ProbeAnswer> + Send + 'a>>;

/// Asks the downstream system what became of a key, for the engine to settle an unknown
/// record without an operator. The gateway's implementation calls a route's status webhook.
///
/// # Cancel safety
/// The engine drops the future at the probe timeout and treats that as
/// [`ProbeAnswer::Unknown`]; a probe must not change anything the engine relies on.
pub trait Probe: Send + Sync + 'static {
    /// What became of `key`'s attempt that holds `fence`.
    fn probe<'a>(&'a self, key: &'a ScopedKey, fence: u64) -> ProbeFuture<'a>;
}

/// A probe made of a function, for tests and small services.
pub struct ProbeFn<F>(pub F);

impl<F> fmt::Debug for ProbeFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProbeFn")
    }
}

impl<F, Fut> Probe for ProbeFn<F>
where
    F: Fn(ScopedKey, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ProbeAnswer> + Send + 'static,
{
    fn probe<'a>(&'a self, key: &'a ScopedKey, fence: u64) -> ProbeFuture<'a> {
        Box::pin((self.0)(key.clone(), fence))
    }
}

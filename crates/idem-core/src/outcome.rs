//! [`Outcome`]: what became of one request, as every carrier reports it.
//!
//! The engine decides what happens to a request; carriers (the HTTP layer, the gateway, gRPC,
//! consumers, plain functions) only translate. So the decision travels with the answer as one
//! typed value: [`Answer::outcome`](crate::Answer::outcome) and
//! [`EngineError::outcome`](crate::EngineError::outcome) give it for a run, the HTTP layer
//! attaches it to every response as an extension, and metrics, logs and audit read it there.
//! Nobody works it out again from a status code or a response body.
//!
//! | variant | the handler | what a retry gets |
//! |---|---|---|
//! | [`Executed`](Outcome::Executed) | ran under a claim | per [`Kept`]: the stored answer, or a new run |
//! | [`Replayed`](Outcome::Replayed) | did not run | the same stored answer |
//! | [`InFlight`](Outcome::InFlight) | is running for another caller | the answer once it is stored |
//! | [`Unknown`](Outcome::Unknown) | did not run: an earlier attempt may have acted | the same, until resolved |
//! | [`Mismatch`](Outcome::Mismatch) | did not run: the key belongs to another request | the same |
//! | [`Refused`](Outcome::Refused) | did not run: the request was refused before any claim | depends on the [`Refusal`] |
//! | [`StoreUnavailable`](Outcome::StoreUnavailable) | did not run: the store failed | a new attempt |
//! | [`Fenced`](Outcome::Fenced) | started, but a newer holder owns the key; its result was discarded | whatever the newer holder leaves |
//! | [`Passthrough`](Outcome::Passthrough) | ran without protection (not an idempotent request) | a new run |
//! | [`Queried`](Outcome::Queried) | did not run: a status query about the key was answered | — |

use std::fmt;

use crate::record::ReleaseKind;

/// What became of one request. Every carrier reports exactly one.
///
/// ```
/// use idem_core::{Kept, Outcome, ReleaseKind};
///
/// assert_eq!(Outcome::Executed(Kept::Stored).as_str(), "executed");
/// assert!(Outcome::Executed(Kept::Released(ReleaseKind::Retryable)).ran());
/// assert!(!Outcome::Replayed.ran());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// This request claimed the key and ran the handler; [`Kept`] says what was recorded.
    Executed(Kept),
    /// The key had completed: the stored answer was replayed and nothing ran.
    Replayed,
    /// Another holder is running the handler for this key; nothing ran.
    InFlight,
    /// An earlier attempt's outcome is unknown; nothing runs until it is resolved.
    Unknown,
    /// The key was used with a different request; nothing ran.
    Mismatch,
    /// The request was refused before any claim (bad key, no principal, body too large, …).
    Refused(Refusal),
    /// The store failed or timed out before a claim; nothing ran.
    StoreUnavailable,
    /// A newer holder took the key over while the handler ran: the handler was cancelled, or
    /// its result was discarded instead of recorded.
    Fenced,
    /// Not an idempotent request (a safe method, an unprotected route, no key where one is
    /// optional): it ran without a claim.
    Passthrough,
    /// A status query about a key was answered (the key's state, or its stored answer when
    /// one was asked for); nothing ran.
    Queried,
}

/// What the engine recorded of an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kept {
    /// The answer is stored and replayed to every retry.
    Stored,
    /// Nothing was stored: the claim was released as the handler (or the carrier's store
    /// policy) asked.
    Released(ReleaseKind),
    /// The handler did not finish (it timed out or panicked); the claim was released as this
    /// kind.
    Interrupted(ReleaseKind),
    /// The store failed while recording the result: the record stays processing until its
    /// lease runs out, then follows the takeover policy.
    Unsettled,
}

/// Why a request was refused before any claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// No key where one is required.
    KeyMissing,
    /// The key is not one valid key (empty, too long, not printable, badly quoted).
    KeyMalformed,
    /// More than one key was sent.
    KeyMultiple,
    /// The principal could not be determined (missing or invalid credential).
    Unauthenticated,
    /// The credential was sent more than once: which one names the principal depends on
    /// who reads it.
    CredentialAmbiguous,
    /// The request body is larger than the route accepts.
    BodyTooLarge,
    /// The request body could not be read.
    BodyUnreadable,
    /// The request body could mean two things (a JSON object naming a member twice).
    BodyAmbiguous,
    /// The request body did not arrive in time (stalled, or slower than the minimum rate).
    BodyTimeout,
    /// The key completed, but its answer was too large to keep, so it cannot be replayed.
    ResponseNotStored,
    /// No route matches the request.
    NoRoute,
    /// The request target cannot be forwarded.
    BadTarget,
    /// The server is at its limit of requests in progress.
    Overloaded,
    /// A one-time token was missing, malformed, unknown, expired or already used, or its
    /// issue was refused (the gateway's token routes).
    Token,
}

impl Outcome {
    /// One outcome of each kind (each name [`Outcome::as_str`] gives), for code that must
    /// handle every kind: a metrics table, a dashboard, their tests.
    pub const EACH_KIND: [Outcome; 10] = [
        Outcome::Executed(Kept::Stored),
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::Unknown,
        Outcome::Mismatch,
        Outcome::Refused(Refusal::KeyMissing),
        Outcome::StoreUnavailable,
        Outcome::Fenced,
        Outcome::Passthrough,
        Outcome::Queried,
    ];

    /// A short, stable, lower-case name for metrics labels and logs: `executed`, `replayed`,
    /// `in_flight`, `unknown`, `mismatch`, `refused`, `store_unavailable`, `fenced`,
    /// `passthrough`, `queried`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed(_) => "executed",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Unknown => "unknown",
            Self::Mismatch => "mismatch",
            Self::Refused(_) => "refused",
            Self::StoreUnavailable => "store_unavailable",
            Self::Fenced => "fenced",
            Self::Passthrough => "passthrough",
            Self::Queried => "queried",
        }
    }

    /// Whether the handler (or the protected service) was called for this request.
    pub fn ran(self) -> bool {
        matches!(self, Self::Executed(_) | Self::Fenced | Self::Passthrough)
    }
}

impl Refusal {
    /// A short, stable, lower-case name: `key_missing`, `key_malformed`, `key_multiple`,
    /// `unauthenticated`, `credential_ambiguous`, `body_too_large`, `body_unreadable`, `body_ambiguous`,
    /// `body_timeout`, `response_not_stored`, `no_route`, `bad_target`, `overloaded`, `token`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KeyMissing => "key_missing",
            Self::KeyMalformed => "key_malformed",
            Self::KeyMultiple => "key_multiple",
            Self::Unauthenticated => "unauthenticated",
            Self::CredentialAmbiguous => "credential_ambiguous",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::BodyAmbiguous => "body_ambiguous",
            Self::BodyTimeout => "body_timeout",
            Self::ResponseNotStored => "response_not_stored",
            Self::NoRoute => "no_route",
            Self::BadTarget => "bad_target",
            Self::Overloaded => "overloaded",
            Self::Token => "token",
        }
    }
}

impl Kept {
    /// A short, stable, lower-case name: `stored`, `released`, `unknown` (released as
    /// unknown), `interrupted`, `unsettled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Released(ReleaseKind::Unknown) => "unknown",
            Self::Released(_) => "released",
            Self::Interrupted(_) => "interrupted",
            Self::Unsettled => "unsettled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Executed(kept) => write!(f, "executed ({})", kept.as_str()),
            Self::Refused(why) => write!(f, "refused ({})", why.as_str()),
            other => f.write_str(other.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_distinct() {
        let all = Outcome::EACH_KIND;
        let mut names: Vec<&str> = all.iter().map(|o| o.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(
            Outcome::Refused(Refusal::BodyTooLarge).to_string(),
            "refused (body_too_large)"
        );
        assert_eq!(
            Outcome::Executed(Kept::Released(ReleaseKind::Unknown)).to_string(),
            "executed (unknown)"
        );
        assert!(Outcome::Fenced.ran() && !Outcome::Mismatch.ran());
    }
}

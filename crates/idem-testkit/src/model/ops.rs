//! The generated operations and the responses they store.

use idem_core::{StateKind, StoredResponse};
use proptest::prelude::*;

use crate::ctx::rich_response;

/// Keys a case works on.
pub(super) const KEYS: u8 = 3;
/// Distinct responses a case stores.
pub(super) const RESPONSES: u8 = 4;

/// How an operation names its holder: the real one, or a forgery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forge {
    /// The holder's own owner and fence.
    Genuine,
    /// Another owner with the holder's fence.
    OtherOwner,
    /// The holder's owner with the next fence.
    FenceUp,
    /// The holder's owner with the previous fence.
    FenceDown,
}

/// The fence a resolve names: the one the key's record has now, or one it does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveFence {
    /// The latest fence granted for the key.
    Current,
    /// One below it: an attempt that is no longer the record's.
    Stale,
}

/// One generated operation. Durations are in model steps; `holder` picks one of the leases the
/// store granted so far in the case (0 is the latest), stale ones included.
#[derive(Clone, Debug)]
pub enum Op {
    /// Claim key `key` with fingerprint `fp`.
    Claim {
        /// Which key.
        key: u8,
        /// Which fingerprint.
        fp: u8,
        /// Takeover policy hold (else reexecute).
        hold: bool,
        /// Lease, in steps.
        lease: u8,
        /// Record TTL, in steps.
        ttl: u8,
        /// Whether to send a request id.
        request_id: bool,
    },
    /// Renew a holder's lease.
    Renew {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// New lease, in steps.
        lease: u8,
    },
    /// Complete as a holder.
    Complete {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// Which response.
        response: u8,
        /// Record TTL, in steps.
        ttl: u8,
    },
    /// Release as a holder.
    Release {
        /// Which holder.
        holder: u8,
        /// Genuine or forged.
        forge: Forge,
        /// Unknown (else retryable).
        unknown: bool,
    },
    /// Resolve a key: with a response and TTL, or by releasing it.
    Resolve {
        /// Which key.
        key: u8,
        /// `Some((response, ttl))` completes; `None` releases.
        complete: Option<(u8, u8)>,
        /// Which fence the resolve names, if any.
        fence: Option<ResolveFence>,
    },
    /// Delete a key.
    Delete {
        /// Which key.
        key: u8,
    },
    /// Read a key and compare it with the model.
    Get {
        /// Which key.
        key: u8,
    },
    /// List the case's namespace, optionally by state, optionally limited.
    List {
        /// State filter.
        state: Option<StateKind>,
        /// The filter's limit (0: the default).
        limit: u8,
    },
    /// Let time pass.
    Advance {
        /// Steps.
        steps: u8,
    },
}

fn forge() -> impl Strategy<Value = Forge> {
    prop_oneof![
        6 => Just(Forge::Genuine),
        1 => Just(Forge::OtherOwner),
        1 => Just(Forge::FenceUp),
        1 => Just(Forge::FenceDown),
    ]
}

fn holder() -> impl Strategy<Value = u8> {
    prop_oneof![4 => Just(0u8), 2 => Just(1u8), 1 => 2u8..6]
}

/// The operation strategy. `time_travel` allows more and longer time steps.
pub fn op(time_travel: bool) -> impl Strategy<Value = Op> {
    let max_steps: u8 = if time_travel { 5 } else { 2 };
    let advance_weight = if time_travel { 4 } else { 1 };
    let ttl = prop_oneof![Just(1u8), Just(3u8), Just(8u8), Just(40u8)];
    prop_oneof![
        8 => (0..KEYS, prop_oneof![4 => Just(0u8), 1 => Just(1u8)], any::<bool>(), 1u8..=4, ttl.clone(), any::<bool>())
            .prop_map(|(key, fp, hold, lease, ttl, request_id)| Op::Claim { key, fp, hold, lease, ttl, request_id }),
        2 => (holder(), forge(), 1u8..=4).prop_map(|(holder, forge, lease)| Op::Renew { holder, forge, lease }),
        4 => (holder(), forge(), 0..RESPONSES, ttl.clone())
            .prop_map(|(holder, forge, response, ttl)| Op::Complete { holder, forge, response, ttl }),
        3 => (holder(), forge(), any::<bool>()).prop_map(|(holder, forge, unknown)| Op::Release { holder, forge, unknown }),
        2 => (
            0..KEYS,
            proptest::option::of((0..RESPONSES, ttl)),
            proptest::option::of(prop_oneof![3 => Just(ResolveFence::Current), 1 => Just(ResolveFence::Stale)]),
        )
            .prop_map(|(key, complete, fence)| Op::Resolve { key, complete, fence }),
        1 => (0..KEYS).prop_map(|key| Op::Delete { key }),
        2 => (0..KEYS).prop_map(|key| Op::Get { key }),
        2 => (
            proptest::option::of(prop_oneof![
                Just(StateKind::Processing),
                Just(StateKind::Completed),
                Just(StateKind::Unknown)
            ]),
            prop_oneof![2 => Just(0u8), 1 => 1u8..=2],
        )
            .prop_map(|(state, limit)| Op::List { state, limit }),
        advance_weight => (1..=max_steps).prop_map(|steps| Op::Advance { steps }),
    ]
}

/// A whole case: a sequence of operations.
pub fn ops(time_travel: bool) -> impl Strategy<Value = Vec<Op>> {
    let max_len = if time_travel { 40 } else { 14 };
    proptest::collection::vec(op(time_travel), 1..max_len)
}

/// The response the model test stores for index `i`.
pub fn response(i: u8) -> StoredResponse {
    match i % RESPONSES {
        0 => StoredResponse::new(200, "ok"),
        1 => StoredResponse::new(201, "{\"id\":1}")
            .with_header("content-type", "application/json")
            .with_header("x-a", "1"),
        2 => StoredResponse {
            status: 200,
            headers: vec![],
            body: bytes::Bytes::new(),
            trailers: Vec::new(),
            body_omitted: true,
        },
        _ => rich_response(),
    }
}

//! [`MemoryTokens`]: one-time tokens in process memory, under one lock.

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, ready};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;

use super::{
    ConsumeOutcome, DEFAULT_RETENTION, IssueRequest, Issued, Token, TokenState, TokenStore,
    binding_matches,
};
use crate::clock::{Clock, SystemClock};
use crate::key::Scope;
use crate::record::Timestamp;
use crate::store::StoreError;
use crate::sync::Mutex;

/// A bounded in-memory token store. Clones share the same tokens.
///
/// At capacity, an issue first forgets tokens past their retention, then expired and consumed
/// ones (they only serve to answer "expired" or "already used" instead of "unknown"); live
/// tokens are never dropped, and when only live ones remain the issue fails with
/// [`StoreError::Full`].
#[derive(Clone)]
pub struct MemoryTokens {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Box<dyn Clock>,
    capacity: usize,
    retention: Duration,
    tokens: Mutex<HashMap<[u8; 32], Entry>>,
}

struct Entry {
    expires_at: Timestamp,
    consumed_at: Option<Timestamp>,
    payload: Option<Bytes>,
}

impl Entry {
    fn forget_at(&self, retention: Duration) -> Timestamp {
        self.expires_at.plus(retention)
    }

    fn live(&self, now: Timestamp) -> bool {
        self.consumed_at.is_none() && now < self.expires_at
    }
}

impl MemoryTokens {
    /// A store holding at most `capacity` tokens, on the system clock.
    pub fn new(capacity: usize) -> Self {
        Self::with_clock(capacity, SystemClock)
    }

    /// A store on a given clock (a [`crate::ManualClock`] in tests).
    pub fn with_clock(capacity: usize, clock: impl Clock) -> Self {
        Self {
            shared: Arc::new(Shared {
                clock: Box::new(clock),
                capacity: capacity.max(1),
                retention: DEFAULT_RETENTION,
                tokens: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Number of tokens held, forgotten ones included until the next sweep.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        // Every critical section leaves the map consistent, so a poisoned lock is still usable.
        self.shared
            .tokens
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn issue_now(&self, req: &IssueRequest) -> Result<Issued, StoreError> {
        let token = Token::generate()?;
        let id = token.digest(&req.scope);
        let now = self.shared.clock.now();
        let retention = self.shared.retention;
        let mut map = self.lock();
        if map.len() >= self.shared.capacity {
            map.retain(|_, e| now < e.forget_at(retention));
        }
        if map.len() >= self.shared.capacity {
            map.retain(|_, e| e.live(now));
        }
        if map.len() >= self.shared.capacity {
            return Err(StoreError::Full {
                capacity: self.shared.capacity,
            });
        }
        let expires_at = now.plus(req.ttl);
        map.insert(
            id,
            Entry {
                expires_at,
                consumed_at: None,
                payload: req.payload.clone(),
            },
        );
        Ok(Issued { token, expires_at })
    }

    fn consume_now(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> ConsumeOutcome {
        let now = self.shared.clock.now();
        let retention = self.shared.retention;
        let mut map = self.lock();
        let Some(entry) = map
            .get_mut(&token.digest(scope))
            .filter(|e| now < e.forget_at(retention))
        else {
            return ConsumeOutcome::Unknown;
        };
        if entry.consumed_at.is_some() {
            return ConsumeOutcome::AlreadyConsumed;
        }
        if now >= entry.expires_at {
            return ConsumeOutcome::Expired;
        }
        if !binding_matches(entry.payload.as_deref(), presented) {
            return ConsumeOutcome::Mismatch;
        }
        entry.consumed_at = Some(now);
        ConsumeOutcome::Consumed {
            payload: entry.payload.clone(),
        }
    }

    fn inspect_now(&self, scope: &Scope, token: &Token) -> TokenState {
        let now = self.shared.clock.now();
        let retention = self.shared.retention;
        let map = self.lock();
        match map
            .get(&token.digest(scope))
            .filter(|e| now < e.forget_at(retention))
        {
            None => TokenState::Unknown,
            Some(e) => match e.consumed_at {
                Some(at) => TokenState::Consumed { at },
                None if now >= e.expires_at => TokenState::Expired { at: e.expires_at },
                None => TokenState::Live {
                    expires_at: e.expires_at,
                    payload: e.payload.clone(),
                },
            },
        }
    }
}

impl fmt::Debug for MemoryTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTokens")
            .field("capacity", &self.shared.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl TokenStore for MemoryTokens {
    fn issue(&self, req: &IssueRequest) -> impl Future<Output = Result<Issued, StoreError>> + Send {
        ready(self.issue_now(req))
    }

    fn consume(
        &self,
        scope: &Scope,
        token: &Token,
        presented: Option<&[u8]>,
    ) -> impl Future<Output = Result<ConsumeOutcome, StoreError>> + Send {
        ready(Ok(self.consume_now(scope, token, presented)))
    }

    fn inspect(
        &self,
        scope: &Scope,
        token: &Token,
    ) -> impl Future<Output = Result<TokenState, StoreError>> + Send {
        ready(Ok(self.inspect_now(scope, token)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn full_store_drops_spent_tokens_never_live_ones() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let tokens = MemoryTokens::with_clock(2, clock.clone());
        let scope = Scope::new("ns").expect("ns");
        let short = IssueRequest::new(scope.clone(), Duration::from_secs(1)).expect("req");
        let long = IssueRequest::new(scope.clone(), Duration::from_secs(100)).expect("req");
        let spent = tokens.issue_now(&short).expect("issue");
        let live = tokens.issue_now(&long).expect("issue");
        clock.advance(Duration::from_secs(2));
        // The expired token makes room; the live one is kept.
        let third = tokens
            .issue_now(&long)
            .expect("room after dropping the expired one");
        assert_eq!(
            tokens.inspect_now(&scope, &spent.token),
            TokenState::Unknown
        );
        assert!(matches!(
            tokens.inspect_now(&scope, &live.token),
            TokenState::Live { .. }
        ));
        assert!(matches!(
            tokens.issue_now(&long),
            Err(StoreError::Full { capacity: 2 })
        ));
        assert!(matches!(
            tokens.consume_now(&scope, &third.token, None),
            ConsumeOutcome::Consumed { .. }
        ));
    }
}

//! [`MemoryTokens`]: one-time tokens in process memory, under one lock.

use std::collections::{BTreeMap, HashMap, VecDeque};
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
/// At capacity, an issue first forgets expired tokens, oldest expiry first, then consumed ones,
/// earliest consumed first (either only serves to answer "expired" or "already used" instead
/// of "unknown"); live tokens are never dropped, and when only live ones remain the issue
/// fails with [`StoreError::Full`]. Consuming or inspecting a token never needs room, so a
/// full store keeps honouring every live token. Spent tokens are found through an expiry
/// index and a queue of consumed tokens, never by walking the store: a refused issue costs
/// a lookup, however many tokens are held.
#[derive(Clone)]
pub struct MemoryTokens {
    shared: Arc<Shared>,
}

struct Shared {
    clock: Box<dyn Clock>,
    capacity: usize,
    retention: Duration,
    tokens: Mutex<Tokens>,
}

/// The tokens and the indexes that find spent ones without a scan.
#[derive(Default)]
struct Tokens {
    map: HashMap<[u8; 32], Entry>,
    /// Expiry time -> the tokens issued to expire then. Kept lazily: a token forgotten
    /// through `consumed` leaves its id here, skipped when reached because it is gone.
    by_expiry: BTreeMap<Timestamp, Vec<[u8; 32]>>,
    /// Ids in `by_expiry`, stale ones included.
    expiry_len: usize,
    /// Consumed tokens, earliest first; lazy in the same way.
    consumed: VecDeque<[u8; 32]>,
}

/// Stale index entries tolerated beyond the live ones before an index is rebuilt.
const STALE_SLACK: usize = 1024;

impl Tokens {
    /// Forgets spent tokens until there is room for one more under `capacity`, or none is
    /// left to forget. Each step takes one index entry off the front, so the work is at
    /// most the entries it removes.
    fn make_room(&mut self, now: Timestamp, capacity: usize) {
        while self.map.len() >= capacity {
            let Some(mut first) = self.by_expiry.first_entry() else {
                break;
            };
            if *first.key() > now {
                break;
            }
            let at = *first.key();
            let ids = first.get_mut();
            let Some(id) = ids.pop() else {
                first.remove();
                continue;
            };
            if ids.is_empty() {
                first.remove();
            }
            self.expiry_len -= 1;
            if self.map.get(&id).is_some_and(|e| e.expires_at == at) {
                self.map.remove(&id);
            }
        }
        while self.map.len() >= capacity {
            let Some(id) = self.consumed.pop_front() else {
                break;
            };
            if self.map.get(&id).is_some_and(|e| e.consumed_at.is_some()) {
                self.map.remove(&id);
            }
        }
    }

    fn insert(&mut self, id: [u8; 32], entry: Entry) {
        self.by_expiry.entry(entry.expires_at).or_default().push(id);
        self.expiry_len += 1;
        self.map.insert(id, entry);
        if self.expiry_len > 2 * self.map.len() + STALE_SLACK {
            self.by_expiry.clear();
            for (id, e) in &self.map {
                self.by_expiry.entry(e.expires_at).or_default().push(*id);
            }
            self.expiry_len = self.map.len();
        }
    }

    fn consumed(&mut self, id: [u8; 32]) {
        self.consumed.push_back(id);
        if self.consumed.len() > 2 * self.map.len() + STALE_SLACK {
            let map = &self.map;
            self.consumed
                .retain(|id| map.get(id).is_some_and(|e| e.consumed_at.is_some()));
        }
    }
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
                tokens: Mutex::new(Tokens::default()),
            }),
        }
    }

    /// Number of tokens held, forgotten ones included until the next sweep.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// True when no token is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Tokens> {
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
        let mut tokens = self.lock();
        tokens.make_room(now, self.shared.capacity);
        if tokens.map.len() >= self.shared.capacity {
            return Err(StoreError::Full {
                capacity: self.shared.capacity,
            });
        }
        let expires_at = now.plus(req.ttl);
        tokens.insert(
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
        let mut tokens = self.lock();
        let id = token.digest(scope);
        let Some(entry) = tokens
            .map
            .get_mut(&id)
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
        let payload = entry.payload.clone();
        tokens.consumed(id);
        ConsumeOutcome::Consumed { payload }
    }

    fn inspect_now(&self, scope: &Scope, token: &Token) -> TokenState {
        let now = self.shared.clock.now();
        let retention = self.shared.retention;
        let tokens = self.lock();
        match tokens
            .map
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

    // The indexes are lazy: churn (issues, consumes, expiries at capacity) must not let them
    // grow without bound, and what they find must be right: a live token is never dropped.
    #[test]
    fn indexes_stay_bounded_and_never_drop_a_live_token() {
        let clock = ManualClock::new(Timestamp(1_000_000));
        let tokens = MemoryTokens::with_clock(16, clock.clone());
        let scope = Scope::new("ns").expect("ns");
        let mut live: Vec<(Token, Timestamp)> = Vec::new();
        for i in 0..5_000u64 {
            let ttl = Duration::from_millis(500 + (i % 7) * 300);
            let req = IssueRequest::new(scope.clone(), ttl).expect("req");
            let now = clock.now();
            live.retain(|(_, until)| *until > now);
            match tokens.issue_now(&req) {
                Ok(issued) => live.push((issued.token, issued.expires_at)),
                Err(StoreError::Full { .. }) => assert_eq!(live.len(), 16, "refused with room"),
                Err(e) => panic!("{e}"),
            }
            if i % 3 == 0
                && let Some((token, _)) = live.pop()
            {
                let used = tokens.consume_now(&scope, &token, None);
                assert!(matches!(used, ConsumeOutcome::Consumed { .. }));
            }
            for (token, _) in &live {
                let state = tokens.inspect_now(&scope, token);
                assert!(matches!(state, TokenState::Live { .. }), "{state:?}");
            }
            let inner = tokens.lock();
            assert!(inner.map.len() <= 16);
            assert!(inner.expiry_len <= 2 * inner.map.len() + STALE_SLACK + 1);
            assert!(inner.consumed.len() <= 2 * inner.map.len() + STALE_SLACK + 1);
            let counted: usize = inner.by_expiry.values().map(Vec::len).sum();
            assert_eq!(counted, inner.expiry_len);
            drop(inner);
            clock.advance(Duration::from_millis(100));
        }
    }
}

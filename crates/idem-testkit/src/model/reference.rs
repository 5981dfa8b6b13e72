//! The reference model: plain records by key index, and time in steps.

use std::collections::{BTreeMap, BTreeSet};

use idem_core::{OwnerId, ResolveOutcome, StateKind};

use super::ops::KEYS;

/// A model record. Times are in model steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRecord {
    /// Fingerprint index.
    pub fp: u8,
    /// The fence the store granted for the claim that wrote this record.
    pub fence: u64,
    /// Request id of the latest claim.
    pub request_id: Option<String>,
    /// When the current attempt claimed it (the first claim, or the latest takeover).
    pub created: u64,
    /// When it goes away.
    pub expires: u64,
    /// Its state.
    pub state: ModelState,
}

/// A model record's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Held by `owner` until `lease_until`.
    Processing {
        /// Holder.
        owner: OwnerId,
        /// Lease end.
        lease_until: u64,
    },
    /// Completed with response index `response` at `at`.
    Completed {
        /// Response index.
        response: u8,
        /// When.
        at: u64,
    },
    /// Outcome unknown since `since`; `owner` is the holder that may still settle it (one
    /// whose lease ran out, not one that released it as unknown).
    Unknown {
        /// When.
        since: u64,
        /// The holder named, if any.
        owner: Option<OwnerId>,
    },
}

impl ModelState {
    fn kind(&self) -> StateKind {
        match self {
            Self::Processing { .. } => StateKind::Processing,
            Self::Completed { .. } => StateKind::Completed,
            Self::Unknown { .. } => StateKind::Unknown,
        }
    }
}

/// What the model expects a claim to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelClaim {
    /// A new lease (the store picks the fence).
    Claimed {
        /// Whether an expired lease was taken over.
        takeover: bool,
    },
    /// Busy for this many steps.
    Busy {
        /// Steps until the lease ends.
        steps: u64,
    },
    /// Replay of response index.
    Done {
        /// Response index.
        response: u8,
    },
    /// Outcome unknown: the record's fence, and its attempt's age in steps.
    Unknown {
        /// The record's fence.
        fence: u64,
        /// Steps since the attempt claimed the key.
        age: u64,
    },
    /// Another fingerprint is stored.
    Mismatch {
        /// Stored fingerprint index.
        stored: u8,
    },
}

/// The reference model: records by key index, and the time in steps.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Time, in steps.
    pub now: u64,
    /// Live (or not yet noticed expired) records by key index.
    pub records: BTreeMap<u8, ModelRecord>,
}

impl Model {
    /// The live record of `key`; an expired one is dropped first.
    pub fn live(&mut self, key: u8) -> Option<&mut ModelRecord> {
        if self
            .records
            .get(&key)
            .is_some_and(|r| r.expires <= self.now)
        {
            self.records.remove(&key);
        }
        self.records.get_mut(&key)
    }

    /// A claim. A `Claimed` answer leaves a processing record whose fence is 0 until
    /// [`Model::granted`] records the store's fence.
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        key: u8,
        fp: u8,
        owner: OwnerId,
        hold: bool,
        lease: u64,
        ttl: u64,
        request_id: Option<String>,
    ) -> ModelClaim {
        let now = self.now;
        let fresh = |created: u64| ModelRecord {
            fp,
            fence: 0,
            request_id: request_id.clone(),
            created,
            expires: (now + ttl).max(now + lease),
            state: ModelState::Processing {
                owner,
                lease_until: now + lease,
            },
        };
        let Some(rec) = self.live(key) else {
            self.records.insert(key, fresh(now));
            return ModelClaim::Claimed { takeover: false };
        };
        if rec.fp != fp {
            return ModelClaim::Mismatch { stored: rec.fp };
        }
        let unknown = ModelClaim::Unknown {
            fence: rec.fence,
            age: now - rec.created,
        };
        match rec.state {
            ModelState::Completed { response, .. } => ModelClaim::Done { response },
            ModelState::Unknown { .. } => unknown,
            ModelState::Processing { lease_until, .. } if lease_until > now => ModelClaim::Busy {
                steps: lease_until - now,
            },
            ModelState::Processing { owner, .. } if hold => {
                rec.state = ModelState::Unknown {
                    since: now,
                    owner: Some(owner),
                };
                unknown
            }
            ModelState::Processing { .. } => {
                *rec = fresh(now);
                ModelClaim::Claimed { takeover: true }
            }
        }
    }

    /// Records the fence the store granted to the claim just made on `key`.
    pub fn granted(&mut self, key: u8, fence: u64) {
        if let Some(r) = self.records.get_mut(&key) {
            r.fence = fence;
        }
    }

    /// The record `owner` and `fence` hold: processing, or unknown naming that holder.
    fn held(&mut self, key: u8, owner: OwnerId, fence: u64) -> Option<&mut ModelRecord> {
        self.live(key).filter(|r| {
            r.fence == fence
                && match r.state {
                    ModelState::Processing { owner: o, .. } => o == owner,
                    ModelState::Unknown { owner: o, .. } => o == Some(owner),
                    ModelState::Completed { .. } => false,
                }
        })
    }

    /// A renewal; true when renewed. Only a processing record is renewed.
    pub fn renew(&mut self, key: u8, owner: OwnerId, fence: u64, lease: u64) -> bool {
        let now = self.now;
        let Some(r) = self
            .held(key, owner, fence)
            .filter(|r| matches!(r.state, ModelState::Processing { .. }))
        else {
            return false;
        };
        r.state = ModelState::Processing {
            owner,
            lease_until: now + lease,
        };
        r.expires = r.expires.max(now + lease);
        true
    }

    /// A completion; true when settled.
    pub fn complete(
        &mut self,
        key: u8,
        owner: OwnerId,
        fence: u64,
        response: u8,
        ttl: u64,
    ) -> bool {
        let now = self.now;
        let Some(r) = self.held(key, owner, fence) else {
            return false;
        };
        r.state = ModelState::Completed { response, at: now };
        r.expires = now + ttl;
        true
    }

    /// A release; true when settled.
    pub fn release(&mut self, key: u8, owner: OwnerId, fence: u64, unknown: bool) -> bool {
        let now = self.now;
        let Some(r) = self.held(key, owner, fence) else {
            return false;
        };
        if !unknown {
            self.records.remove(&key);
        } else if matches!(r.state, ModelState::Processing { .. }) {
            // The holder gave up: nobody is left who could settle it but a resolve.
            r.state = ModelState::Unknown {
                since: now,
                owner: None,
            };
        }
        true
    }

    /// A resolve, naming the record's fence or not.
    pub fn resolve(
        &mut self,
        key: u8,
        complete: Option<(u8, u64)>,
        fence: Option<u64>,
    ) -> ResolveOutcome {
        let now = self.now;
        let Some(r) = self.live(key) else {
            return ResolveOutcome::NotFound;
        };
        if let Some(expected) = fence
            && expected != r.fence
        {
            return ResolveOutcome::Fenced { fence: r.fence };
        }
        let resolvable = match r.state {
            ModelState::Unknown { .. } => true,
            ModelState::Processing { lease_until, .. } => lease_until <= now,
            ModelState::Completed { .. } => false,
        };
        if !resolvable {
            return ResolveOutcome::NotResolvable {
                state: r.state.kind(),
            };
        }
        match complete {
            Some((response, ttl)) => {
                r.state = ModelState::Completed { response, at: now };
                r.expires = now + ttl;
            }
            None => {
                self.records.remove(&key);
            }
        }
        ResolveOutcome::Resolved
    }

    /// A delete; true when a live record existed.
    pub fn delete(&mut self, key: u8) -> bool {
        let existed = self.live(key).is_some();
        self.records.remove(&key);
        existed
    }

    /// Keys of live records in the given state (any state if `None`).
    pub fn list(&mut self, state: Option<StateKind>) -> BTreeSet<u8> {
        (0..KEYS)
            .filter(|&k| {
                self.live(k)
                    .is_some_and(|r| state.is_none_or(|s| r.state.kind() == s))
            })
            .collect()
    }
}

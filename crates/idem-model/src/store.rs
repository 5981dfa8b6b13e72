//! The store: one record for the key, and every operation on it one atomic step.
//!
//! This is the spec of `docs/design.md` plus the new rules, not a call into idem-core: the
//! model checks the protocol, the conformance suite checks that stores implement it.

use crate::config::Takeover;
use crate::ids::{Fence, GatewayId, Response};

/// The key's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Record {
    /// No record: the next claim runs.
    Absent,
    /// A holder runs the request under `(owner, fence)`.
    Processing {
        /// The holder.
        owner: GatewayId,
        /// The holder's fence.
        fence: Fence,
        /// Whether the lease is still live. A running holder renews it; it runs out when the
        /// holder has crashed or stalled.
        lease_live: bool,
    },
    /// The stored final answer, replayed to every retry.
    Completed {
        /// The answer.
        response: Response,
    },
    /// The last holder's outcome is not known: it may or may not have acted.
    Unknown {
        /// The last holder.
        owner: GatewayId,
        /// The last holder's fence.
        fence: Fence,
    },
}

/// What a claim found, as the gateway sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The gateway holds the key under this fence and runs the request.
    Claimed(Fence),
    /// A live lease: someone is running it.
    Busy,
    /// The stored answer.
    Done(Response),
    /// The record is unknown (perhaps made so by this claim), last held under this fence.
    Unknown(Fence),
}

/// What became of a holder's completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// Its processing record is completed.
    Settled,
    /// Its record had become unknown (it was late), and is completed now.
    SettledUnknown,
    /// Someone else owns the key now: nothing was written.
    Fenced,
}

/// The store's state for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// The record.
    pub record: Record,
    /// The highest fence ever handed out for the key: it outlives every record, so fences
    /// strictly increase.
    pub last_fence: Fence,
}

impl Store {
    /// No record, no fence handed out yet.
    pub const fn new() -> Self {
        Self {
            record: Record::Absent,
            last_fence: 0,
        }
    }

    /// A claim by `owner` (rules 1, 2, 3 and 6).
    pub fn claim(&mut self, owner: GatewayId, takeover: Takeover) -> ClaimOutcome {
        match self.record {
            Record::Absent => ClaimOutcome::Claimed(self.grant(owner)),
            Record::Processing {
                lease_live: true, ..
            } => ClaimOutcome::Busy,
            Record::Processing {
                owner: holder,
                fence,
                lease_live: false,
            } => match takeover {
                Takeover::Reexecute => ClaimOutcome::Claimed(self.grant(owner)),
                Takeover::Hold => {
                    self.record = Record::Unknown {
                        owner: holder,
                        fence,
                    };
                    ClaimOutcome::Unknown(fence)
                }
            },
            Record::Completed { response } => ClaimOutcome::Done(response),
            Record::Unknown { fence, .. } => ClaimOutcome::Unknown(fence),
        }
    }

    /// The holder's completion (rule 5): accepted on its own processing record (live or
    /// expired) and, with `late_complete`, on its own unknown record.
    pub fn complete(
        &mut self,
        owner: GatewayId,
        fence: Fence,
        response: Response,
        late_complete: bool,
    ) -> Completion {
        let completion = match self.record {
            Record::Processing { .. } if self.held_by(owner, fence) => Completion::Settled,
            Record::Unknown { owner: o, fence: f } if late_complete && o == owner && f == fence => {
                Completion::SettledUnknown
            }
            _ => return Completion::Fenced,
        };
        self.record = Record::Completed { response };
        completion
    }

    /// The holder's handler timed out: it gives the claim up per the takeover policy (unknown
    /// under hold, retryable under reexecute), if it still holds it.
    pub fn release_timed_out(&mut self, owner: GatewayId, fence: Fence, takeover: Takeover) {
        if !self.held_by(owner, fence) {
            return;
        }
        self.record = match takeover {
            Takeover::Hold => Record::Unknown { owner, fence },
            Takeover::Reexecute => Record::Absent,
        };
    }

    /// The holder's lease runs out.
    pub fn expire(&mut self) {
        if let Record::Processing { lease_live, .. } = &mut self.record {
            *lease_live = false;
        }
    }

    /// A prober's resolve to the answer the upstream reported (rule 4, done). Whether it wrote.
    pub fn resolve_complete(
        &mut self,
        fence_read: Fence,
        response: Response,
        guarded: bool,
    ) -> bool {
        if !self.resolvable(fence_read, guarded) {
            return false;
        }
        self.record = Record::Completed { response };
        true
    }

    /// A prober's resolve-release, claimed afresh by `owner` in the same step (rule 4, not
    /// done). The new fence when it wrote.
    pub fn resolve_release(
        &mut self,
        fence_read: Fence,
        owner: GatewayId,
        guarded: bool,
    ) -> Option<Fence> {
        self.resolvable(fence_read, guarded)
            .then(|| self.grant(owner))
    }

    /// Guarded: the record is still the unknown one the prober read. Unguarded: what the
    /// operator's resolve accepts today, an unknown record or an expired lease, any fence.
    fn resolvable(&self, fence_read: Fence, guarded: bool) -> bool {
        match self.record {
            Record::Unknown { fence, .. } => !guarded || fence == fence_read,
            Record::Processing {
                lease_live: false, ..
            } => !guarded,
            Record::Absent | Record::Processing { .. } | Record::Completed { .. } => false,
        }
    }

    /// Whether `(owner, fence)` holds the processing record, its lease live or not.
    fn held_by(&self, owner: GatewayId, fence: Fence) -> bool {
        matches!(
            self.record,
            Record::Processing { owner: o, fence: f, .. } if o == owner && f == fence
        )
    }

    fn grant(&mut self, owner: GatewayId) -> Fence {
        self.last_fence += 1;
        self.record = Record::Processing {
            owner,
            fence: self.last_fence,
            lease_live: true,
        };
        self.last_fence
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

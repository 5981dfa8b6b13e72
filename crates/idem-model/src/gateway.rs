//! A gateway: it serves one client request at a time, and loses all of it when it crashes.

use crate::ids::{ClientId, Fence, Response};

/// The client request a gateway is serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Job {
    /// Who asked.
    pub client: ClientId,
    /// Which of the client's requests it is (1 for the first), so a late answer to a request
    /// the client no longer waits for is not taken for the answer to its retry.
    pub request: u8,
}

/// Where a gateway is in serving its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Step {
    /// It holds the claim under `fence` and has sent the request; it waits for the upstream.
    Sent {
        /// The claim's fence, carried by the request.
        fence: Fence,
    },
    /// The upstream answered; next is the completion.
    Answered {
        /// The claim's fence.
        fence: Fence,
        /// The upstream's answer.
        response: Response,
    },
    /// The claim found the record unknown under `fence`; next is asking the upstream.
    Probing {
        /// The fence read from the unknown record.
        fence: Fence,
    },
    /// The upstream's answer is in and can be acted on; next is the resolve.
    Probed {
        /// The fence read from the unknown record; the resolve is guarded by it.
        fence: Fence,
        /// What to resolve to.
        verdict: Verdict,
    },
}

/// What a prober resolves an unknown record to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// The upstream executed it: complete with its response.
    Done(Response),
    /// The upstream did not and (by the window rule) never will: release and run afresh.
    NotDone,
}

/// A gateway's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Gateway {
    /// Ready for a request.
    Idle,
    /// Serving `job`, at `step`.
    Serving {
        /// The request.
        job: Job,
        /// Where it is.
        step: Step,
    },
}

impl Gateway {
    /// The fence this gateway holds a claim under, if it is running one.
    pub const fn held_fence(&self) -> Option<Fence> {
        match self {
            Self::Serving {
                step: Step::Sent { fence } | Step::Answered { fence, .. },
                ..
            } => Some(*fence),
            Self::Serving { .. } | Self::Idle => None,
        }
    }
}

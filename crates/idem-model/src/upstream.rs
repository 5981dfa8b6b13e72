//! The upstream: the system the effect happens in (a card network, an order service).
//!
//! Requests travel to it and may be delayed. The assumption the new design rests on is that
//! the upstream does not act on a request past its timeout: each attempt (named by its fence)
//! has a window, and once the window has passed, a request of that attempt still in transit is
//! dropped and can never execute.

use crate::ids::{Fence, FenceSet, Response};

/// One effect the upstream carried out for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Execution {
    /// The fence the request carried.
    pub fence: Fence,
    /// What it answered.
    pub response: Response,
}

/// What the status webhook answers about the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// It executed; this is the (first) response.
    Done(Response),
    /// It has not executed (yet: a request may still be in transit).
    NotDone,
}

/// The upstream's state for the key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Upstream {
    /// Requests sent and neither executed nor dropped.
    pub in_transit: FenceSet,
    /// Attempts whose window has passed.
    pub over: FenceSet,
    /// Every execution, in order: the property is that it never holds more than one.
    pub ledger: Vec<Execution>,
}

impl Upstream {
    /// A request carrying `fence` is sent (with its claim, so well inside its window).
    pub fn send(&mut self, fence: Fence) {
        self.in_transit.insert(fence);
    }

    /// The in-transit request with `fence` arrives and executes; its response.
    pub fn execute(&mut self, fence: Fence) -> Response {
        self.in_transit.remove(fence);
        let response = Response(fence);
        self.ledger.push(Execution { fence, response });
        response
    }

    /// The window of attempt `fence` passes: its request, if still in transit, is dropped.
    pub fn window_passes(&mut self, fence: Fence) {
        self.over.insert(fence);
        self.in_transit.remove(fence);
    }

    /// The status webhook's answer about the key.
    pub fn status(&self) -> Status {
        self.ledger
            .first()
            .map_or(Status::NotDone, |e| Status::Done(e.response))
    }

    /// The response of the first execution, if any.
    pub fn first_response(&self) -> Option<Response> {
        self.ledger.first().map(|e| e.response)
    }
}

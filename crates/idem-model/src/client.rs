//! A client: it sends requests with the key and retries the ones that got no final answer.

/// What a gateway answers a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Answer {
    /// A 2xx: the response of an execution (fresh, replayed or reported by the probe).
    Ok(crate::ids::Response),
    /// Final, but not a 2xx: the outcome is unknown (hold without a probe).
    OutcomeUnknown,
    /// Someone holds a live lease: retry later.
    Busy,
    /// The outcome is not known yet (the window has not passed, or the record moved on under
    /// the prober): retry later.
    InFlight,
    /// The gateway's claim was fenced out or its handler timed out: retry.
    Error,
}

impl Answer {
    /// Whether the client stops retrying on this answer.
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Ok(_) | Self::OutcomeUnknown)
    }
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// It has a request to send (the first, or a retry).
    Ready,
    /// It waits for the answer to its latest request.
    Waiting,
    /// It got a final answer.
    Done(Answer),
    /// It has no requests left and no final answer.
    GaveUp,
}

/// A client's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// How many requests it has sent; the latest one is number `sent`.
    pub sent: u8,
    /// Where it is.
    pub phase: Phase,
}

impl Client {
    /// A client that has sent nothing yet.
    pub const fn new() -> Self {
        Self {
            sent: 0,
            phase: Phase::Ready,
        }
    }

    /// It sends its next request; that request's number.
    pub const fn send(&mut self) -> u8 {
        self.sent += 1;
        self.phase = Phase::Waiting;
        self.sent
    }

    /// An answer to request number `request` arrives. A client only hears the answer to the
    /// request it is waiting for: one it stopped waiting for is gone (its connection closed).
    pub fn hear(&mut self, request: u8, answer: Answer, max_requests: u8) {
        if self.phase != Phase::Waiting || request != self.sent {
            return;
        }
        self.phase = if answer.is_final() {
            Phase::Done(answer)
        } else {
            self.after_no_answer(max_requests)
        };
    }

    /// It stops waiting: the answer was lost or is late.
    pub fn give_up_waiting(&mut self, max_requests: u8) {
        self.phase = self.after_no_answer(max_requests);
    }

    /// The 2xx it received, if any.
    pub const fn ok(&self) -> Option<crate::ids::Response> {
        match self.phase {
            Phase::Done(Answer::Ok(response)) => Some(response),
            _ => None,
        }
    }

    const fn after_no_answer(&self, max_requests: u8) -> Phase {
        if self.sent < max_requests {
            Phase::Ready
        } else {
            Phase::GaveUp
        }
    }
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

//! What a test handler counts and waits on, shared between it and the test driving it.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Counters and gates shared with a test handler.
#[derive(Debug, Default)]
pub struct Hits {
    /// Handler executions started.
    pub started: AtomicUsize,
    /// Handler executions that ran to their end (not cancelled).
    pub finished: AtomicUsize,
    /// Signalled whenever a handler starts.
    pub on_start: Notify,
    /// Gated handlers wait for this.
    pub gate: Notify,
    /// Signalled when a gated handler finished.
    pub on_finish: Notify,
}

impl Hits {
    /// Handler executions started so far.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Handler executions finished so far.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
}

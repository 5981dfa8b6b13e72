//! The consume loop both adapters share: take deliveries while not shutting down, process up to
//! `concurrency` at once, carry out each disposition, and at shutdown finish what is in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use idem_core::Store;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::message::Message;
use crate::process::{Delivered, Processor};
use crate::work::Work;

/// One delivery of a broker, before and after processing.
pub(crate) trait Inbound: Send + 'static {
    /// The message as the processor sees it; `None` when the delivery cannot be read (then
    /// it is dead-lettered by [`Inbound::unreadable`]).
    fn message(&self) -> Message;

    /// Carries out the processor's decision. `stopping` turns true at shutdown: a delayed
    /// redelivery then hands the message back at once.
    fn settle(
        self,
        delivered: Delivered,
        stopping: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send;
}

/// Consecutive stream errors after which the consumer stops and reports the last one.
const MAX_STREAM_ERRORS: u32 = 10;

/// Sleeps `after`, or less when shutdown begins.
pub(crate) async fn delay(after: Duration, mut stopping: watch::Receiver<bool>) {
    if *stopping.borrow() {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep(after) => {}
        _ = stopping.wait_for(|s| *s) => {}
    }
}

/// Consumes `deliveries` until `shutdown` resolves or the stream ends, then waits for every
/// message in progress to be settled.
pub(crate) async fn drive<S, W, D, St, E>(
    deliveries: St,
    processor: Arc<Processor<S, W>>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), E>
where
    S: Store,
    W: Work<S>,
    D: Inbound,
    St: Stream<Item = Result<D, E>> + Send,
    E: std::fmt::Display,
{
    let permits = Arc::new(Semaphore::new(processor.config().concurrency.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut deliveries = Box::pin(deliveries);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failures = 0u32;
    let result = loop {
        // Reap finished tasks so the set does not grow with the queue.
        while tasks.try_join_next().is_some() {}
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break Ok(()),
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break Ok(()),
            },
        };
        let next = tokio::select! {
            biased;
            () = &mut shutdown => break Ok(()),
            next = deliveries.next() => next,
        };
        let delivery = match next {
            None => break Ok(()),
            Some(Ok(d)) => {
                failures = 0;
                d
            }
            // Some errors pass (a JetStream pull that missed a heartbeat is renewed); a run of
            // them means the connection is gone.
            Some(Err(e)) if failures < MAX_STREAM_ERRORS => {
                failures += 1;
                tracing::warn!(error = %e, failures, "consumer stream error");
                tokio::time::sleep(Duration::from_millis(20 << failures.min(5))).await;
                continue;
            }
            Some(Err(e)) => {
                tracing::error!(error = %e, "consumer stream failed");
                break Err(e);
            }
        };
        let processor = Arc::clone(&processor);
        let stopping = stop_rx.clone();
        tasks.spawn(async move {
            let message = delivery.message();
            let delivered = processor.process(&message).await;
            delivery.settle(delivered, stopping).await;
            drop(permit);
        });
    };
    // Stop: no new deliveries; what is in progress finishes and is settled (delayed
    // redeliveries are handed back now).
    let _ = stop_tx.send(true);
    drop(deliveries);
    while tasks.join_next().await.is_some() {}
    result
}

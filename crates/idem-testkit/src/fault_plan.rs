//! What the two fault proxies ([`fault_proxy`](crate::fault_proxy) for bytes,
//! [`h2_fault`](crate::h2_fault) for HTTP/2 calls) share: the plan of faults handed out in
//! turn, the record of those applied, and the count of requests still being forwarded that
//! `settled` waits on; and the accept loop they run on a loopback port.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Mutex, Notify};

/// The faults still to hand out, and those handed out so far.
struct Queue<F> {
    plan: VecDeque<F>,
    applied: Vec<F>,
}

/// A proxy's plan of faults of kind `F` and its busy count.
pub(crate) struct FaultPlan<F> {
    queue: Mutex<Queue<F>>,
    busy: AtomicUsize,
    idle: Notify,
}

impl<F: Copy> FaultPlan<F> {
    pub(crate) fn new(plan: impl IntoIterator<Item = F>) -> Self {
        Self {
            queue: Mutex::new(Queue {
                plan: plan.into_iter().collect(),
                applied: Vec::new(),
            }),
            busy: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }

    /// The next fault of the plan, `pass` once it is spent; recorded as applied.
    pub(crate) async fn next(&self, pass: F) -> F {
        let mut queue = self.queue.lock().await;
        let fault = queue.plan.pop_front().unwrap_or(pass);
        queue.applied.push(fault);
        fault
    }

    /// Appends faults to the plan.
    pub(crate) async fn push(&self, faults: impl IntoIterator<Item = F>) {
        self.queue.lock().await.plan.extend(faults);
    }

    /// The faults applied so far, in order.
    pub(crate) async fn applied(&self) -> Vec<F> {
        self.queue.lock().await.applied.clone()
    }

    /// One more request is being forwarded: `settled` waits for it.
    pub(crate) fn begin(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
    }

    /// A request begun with [`begin`](Self::begin) got far enough; the last one wakes the
    /// waiters of `settled`.
    pub(crate) fn end(&self) {
        if self.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no request is begun and not ended, at most `limit`; returns whether it
    /// got there.
    pub(crate) async fn settled(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                // Registered before the count is read, so an `end` in between is not missed.
                let idle = self.idle.notified();
                if self.busy.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await
        .is_ok()
    }
}

/// A proxy's accept loop on a spare loopback port; stopped when dropped.
pub(crate) struct Listening {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Listening {
    /// Binds a spare loopback port and runs `accept` on its listener in a task of its own.
    pub(crate) async fn start<A>(accept: impl FnOnce(TcpListener) -> A) -> io::Result<Self>
    where
        A: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener));
        Ok(Self { addr, task })
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

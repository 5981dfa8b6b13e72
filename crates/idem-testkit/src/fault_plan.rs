//! What the two fault proxies ([`fault_proxy`](crate::fault_proxy) for bytes,
//! [`h2_fault`](crate::h2_fault) for HTTP/2 calls) share: the plan of faults handed out in
//! turn, the record of those applied, and the count of requests still being forwarded that
//! `settled` waits on; the accept loop they run on a loopback port; and the running proxy,
//! [`Proxy`], both are kinds of.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
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

/// A kind of fault proxy: what its faults are, what picks the connections or requests that
/// take one, and what else its connections share.
pub trait ProxyKind: Send + Sync + 'static {
    /// One fault of the plan.
    type Fault: Copy + Send + Sync + 'static;
    /// Decides what takes a fault from the plan (the rest pass).
    type Matcher: Send + Sync + 'static;
    /// What else the proxy's connections share.
    type State: Send + Sync + 'static;
    /// The proxy's name in `Debug` output.
    const NAME: &'static str;
}

/// What the connections of a running proxy of kind `K` share.
pub struct Shared<K: ProxyKind> {
    pub(crate) target: SocketAddr,
    pub(crate) plan: FaultPlan<K::Fault>,
    pub(crate) matcher: K::Matcher,
    pub(crate) state: K::State,
}

impl<K: ProxyKind> std::fmt::Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// A running fault proxy of kind `K`
/// ([`FaultProxy`](crate::fault_proxy::FaultProxy) or
/// [`H2FaultProxy`](crate::h2_fault::H2FaultProxy)); stops accepting when dropped.
pub struct Proxy<K: ProxyKind> {
    listening: Listening,
    pub(crate) shared: Arc<Shared<K>>,
}

impl<K: ProxyKind> std::fmt::Debug for Proxy<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(K::NAME)
            .field("addr", &self.listening.addr)
            .field("target", &self.shared.target)
            .finish()
    }
}

impl<K: ProxyKind> Proxy<K> {
    /// A proxy on a spare loopback port in front of `target`, serving its clients with
    /// `accept` and handing out `plan` to what `matcher` accepts.
    pub(crate) async fn start_with<A>(
        target: SocketAddr,
        matcher: K::Matcher,
        state: K::State,
        plan: impl IntoIterator<Item = K::Fault>,
        accept: fn(TcpListener, Arc<Shared<K>>) -> A,
    ) -> io::Result<Self>
    where
        A: Future<Output = ()> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            target,
            plan: FaultPlan::new(plan),
            matcher,
            state,
        });
        let listening = {
            let shared = Arc::clone(&shared);
            Listening::start(|listener| accept(listener, shared)).await?
        };
        Ok(Self { listening, shared })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.listening.addr
    }

    /// Appends faults to the plan.
    pub async fn push(&self, faults: impl IntoIterator<Item = K::Fault>) {
        self.shared.plan.push(faults).await;
    }

    /// The faults applied so far to the connections or requests that matched, in order
    /// (the kind's `Pass` for those past the plan).
    pub async fn applied(&self) -> Vec<K::Fault> {
        self.shared.plan.applied().await
    }

    /// Waits until every request the proxy holds or forwards has got its answer under way
    /// (see the kind's `settled`), at most `limit`; returns whether it got there.
    pub async fn settled(&self, limit: Duration) -> bool {
        self.shared.plan.settled(limit).await
    }
}

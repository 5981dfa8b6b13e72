//! A private loopback server for tests that write their own upstream: it accepts on a spare
//! port and hands each connection, with a shared execution counter, to the test's handler.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running server; its accept loop is aborted on drop.
#[derive(Debug)]
pub struct CountingServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What the handlers counted (each one decides what an execution is).
    pub executions: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl CountingServer {
    /// Binds a spare loopback port and runs `handle(connection, counter)` in a task of its own
    /// for every connection accepted, so that one slow connection never holds up the next.
    pub async fn start<F, Fut>(handle: F) -> Self
    where
        F: Fn(TcpStream, Arc<AtomicU64>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let executions = Arc::new(AtomicU64::new(0));
        let count = Arc::clone(&executions);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(handle(stream, Arc::clone(&count)));
            }
        });
        Self {
            addr,
            executions,
            task,
        }
    }

    /// How many executions the handlers counted so far.
    pub fn count(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

impl Drop for CountingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

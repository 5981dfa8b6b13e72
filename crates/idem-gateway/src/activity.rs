//! When a stream last moved bytes: what the listener's idle timeout and an upgraded tunnel's
//! idle timeout both watch.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// When a connection (or a tunnel) last moved bytes, and how many requests it has in
/// progress.
#[derive(Debug)]
pub(crate) struct Activity {
    origin: Instant,
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `idle` and no request is in progress.
    pub(crate) async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.origin + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let due = last + idle;
            if Instant::now() >= due && self.in_flight.load(Ordering::Relaxed) == 0 {
                return;
            }
            tokio::time::sleep_until(due.max(Instant::now() + Duration::from_millis(100))).await;
        }
    }
}

pin_project_lite::pin_project! {
    /// A stream that records when it last moved bytes.
    pub(crate) struct Tracked<S> {
        #[pin]
        inner: S,
        activity: Arc<Activity>,
    }
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Self {
        activity.touch();
        Self { inner, activity }
    }
}

impl<S: AsyncRead> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let out = this.inner.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        out
    }
}

impl<S: AsyncWrite> AsyncWrite for Tracked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let out = this.inner.poll_write(cx, buf);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        out
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let out = this.inner.poll_write_vectored(cx, bufs);
        if matches!(out, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        out
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// One request in progress on a connection; the count drops with it, even if the request's
/// future is dropped.
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(crate) fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

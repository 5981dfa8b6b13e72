//! A switchable TCP link between one gateway (or relay) and the store, so the nemesis can cut
//! or slow that one path while the others stay whole.
//!
//! idem-testkit's `FaultProxy` decides a fault once per new connection, from its first
//! request; a store client keeps one connection open for the whole run, so cutting it needs a
//! link that acts on connections already open. This one does, in three ways besides passing:
//! [`Mode::Cut`] resets every open connection and every new one, [`Mode::Blackhole`] stops
//! forwarding (open connections stall, new ones are accepted and hang, as across a network
//! partition) until the mode changes, and [`Mode::Slow`] delays every chunk each way.
//! [`Link::retarget`] moves it to another server, as a virtual IP follows a promoted standby.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the link does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Forwards both ways.
    Pass,
    /// Resets open connections and new ones.
    Cut,
    /// Forwards nothing, holding connections open, until the mode changes.
    Blackhole,
    /// Forwards each chunk after this delay.
    Slow(Duration),
}

/// The running link; stops when dropped.
#[derive(Debug)]
pub struct Link {
    addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    mode: watch::Sender<Mode>,
    task: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        // Connections see the sender go and close.
        self.task.abort();
    }
}

impl Link {
    /// A link on a spare loopback port to `target`, passing.
    ///
    /// # Errors
    /// The listener cannot be bound.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let target = Arc::new(Mutex::new(target));
        let task = tokio::spawn(accept(listener, Arc::clone(&target), rx));
        Ok(Self {
            addr,
            target,
            mode,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode for open and new connections.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Sends new connections to `target` from now on, as a virtual IP moves to a promoted
    /// standby; open connections stay with the old target (and die with it).
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock() = target;
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

async fn accept(listener: TcpListener, target: Arc<Mutex<SocketAddr>>, rx: watch::Receiver<Mode>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let rx = rx.clone();
        let target = *target.lock();
        tokio::spawn(async move {
            let _ = carry(client, target, rx).await;
        });
    }
}

async fn carry(
    mut client: TcpStream,
    target: SocketAddr,
    mut rx: watch::Receiver<Mode>,
) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    // A connection made during a blackhole hangs until it lifts; during a cut it is reset.
    loop {
        let mode = *rx.borrow_and_update();
        match mode {
            Mode::Cut => {
                reset(client);
                return Ok(());
            }
            Mode::Blackhole => {}
            Mode::Pass | Mode::Slow(_) => break,
        }
        if rx.changed().await.is_err() {
            return Ok(());
        }
    }
    let mut server = TcpStream::connect(target).await?;
    let _ = server.set_nodelay(true);
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        let mode = *rx.borrow_and_update();
        let delay = match mode {
            Mode::Cut => {
                reset(client);
                reset(server);
                return Ok(());
            }
            Mode::Blackhole => {
                if rx.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            }
            Mode::Pass => None,
            Mode::Slow(d) => Some(d),
        };
        tokio::select! {
            read = client.read(&mut up) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                server.write_all(&up[..n]).await?;
            }
            read = server.read(&mut down) => {
                let n = read?;
                if n == 0 {
                    return Ok(());
                }
                if let Some(d) = delay {
                    tokio::time::sleep(d).await;
                }
                client.write_all(&down[..n]).await?;
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// Closes with a TCP reset rather than an orderly shutdown.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn ping(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        c.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_millis(500), c.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        Ok(buf.to_vec())
    }

    /// An open connection passes, stalls in a blackhole and resumes after it, and is reset
    /// by a cut; a new one during the cut is reset too.
    #[tokio::test]
    async fn modes_act_on_open_connections() {
        let link = Link::start(echo_server().await).await.expect("link");
        let mut c = TcpStream::connect(link.addr()).await.expect("connect");
        assert_eq!(ping(&mut c).await.expect("pass"), b"ping");
        link.set(Mode::Blackhole);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ping(&mut c).await.is_err(), "a blackhole forwards nothing");
        link.set(Mode::Pass);
        let mut late = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(1), c.read_exact(&mut late))
            .await
            .expect("the held bytes arrive after the blackhole")
            .expect("read");
        assert_eq!(&late, b"ping");
        link.set(Mode::Cut);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ping(&mut c).await.is_err(), "a cut resets open connections");
        let mut fresh = TcpStream::connect(link.addr()).await.expect("connect");
        assert!(ping(&mut fresh).await.is_err(), "and new ones");
        link.set(Mode::Slow(Duration::from_millis(100)));
        let mut slow = TcpStream::connect(link.addr()).await.expect("connect");
        let started = std::time::Instant::now();
        assert_eq!(ping(&mut slow).await.expect("slow"), b"ping");
        assert!(started.elapsed() >= Duration::from_millis(200));
    }
}

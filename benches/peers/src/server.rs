//! The bench's own `redis-server` (no persistence, on a spare loopback port), so no other
//! client's traffic lands in a measurement and nothing is left behind.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private `redis-server`, stopped and its directory removed on drop.
#[derive(Debug)]
pub(crate) struct Server {
    child: Child,
    dir: PathBuf,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
}

impl Server {
    /// Starts `redis-server` on a spare port and waits until it accepts connections.
    pub(crate) fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("spare port");
        let dir = std::env::temp_dir().join(format!("idem-peers-bench-{port}"));
        std::fs::create_dir_all(&dir).expect("server directory");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (or set PEERS_REDIS_URL)");
        let server = Server { child, dir, port };
        let give_up = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < give_up, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// The server's process id (for its CPU time).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

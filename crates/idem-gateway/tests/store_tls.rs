//! TLS between the gateway and its store, with a private CA built here: a Redis that speaks
//! only TLS (and asks for a client certificate), a private PostgreSQL with `ssl = on` that
//! refuses plain connections, and the wrong CA refused with a clear error.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, Http, TempDir, Upstream, key};
use http::StatusCode;
use idem_testkit::redis_server::{Cluster, Server, redis_server_available};

/// PEM files of a private CA, a server certificate for 127.0.0.1 and a client certificate it
/// signed, and of an unrelated CA.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = TempDir::new("store-tls");
        let (ca_cert, issuer) = ca("idem test store CA");
        let (wrong, _) = ca("idem unrelated CA");
        std::fs::write(dir.0.join("ca.pem"), ca_cert.pem()).expect("write");
        std::fs::write(dir.0.join("wrong-ca.pem"), wrong.pem()).expect("write");
        for (name, sans) in [
            (
                "server",
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            ),
            ("client", vec!["idem-gateway".to_owned()]),
        ] {
            let key = rcgen::KeyPair::generate().expect("key");
            let mut params = rcgen::CertificateParams::new(sans).expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let cert = params.signed_by(&key, &issuer).expect("sign");
            std::fs::write(dir.0.join(format!("{name}.pem")), cert.pem()).expect("write");
            std::fs::write(dir.0.join(format!("{name}.key")), key.serialize_pem()).expect("write");
        }
        Self { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.0.join(name).display().to_string()
    }
}

fn ca(name: &str) -> (rcgen::Certificate, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let key = rcgen::KeyPair::generate().expect("ca key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("ca cert");
    (cert, rcgen::Issuer::new(params, key))
}

fn config(upstream: &str, store: &str, extra: &str) -> String {
    format!(
        r#"
upstream = "{upstream}"
store = "{store}"
store_timeout = "2s"
{extra}

[defaults]
namespace = "store-tls"
principal = {{ from = "none" }}

[[routes]]
name = "pay"
path = "/pay/*"
"#
    )
}

/// One key sent twice through a gateway on `store`: it runs once and the retry replays.
async fn runs_once(store: &str, extra: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up.url(), store, extra), &[]);
    let http = Http::new();
    let k = key();
    let first = http.post(&gw.url("/pay/1"), Some(&k), "{}").await;
    first.assert_status(StatusCode::CREATED);
    let again = http.post(&gw.url("/pay/1"), Some(&k), "{}").await;
    assert!(again.replayed(), "{:?}", again.headers);
    assert_eq!(again.body, first.body);
    assert_eq!(up.seen.count("/pay/1"), 1);
}

/// A database store reached as its URL says: on `verified` (checked against the private CA)
/// and on `required` (TLS, unchecked) a request runs once and replays; on `wrong_ca` the
/// gateway refuses to start and names the untrusted issuer. Returns what `idem serve`
/// printed when refused on `plain` (no TLS), for the test to check the server's reason.
async fn tls_as_the_url_says(
    verified: &str,
    required: &str,
    wrong_ca: &str,
    plain: &str,
) -> String {
    runs_once(verified, "").await;
    runs_once(required, "").await;
    let wrong = serve_fails(&config("http://127.0.0.1:9", wrong_ca, ""));
    assert!(
        wrong.contains("UnknownIssuer") && wrong.contains("certificate is not trusted"),
        "the wrong CA is named as the cause: {wrong}"
    );
    serve_fails(&config("http://127.0.0.1:9", plain, ""))
}

/// A private database server that takes TLS connections only, on the test's PKI.
trait TlsDatabase: Sized {
    /// `None` (loudly, or a failure under CI) when its binaries are missing.
    fn start(pki: &Pki) -> Option<Self>;
    /// Its URL with `query`.
    fn url(&self, query: &str) -> String;
}

/// [`tls_as_the_url_says`] on a private `D` started for the purpose: `verify(ca)` is the URL
/// query that checks the server against `ca`, `require` the one that wants TLS unchecked and
/// `disable` the one without TLS. `None` when `D` cannot be started.
async fn database_over_tls<D: TlsDatabase>(
    verify: fn(&str) -> String,
    require: &str,
    disable: &str,
) -> Option<String> {
    let pki = Pki::new();
    // Blocks this test's thread while the server starts; nothing else runs yet.
    let db = D::start(&pki)?;
    let verified = |ca: &str| db.url(&verify(ca));
    Some(
        tls_as_the_url_says(
            &verified(&pki.file("ca.pem")),
            &db.url(require),
            &verified(&pki.file("wrong-ca.pem")),
            &db.url(disable),
        )
        .await,
    )
}

/// `idem serve` on `config` exits without listening; returns what it printed.
fn serve_fails(config: &str) -> String {
    let (dir, mut cmd) = common::command("serve", config);
    let mut child = cmd
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idem");
    let give_up = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "idem serve exited successfully");
            break;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "idem serve did not give up on a store it cannot trust: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("idem listening on"), "{text}");
    text
}

/// A Redis that speaks only TLS and wants a client certificate: the gateway verifies it
/// against the private CA, presents its own certificate, runs a request once and replays
/// it. Without the client certificate, or trusting another CA, it refuses to start and
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_a_client_certificate() {
    if !redis_server_available() {
        return;
    }
    let pki = Pki::new();
    let redis = Server::start_tls(
        &pki.file("server.pem"),
        &pki.file("server.key"),
        &pki.file("ca.pem"),
        &["--tls-auth-clients", "yes"],
    );
    let port = redis.tls_port.expect("tls port");
    let store = format!("rediss://127.0.0.1:{port}");
    let prefix = format!(
        "store_prefix = \"idem-tls-{}:\"",
        uuid::Uuid::now_v7().simple()
    );
    let client = format!(
        "store_tls_cert_file = \"{}\"\nstore_tls_key_file = \"{}\"",
        pki.file("client.pem"),
        pki.file("client.key")
    );
    runs_once(
        &store,
        &format!(
            "{prefix}\n{client}\nstore_tls_ca_file = \"{}\"",
            pki.file("ca.pem")
        ),
    )
    .await;

    let wrong = serve_fails(&config(
        "http://127.0.0.1:9",
        &store,
        &format!(
            "{prefix}\n{client}\nstore_tls_ca_file = \"{}\"",
            pki.file("wrong-ca.pem")
        ),
    ));
    assert!(
        wrong.contains("UnknownIssuer") && wrong.contains("certificate is not trusted"),
        "the wrong CA is named as the cause: {wrong}"
    );
    let no_client = serve_fails(&config(
        "http://127.0.0.1:9",
        &store,
        &format!("{prefix}\nstore_tls_ca_file = \"{}\"", pki.file("ca.pem")),
    ));
    assert!(
        no_client.contains("client certificate"),
        "the missing client certificate is named: {no_client}"
    );
    // The system roots do not know the private CA either.
    let system = serve_fails(&config(
        "http://127.0.0.1:9",
        &store,
        &format!("{prefix}\n{client}"),
    ));
    assert!(system.contains("UnknownIssuer"), "{system}");
}

/// PostgreSQL that takes TLS connections only, through sqlx's rustls: `verify-full` against the
/// private CA and `require` run a request once; the wrong CA and a plain connection are
/// refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_as_the_url_says() {
    let Some(plain) = database_over_tls::<Postgres>(
        |ca| format!("sslmode=verify-full&sslrootcert={ca}"),
        "sslmode=require",
        "sslmode=disable",
    )
    .await
    else {
        return;
    };
    assert!(
        plain.contains("pg_hba.conf") || plain.contains("no encryption"),
        "the server refuses plain connections: {plain}"
    );
}

#[test]
fn store_tls_files_are_checked_before_start() {
    let pki = Pki::new();
    for (store, extra, want) in [
        (
            "redis://127.0.0.1:6379",
            format!("store_tls_ca_file = \"{}\"", pki.file("ca.pem")),
            "rediss://",
        ),
        (
            "rediss://127.0.0.1:6379",
            "store_tls_ca_file = \"/nonexistent/ca.pem\"".to_owned(),
            "store_tls_ca_file",
        ),
        (
            "rediss://127.0.0.1:6379",
            format!("store_tls_cert_file = \"{}\"", pki.file("client.pem")),
            "go together",
        ),
        (
            "postgres://u@127.0.0.1/db",
            format!("store_tls_ca_file = \"{}\"", pki.file("ca.pem")),
            "sslrootcert",
        ),
    ] {
        let out = common::check_config(&config("http://127.0.0.1:9", store, &extra));
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{store} {extra}");
        assert!(text.contains(want), "{store} {extra}: {text}");
    }
}

/// A private PostgreSQL with `ssl = on`, run as the `postgres` user from a temp directory,
/// that takes TLS connections only; killed (and its directory removed) on drop.
struct Postgres {
    port: u16,
    dir: PathBuf,
    child: std::process::Child,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl TlsDatabase for Postgres {
    fn start(pki: &Pki) -> Option<Self> {
        if !Path::new(PG_BIN).join("postgres").exists() {
            assert!(!common::ci(), "CI: PostgreSQL binaries missing in {PG_BIN}");
            eprintln!("!!! SKIPPING: no PostgreSQL binaries in {PG_BIN}");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("idem-pg-tls-{}", uuid::Uuid::now_v7()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).expect("dir");
        for (from, to) in [("server.pem", "server.crt"), ("server.key", "server.key")] {
            std::fs::copy(pki.dir.0.join(from), dir.join(to)).expect("copy");
        }
        run(Command::new("chown").args(["-R", "postgres"]).arg(&dir));
        run(Command::new("chmod").arg("600").arg(dir.join("server.key")));
        let initdb = format!("{PG_BIN}/initdb");
        as_postgres(&[
            &initdb,
            "-D",
            &data.display().to_string(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("hba");
        let port = common::spare_port();
        let postgres = format!("{PG_BIN}/postgres");
        let child = Command::new("runuser")
            .args(["-u", "postgres", "--", &postgres, "-D"])
            .arg(&data)
            .args([
                "-p",
                &port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("unix_socket_directories={}", dir.display()),
                "-c",
                "ssl=on",
                "-c",
                &format!("ssl_cert_file={}", dir.join("server.crt").display()),
                "-c",
                &format!("ssl_key_file={}", dir.join("server.key").display()),
                "-c",
                "fsync=off",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start postgres");
        let pg = Self { port, dir, child };
        let give_up = Instant::now() + Duration::from_secs(30);
        while !Command::new(format!("{PG_BIN}/pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(Instant::now() < give_up, "private PostgreSQL did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(pg)
    }

    fn url(&self, query: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?{query}",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // `runuser` passes the signal on to postgres; SIGQUIT stops it at once.
        let _ = Command::new("kill")
            .args(["-QUIT", &self.child.id().to_string()])
            .status();
        let give_up = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

fn as_postgres(args: &[&str]) {
    run(Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(args)
        .stdout(Stdio::null()));
}

/// A private MariaDB with TLS and `require_secure_transport`, from a temp directory, with a
/// user `idem` (no password) and a database `idem`; killed and removed on drop.
struct Mariadb {
    port: u16,
    dir: PathBuf,
    child: std::process::Child,
}

impl TlsDatabase for Mariadb {
    fn start(pki: &Pki) -> Option<Self> {
        let have = |b: &str| {
            Command::new(b)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !have("mariadbd") || !have("mariadb-install-db") {
            assert!(!common::ci(), "CI: mariadbd / mariadb-install-db missing");
            eprintln!("!!! SKIPPING: no mariadbd / mariadb-install-db");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("idem-mdb-tls-{}", uuid::Uuid::now_v7()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir).expect("dir");
        run(Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--user=root", "--skip-test-db"]));
        let port = common::spare_port();
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-name-resolve",
                "--require-secure-transport=ON",
                "--innodb-buffer-pool-size=16M",
            ])
            .arg(format!("--ssl-cert={}", pki.file("server.pem")))
            .arg(format!("--ssl-key={}", pki.file("server.key")))
            .arg(format!("--ssl-ca={}", pki.file("ca.pem")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let db = Self { port, dir, child };
        let give_up = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < give_up, "private MariaDB did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        // root authenticates by the socket's peer (this process runs as root).
        run(Command::new("mariadb")
            .arg(format!("--socket={}", db.dir.join("sock").display()))
            .args(["-u", "root", "-e"])
            .arg(
                "CREATE USER 'idem'@'127.0.0.1'; \
                 GRANT ALL PRIVILEGES ON *.* TO 'idem'@'127.0.0.1'; CREATE DATABASE idem;",
            ));
        Some(db)
    }

    fn url(&self, query: &str) -> String {
        format!("mysql://idem@127.0.0.1:{}/idem?{query}", self.port)
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// MariaDB that takes TLS connections only, through sqlx's rustls: `VERIFY_IDENTITY` against
/// the private CA and `REQUIRED` run a request once; the wrong CA and a plain connection are
/// refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls_as_the_url_says() {
    let Some(plain) = database_over_tls::<Mariadb>(
        |ca| format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"),
        "ssl-mode=REQUIRED",
        "ssl-mode=DISABLED",
    )
    .await
    else {
        return;
    };
    // The same user, refused without TLS: MariaDB 10.11 reports `require_secure_transport`
    // as "Access denied", other versions as "insecure transport".
    assert!(
        plain.contains("insecure transport") || plain.contains("Access denied for user 'idem'"),
        "the server refuses plain connections: {plain}"
    );
}

/// A Redis Cluster that speaks only TLS (clients and cluster bus) and wants client
/// certificates: `rediss+cluster://` with the private CA and a client certificate reaches
/// every master, runs each key once and replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_with_a_private_ca() {
    if !redis_server_available() {
        return;
    }
    let pki = Pki::new();
    let (cert, key_file, ca) = (
        pki.file("server.pem"),
        pki.file("server.key"),
        pki.file("ca.pem"),
    );
    let cluster = tokio::task::spawn_blocking(move || Cluster::start_tls(&cert, &key_file, &ca))
        .await
        .expect("start cluster");
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let prefix = format!("idem-tls-cluster-{}:", uuid::Uuid::now_v7().simple());
    let up = Upstream::start().await;
    let gw = Gateway::start(
        &config(
            &up.url(),
            &url,
            &format!(
                "store_prefix = \"{prefix}\"\nstore_tls_ca_file = \"{}\"\n\
                 store_tls_cert_file = \"{}\"\nstore_tls_key_file = \"{}\"",
                pki.file("ca.pem"),
                pki.file("client.pem"),
                pki.file("client.key")
            ),
        ),
        &[],
    );
    let http = Http::new();
    let run = uuid::Uuid::now_v7().simple().to_string();
    for i in 0..12 {
        let (path, k) = (format!("/pay/{i}"), format!("{run}-{i}"));
        let first = http.post(&gw.url(&path), Some(&k), "{}").await;
        first.assert_status(StatusCode::CREATED);
        let again = http.post(&gw.url(&path), Some(&k), "{}").await;
        assert!(again.replayed() && again.body == first.body);
        assert_eq!(up.seen.count(&path), 1);
    }
    let pattern = format!("{prefix}*");
    let per_master: Vec<usize> = cluster
        .masters()
        .into_iter()
        .map(|m| {
            cluster
                .node(m)
                .and_then(|n| n.cli(&["--scan", "--pattern", &pattern]))
                .map_or(0, |out| out.lines().filter(|l| !l.is_empty()).count())
        })
        .collect();
    assert_eq!(per_master.len(), 3);
    assert!(
        per_master.iter().all(|&n| n > 0),
        "every master holds records: {per_master:?}"
    );
}

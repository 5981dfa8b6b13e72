//! Upstreams: where requests go (`http://`, `https://` or `h2c://`), how TLS to them is
//! verified, which HTTP version is spoken, and the pooled clients that reach them.
//!
//! An upstream is written as a URL, or as a table when it needs more:
//!
//! ```toml
//! upstream = "https://pay.internal:8443"
//! upstream = { url = "https://pay.internal:8443", ca_file = "ca.pem",
//!              client_cert_file = "gw.crt", client_key_file = "gw.key", http2 = true }
//! ```
//!
//! `https://` upstreams are verified against the system's root certificates plus `ca_file`
//! if given; a client certificate is presented when `client_cert_file` and `client_key_file`
//! are set. `http2 = true` (or the `h2c://` scheme) speaks HTTP/2 to the upstream: with prior
//! knowledge over plain TCP, through ALPN over TLS. Otherwise the gateway speaks HTTP/1.1 to
//! it, whatever the client speaks to the gateway.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use http::Uri;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioIo};
use idem_http::RequestBody;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// An upstream as written: a URL, or a table with TLS and protocol settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawUpstream {
    /// `http://host:port`, `https://host:port` or `h2c://host:port`, optionally with a path
    /// prefix.
    Url(String),
    /// The URL with its settings.
    Table(RawUpstreamTable),
}

/// An upstream with its settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstreamTable {
    /// The upstream's URL.
    pub url: String,
    /// `https://`: PEM certificates trusted besides the system roots.
    pub ca_file: Option<PathBuf>,
    /// `https://`: a PEM certificate chain the gateway presents to the upstream.
    pub client_cert_file: Option<PathBuf>,
    /// `https://`: the PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    /// Speak HTTP/2 to the upstream (default false; `h2c://` implies it).
    pub http2: Option<bool>,
}

/// A checked upstream.
#[derive(Clone)]
pub struct UpstreamSpec {
    /// The URL requests go to (`http` or `https`; `h2c` is turned into `http`).
    pub uri: Uri,
    /// TLS settings, for `https`.
    pub tls: Option<UpstreamTls>,
    /// HTTP/2 to the upstream.
    pub http2: bool,
}

/// How the gateway verifies an `https` upstream and identifies itself to it.
#[derive(Clone, Debug)]
pub struct UpstreamTls {
    /// Extra trusted certificates.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain and key, if any.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// How many system root certificates were loaded.
    pub system_roots: usize,
    config: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for UpstreamSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for UpstreamSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.uri)?;
        let mut notes = Vec::new();
        if let Some(tls) = &self.tls {
            let mut trust = format!("TLS verified against {} system roots", tls.system_roots);
            if let Some(ca) = &tls.ca_file {
                trust.push_str(&format!(" + CA file {}", ca.display()));
            }
            notes.push(trust);
            match &tls.client_cert {
                Some((cert, _)) => notes.push(format!("client certificate {}", cert.display())),
                None => notes.push("no client certificate".to_owned()),
            }
        }
        notes.push(if self.http2 { "HTTP/2" } else { "HTTP/1.1" }.to_owned());
        write!(f, " ({})", notes.join("; "))
    }
}

impl UpstreamSpec {
    /// A plain `http://` upstream over HTTP/1.1 (the demo upstream).
    pub fn plain(uri: Uri) -> Self {
        Self {
            uri,
            tls: None,
            http2: false,
        }
    }

    /// Checks `raw`: the URL, and for `https` the certificate files (read now, so a missing
    /// or broken file is reported at start, by `check-config` and by a reload).
    ///
    /// # Errors
    /// What is wrong, naming the URL or the file.
    pub fn compile(raw: &RawUpstream) -> anyhow::Result<Self> {
        let table = match raw {
            RawUpstream::Url(url) => RawUpstreamTable {
                url: url.clone(),
                ..RawUpstreamTable::default()
            },
            RawUpstream::Table(t) => t.clone(),
        };
        let (uri, https, h2c) = upstream_uri(&table.url)?;
        let http2 = h2c || table.http2.unwrap_or(false);
        if h2c && table.http2 == Some(false) {
            bail!("`{}`: h2c:// is HTTP/2; drop `http2 = false`", table.url);
        }
        let tls_fields = table.ca_file.is_some()
            || table.client_cert_file.is_some()
            || table.client_key_file.is_some();
        if !https {
            if tls_fields {
                bail!(
                    "`{}`: `ca_file`, `client_cert_file` and `client_key_file` need an https:// upstream",
                    table.url
                );
            }
            return Ok(Self {
                uri,
                tls: None,
                http2,
            });
        }
        let client_cert = match (&table.client_cert_file, &table.client_key_file) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            (None, None) => None,
            _ => bail!("`client_cert_file` and `client_key_file` go together"),
        };
        let tls = UpstreamTls::load(table.ca_file.clone(), client_cert, http2)?;
        Ok(Self {
            uri,
            tls: Some(tls),
            http2,
        })
    }
}

/// Parses an upstream URL: `(uri, https, h2c)`, with `h2c` rewritten to `http`.
pub(crate) fn upstream_uri(text: &str) -> anyhow::Result<(Uri, bool, bool)> {
    let text = text.trim();
    let url = url::Url::parse(text).map_err(|e| anyhow!("`{text}` is not a URL ({e})"))?;
    let (https, h2c) = match url.scheme() {
        "http" => (false, false),
        "https" => (true, false),
        "h2c" => (false, true),
        _ => bail!(
            "`{text}` must be an http://, https:// or h2c:// URL such as http://127.0.0.1:3000"
        ),
    };
    if url.host_str().is_none_or(str::is_empty) {
        bail!("`{text}` has no host");
    }
    if url.query().is_some() {
        bail!("`{text}`: an upstream URL cannot have a query");
    }
    if url.username() != "" || url.password().is_some() {
        bail!("`{text}`: an upstream URL cannot carry credentials");
    }
    let text = match text.strip_prefix("h2c://") {
        Some(rest) => format!("http://{rest}"),
        None => text.to_owned(),
    };
    if h2c && url.port().is_none() {
        bail!("`{text}`: an h2c:// upstream needs a port");
    }
    let uri = text
        .parse()
        .map_err(|e| anyhow!("`{text}` is not a URL ({e})"))?;
    Ok((uri, https, h2c))
}

impl UpstreamTls {
    fn load(
        ca_file: Option<PathBuf>,
        client_cert: Option<(PathBuf, PathBuf)>,
        http2: bool,
    ) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        // Unreadable system certificates are skipped: the ones that load still count.
        let native = rustls_native_certs::load_native_certs();
        let (system_roots, _) = roots.add_parsable_certificates(native.certs);
        if let Some(ca) = &ca_file {
            let certs = read_certs(ca)?;
            for cert in certs {
                roots.add(cert).with_context(|| {
                    format!("{} holds an unusable CA certificate", ca.display())
                })?;
            }
        }
        if roots.is_empty() {
            bail!("no system root certificates were found: set `ca_file` for the https upstream");
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
        let mut config = match &client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert)?;
                let key_der = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("cannot read a private key from {}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .with_context(|| {
                        format!(
                            "the key in {} does not fit the certificate in {}",
                            key.display(),
                            cert.display()
                        )
                    })?
            }
        };
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        Ok(Self {
            ca_file,
            client_cert,
            system_roots,
            config: Arc::new(config),
        })
    }
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read certificates from {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

/// The pooled client of one kind of upstream.
pub type HttpClient = Client<Connector, RequestBody>;

/// Makes one pooled client per distinct upstream setting (TLS files, HTTP version), shared by
/// every route that uses the same one.
#[derive(Debug)]
pub struct Clients {
    connect_timeout: Duration,
    max_idle: usize,
    made: Vec<(ClientKey, HttpClient)>,
}

#[derive(Debug, PartialEq, Eq)]
struct ClientKey {
    tls: Option<TlsKey>,
    http2: bool,
}

/// The files a TLS client configuration was read from: the CA file and the client
/// certificate and key.
type TlsKey = (Option<PathBuf>, Option<(PathBuf, PathBuf)>);

impl Clients {
    /// Clients with these connection settings.
    pub fn new(connect_timeout: Duration, max_idle: usize) -> Self {
        Self {
            connect_timeout,
            max_idle,
            made: Vec::new(),
        }
    }

    /// The client for `spec`.
    pub fn get(&mut self, spec: &UpstreamSpec) -> HttpClient {
        let key = ClientKey {
            tls: spec
                .tls
                .as_ref()
                .map(|t| (t.ca_file.clone(), t.client_cert.clone())),
            http2: spec.http2,
        };
        if let Some((_, client)) = self.made.iter().find(|(k, _)| *k == key) {
            return client.clone();
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(self.connect_timeout));
        http.set_nodelay(true);
        // The scheme is checked here, not by the TCP connector: `https` is this one's job.
        http.enforce_http(false);
        let connector = Connector {
            http,
            tls: spec
                .tls
                .as_ref()
                .map(|t| TlsConnector::from(Arc::clone(&t.config))),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(self.max_idle)
            .http2_only(spec.http2)
            .build(connector);
        self.made.push((key, client.clone()));
        client
    }
}

/// Connects to an upstream: TCP, then TLS for `https`.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Why a connection to the upstream could not be made. Nothing was sent in either case.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No TCP connection.
    #[error("cannot connect: {0}")]
    Tcp(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The TLS handshake failed: the upstream's certificate was not accepted, or it refused
    /// the gateway's.
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// The URL does not fit this connector (an `https` URL without TLS settings, a host
    /// that is not a valid server name).
    #[error("{0}")]
    Target(String),
}

impl tower::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, ConnectError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        tower::Service::<Uri>::poll_ready(&mut self.http, cx)
            .map_err(|e| ConnectError::Tcp(Box::new(e)))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = uri.host().map(|h| h.trim_matches(['[', ']']).to_owned());
        let connecting = tower::Service::<Uri>::call(&mut self.http, uri);
        Box::pin(async move {
            let tcp = connecting
                .await
                .map_err(|e| ConnectError::Tcp(Box::new(e)))?;
            match (https, tls) {
                (false, _) => Ok(UpstreamIo::Plain(tcp)),
                (true, None) => Err(ConnectError::Target(
                    "an https URL reached a client without TLS settings".into(),
                )),
                (true, Some(tls)) => {
                    let host = host.ok_or_else(|| ConnectError::Target("no host".into()))?;
                    let name = ServerName::try_from(host.clone()).map_err(|_| {
                        ConnectError::Target(format!("`{host}` is not a TLS server name"))
                    })?;
                    let stream = tls
                        .connect(name, tcp.into_inner())
                        .await
                        .map_err(ConnectError::Tls)?;
                    Ok(UpstreamIo::Tls(Box::new(TokioIo::new(stream))))
                }
            }
        })
    }
}

/// A connection to an upstream, plain or TLS.
#[derive(Debug)]
pub enum UpstreamIo {
    /// Plain TCP.
    Plain(TokioIo<TcpStream>),
    /// TLS over TCP (boxed: the session state is large and plain connections are common).
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(io) => io.connected(),
            Self::Tls(io) => {
                let (tcp, session) = io.inner().get_ref();
                let connected = tcp.connected();
                if session.alpn_protocol() == Some(b"h2") {
                    connected.negotiated_h2()
                } else {
                    connected
                }
            }
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(io) => Pin::new(&mut **io).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls(io) => Pin::new(&mut **io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(&mut **io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(&mut **io).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls(io) => Pin::new(&mut **io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls(io) => io.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> anyhow::Result<UpstreamSpec> {
        UpstreamSpec::compile(&RawUpstream::Url(text.to_owned()))
    }

    #[test]
    fn urls_are_checked() {
        assert!(!url("http://127.0.0.1:3000").expect("http").http2);
        let h2c = url("h2c://127.0.0.1:3000").expect("h2c");
        assert!(h2c.http2);
        assert_eq!(h2c.uri.scheme_str(), Some("http"));
        assert!(url("h2c://127.0.0.1").is_err(), "h2c needs a port");
        for bad in [
            "ftp://x",
            "http://",
            "http://a/?q=1",
            "http://u:p@a/",
            "not a url",
        ] {
            assert!(url(bad).is_err(), "{bad} must be refused");
        }
        let tls_on_http = RawUpstream::Table(RawUpstreamTable {
            url: "http://127.0.0.1:1".into(),
            ca_file: Some("ca.pem".into()),
            ..RawUpstreamTable::default()
        });
        assert!(UpstreamSpec::compile(&tls_on_http).is_err());
        let half_client_cert = RawUpstream::Table(RawUpstreamTable {
            url: "https://127.0.0.1:1".into(),
            client_cert_file: Some("c.pem".into()),
            ..RawUpstreamTable::default()
        });
        let err = UpstreamSpec::compile(&half_client_cert).expect_err("half a client cert");
        assert!(err.to_string().contains("go together"), "{err}");
        let missing_ca = RawUpstream::Table(RawUpstreamTable {
            url: "https://127.0.0.1:1".into(),
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..RawUpstreamTable::default()
        });
        let err = UpstreamSpec::compile(&missing_ca).expect_err("missing CA file");
        assert!(
            format!("{err:#}").contains("/nonexistent/ca.pem"),
            "{err:#}"
        );
    }
}

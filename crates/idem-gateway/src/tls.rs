//! A listener's certificate files, and the rustls server configuration read from them: at
//! start, on every reload, and when the configuration is checked.

use std::path::PathBuf;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A listener's certificate files. Read at start and on every reload, so a renewed
/// certificate is picked up without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
}

/// Reads a certificate chain and key into a server configuration offering HTTP/2 and
/// HTTP/1.1.
///
/// # Errors
/// A file that cannot be read, holds no certificate or key, or a key that does not fit.
pub(crate) fn server_config(files: &TlsFiles) -> anyhow::Result<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("cannot read certificates from {}", files.cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{} is not a PEM certificate chain", files.cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no certificate", files.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("cannot read a private key from {}", files.key.display()))?;
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "the key in {} does not fit the certificate in {}",
                files.key.display(),
                files.cert.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// [`server_config`] for `Some` files, `None` for plain TCP.
///
/// # Errors
/// See [`server_config`].
pub(crate) fn server_config_opt(
    files: Option<&TlsFiles>,
) -> anyhow::Result<Option<rustls::ServerConfig>> {
    files.map(server_config).transpose()
}

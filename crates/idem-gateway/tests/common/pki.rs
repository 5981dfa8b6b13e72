//! A private CA made in the test, with a server certificate for 127.0.0.1 and a client
//! certificate it signed, as PEM files.

use std::path::{Path, PathBuf};

use rustls::pki_types::CertificateDer;

/// The CA (in DER, to trust in a client) and the PEM files.
pub struct Pki {
    pub ca: CertificateDer<'static>,
    pub ca_file: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Makes a CA named after `name` and the certificates it signs, as files `name-*` in `dir`.
pub fn issue(dir: &Path, name: &str) -> Pki {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("idem test CA {name}"));
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let write = |file: &str, text: String| {
        let path = dir.join(format!("{name}-{file}"));
        std::fs::write(&path, text).expect("write pem");
        path
    };
    let server_key = rcgen::KeyPair::generate().expect("key");
    let server =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("params")
            .signed_by(&server_key, &issuer)
            .expect("server cert");
    let client_key = rcgen::KeyPair::generate().expect("key");
    let mut client_params =
        rcgen::CertificateParams::new(vec!["idem-gateway".to_owned()]).expect("params");
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client = client_params
        .signed_by(&client_key, &issuer)
        .expect("client cert");
    Pki {
        ca: ca.der().clone(),
        ca_file: write("ca.crt", ca.pem()),
        server_cert: write("server.crt", server.pem()),
        server_key: write("server.key", server_key.serialize_pem()),
        client_cert: write("client.crt", client.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
    }
}

//! A secured metrics endpoint's other side: a throwaway CA and a server
//! certificate for 127.0.0.1 (made with the openssl command), bcrypt
//! hashes, and an HTTPS client that trusts only that CA.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    sync::Arc,
};

use base64::Engine as _;
use rustls::{
    ClientConfig, ClientConnection, RootCertStore, StreamOwned,
    crypto::ring,
    pki_types::{CertificateDer, ServerName, pem::PemObject as _},
};

use super::*;

/// A CA and the server certificate it signed for 127.0.0.1, in a scratch
/// directory: `ca.pem`, `server.pem`, `server.key`.
pub struct Pki {
    pub dir: TempDir,
}

impl Pki {
    pub fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir.0)
                .output()
                .expect("running openssl (Debian's openssl package)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let p256 = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &p256,
                &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"],
                &["-subj", "/CN=stackprobe test CA"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &p256,
                &["-keyout", "server.key", "-out", "server.csr"],
                &["-subj", "/CN=127.0.0.1"],
            ]
            .concat(),
        );
        std::fs::write(
            dir.0.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
             extendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }
}

/// A bcrypt hash of `password`, as `htpasswd -nB` makes (at the lowest
/// cost: the agent under test is a debug build).
pub fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash(password, 4).unwrap()
}

/// An `Authorization` header line for `user` and `password`.
pub fn basic_auth(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Authorization: Basic {encoded}\r\n")
}

/// An HTTP/1.0 GET of `path` over TLS from `addr` (127.0.0.1:PORT), trusting
/// only `ca`, with `headers` (whole lines): the response's head and body.
pub fn https_get(addr: &str, path: &str, headers: &str, ca: &std::path::Path) -> (String, String) {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    // The agent's own provider (deprecated for want of post-quantum key
    // exchange: see the output crate's web_config.rs).
    #[allow(deprecated)]
    let provider = Arc::new(ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = addr.rsplit_once(':').unwrap().0.to_owned();
    let conn =
        ClientConnection::new(Arc::new(config), ServerName::try_from(host).unwrap()).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    write!(tls, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n").unwrap();
    let mut response = String::new();
    tls.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

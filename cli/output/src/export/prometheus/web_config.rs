//! `--web.config.file`: the web configuration file that Prometheus'
//! exporters share (exporter-toolkit's format), read once at startup. It
//! turns on TLS for the endpoint and basic authentication against bcrypt
//! hashes. Every mistake in it ends the start with the key at fault named:
//! an endpoint serving in the clear, or to anyone, because a key was
//! misspelt or ignored would be worse than no endpoint.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde::{Deserialize, de::IgnoredAny};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        Error, RootCertStore, ServerConfig, SupportedProtocolVersion,
        crypto::{CryptoProvider, ring},
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
        server::{WebPkiClientVerifier, danger::ClientCertVerifier},
        version::{TLS12, TLS13},
    },
};

use super::auth::Users;

/// The file as written. exporter-toolkit's keys that stackprobe does not
/// implement are read only to be refused by name: ignoring
/// `client_allowed_sans`, say, would let in clients the file keeps out.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    http_server_config: Option<IgnoredAny>,
    rate_limit: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<String>,
    max_version: Option<String>,
    cert: Option<IgnoredAny>,
    key: Option<IgnoredAny>,
    client_ca: Option<IgnoredAny>,
    cipher_suites: Option<IgnoredAny>,
    curve_preferences: Option<IgnoredAny>,
    prefer_server_cipher_suites: Option<IgnoredAny>,
    client_allowed_sans: Option<IgnoredAny>,
}

/// What the endpoint enforces: TLS, basic authentication, or both.
pub struct WebConfig {
    pub(super) tls: Option<TlsAcceptor>,
    pub(super) users: Option<Arc<Users>>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.as_ref().map(|u| u.count()))
            .finish()
    }
}

impl WebConfig {
    /// Reads `path`, and the certificates and key it names (relative paths
    /// from the file's directory, as exporter-toolkit does).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the web config file {}", path.display()))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("in the web config file {}", path.display()))
    }

    /// Whether the endpoint speaks only TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether a scrape must name a user and its password.
    pub fn basic_auth(&self) -> bool {
        self.users.is_some()
    }

    /// The file's `text`, its relative paths from `dir`.
    pub(super) fn parse(text: &str, dir: &Path) -> Result<Self> {
        // An empty file (or one of comments only) is a document of null:
        // exporter-toolkit takes it as neither TLS nor users, and so do we.
        let file: File = yaml_serde::from_str::<Option<File>>(text)
            .map_err(|e| anyhow!("{e}"))?
            .unwrap_or_default();
        refuse_unsupported(&[
            ("http_server_config", file.http_server_config.is_some()),
            ("rate_limit", file.rate_limit.is_some()),
        ])?;
        let tls = file
            .tls_server_config
            .map(|t| tls(t, dir).context("in tls_server_config"))
            .transpose()?;
        let users = match file.basic_auth_users {
            Some(users) if !users.is_empty() => {
                Some(Arc::new(Users::new(users).context("in basic_auth_users")?))
            }
            _ => None,
        };
        Ok(Self { tls, users })
    }
}

fn refuse_unsupported(keys: &[(&str, bool)]) -> Result<()> {
    match keys.iter().find(|(_, set)| *set) {
        Some((key, _)) => bail!(
            "`{key}` is not supported by stackprobe (it reads tls_server_config's cert_file, \
             key_file, client_auth_type, client_ca_file, min_version and max_version, and \
             basic_auth_users); remove it"
        ),
        None => Ok(()),
    }
}

/// The server's TLS settings, its certificate and key loaded.
fn tls(t: TlsFile, dir: &Path) -> Result<TlsAcceptor> {
    refuse_unsupported(&[
        ("cert", t.cert.is_some()),
        ("key", t.key.is_some()),
        ("client_ca", t.client_ca.is_some()),
        ("cipher_suites", t.cipher_suites.is_some()),
        ("curve_preferences", t.curve_preferences.is_some()),
        (
            "prefer_server_cipher_suites",
            t.prefer_server_cipher_suites.is_some(),
        ),
        ("client_allowed_sans", t.client_allowed_sans.is_some()),
    ])?;
    let cert_file = dir.join(t.cert_file.context("cert_file is missing")?);
    let key_file = dir.join(t.key_file.context("key_file is missing")?);
    let certs = certificates(&cert_file, "cert_file")?;
    let key = std::fs::read(&key_file)
        .with_context(|| format!("reading key_file {}", key_file.display()))
        .and_then(|pem| {
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                anyhow!(
                    "key_file {}: no private key in PEM ({e})",
                    key_file.display()
                )
            })
        })?;
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;
    let provider = provider();
    let verifier = client_verifier(
        t.client_auth_type.as_deref(),
        t.client_ca_file.map(|f| dir.join(f)),
        &provider,
    )?;
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .context("choosing the TLS versions")?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let (cert, key_path) = (cert_file.display(), key_file.display());
    let mut config = builder.with_single_cert(certs, key).map_err(|e| match e {
        Error::InconsistentKeys(_) => {
            anyhow!("key_file {key_path} is not the key of cert_file {cert}'s first certificate")
        }
        Error::InvalidCertificate(e) => anyhow!("cert_file {cert}: unreadable certificate ({e:?})"),
        e => anyhow!("cert_file {cert} with key_file {key_path}: {e}"),
    })?;
    // What the endpoint speaks; a client offering only h2 is refused at
    // the handshake rather than misread after it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// rustls' *ring* provider. rustls 0.23.48 deprecated it for want of
/// post-quantum key exchange (X25519MLKEM768, which only its aws-lc-rs
/// provider has), but aws-lc-rs builds C with cmake for every target, and
/// stackprobe is to cross-build for aarch64 and musl. What the exchange
/// protects here is a scrape and a basic-auth password, against a
/// recording decrypted by a future quantum computer; Debian 12's Prometheus
/// (Go 1.19) does not offer that exchange anyway.
#[allow(deprecated)]
pub(super) fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Every certificate in the PEM file `path` (a chain: the server's first).
fn certificates(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {key} {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{key} {}: bad PEM ({e})", path.display()))?;
    if certs.is_empty() {
        bail!("{key} {}: no CERTIFICATE in it", path.display());
    }
    Ok(certs)
}

/// The versions from `min` to `max` (TLS12 to TLS13 when unset).
fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static SupportedProtocolVersion>> {
    fn rank(key: &str, v: &str) -> Result<u8> {
        match v {
            "TLS12" => Ok(2),
            "TLS13" => Ok(3),
            "TLS10" | "TLS11" => {
                bail!("{key} {v} is not supported: stackprobe speaks TLS12 and TLS13")
            }
            _ => bail!("{key} `{v}` is not a TLS version (TLS12 or TLS13)"),
        }
    }
    let min = min.map_or(Ok(2), |v| rank("min_version", v))?;
    let max = max.map_or(Ok(3), |v| rank("max_version", v))?;
    let versions: Vec<_> = [(2, &TLS12), (3, &TLS13)]
        .into_iter()
        .filter(|(r, _)| (min..=max).contains(r))
        .map(|(_, v)| v)
        .collect();
    if versions.is_empty() {
        bail!("min_version is above max_version");
    }
    Ok(versions)
}

/// How clients prove who they are, if they must: Go's ClientAuthType names.
/// The two that accept a certificate nobody verified (RequestClientCert,
/// RequireAnyClientCert) are refused rather than half done.
fn client_verifier(
    kind: Option<&str>,
    ca_file: Option<PathBuf>,
    provider: &Arc<CryptoProvider>,
) -> Result<Option<Arc<dyn ClientCertVerifier>>> {
    let optional = match kind.unwrap_or("NoClientCert") {
        "" | "NoClientCert" => {
            if ca_file.is_some() {
                bail!(
                    "client_ca_file is set but client_auth_type is NoClientCert: set \
                     client_auth_type to RequireAndVerifyClientCert to check client certificates"
                );
            }
            return Ok(None);
        }
        "RequireAndVerifyClientCert" => false,
        "VerifyClientCertIfGiven" => true,
        k @ ("RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert") => bail!(
            "client_auth_type {k} is not supported (it accepts certificates nobody verified): \
             use RequireAndVerifyClientCert"
        ),
        k => bail!(
            "client_auth_type `{k}` is unknown (NoClientCert, RequireAndVerifyClientCert or \
             VerifyClientCertIfGiven)"
        ),
    };
    let ca_file = ca_file.with_context(|| {
        format!(
            "client_auth_type {} needs client_ca_file, the CA that signs the clients' certificates",
            kind.unwrap_or_default()
        )
    })?;
    let mut roots = RootCertStore::empty();
    for cert in certificates(&ca_file, "client_ca_file")? {
        roots
            .add(cert)
            .map_err(|e| anyhow!("client_ca_file {}: {e}", ca_file.display()))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    let builder = if optional {
        builder.allow_unauthenticated()
    } else {
        builder
    };
    let verifier = builder
        .build()
        .map_err(|e| anyhow!("client_ca_file {}: {e}", ca_file.display()))?;
    Ok(Some(verifier))
}

#[cfg(test)]
pub(super) mod tests {
    //! testdata/ holds a test CA, a server certificate it signed for
    //! 127.0.0.1 and localhost, a client certificate, their P-256 keys and
    //! one more key (other.key), all made with openssl, valid until 2126.

    use tokio_rustls::rustls::ProtocolVersion;

    use super::*;

    pub fn testdata() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export/prometheus/testdata")
    }

    /// `text` parsed from testdata/, the error as the user reads it.
    fn parse(text: &str) -> Result<WebConfig, String> {
        WebConfig::parse(text, &testdata()).map_err(|e| format!("{e:#}"))
    }

    fn fails(text: &str, wanted: &[&str]) {
        let e = parse(text).expect_err(text);
        for w in wanted {
            assert!(e.contains(w), "{w:?} not in {e:?}");
        }
    }

    /// A bcrypt hash of "secret" at the smallest cost (fast tests).
    pub fn hash() -> String {
        bcrypt::hash("secret", 4).unwrap()
    }

    const TLS: &str = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";

    #[test]
    fn a_full_file_turns_on_tls_and_users() {
        let text = format!(
            "{TLS}  min_version: TLS13\n  client_auth_type: RequireAndVerifyClientCert\n  \
             client_ca_file: ca.pem\nbasic_auth_users:\n  prometheus: {}\n  other: '{}'\n",
            hash(),
            hash()
        );
        let c = parse(&text).unwrap();
        assert!(c.tls() && c.basic_auth());
        assert_eq!(c.users.unwrap().count(), 2);
    }

    #[test]
    fn tls_alone_users_alone_and_nothing() {
        let c = parse(TLS).unwrap();
        assert!(c.tls() && !c.basic_auth());
        let c = parse(&format!("basic_auth_users:\n  u: {}\n", hash())).unwrap();
        assert!(!c.tls() && c.basic_auth());
        for empty in [
            "",
            "# nothing\n",
            "basic_auth_users: {}\n",
            "tls_server_config:\n",
        ] {
            let c = parse(empty).unwrap();
            assert!(!c.tls() && !c.basic_auth(), "{empty:?}");
        }
    }

    #[test]
    fn paths_are_relative_to_the_files_directory() {
        let dir =
            std::env::temp_dir().join(format!("stackprobe-web-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.yml");
        let data = testdata();
        std::fs::write(
            &path,
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                data.join("server.pem").display(),
                data.join("server.key").display()
            ),
        )
        .unwrap();
        assert!(WebConfig::load(&path).unwrap().tls(), "absolute paths");
        std::fs::write(&path, TLS).unwrap();
        let e = format!("{:#}", WebConfig::load(&path).unwrap_err());
        assert!(
            e.contains(&dir.join("server.pem").display().to_string()),
            "looked beside the file: {e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_or_malformed_file_is_an_error_naming_it() {
        let e = format!(
            "{:#}",
            WebConfig::load(Path::new("/nonexistent/web.yml")).unwrap_err()
        );
        assert!(
            e.contains("/nonexistent/web.yml") && e.contains("No such file"),
            "{e}"
        );
        fails("tls_server_config: [", &["line 1"]);
        fails("basic_auth_users: [a, b]\n", &["basic_auth_users"]);
    }

    #[test]
    fn unknown_and_unsupported_keys_are_named() {
        fails(
            "basic_auth_user:\n  u: x\n",
            &["unknown field `basic_auth_user`"],
        );
        fails(
            "tls_server_config:\n  cert_fil: server.pem\n",
            &["unknown field `cert_fil`"],
        );
        fails(
            "http_server_config:\n  http2: false\n",
            &["`http_server_config` is not supported"],
        );
        fails("rate_limit:\n  burst: 1\n", &["`rate_limit`"]);
        for key in [
            "cert: x",
            "key: x",
            "client_ca: x",
            "cipher_suites: [TLS_AES_128_GCM_SHA256]",
            "curve_preferences: [X25519]",
            "prefer_server_cipher_suites: true",
            "client_allowed_sans: [a]",
        ] {
            let name = key.split(':').next().unwrap();
            fails(
                &format!("{TLS}  {key}\n"),
                &["tls_server_config", &format!("`{name}` is not supported")],
            );
        }
    }

    #[test]
    fn bad_hashes_and_user_names_are_refused() {
        fails(
            "basic_auth_users:\n  u: plaintext\n",
            &["basic_auth_users", "user `u`", "bcrypt"],
        );
        fails(
            &format!("basic_auth_users:\n  'a:b': {}\n", hash()),
            &["user `a:b`", "':'"],
        );
        fails("basic_auth_users:\n  u:\n", &["basic_auth_users"]);
    }

    #[test]
    fn certificates_and_keys_must_load_and_match() {
        fails(
            "tls_server_config:\n  key_file: server.key\n",
            &["cert_file is missing"],
        );
        fails(
            "tls_server_config:\n  cert_file: server.pem\n",
            &["key_file is missing"],
        );
        fails(
            "tls_server_config:\n  cert_file: nope.pem\n  key_file: server.key\n",
            &["reading cert_file", "nope.pem"],
        );
        fails(
            "tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n",
            &["no CERTIFICATE"],
        );
        fails(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.pem\n",
            &["no private key"],
        );
        fails(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: other.key\n",
            &["other.key is not the key of cert_file", "server.pem"],
        );
        let bad =
            std::env::temp_dir().join(format!("stackprobe-bad-cert-{}.pem", std::process::id()));
        std::fs::write(
            &bad,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        fails(
            &format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: server.key\n",
                bad.display()
            ),
            &["unreadable certificate"],
        );
        std::fs::remove_file(&bad).unwrap();
    }

    #[test]
    fn versions_and_client_auth() {
        use ProtocolVersion::{TLSv1_2, TLSv1_3};
        let spoken = |min, max| -> Vec<ProtocolVersion> {
            versions(min, max)
                .unwrap()
                .iter()
                .map(|v| v.version)
                .collect()
        };
        assert_eq!(spoken(None, None), [TLSv1_2, TLSv1_3]);
        assert_eq!(spoken(Some("TLS13"), None), [TLSv1_3]);
        assert_eq!(spoken(None, Some("TLS12")), [TLSv1_2]);
        fails(
            &format!("{TLS}  min_version: TLS11\n"),
            &["min_version TLS11 is not supported"],
        );
        fails(
            &format!("{TLS}  min_version: tls13\n"),
            &["`tls13` is not a TLS version"],
        );
        fails(
            &format!("{TLS}  min_version: TLS13\n  max_version: TLS12\n"),
            &["above max_version"],
        );
        fails(
            &format!("{TLS}  client_auth_type: RequireAndVerifyClientCert\n"),
            &["needs client_ca_file"],
        );
        fails(
            &format!("{TLS}  client_ca_file: ca.pem\n"),
            &["client_auth_type is NoClientCert"],
        );
        fails(
            &format!("{TLS}  client_auth_type: RequireAnyClientCert\n  client_ca_file: ca.pem\n"),
            &["RequireAnyClientCert is not supported"],
        );
        fails(
            &format!("{TLS}  client_auth_type: Maybe\n"),
            &["`Maybe` is unknown"],
        );
        let optional =
            format!("{TLS}  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n");
        assert!(parse(&optional).unwrap().tls());
    }
}

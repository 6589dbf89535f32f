//! The HTTP endpoint: `GET /metrics` answered from the last published
//! snapshot, in the format the scraper asks for; over TLS and to known
//! users only when a web config says so.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use prometheus_client::registry::Registry;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use super::{auth::Users, encoder::Published, snapshot::Snapshot, web_config::WebConfig};

/// What Prometheus sends in `Accept` when it can take native histograms.
const PROTOBUF: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// Whether the request's `Accept` header asks for Prometheus' protobuf
/// format (Prometheus lists it first when native histograms are on).
fn wants_protobuf(request: &str) -> bool {
    request.lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("accept")
                && value.contains("application/vnd.google.protobuf")
                && value.contains("io.prometheus.client.MetricFamily")
        })
    })
}

/// The scrape's content type and body.
pub(super) fn body(registry: &Registry, protobuf: bool) -> (&'static str, Vec<u8>) {
    // Should protobuf fail to encode, text (which always does) serves the
    // scrape rather than an error.
    if protobuf
        && let Ok(bytes) = prometheus_client::encoding::prometheus_protobuf::encode_to_vec(registry)
    {
        return (PROTOBUF, bytes);
    }
    let mut text = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    (
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        text.into_bytes(),
    )
}

/// Reads a request's head into `buf` (it may come in several segments)
/// until its blank line, a full `buf`, the peer's end or a stalled peer;
/// returns how many bytes it read.
async fn read_head<S: AsyncRead + Unpin>(conn: &mut S, buf: &mut [u8]) -> usize {
    let mut n = 0;
    let read = async {
        while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(more) => n += more,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read).await;
    n
}

/// The response to `request`: the metrics for `GET /metrics`, else 404.
fn response(registry: &Registry, request: &str) -> Vec<u8> {
    if !request.starts_with("GET /metrics") {
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .to_vec();
    }
    let (kind, body) = body(registry, wants_protobuf(request));
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(&body);
    r
}

/// Answers one connection's request.
async fn serve(mut conn: TcpStream, registry: Arc<Registry>) {
    let mut buf = [0u8; 1024];
    let n = read_head(&mut conn, &mut buf).await;
    let request = String::from_utf8_lossy(&buf[..n]);
    let _ = conn.write_all(&response(&registry, &request)).await;
}

const UNAUTHORIZED: &[u8] = b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic\r\n\
Content-Type: text/plain; charset=utf-8\r\nContent-Length: 13\r\nConnection: close\r\n\r\n\
Unauthorized\n";

/// What Go's servers answer plain HTTP on a TLS port: the scraper then says
/// why rather than a bare EOF.
const PLAIN_ON_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// How long a client may take over its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// Answers one connection's request as the web config asks: over TLS, and
/// only to a user with its password.
async fn serve_guarded(conn: TcpStream, registry: Arc<Registry>, web: Arc<WebConfig>) {
    let users = web.users.as_deref();
    match &web.tls {
        None => {
            let mut conn = conn;
            answer_guarded(&mut conn, &registry, users).await;
        }
        Some(acceptor) => {
            let Some(mut conn) = handshake(acceptor, conn).await else {
                return;
            };
            answer_guarded(&mut conn, &registry, users).await;
            // close_notify, so that the client knows the body is whole.
            let _ = conn.shutdown().await;
        }
    }
}

/// The TLS session, or None when the client spoke anything else, went
/// quiet or failed the handshake.
async fn handshake(acceptor: &TlsAcceptor, mut conn: TcpStream) -> Option<TlsStream<TcpStream>> {
    let shake = async move {
        // A TLS client opens with a handshake record (type 22).
        let mut first = [0u8; 1];
        match conn.peek(&mut first).await {
            Ok(1) if first[0] != 0x16 => {
                // Its head read first: closing on unread bytes would reset
                // the connection and lose the answer.
                let mut buf = [0u8; 1024];
                read_head(&mut conn, &mut buf).await;
                let _ = conn.write_all(PLAIN_ON_TLS).await;
                None
            }
            Ok(1) => acceptor.accept(conn).await.ok(),
            _ => None,
        }
    };
    tokio::time::timeout(HANDSHAKE, shake).await.ok().flatten()
}

async fn answer_guarded<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut S,
    registry: &Registry,
    users: Option<&Users>,
) {
    // Room for an Authorization header beside Prometheus' long Accept.
    let mut buf = [0u8; 4096];
    let n = read_head(conn, &mut buf).await;
    let request = String::from_utf8_lossy(&buf[..n]);
    let allowed = match users {
        Some(users) => users.allow(&request).await,
        None => true,
    };
    let reply = if allowed {
        response(registry, &request)
    } else {
        UNAUTHORIZED.to_vec()
    };
    let _ = conn.write_all(&reply).await;
}

/// The endpoint: publish a snapshot each interval; it serves the last one.
pub struct Endpoint {
    snapshot: Arc<Mutex<Snapshot>>,
    pub addr: SocketAddr,
}

impl Endpoint {
    /// Binds `addr` and serves `GET /metrics` from a task on the current
    /// runtime; as `web` says when there is one.
    pub async fn start(addr: SocketAddr, web: Option<WebConfig>) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} for metrics"))?;
        let addr = listener.local_addr()?;
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(snapshot.clone())));
        let registry = Arc::new(registry);
        match web {
            None => tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve(conn, registry.clone()));
                }
            }),
            Some(web) => {
                let web = Arc::new(web);
                tokio::spawn(async move {
                    while let Ok((conn, _)) = listener.accept().await {
                        tokio::spawn(serve_guarded(conn, registry.clone(), web.clone()));
                    }
                })
            }
        };
        Ok(Self { snapshot, addr })
    }

    pub fn publish(&self, snapshot: Snapshot) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use stackprobe_model::{
        event::HistMetric,
        fixtures::{kernel_hist, live},
        process::ProcessTable,
    };

    use super::*;
    use crate::export::prometheus::{
        buckets::NATIVE_SCHEMA,
        tests::registry,
        web_config::{
            provider,
            tests::{hash, testdata},
        },
    };
    use stackprobe_model::frame::OwnCost;

    #[test]
    fn a_protobuf_scrape_carries_native_histograms_and_the_text_one_classic_buckets() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "nginx")]);
        t.apply(&kernel_hist(
            1,
            "nginx",
            HistMetric::Accept,
            &[10_000, 10_000, 20_000],
        ));
        let registry = registry(&t);
        let families = prometheus_client::encoding::prometheus_protobuf::encode(&registry).unwrap();
        let latency = families
            .iter()
            .find(|f| f.name == "stackprobe_latency_seconds")
            .unwrap();
        let h = latency.metric[0].histogram.as_ref().unwrap();
        assert_eq!((h.sample_count, h.schema), (3, NATIVE_SCHEMA));
        let counts: i64 = h
            .positive_delta
            .iter()
            .scan(0, |c, d| {
                *c += d;
                Some(*c)
            })
            .sum();
        assert_eq!(counts, 3, "{h:?}");
        assert!(
            !h.bucket.is_empty(),
            "classic buckets beside the native ones"
        );
        let (kind, body) = body(&registry, false);
        assert!(kind.starts_with("application/openmetrics-text"));
        assert!(
            String::from_utf8(body)
                .unwrap()
                .contains("stackprobe_latency_seconds_bucket")
        );
        assert_eq!(body_kind(&registry, true), PROTOBUF);
        assert!(wants_protobuf(
            "GET /metrics HTTP/1.1\r\nAccept: application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,*/*;q=0.1\r\n"
        ));
        assert!(!wants_protobuf(
            "GET /metrics HTTP/1.1\r\nAccept: text/plain\r\n"
        ));
    }

    fn body_kind(registry: &Registry, protobuf: bool) -> &'static str {
        body(registry, protobuf).0
    }

    #[test]
    fn a_request_in_several_segments_is_served() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap(), None)
                .await
                .unwrap();
            let mut conn = TcpStream::connect(endpoint.addr).await.unwrap();
            conn.set_nodelay(true).unwrap();
            // As an unbuffered `write!` sends it: the server must not
            // answer the first piece alone.
            for piece in ["GET ", "/metrics", " HTTP/1.0\r\n", "\r\n"] {
                conn.write_all(piece.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut response = String::new();
            conn.read_to_string(&mut response).await.unwrap();
            assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        });
    }

    /// An endpoint serving an accept histogram, guarded by the web config
    /// `yaml` (paths in testdata/), with user `u` of password `secret`.
    async fn guarded(yaml: &str) -> Endpoint {
        let users = format!("basic_auth_users:\n  u: {}\n", hash());
        let web = WebConfig::parse(&format!("{yaml}{users}"), &testdata()).unwrap();
        let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap(), Some(web))
            .await
            .unwrap();
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "nginx")]);
        t.apply(&kernel_hist(1, "nginx", HistMetric::Accept, &[10_000]));
        let report = stackprobe_model::fixtures::interval_report(&t);
        endpoint.publish(Snapshot::take(&t, &report, OwnCost::default()));
        endpoint
    }

    fn get(authorization: &str) -> String {
        format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{authorization}\r\n")
    }

    const RIGHT: &str = "Authorization: Basic dTpzZWNyZXQ=\r\n";
    const WRONG: &str = "Authorization: Basic dTpzZWNyZXU=\r\n";
    const METRIC: &str = "stackprobe_latency_seconds";

    async fn plain(addr: SocketAddr, request: &str) -> String {
        let mut conn = TcpStream::connect(addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        // A reset (the TLS port dropping a stranger) reads as the end.
        let _ = conn.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response).into_owned()
    }

    /// The response over TLS (testdata's CA trusted, with the client
    /// certificate if `client_cert`), or the handshake's error.
    async fn tls(addr: SocketAddr, request: &str, client_cert: bool) -> Result<String, String> {
        use tokio_rustls::{
            TlsConnector,
            rustls::{
                ClientConfig, RootCertStore,
                pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _},
            },
        };
        let pem = |name: &str| std::fs::read(testdata().join(name)).unwrap();
        let certs = |name: &str| -> Vec<CertificateDer<'static>> {
            CertificateDer::pem_slice_iter(&pem(name))
                .collect::<Result<_, _>>()
                .unwrap()
        };
        let mut roots = RootCertStore::empty();
        roots.add(certs("ca.pem").remove(0)).unwrap();
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if client_cert {
            let key = PrivateKeyDer::from_pem_slice(&pem("client.key")).unwrap();
            builder
                .with_client_auth_cert(certs("client.pem"), key)
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        let tcp = TcpStream::connect(addr).await.unwrap();
        let server = ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = TlsConnector::from(Arc::new(config))
            .connect(server, tcp)
            .await
            .map_err(|e| e.to_string())?;
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        // TLS 1.3 checks the client's certificate after the handshake
        // returned: its refusal comes with the first read.
        conn.read_to_string(&mut response)
            .await
            .map_err(|e| e.to_string())?;
        Ok(response)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn basic_auth_lets_in_only_a_user_with_its_password() {
        runtime().block_on(async {
            let endpoint = guarded("").await;
            for refused in [
                get(""),
                get(WRONG),
                "GET /other HTTP/1.1\r\n\r\n".to_owned(),
            ] {
                let r = plain(endpoint.addr, &refused).await;
                assert!(r.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{r}");
                assert!(r.contains("\r\nWWW-Authenticate: Basic\r\n"), "{r}");
                assert!(!r.contains(METRIC), "{r}");
            }
            let r = plain(endpoint.addr, &get(RIGHT)).await;
            assert!(
                r.starts_with("HTTP/1.1 200 OK") && r.contains(METRIC),
                "{r}"
            );
        });
    }

    #[test]
    fn a_tls_endpoint_serves_only_tls() {
        runtime().block_on(async {
            let endpoint =
                guarded("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n")
                    .await;
            let r = tls(endpoint.addr, &get(RIGHT), false).await.unwrap();
            assert!(
                r.starts_with("HTTP/1.1 200 OK") && r.contains(METRIC),
                "{r}"
            );
            let r = tls(endpoint.addr, &get(WRONG), false).await.unwrap();
            assert!(r.starts_with("HTTP/1.1 401 Unauthorized"), "{r}");
            let r = plain(endpoint.addr, &get(RIGHT)).await;
            assert!(r.starts_with("HTTP/1.0 400 Bad Request"), "{r}");
            assert!(r.contains("HTTPS server") && !r.contains(METRIC), "{r}");
            // A client that says nothing is let go.
            let mut quiet = TcpStream::connect(endpoint.addr).await.unwrap();
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(HANDSHAKE * 2, quiet.read(&mut byte)).await;
            assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
        });
    }

    #[test]
    fn a_client_certificate_is_required_and_verified_when_asked() {
        runtime().block_on(async {
            let endpoint = guarded(
                "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
                 client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n",
            )
            .await;
            let r = tls(endpoint.addr, &get(RIGHT), true).await.unwrap();
            assert!(
                r.starts_with("HTTP/1.1 200 OK") && r.contains(METRIC),
                "{r}"
            );
            let refused = tls(endpoint.addr, &get(RIGHT), false).await;
            assert!(refused.is_err(), "{refused:?}");
        });
    }
}

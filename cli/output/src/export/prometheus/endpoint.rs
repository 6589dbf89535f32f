//! The HTTP endpoint: `GET /metrics` answered from the last published
//! snapshot, in the format the scraper asks for.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use prometheus_client::registry::Registry;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

use super::{encoder::Published, snapshot::Snapshot};

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
async fn read_head(conn: &mut TcpStream, buf: &mut [u8]) -> usize {
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

/// The endpoint: publish a snapshot each interval; it serves the last one.
pub struct Endpoint {
    snapshot: Arc<Mutex<Snapshot>>,
    pub addr: SocketAddr,
}

impl Endpoint {
    /// Binds `addr` and serves `GET /metrics` from a task on the current
    /// runtime.
    pub async fn start(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening on {addr} for metrics"))?;
        let addr = listener.local_addr()?;
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(snapshot.clone())));
        let registry = Arc::new(registry);
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, registry.clone()));
            }
        });
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
    use crate::export::prometheus::{buckets::NATIVE_SCHEMA, tests::registry};

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
            let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap())
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
}

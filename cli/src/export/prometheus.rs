//! `watch --listen ADDR`: a Prometheus / OpenMetrics endpoint. Histograms per
//! role and metric (never one series per short-lived pid) with power-of-two
//! latency buckets, and gauges and counters for processes, TIME_WAIT and
//! drops. The collector publishes a snapshot each interval; scrapes read it.

use std::{
    fmt,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{MetricType, gauge::ConstGauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

use crate::model::{
    containers,
    process::{ProcessTable, Span},
    report::Report,
};

/// A role's labels: the role, and the container it runs in (empty on the
/// host): one series per (container, role), as the views count them.
fn role_labels(role: &str) -> [(&'static str, &str); 2] {
    let (role, container) = containers::split_role(role);
    [("role", role), ("container", container.unwrap_or(""))]
}

/// Bucket upper bounds: 2^k − 1 ns for k = 10..=36 (1 µs .. 69 s), so that
/// "≤ le" is exact for HdrHistogram's counts.
const BUCKET_EXPONENTS: std::ops::RangeInclusive<u32> = 10..=36;

#[derive(Clone, Debug, Default)]
struct HistogramSample {
    role: String,
    metric: &'static str,
    count: u64,
    sum_seconds: f64,
    /// (le in seconds, count in this bucket alone): the encoder accumulates.
    buckets: Vec<(f64, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    histograms: Vec<HistogramSample>,
    processes: Vec<(String, u64)>,
    time_wait: Vec<(String, u64)>,
    walk_age_s: f64,
    drops: u64,
    lost: [(&'static str, u64); 4],
    skipped: [(&'static str, u64); 6],
}

impl Snapshot {
    /// Everything since the start, per role.
    pub fn take(table: &ProcessTable, report: &Report) -> Self {
        let mut histograms = Vec::new();
        for (role, (_, activity)) in table.roles(Span::Whole) {
            for (metric, m) in activity.metrics() {
                let total = &m.total;
                if total.is_empty() {
                    continue;
                }
                let mut below = 0;
                let mut buckets: Vec<(f64, u64)> = BUCKET_EXPONENTS
                    .map(|k| {
                        let le_ns = (1u64 << k) - 1;
                        let at_most = total.count_at_most(le_ns);
                        let in_bucket = at_most - below;
                        below = at_most;
                        (le_ns as f64 / 1e9, in_bucket)
                    })
                    .collect();
                buckets.push((f64::INFINITY, total.count() - below));
                histograms.push(HistogramSample {
                    role: role.clone(),
                    metric,
                    count: total.count(),
                    sum_seconds: total.sum_ns() as f64 / 1e9,
                    buckets,
                });
            }
        }
        let mut time_wait: std::collections::BTreeMap<String, u64> = Default::default();
        for l in &report.tcp.links {
            *time_wait
                .entry(l.owner.clone().unwrap_or_else(|| "unknown".into()))
                .or_default() += l.time_wait;
        }
        Self {
            histograms,
            processes: report
                .roles
                .iter()
                .map(|r| (r.role.clone(), r.processes as u64))
                .collect(),
            time_wait: time_wait.into_iter().collect(),
            walk_age_s: report.tcp.walk_age_ms as f64 / 1e3,
            drops: report.drops,
            lost: report.drops_by_cause.lost.by_kind(),
            skipped: report.drops_by_cause.skipped.by_kind(),
        }
    }
}

#[derive(Debug, Default)]
struct Published(Arc<Mutex<Snapshot>>);

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut family = encoder.encode_descriptor(
            "stackprobe_latency_seconds",
            "Latency per role and metric (accept, accept_queue, fork, thread, child_lifetime) since stackprobe started",
            None,
            MetricType::Histogram,
        )?;
        for h in &s.histograms {
            let [role, container] = role_labels(&h.role);
            let labels = [role, container, ("metric", h.metric)];
            family
                .encode_family(&labels)?
                .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    h.sum_seconds,
                    h.count,
                    &h.buckets,
                    None,
                )?;
        }
        let mut processes = encoder.encode_descriptor(
            "stackprobe_processes",
            "Live watched processes per role",
            None,
            MetricType::Gauge,
        )?;
        for (role, n) in &s.processes {
            ConstGauge::new(*n as i64).encode(processes.encode_family(&role_labels(role))?)?;
        }
        let mut tw = encoder.encode_descriptor(
            "stackprobe_time_wait_sockets",
            "TIME_WAIT sockets now, by the role that closed first (unknown when not seen)",
            None,
            MetricType::Gauge,
        )?;
        for (role, n) in &s.time_wait {
            ConstGauge::new(*n as i64).encode(tw.encode_family(&role_labels(role))?)?;
        }
        let age = encoder.encode_descriptor(
            "stackprobe_time_wait_age_seconds",
            "How old the walk of the sockets behind stackprobe_time_wait_sockets is (walks are spaced out when sockets are many)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.walk_age_s).encode(age)?;
        let drops = encoder.encode_descriptor(
            "stackprobe_dropped_events",
            "Events the probes could not deliver since the start",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.drops as i64).encode(drops)?;
        let mut lost = encoder.encode_descriptor(
            "stackprobe_ring_full_events",
            "Events the full ring buffer could not take since the start, by kind (accept and fork samples never cross it)",
            None,
            MetricType::Gauge,
        )?;
        for (kind, n) in s.lost {
            ConstGauge::new(n as i64).encode(lost.encode_family(&[("kind", kind)])?)?;
        }
        let mut skipped = encoder.encode_descriptor(
            "stackprobe_skipped_runs",
            "Probe runs the kernel skipped because a BPF program was already running on that CPU, by the kind of event lost",
            None,
            MetricType::Gauge,
        )?;
        for (kind, n) in s.skipped {
            ConstGauge::new(n as i64).encode(skipped.encode_family(&[("kind", kind)])?)?;
        }
        Ok(())
    }
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
            while let Ok((mut conn, _)) = listener.accept().await {
                let registry = registry.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]);
                    let response = if request.starts_with("GET /metrics") {
                        let mut body = String::new();
                        let _ = prometheus_client::encoding::text::encode(&mut body, &registry);
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    } else {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_string()
                    };
                    let _ = conn.write_all(response.as_bytes()).await;
                });
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

    use super::*;
    use crate::model::{
        event::HistMetric, fixtures::kernel_hist, probe_stats::Drops, process::LiveProcess,
        report::ReportKind,
    };

    #[test]
    fn buckets_are_cumulative_and_exact() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[LiveProcess {
            pid: 1,
            name: "nginx".into(),
            title: None,
            parent: None,
            container: None,
            ns_pid: None,
        }]);
        let samples = [1_023, 1_024, 5_000, 2_000_000];
        t.apply(&kernel_hist(1, "nginx", HistMetric::Accept, &samples));
        let report = Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        let s = Snapshot::take(&t, &report);
        let h = &s.histograms[0];
        assert_eq!((h.role.as_str(), h.metric, h.count), ("nginx", "accept", 4));
        assert!((h.sum_seconds - 2_007_047e-9).abs() < 1e-12);
        // Per bucket: ≤ 1023 ns holds the first sample, (1023, 2047] the
        // second, (4095, 8191] the 5 µs one, (2^20-1, 2^21-1] the 2 ms one:
        // neither the kernel's buckets nor HdrHistogram's straddle a power of two.
        assert_eq!(h.buckets[0], (1023e-9, 1));
        assert_eq!(h.buckets[1], (2047e-9, 1));
        assert_eq!(h.buckets[3], (8191e-9, 1));
        assert_eq!(h.buckets[11], (2_097_151e-9, 1));
        assert_eq!(h.buckets.iter().map(|b| b.1).sum::<u64>(), 4);
        assert_eq!(h.buckets.last().unwrap(), &(f64::INFINITY, 0));
    }
}

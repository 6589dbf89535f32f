//! `watch --listen ADDR` and `agent`: a Prometheus / OpenMetrics endpoint.
//! Histograms per role and metric (never one series per short-lived pid),
//! each both a native histogram (sparse exponential buckets about 1 % wide,
//! as fine as stackprobe's own) and classic power-of-two buckets for
//! servers without native histograms, and gauges for processes, TIME_WAIT
//! and drops. OpenMetrics text by default; Prometheus' protobuf format, the
//! one that carries native histograms, when the scraper asks for it. The
//! collector publishes a snapshot each interval; scrapes read it.

use std::{
    fmt,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeMetric, MetricEncoder, NativeHistogram, NativeHistogramBuckets,
    },
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

use stackprobe_model::measure::{COUNTS, Count, LATENCIES, Per};
use stackprobe_model::{
    containers,
    frame::OwnCost,
    process::{Metric, ProcessTable, Span},
    report::{self, Report},
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

/// The native histograms' schema: bucket bounds grow by 2^(2^-6) ≈ 1.011,
/// so a bucket is about 1 % wide (stackprobe's own: 1/128).
pub const NATIVE_SCHEMA: i32 = 6;

#[derive(Clone, Debug, Default)]
struct HistogramSample {
    role: String,
    metric: &'static str,
    /// The listening socket, for accept metrics; the destination, for
    /// connects; "" for the others.
    path: String,
    count: u64,
    sum_seconds: f64,
    /// (le in seconds, count in this bucket alone): the encoder accumulates.
    buckets: Vec<(f64, u64)>,
    native: NativeBuckets,
}

impl HistogramSample {
    /// `metric`'s histogram since the start, None while it is empty.
    fn of(role: &str, metric: &'static str, path: &str, m: &Metric) -> Option<Self> {
        let total = &m.total;
        if total.is_empty() {
            return None;
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
        // Each of the HdrHistogram's buckets at the value its percentiles
        // report.
        let native = native_buckets(total.hdr().into_iter().flat_map(|h| {
            h.iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
        }));
        Some(Self {
            role: role.to_string(),
            metric,
            path: path.to_string(),
            count: total.count(),
            sum_seconds: total.sum_ns() as f64 / 1e9,
            buckets,
            native,
        })
    }
}

/// A native histogram's positive buckets as Prometheus encodes them: spans
/// of consecutive bucket indexes (offset from the end of the previous span,
/// length) and each bucket's count as a delta from the previous one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NativeBuckets {
    pub spans: Vec<(i32, u32)>,
    pub deltas: Vec<i64>,
}

/// The bucket of a value of `seconds` in schema [`NATIVE_SCHEMA`]: index i
/// holds (2^((i-1)/64), 2^(i/64)].
fn native_index(seconds: f64) -> i32 {
    (seconds.log2() * f64::from(1u32 << NATIVE_SCHEMA)).ceil() as i32
}

/// Native buckets from (value in ns, samples) pairs, any order.
pub fn native_buckets(values: impl IntoIterator<Item = (u64, u64)>) -> NativeBuckets {
    let mut counts: std::collections::BTreeMap<i32, u64> = Default::default();
    for (ns, n) in values {
        if n > 0 {
            *counts
                .entry(native_index(ns.max(1) as f64 / 1e9))
                .or_default() += n;
        }
    }
    let mut out = NativeBuckets::default();
    let (mut next, mut last) = (None::<i32>, 0u64);
    for (i, n) in counts {
        match (next, out.spans.last_mut()) {
            (Some(at), Some(span)) if at == i => span.1 += 1,
            (Some(at), _) => out.spans.push((i - at, 1)),
            (None, _) => out.spans.push((i, 1)),
        }
        out.deltas.push(n as i64 - last as i64);
        (next, last) = (Some(i + 1), n);
    }
    out
}

/// A link's labels: its owner's role and container, its side and where
/// its connections go (never the client's address, so the series stay as
/// few as the services).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct LinkLabels {
    role: String,
    side: &'static str,
    endpoint: String,
}

impl LinkLabels {
    fn encode(&self) -> [(&'static str, &str); 4] {
        let [role, container] = role_labels(&self.role);
        [
            role,
            container,
            ("side", self.side),
            ("link", &self.endpoint),
        ]
    }
}

/// A link's numbers, summed over the links with the same labels.
#[derive(Clone, Copy, Debug, Default)]
struct LinkNumbers {
    time_wait: u64,
    opens: u64,
    closes: u64,
    aborts: u64,
    new_time_wait: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    histograms: Vec<HistogramSample>,
    /// Connect latency per role and destination.
    connects: Vec<HistogramSample>,
    /// (role, destination, refused, failed) since the start.
    connect_failures: Vec<(String, String, u64, u64)>,
    /// (role, count, total since the start), those above 0.
    counts: Vec<(String, Count, u64)>,
    processes: Vec<(String, u64)>,
    links: Vec<(LinkLabels, LinkNumbers)>,
    walk_age_s: f64,
    drops: u64,
    lost: Vec<(&'static str, u64)>,
    skipped: [(&'static str, u64); 7],
    cost: OwnCost,
    /// Per program: runs and run time in seconds, with `--probe-cost`.
    programs: Vec<(String, u64, f64)>,
}

impl Snapshot {
    /// Everything since the start, per role, and stackprobe's own cost.
    pub fn take(table: &ProcessTable, report: &Report, cost: OwnCost) -> Self {
        let mut histograms = Vec::new();
        let mut connects = Vec::new();
        let mut connect_failures = Vec::new();
        let mut counts = Vec::new();
        for (role, (_, activity)) in table.roles(Span::Whole) {
            for (c, n) in activity.counts.iter() {
                if n.total > 0 {
                    counts.push((role.clone(), c, n.total));
                }
            }
            for (destination, c) in &activity.connects {
                connects.extend(HistogramSample::of(
                    &role,
                    "connect",
                    destination,
                    &c.latency,
                ));
                if c.refused.total + c.failed.total > 0 {
                    connect_failures.push((
                        role.clone(),
                        destination.clone(),
                        c.refused.total,
                        c.failed.total,
                    ));
                }
            }
            for (l, m) in activity.latency.iter() {
                let metric = l.name();
                match l.decl().per {
                    Per::Process => histograms.extend(HistogramSample::of(&role, metric, "", m)),
                    // Per listener: together they are the role's.
                    Per::Listener => {
                        for (listener, a) in &activity.listeners {
                            histograms.extend(HistogramSample::of(
                                &role,
                                metric,
                                listener,
                                &a.latency[l],
                            ));
                        }
                    }
                    // A family of its own, per destination.
                    Per::Destination => {}
                }
            }
        }
        let mut links: std::collections::BTreeMap<LinkLabels, LinkNumbers> = Default::default();
        for l in &report.tcp.links {
            let labels = LinkLabels {
                role: l.owner.clone().unwrap_or_else(|| "unknown".into()),
                side: l.side,
                endpoint: l.endpoint.clone(),
            };
            let n = links.entry(labels).or_default();
            n.time_wait += l.time_wait;
            n.opens += l.opens.total;
            n.closes += l.closes.total;
            n.aborts += l.aborts.total;
            n.new_time_wait += l.new_time_wait.total;
        }
        Self {
            histograms,
            connects,
            connect_failures,
            counts,
            processes: report
                .roles
                .iter()
                .map(|r| (r.role.clone(), r.processes as u64))
                .collect(),
            links: links.into_iter().collect(),
            walk_age_s: report.tcp.walk_age_ms as f64 / 1e3,
            drops: report.drops,
            lost: report
                .drops_by_cause
                .ring_lost()
                .map(|(c, n)| (c.name, n))
                .collect(),
            skipped: report.drops_by_cause.skipped.by_kind(),
            cost,
            programs: report
                .probe_cost
                .iter()
                .map(|p| (p.program.clone(), p.runs, p.run_time_ns as f64 / 1e9))
                .collect(),
        }
    }
}

#[derive(Debug, Default)]
struct Published(Arc<Mutex<Snapshot>>);

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let latencies: Vec<&str> = LATENCIES
            .iter()
            .filter(|(_, d)| d.per != Per::Destination)
            .map(|(_, d)| d.name)
            .collect();
        let help = format!(
            "Latency per role and metric ({}) since stackprobe started",
            latencies.join(", ")
        );
        let mut family = encoder.encode_descriptor(
            "stackprobe_latency_seconds",
            &help,
            None,
            MetricType::Histogram,
        )?;
        for h in &s.histograms {
            let [role, container] = role_labels(&h.role);
            let labels = [
                role,
                container,
                ("metric", h.metric),
                ("listener", h.path.as_str()),
            ];
            encode_histogram(&mut family, &labels, h)?;
        }
        let mut family = encoder.encode_descriptor(
            "stackprobe_connect_latency_seconds",
            "Successful connects per role and destination since stackprobe started: TCP, from the SYN to ESTABLISHED; unix sockets, the connect() call",
            None,
            MetricType::Histogram,
        )?;
        for h in &s.connects {
            let [role, container] = role_labels(&h.role);
            let labels = [
                role,
                container,
                ("destination", h.path.as_str()),
                ("path", report::path_kind(&h.path)),
            ];
            encode_histogram(&mut family, &labels, h)?;
        }
        let mut failures = encoder.encode_descriptor(
            "stackprobe_connect_failures",
            "Connects per role and destination that did not succeed since the start, by reason: refused (ECONNREFUSED) or failed (anything else)",
            None,
            MetricType::Counter,
        )?;
        for (role, destination, refused, failed) in &s.connect_failures {
            let [role, container] = role_labels(role);
            for (reason, n) in [("refused", refused), ("failed", failed)] {
                let labels = [
                    role,
                    container,
                    ("destination", destination.as_str()),
                    ("reason", reason),
                ];
                ConstCounter::new(*n).encode(failures.encode_family(&labels)?)?;
            }
        }
        let help = COUNTS.iter().fold(
            "Counts per role and metric since stackprobe started:".to_string(),
            |help, (_, d)| format!("{help} {} ({})", d.name, d.help.trim_end_matches('.')),
        );
        let mut family =
            encoder.encode_descriptor("stackprobe_events", &help, None, MetricType::Counter)?;
        for (role, count, n) in &s.counts {
            let [role, container] = role_labels(role);
            let labels = [role, container, ("metric", count.name())];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
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
        let tw = encoder.encode_descriptor(
            "stackprobe_time_wait_sockets",
            "TIME_WAIT sockets now per link, by the role that closed first (unknown when not seen)",
            None,
            MetricType::Gauge,
        )?;
        per_link(tw, &s.links, |n| n.time_wait, ConstGauge::new)?;
        let age = encoder.encode_descriptor(
            "stackprobe_time_wait_age_seconds",
            "How old the walk of the sockets behind stackprobe_time_wait_sockets is (walks are spaced out when sockets are many)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.walk_age_s).encode(age)?;
        for (name, help, field) in LINK_COUNTERS {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            per_link(family, &s.links, field, ConstCounter::new)?;
        }
        let drops = encoder.encode_descriptor(
            "stackprobe_dropped_events",
            "Events the probes could not deliver since the start",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.drops).encode(drops)?;
        let mut lost = encoder.encode_descriptor(
            "stackprobe_ring_full_events",
            "Events the full ring buffer could not take since the start, by kind (accept and fork samples never cross it)",
            None,
            MetricType::Counter,
        )?;
        for &(kind, n) in &s.lost {
            ConstCounter::new(n).encode(lost.encode_family(&[("kind", kind)])?)?;
        }
        let mut skipped = encoder.encode_descriptor(
            "stackprobe_skipped_runs",
            "Probe runs the kernel skipped because a BPF program was already running on that CPU, by the kind of event lost",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in s.skipped {
            ConstCounter::new(n).encode(skipped.encode_family(&[("kind", kind)])?)?;
        }
        let cpu = encoder.encode_descriptor(
            "stackprobe_cpu_seconds",
            "stackprobe's own CPU time, user and system, since it started",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.cost.cpu_seconds).encode(cpu)?;
        let rss = encoder.encode_descriptor(
            "stackprobe_resident_memory_bytes",
            "stackprobe's own resident memory",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(s.cost.resident_bytes as i64).encode(rss)?;
        if !s.programs.is_empty() {
            let mut runs = encoder.encode_descriptor(
                "stackprobe_bpf_runs",
                "Runs of each of stackprobe's kernel programs (with --probe-cost)",
                None,
                MetricType::Counter,
            )?;
            for (program, n, _) in &s.programs {
                ConstCounter::new(*n)
                    .encode(runs.encode_family(&[("program", program.as_str())])?)?;
            }
            let mut time = encoder.encode_descriptor(
                "stackprobe_bpf_run_seconds",
                "Time the kernel spent running each of stackprobe's programs (with --probe-cost)",
                None,
                MetricType::Counter,
            )?;
            for (program, _, seconds) in &s.programs {
                ConstCounter::new(*seconds)
                    .encode(time.encode_family(&[("program", program.as_str())])?)?;
            }
        }
        Ok(())
    }
}

/// One histogram sample, classic buckets and native ones, under `labels`.
fn encode_histogram(
    family: &mut MetricEncoder,
    labels: &[(&str, &str); 4],
    h: &HistogramSample,
) -> Result<(), fmt::Error> {
    let native = NativeHistogram {
        schema: NATIVE_SCHEMA,
        zero_threshold: 0.0,
        zero_count: 0,
        negative: NativeHistogramBuckets {
            spans: &[],
            deltas: &[],
        },
        positive: NativeHistogramBuckets {
            spans: &h.native.spans,
            deltas: &h.native.deltas,
        },
        created: None,
    };
    family
        .encode_family(labels)?
        .encode_histogram_with_native::<prometheus_client::encoding::NoLabelSet>(
            h.sum_seconds,
            h.count,
            &h.buckets,
            None,
            native,
        )
}

/// The link counters: name, help and the number each serves.
type LinkField = fn(&LinkNumbers) -> u64;
const LINK_COUNTERS: [(&str, &str, LinkField); 4] = [
    (
        "stackprobe_connections_opened",
        "Connections opened per link since the start (connected, or established at a listener)",
        |n| n.opens,
    ),
    (
        "stackprobe_connections_closed",
        "Connections closed per link since the start",
        |n| n.closes,
    ),
    (
        "stackprobe_connections_aborted",
        "Connections per link that ended without the FIN handshake (reset, refused) since the start",
        |n| n.aborts,
    ),
    (
        "stackprobe_time_wait_entered",
        "Sockets per link that went into TIME_WAIT since the start, by the role that closed first",
        |n| n.new_time_wait,
    ),
];

/// One sample per link of `field`'s value, as the metric `make` builds.
fn per_link<M: EncodeMetric>(
    mut family: MetricEncoder,
    links: &[(LinkLabels, LinkNumbers)],
    field: LinkField,
    make: impl Fn(u64) -> M,
) -> Result<(), fmt::Error> {
    for (labels, n) in links {
        make(field(n)).encode(family.encode_family(&labels.encode())?)?;
    }
    Ok(())
}

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
fn body(registry: &Registry, protobuf: bool) -> (&'static str, Vec<u8>) {
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
async fn read_head(conn: &mut tokio::net::TcpStream, buf: &mut [u8]) -> usize {
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
                    let n = read_head(&mut conn, &mut buf).await;
                    let request = String::from_utf8_lossy(&buf[..n]);
                    let response = if request.starts_with("GET /metrics") {
                        let (kind, body) = body(&registry, wants_protobuf(&request));
                        let mut r = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        r.extend_from_slice(&body);
                        r
                    } else {
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_vec()
                    };
                    let _ = conn.write_all(&response).await;
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
    use stackprobe_model::{
        event::HistMetric,
        fixtures::{self, kernel_hist, kernel_hist_from, live},
    };

    #[test]
    fn buckets_are_cumulative_and_exact() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "nginx")]);
        let samples = [1_023, 1_024, 5_000, 2_000_000];
        t.apply(&kernel_hist(1, "nginx", HistMetric::Accept, &samples));
        let report = fixtures::interval_report(&t);
        let s = Snapshot::take(&t, &report, OwnCost::default());
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

    #[test]
    fn native_buckets_are_spans_of_consecutive_indexes_and_count_deltas() {
        // 1 s is the top of bucket 0 ((2^-1/64, 1] s); 1.01 s lies in bucket
        // 1 (up to 2^(1/64) ≈ 1.0109 s), 1.1 s in bucket 9.
        let b = native_buckets([
            (1_100_000_000, 1),
            (1_000_000_000, 3),
            (1_010_000_000, 2),
            (5, 0),
        ]);
        assert_eq!(b.spans, [(0, 2), (7, 1)]);
        assert_eq!(b.deltas, [3, -1, -1]);
        assert_eq!(native_buckets([]), NativeBuckets::default());
        // A bucket is about 1 % wide: 1000 ns and 1010 ns fall apart.
        let b = native_buckets([(1_000, 1), (1_011, 1)]);
        assert_eq!(b.spans.iter().map(|s| s.1).sum::<u32>(), 2);
    }

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
        let report = fixtures::interval_report(&t);
        let snapshot = Arc::new(Mutex::new(Snapshot::take(&t, &report, OwnCost::default())));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(snapshot)));
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

    #[test]
    fn connects_are_per_destination_with_their_path_and_failures_by_reason() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "php")]);
        let from = |metric, path, ns: &[u64]| kernel_hist_from(1, "php", metric, Some(path), ns);
        t.apply(&from(
            HistMetric::Connect,
            "127.0.0.1:5432",
            &[15_000, 16_000],
        ));
        t.apply(&from(HistMetric::ConnectRefused, "127.0.0.1:5432", &[0]));
        t.apply(&from(HistMetric::Connect, "/run/pg.sock", &[5_000]));
        t.apply(&from(HistMetric::ConnectFailed, "/run/gone.sock", &[0, 0]));
        let report = fixtures::interval_report(&t);
        let snapshot = Arc::new(Mutex::new(Snapshot::take(&t, &report, OwnCost::default())));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(snapshot)));
        let text = String::from_utf8(body(&registry, false).1).unwrap();
        for line in [
            r#"stackprobe_connect_latency_seconds_count{role="php",container="",destination="127.0.0.1:5432",path="tcp"} 2"#,
            r#"stackprobe_connect_latency_seconds_count{role="php",container="",destination="/run/pg.sock",path="unix"} 1"#,
            r#"stackprobe_connect_failures_total{role="php",container="",destination="127.0.0.1:5432",reason="refused"} 1"#,
            r#"stackprobe_connect_failures_total{role="php",container="",destination="/run/gone.sock",reason="failed"} 2"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        // Connects are not also in the per-metric latency family.
        assert!(!text.contains(r#"metric="connect""#), "{text}");
    }

    #[test]
    fn each_declared_count_is_a_counter_by_metric_with_its_help() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&kernel_hist(1, "srv", HistMetric::AcceptUntimed, &[0, 0]));
        t.apply(&kernel_hist(1, "srv", HistMetric::ForkFailed, &[0]));
        let report = fixtures::interval_report(&t);
        let snapshot = Arc::new(Mutex::new(Snapshot::take(&t, &report, OwnCost::default())));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(snapshot)));
        let text = String::from_utf8(body(&registry, false).1).unwrap();
        for line in [
            r#"stackprobe_events_total{role="srv",container="",metric="accept_untimed"} 2"#,
            r#"stackprobe_events_total{role="srv",container="",metric="fork_failed"} 1"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        // Counts not seen have no series; every count is in the help.
        assert!(!text.contains(r#"metric="execs""#), "{text}");
        for (_, d) in COUNTS {
            assert!(
                text.contains(&format!(" {} (", d.name)),
                "{} not in the help",
                d.name
            );
        }
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
            let mut conn = tokio::net::TcpStream::connect(endpoint.addr).await.unwrap();
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

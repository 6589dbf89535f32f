//! The snapshot as metric families: their names, labels and help, in the
//! order a scrape lists them.

use std::{
    fmt,
    sync::{Arc, Mutex},
};

use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NativeHistogram,
        NativeHistogramBuckets,
    },
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use stackprobe_model::{
    containers,
    measure::{COUNTS, LATENCIES, Latency, Per},
    report,
};

use super::{
    buckets::NATIVE_SCHEMA,
    snapshot::{HistogramSample, LinkLabels, LinkNumbers, Snapshot},
};

/// The snapshot the endpoint last published, encoded at each scrape.
#[derive(Debug, Default)]
pub(super) struct Published(pub Arc<Mutex<Snapshot>>);

impl Collector for Published {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        latencies(&mut encoder, &s)?;
        connects(&mut encoder, &s)?;
        listener_lost(&mut encoder, &s)?;
        counts(&mut encoder, &s)?;
        processes(&mut encoder, &s)?;
        busy(&mut encoder, &s)?;
        hop_own(&mut encoder, &s)?;
        links(&mut encoder, &s)?;
        drops(&mut encoder, &s)?;
        own_cost(&mut encoder, &s)
    }
}

/// A role's labels: the role, and the container it runs in (empty on the
/// host): one series per (container, role), as the views count them.
fn role_labels(role: &str) -> [(&'static str, &str); 2] {
    let (role, container) = containers::split_role(role);
    [("role", role), ("container", container.unwrap_or(""))]
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

/// Each declared latency but connects, per role (and listener).
fn latencies(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
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
    Ok(())
}

/// Connect latency per role and destination, and the connects that failed.
fn connects(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "stackprobe_connect_latency_seconds",
        "Successful connects per role and destination since stackprobe started: TCP, from the SYN to ESTABLISHED; unix sockets, the connect() call",
        None,
        MetricType::Histogram,
    )?;
    let connect = Latency::Connect.name();
    for h in s.connects.iter().filter(|h| h.metric == connect) {
        let [role, container] = role_labels(&h.role);
        let labels = [
            role,
            container,
            ("destination", h.path.as_str()),
            ("path", report::path_kind(&h.path)),
        ];
        encode_histogram(&mut family, &labels, h)?;
    }
    drop(family);
    let mut family = encoder.encode_descriptor(
        "stackprobe_destination_latency_seconds",
        "The other latencies kept per role and destination since stackprobe started, by metric: held, how long each TCP connection the role opened stayed open (its SYN to its first FIN or a reset)",
        None,
        MetricType::Histogram,
    )?;
    for h in s.connects.iter().filter(|h| h.metric != connect) {
        let [role, container] = role_labels(&h.role);
        let labels = [
            role,
            container,
            ("metric", h.metric),
            ("destination", h.path.as_str()),
            ("path", report::path_kind(&h.path)),
        ];
        encode_histogram(&mut family, &labels, h)?;
    }
    let mut failures = encoder.encode_descriptor(
        "stackprobe_connect_failures",
        "Connects per role and destination that did not succeed since the start, by reason: refused (ECONNREFUSED), lost (a unix listener's full queue, EAGAIN) or failed (anything else)",
        None,
        MetricType::Counter,
    )?;
    for (role, destination, [refused, failed, lost]) in &s.connect_failures {
        let [role, container] = role_labels(role);
        for (reason, n) in [("refused", refused), ("failed", failed), ("lost", lost)] {
            let labels = [
                role,
                container,
                ("destination", destination.as_str()),
                ("reason", reason),
            ];
            ConstCounter::new(*n).encode(failures.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Connections lost at each listener's full queue.
fn listener_lost(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "stackprobe_listener_lost",
        "Connections lost at a listener's full queue since stackprobe started, per role and listener: a unix socket's connects refused with EAGAIN (from any process), a TCP listener's connections the kernel dropped at it (its sk_drops: a full accept or SYN queue; as of the last walk of the sockets)",
        None,
        MetricType::Counter,
    )?;
    for (role, listener, n) in &s.listener_lost {
        let [role, container] = role_labels(role);
        let labels = [role, container, ("listener", listener.as_str())];
        ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Each declared count per role, one family by metric, with their help.
fn counts(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
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
    Ok(())
}

fn processes(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
    let mut processes = encoder.encode_descriptor(
        "stackprobe_processes",
        "Live watched processes per role",
        None,
        MetricType::Gauge,
    )?;
    for (role, n) in &s.processes {
        ConstGauge::new(*n as i64).encode(processes.encode_family(&role_labels(role))?)?;
    }
    Ok(())
}

/// The connections each role's server held over the last interval (mean
/// and most at once), and its configured limit.
fn busy(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
    let mut mean = encoder.encode_descriptor(
        "stackprobe_busy_connections_mean",
        "Connections the role's server held on average over the last interval: its busy workers, for servers whose workers serve one connection at a time",
        None,
        MetricType::Gauge,
    )?;
    for b in &s.busy {
        ConstGauge::new(b.mean).encode(mean.encode_family(&role_labels(&b.role))?)?;
    }
    let mut max = encoder.encode_descriptor(
        "stackprobe_busy_connections_max",
        "The most connections the role's server held at once in the last interval",
        None,
        MetricType::Gauge,
    )?;
    for b in &s.busy {
        ConstGauge::new(b.max as i64).encode(max.encode_family(&role_labels(&b.role))?)?;
    }
    let mut limit = encoder.encode_descriptor(
        "stackprobe_busy_connections_limit",
        "The most connections the role's server may hold, from its configuration (pm.max_children, max_connections, worker_connections × worker_processes)",
        None,
        MetricType::Gauge,
    )?;
    for b in &s.busy {
        if let Some((setting, value)) = b.limit {
            let [role, container] = role_labels(&b.role);
            let labels = [role, container, ("setting", setting)];
            ConstGauge::new(i64::from(value)).encode(limit.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// Each hop's own time on its chain, where a request opens one connection
/// per hop.
fn hop_own(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "stackprobe_hop_own_seconds",
        "A hop's own time over the last interval on a chain of watched roles (chain: its first role): its mean service time less the next hop's mean connect, queue wait and service time; the last hop's mean service time. Only where each request opens one connection to the next hop (no keepalive or pooling)",
        None,
        MetricType::Gauge,
    )?;
    for (role, root, seconds) in &s.hop_own {
        let [role, container] = role_labels(role);
        let labels = [role, container, ("chain", containers::bare_role(root))];
        ConstGauge::new(*seconds).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// TIME_WAIT per link, how old its count is, and the link counters.
fn links(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
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
    Ok(())
}

/// What the probes could not deliver, in all and by kind.
fn drops(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
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
    Ok(())
}

/// stackprobe's CPU and memory, and its programs' runs with --probe-cost.
fn own_cost(encoder: &mut DescriptorEncoder, s: &Snapshot) -> Result<(), fmt::Error> {
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
    if s.programs.is_empty() {
        return Ok(());
    }
    let mut runs = encoder.encode_descriptor(
        "stackprobe_bpf_runs",
        "Runs of each of stackprobe's kernel programs (with --probe-cost)",
        None,
        MetricType::Counter,
    )?;
    for (program, n, _) in &s.programs {
        ConstCounter::new(*n).encode(runs.encode_family(&[("program", program.as_str())])?)?;
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
    Ok(())
}

/// One histogram sample, classic buckets and native ones, under `labels`.
fn encode_histogram(
    family: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
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

#[cfg(test)]
mod tests {
    use stackprobe_model::{
        event::HistMetric,
        fixtures::{kernel_hist, kernel_hist_from, live},
        process::ProcessTable,
    };

    use super::*;
    use crate::export::prometheus::{endpoint::body, tests::registry};

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
        let text = String::from_utf8(body(&registry(&t), false).1).unwrap();
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
    fn connections_lost_at_a_listener_are_a_counter_per_listener() {
        use stackprobe_model::{
            fixtures::interval_report,
            frame::OwnCost,
            report::{CountRow, ListenerLatencyRow},
        };

        use crate::export::prometheus::Snapshot;

        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "php-fpm")]);
        t.apply(&kernel_hist(1, "php-fpm", HistMetric::AcceptUntimed, &[0]));
        let mut report = interval_report(&t);
        let mut lost = ListenerLatencyRow::unaccepted("/run/php/www.sock".into());
        lost.lost = Some(CountRow {
            count: 3,
            total: 12,
        });
        let unknown = ListenerLatencyRow::unaccepted("127.0.0.1:9000".into());
        report.roles[0].listeners.extend([lost, unknown]);
        let snapshot = Snapshot::take(&t, &report, OwnCost::default());
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Published(Arc::new(Mutex::new(snapshot)))));
        let text = String::from_utf8(body(&registry, false).1).unwrap();
        let role = &report.roles[0].role;
        for line in [
            "# TYPE stackprobe_listener_lost counter".to_string(),
            "# HELP stackprobe_listener_lost Connections lost at a listener's full queue since stackprobe started".to_string(),
            format!(
                r#"stackprobe_listener_lost_total{{role="{role}",container="",listener="/run/php/www.sock"}} 12"#
            ),
        ] {
            assert!(text.contains(&line), "no {line} in:\n{text}");
        }
        // A listener whose count is not known has no series.
        assert!(!text.contains(r#"listener="127.0.0.1:9000""#), "{text}");
    }

    #[test]
    fn a_roles_busy_connections_are_gauges_with_its_limit() {
        use stackprobe_model::{
            busy::{BusyRow, LimitRow},
            fixtures::interval_report,
            frame::OwnCost,
        };

        use crate::export::prometheus::Snapshot;

        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "php-fpm")]);
        t.apply(&kernel_hist(1, "php-fpm", HistMetric::Accept, &[1_000]));
        let mut report = interval_report(&t);
        report.roles[0].busy = Some(BusyRow {
            mean: 1.5,
            max: 2,
            now: 1,
            processes: 2,
            limit: Some(LimitRow {
                setting: "pm.max_children",
                value: 2,
                source: "/etc/php/8.2/fpm/pool.d/www.conf".into(),
            }),
        });
        let snapshot = Snapshot::take(&t, &report, OwnCost::default());
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Published(Arc::new(Mutex::new(snapshot)))));
        let text = String::from_utf8(body(&registry, false).1).unwrap();
        let role = &report.roles[0].role;
        for line in [
            format!(r#"stackprobe_busy_connections_mean{{role="{role}",container=""}} 1.5"#),
            format!(r#"stackprobe_busy_connections_max{{role="{role}",container=""}} 2"#),
            format!(
                r#"stackprobe_busy_connections_limit{{role="{role}",container="",setting="pm.max_children"}} 2"#
            ),
        ] {
            assert!(text.contains(&line), "no {line} in:\n{text}");
        }
    }

    #[test]
    fn each_hop_with_an_own_time_is_a_gauge_on_its_chain() {
        use stackprobe_model::fixtures::{self, PathHop, request_path, three_hop_path};

        let mut t = ProcessTable::default();
        t.sync_watched(&[live(11, "nginx"), live(12, "php-fpm"), live(13, "postgres")]);
        // php-fpm keeps persistent connections: neither it nor postgres
        // has an own time.
        let hops: [PathHop<'_>; 3] = three_hop_path(100, 5);
        request_path(&mut t, &hops);
        let text = String::from_utf8(body(&registry(&t), false).1).unwrap();
        for line in [
            "# TYPE stackprobe_hop_own_seconds gauge",
            r#"stackprobe_hop_own_seconds{role="nginx",container="",chain="nginx"} 0.00796"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        assert!(
            !text.contains(r#"stackprobe_hop_own_seconds{role="php-fpm""#),
            "{text}"
        );
        assert!(
            !text.contains(r#"stackprobe_hop_own_seconds{role="postgres""#),
            "{text}"
        );
        // One connection per request: every hop.
        let mut t = ProcessTable::default();
        fixtures::three_hops(&mut t, 100);
        let text = String::from_utf8(body(&registry(&t), false).1).unwrap();
        assert!(
            text.contains(
                r#"stackprobe_hop_own_seconds{role="postgres",container="",chain="nginx"} 0.05"#
            ),
            "{text}"
        );
    }

    #[test]
    fn the_run_queue_probes_latencies_and_preemptions_are_per_role() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "php-fpm")]);
        t.apply(&kernel_hist(
            1,
            "php-fpm",
            HistMetric::RunQueue,
            &[3_000; 4],
        ));
        t.apply(&kernel_hist(
            1,
            "php-fpm",
            HistMetric::OnCpu,
            &[2_000_000; 5],
        ));
        t.apply(&kernel_hist(1, "php-fpm", HistMetric::Preempted, &[0; 3]));
        let text = String::from_utf8(body(&registry(&t), false).1).unwrap();
        for line in [
            r#"stackprobe_latency_seconds_count{role="php-fpm",container="",metric="run_queue",listener=""} 4"#,
            // The slices' sum: the role's CPU time, which rate() makes
            // cores.
            r#"stackprobe_latency_seconds_sum{role="php-fpm",container="",metric="on_cpu",listener=""} 0.01"#,
            r#"stackprobe_events_total{role="php-fpm",container="",metric="preempted"} 3"#,
        ] {
            assert!(text.contains(line), "no {line} in:\n{text}");
        }
        assert!(
            text.contains("Latency per role and metric (accept, accept_queue, service, fork, thread, child_lifetime, run_queue, on_cpu)"),
            "{text}"
        );
    }

    #[test]
    fn each_declared_count_is_a_counter_by_metric_with_its_help() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&kernel_hist(1, "srv", HistMetric::AcceptUntimed, &[0, 0]));
        t.apply(&kernel_hist(1, "srv", HistMetric::ForkFailed, &[0]));
        let text = String::from_utf8(body(&registry(&t), false).1).unwrap();
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
}

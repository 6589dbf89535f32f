//! Test fixtures: model states built from what the probes would hand over —
//! ring buffer events, and reads of the kernel's latency histograms — and
//! the reports the collector would build of them.

use std::time::Duration;

use probes_common::hist::{HistKey, HistValue};

use super::{
    event::{Event, ExitSample, HistMetric, SpawnSample, TaskKind},
    process::{LiveProcess, ProcessTable},
};
use crate::{
    insights,
    kernel_hist::HistReads,
    probe_stats::Drops,
    report::{Report, ReportKind},
};

/// A live process with no parent known.
pub fn live(pid: u32, name: &str) -> LiveProcess {
    LiveProcess {
        pid,
        name: name.into(),
        title: None,
        parent: None,
        container: None,
        ns_pid: None,
    }
}

/// What the first read of process `tgid`'s (named `comm`) histogram of
/// `metric` hands over once the kernel has recorded `samples` in it: the
/// kernel's bucketing and userspace's reading, as in a run.
pub fn kernel_hist(tgid: u32, comm: &str, metric: HistMetric, samples: &[u64]) -> Event {
    kernel_hist_from(tgid, comm, metric, None, samples)
}

/// [`kernel_hist`], of accepts from the listener named `listener`.
pub fn kernel_hist_from(
    tgid: u32,
    comm: &str,
    metric: HistMetric,
    listener: Option<&str>,
    samples: &[u64],
) -> Event {
    let mut cpu = HistValue::ZERO;
    for &ns in samples {
        cpu.record(ns);
    }
    let key = HistKey {
        tgid,
        metric: metric as u32,
        path: 0,
    };
    let mut delta = HistReads::default()
        .read(key, [&cpu], false, || Some(comm.into()))
        .expect("a histogram with samples gained them");
    delta.path = listener.map(str::to_string);
    Event::Hist(delta)
}

/// `parent` (named `comm`) accepts `latencies.len()` connections and forks a
/// child (pids from 100) for each, each fork taking `fork_ns`; the first
/// `exits` children exit `lifetime_ns` after their birth at time 0. The
/// accepts and forks arrive as the kernel's histograms are read: once, after
/// the children's births.
pub fn fork_per_connection(
    t: &mut ProcessTable,
    parent: u32,
    comm: &str,
    latencies: &[u64],
    fork_ns: u64,
    exits: usize,
    lifetime_ns: u64,
) {
    for i in 0..latencies.len() {
        t.apply(&Event::Spawn(SpawnSample {
            parent_tgid: parent,
            child: 100 + i as u32,
            kind: TaskKind::Process,
            ts_ns: 0,
            comm: comm.into(),
        }));
    }
    if !latencies.is_empty() {
        let forks = vec![fork_ns; latencies.len()];
        t.apply(&kernel_hist(parent, comm, HistMetric::Accept, latencies));
        t.apply(&kernel_hist(parent, comm, HistMetric::Fork, &forks));
    }
    for i in 0..exits.min(latencies.len()) {
        t.apply(&Event::Exit(ExitSample {
            tgid: 100 + i as u32,
            ts_ns: lifetime_ns,
        }));
    }
}

/// The report the collector builds of `table` after its first second: the
/// last interval, one second long, nothing dropped, no insights.
pub fn interval_report(table: &ProcessTable) -> Report {
    report(table).build()
}

/// A report of `table` that differs from [`interval_report`]'s in what a
/// test sets: `report(&t).at(3).drops(d).build()`.
pub fn report(table: &ProcessTable) -> ReportFixture<'_> {
    ReportFixture {
        table,
        kind: ReportKind::Interval,
        elapsed_s: 1,
        drops: Drops::default(),
        insights: false,
    }
}

/// What [`report`] builds: a report of a one-second interval, or the
/// summary.
pub struct ReportFixture<'a> {
    table: &'a ProcessTable,
    kind: ReportKind,
    elapsed_s: u64,
    drops: Drops,
    insights: bool,
}

impl ReportFixture<'_> {
    /// Everything since the start, not the last interval.
    pub fn summary(self) -> Self {
        Self {
            kind: ReportKind::Summary,
            ..self
        }
    }

    /// `elapsed_s` seconds after the start.
    pub fn at(self, elapsed_s: u64) -> Self {
        Self { elapsed_s, ..self }
    }

    /// With what the probes dropped.
    pub fn drops(self, drops: Drops) -> Self {
        Self { drops, ..self }
    }

    /// With its insights, as the collector annotates each report.
    pub fn with_insights(self) -> Self {
        Self {
            insights: true,
            ..self
        }
    }

    pub fn build(self) -> Report {
        let mut report = Report::build(
            self.kind,
            self.table,
            Duration::from_secs(1),
            Duration::from_secs(self.elapsed_s),
            self.drops,
        );
        if self.insights {
            insights::annotate(&mut report);
        }
        report
    }
}

/// One hop of [`request_path`]: process `pid` (named `name`, watched by the
/// caller) accepting `accepts` connections on `listener`, each waiting
/// `queue_ns` in its queue and held `service_ns`; and connecting
/// `connects` times, each in `connect_ns`, to `next` (the next hop's
/// listener), if any.
pub struct PathHop<'a> {
    pub pid: u32,
    pub name: &'a str,
    pub listener: &'a str,
    pub accepts: usize,
    pub queue_ns: u64,
    pub service_ns: u64,
    pub next: Option<&'a str>,
    pub connects: usize,
    pub connect_ns: u64,
}

/// Each hop's accepts, queue waits, service times and connects onward, as
/// one read of the kernel's histograms: every sample of a kind alike, so
/// each mean is the value given.
pub fn request_path(t: &mut ProcessTable, hops: &[PathHop<'_>]) {
    for h in hops {
        let from = |metric, path, n: usize, ns: u64| {
            kernel_hist_from(h.pid, h.name, metric, Some(path), &vec![ns; n])
        };
        for (metric, ns) in [
            (HistMetric::Accept, 4_000),
            (HistMetric::AcceptQueue, h.queue_ns),
            (HistMetric::Service, h.service_ns),
        ] {
            if h.accepts > 0 {
                t.apply(&from(metric, h.listener, h.accepts, ns));
            }
        }
        if let Some(next) = h.next
            && h.connects > 0
        {
            t.apply(&from(HistMetric::Connect, next, h.connects, h.connect_ns));
        }
    }
}

/// nginx (pid 11) → php-fpm (12, on a unix socket) → postgres (13, on
/// TCP), `n` requests each opening one connection to the next hop; means:
/// nginx holds each connection 100 ms and connects to php-fpm in 40 µs;
/// php-fpm's connections wait 12 ms in its queue and are held 80 ms, and
/// it connects to postgres in 15 µs; postgres's wait 1 ms and are held
/// 50 ms. Own times: postgres 50 ms, php-fpm 80 − (0.015 + 1 + 50) =
/// 28.985 ms, nginx 100 − (0.04 + 12 + 80) = 7.96 ms. Watches the three
/// processes.
pub fn three_hops(t: &mut ProcessTable, n: usize) {
    t.sync_watched(&[live(11, "nginx"), live(12, "php-fpm"), live(13, "postgres")]);
    request_path(t, &three_hop_path(n, n));
}

/// [`three_hops`]' hops, php-fpm connecting `to_postgres` times.
pub fn three_hop_path(n: usize, to_postgres: usize) -> [PathHop<'static>; 3] {
    [
        PathHop {
            pid: 11,
            name: "nginx",
            listener: "0.0.0.0:80",
            accepts: n,
            queue_ns: 30_000,
            service_ns: 100_000_000,
            next: Some("/run/php/php-fpm.sock"),
            connects: n,
            connect_ns: 40_000,
        },
        PathHop {
            pid: 12,
            name: "php-fpm",
            listener: "/run/php/php-fpm.sock",
            accepts: n,
            queue_ns: 12_000_000,
            service_ns: 80_000_000,
            next: Some("127.0.0.1:5432"),
            connects: to_postgres,
            connect_ns: 15_000,
        },
        PathHop {
            pid: 13,
            name: "postgres",
            listener: "127.0.0.1:5432",
            accepts: to_postgres,
            queue_ns: 1_000_000,
            service_ns: 50_000_000,
            next: None,
            connects: 0,
            connect_ns: 0,
        },
    ]
}

//! What one interval (or the whole run) measured, ready for any view to
//! render: text, JSON, later the dashboard.

use std::time::Duration;

use serde::Serialize;

use super::{
    histogram::{LatencyHistogram, Log2Bucket, Summary},
    process::ProcessTable,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    /// The last interval.
    Interval,
    /// Everything since stackprobe started.
    Summary,
}

/// Events the probes could not deliver, by cause, since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Drops {
    /// Lost because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Accepts not timed because another watched thread's accept shared their slot.
    pub accept_slot_shared: u64,
    /// Processes not watched because their pid lies beyond the watch set.
    pub watch_out_of_range: u64,
}

impl Drops {
    pub fn total(&self) -> u64 {
        self.ringbuf_full + self.accept_slot_shared + self.watch_out_of_range
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub kind: ReportKind,
    /// Seconds since stackprobe attached its probes.
    pub elapsed_s: f64,
    /// Seconds this report covers.
    pub period_s: f64,
    /// Processes in the watch set now.
    pub watched: usize,
    /// All drops since the start (see `drops_by_cause`).
    pub drops: u64,
    pub drops_by_cause: Drops,
    pub processes: Vec<ProcessRow>,
    /// Per-program BPF run-time statistics, with `--probe-cost` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub probe_cost: Vec<ProgramCost>,
}

/// Cumulative cost of one kernel program since it was loaded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProgramCost {
    pub program: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

impl ProgramCost {
    pub fn ns_per_run(&self) -> f64 {
        if self.runs == 0 {
            0.0
        } else {
            self.run_time_ns as f64 / self.runs as f64
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    pub process: String,
    pub pid: u32,
    pub metric: &'static str,
    /// Accepts per second over the period.
    pub rate_per_s: f64,
    /// Accepts since the start.
    pub total: u64,
    /// The period's distribution; `count` is the period's accepts.
    #[serde(flatten)]
    pub latency: Summary,
    pub log2_buckets: Vec<Log2Bucket>,
}

pub const ACCEPT_METRIC: &str = "accept_latency";

impl Report {
    /// Every process that has accepted anything so far gets a row, so a
    /// server that went quiet shows 0 rather than vanishing.
    pub fn build(
        kind: ReportKind,
        table: &ProcessTable,
        period: Duration,
        elapsed: Duration,
        drops: Drops,
    ) -> Self {
        let mut processes: Vec<ProcessRow> = table
            .iter()
            .filter(|p| !p.accept.total.is_empty())
            .map(|p| {
                let hist: &LatencyHistogram = match kind {
                    ReportKind::Interval => &p.accept.interval,
                    ReportKind::Summary => &p.accept.total,
                };
                ProcessRow {
                    process: p.name.clone(),
                    pid: p.pid,
                    metric: ACCEPT_METRIC,
                    rate_per_s: rate(hist.count(), period),
                    total: p.accept.total.count(),
                    latency: hist.summary(),
                    log2_buckets: hist.log2_buckets(),
                }
            })
            .collect();
        processes.sort_by(|a, b| b.total.cmp(&a.total).then(a.pid.cmp(&b.pid)));
        Self {
            kind,
            elapsed_s: elapsed.as_secs_f64(),
            period_s: period.as_secs_f64(),
            watched: table.watched_count(),
            drops: drops.total(),
            drops_by_cause: drops,
            processes,
            probe_cost: Vec::new(),
        }
    }
}

fn rate(count: u64, period: Duration) -> f64 {
    let secs = period.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::process::AcceptSample;

    fn table() -> ProcessTable {
        let mut t = ProcessTable::default();
        t.sync_watched(&[(1, "idle".into()), (2, "busy".into()), (3, "quiet".into())]);
        for ns in [1000, 2000, 3000, 4000] {
            t.record_accept(&AcceptSample {
                tgid: 2,
                tid: 2,
                comm: "busy".into(),
                conn_fd: 5,
                latency_ns: ns,
            });
        }
        t.record_accept(&AcceptSample {
            tgid: 3,
            tid: 3,
            comm: "quiet".into(),
            conn_fd: 5,
            latency_ns: 7,
        });
        t
    }

    #[test]
    fn interval_rows_rates_and_drops() {
        let mut t = table();
        t.reset_interval();
        t.record_accept(&AcceptSample {
            tgid: 2,
            tid: 2,
            comm: "busy".into(),
            conn_fd: 5,
            latency_ns: 500,
        });
        let drops = Drops {
            ringbuf_full: 2,
            accept_slot_shared: 1,
            watch_out_of_range: 0,
        };
        let r = Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_millis(500),
            Duration::from_secs(3),
            drops,
        );
        assert_eq!(r.watched, 3);
        assert_eq!(r.drops, 3);
        // The idle process never accepted: no row. The quiet one shows 0 this interval.
        let rows: Vec<(u32, u64, u64)> = r
            .processes
            .iter()
            .map(|p| (p.pid, p.latency.count, p.total))
            .collect();
        assert_eq!(rows, vec![(2, 1, 5), (3, 0, 1)]);
        assert_eq!(r.processes[0].rate_per_s, 2.0);
        assert_eq!(r.processes[0].latency.max_ns, 500);
        assert_eq!(r.processes[1].rate_per_s, 0.0);
    }

    #[test]
    fn summary_covers_everything() {
        let t = table();
        let r = Report::build(
            ReportKind::Summary,
            &t,
            Duration::from_secs(2),
            Duration::from_secs(2),
            Drops::default(),
        );
        let busy = &r.processes[0];
        assert_eq!((busy.pid, busy.latency.count, busy.total), (2, 4, 4));
        assert_eq!(busy.rate_per_s, 2.0);
        assert_eq!(busy.latency.min_ns, 1000);
        assert_eq!(busy.latency.max_ns, 4000);
        assert_eq!(busy.latency.mean_ns, 2500);
    }

    #[test]
    fn json_field_names_are_the_documented_ones() {
        let t = table();
        let r = Report::build(
            ReportKind::Summary,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["type"], "summary");
        assert_eq!(v["drops"], 0);
        let p = &v["processes"][0];
        for field in [
            "process",
            "pid",
            "metric",
            "count",
            "rate_per_s",
            "total",
            "min_ns",
            "p50_ns",
            "p90_ns",
            "p99_ns",
            "p999_ns",
            "max_ns",
            "mean_ns",
            "log2_buckets",
        ] {
            assert!(!p[field].is_null(), "missing {field}");
        }
        assert_eq!(p["metric"], "accept_latency");
    }
}

//! What a scrape serves: everything since the start per role, per link and
//! of stackprobe itself, taken from the model each interval.

use std::collections::BTreeMap;

use stackprobe_model::{
    frame::OwnCost,
    measure::{Count, Per},
    process::{Activity, Metric, ProcessTable, Span},
    report::Report,
};

use super::buckets::{self, NativeBuckets};

#[derive(Clone, Debug, Default)]
pub(super) struct HistogramSample {
    pub role: String,
    pub metric: &'static str,
    /// The listening socket, for accept metrics; the destination, for
    /// connects; "" for the others.
    pub path: String,
    pub count: u64,
    pub sum_seconds: f64,
    /// (le in seconds, count in this bucket alone): the encoder accumulates.
    pub buckets: Vec<(f64, u64)>,
    pub native: NativeBuckets,
}

impl HistogramSample {
    /// `metric`'s histogram since the start, None while it is empty.
    fn of(role: &str, metric: &'static str, path: &str, m: &Metric) -> Option<Self> {
        let total = &m.total;
        if total.is_empty() {
            return None;
        }
        Some(Self {
            role: role.to_string(),
            metric,
            path: path.to_string(),
            count: total.count(),
            sum_seconds: total.sum_ns() as f64 / 1e9,
            buckets: buckets::classic(total),
            native: buckets::native(total),
        })
    }
}

/// A link's labels: its owner's role and container, its side and where
/// its connections go (never the client's address, so the series stay as
/// few as the services).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct LinkLabels {
    pub role: String,
    pub side: &'static str,
    pub endpoint: String,
}

/// A link's numbers, summed over the links with the same labels.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LinkNumbers {
    pub time_wait: u64,
    pub opens: u64,
    pub closes: u64,
    pub aborts: u64,
    pub new_time_wait: u64,
}

/// A role's busy row: the last interval's mean and max held, and its
/// limit (setting, value) where read.
#[derive(Clone, Debug)]
pub(super) struct BusySample {
    pub role: String,
    pub mean: f64,
    pub max: u64,
    pub limit: Option<(&'static str, u32)>,
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub(super) histograms: Vec<HistogramSample>,
    /// Connect latency per role and destination.
    pub(super) connects: Vec<HistogramSample>,
    /// (role, destination, refused, failed) since the start.
    /// Per role and destination: refused, failed, lost.
    pub(super) connect_failures: Vec<(String, String, [u64; 3])>,
    /// (role, listener, connections lost at its full queue since the
    /// start), for each listener whose count is known.
    pub(super) listener_lost: Vec<(String, String, u64)>,
    /// (role, count, total since the start), those above 0.
    pub(super) counts: Vec<(String, Count, u64)>,
    pub(super) processes: Vec<(String, u64)>,
    pub(super) busy: Vec<BusySample>,
    pub(super) links: Vec<(LinkLabels, LinkNumbers)>,
    /// (role, its chain's root role, own time in seconds) for each hop of
    /// the report's chains with an own time.
    pub(super) hop_own: Vec<(String, String, f64)>,
    pub(super) walk_age_s: f64,
    pub(super) drops: u64,
    pub(super) lost: Vec<(&'static str, u64)>,
    pub(super) skipped: [(&'static str, u64); 8],
    pub(super) cost: OwnCost,
    /// Per program: runs and run time in seconds, with `--probe-cost`.
    pub(super) programs: Vec<(String, u64, f64)>,
}

impl Snapshot {
    /// Everything since the start, per role, and stackprobe's own cost.
    pub fn take(table: &ProcessTable, report: &Report, cost: OwnCost) -> Self {
        let mut s = Self::of_report(report, cost);
        for (role, (_, activity)) in table.roles(Span::Whole) {
            s.add_counts(&role, &activity);
            s.add_connects(&role, &activity);
            s.add_latencies(&role, &activity);
        }
        s
    }

    /// What the report has: processes, links, drops and the probes' cost.
    fn of_report(report: &Report, cost: OwnCost) -> Self {
        Self {
            processes: report
                .roles
                .iter()
                .map(|r| (r.role.clone(), r.processes as u64))
                .collect(),
            listener_lost: report
                .roles
                .iter()
                .flat_map(|r| {
                    r.listeners
                        .iter()
                        .filter_map(|l| Some((r.role.clone(), l.listener.clone(), l.lost?.total)))
                })
                .collect(),
            busy: report
                .roles
                .iter()
                .filter_map(|r| {
                    let b = r.busy.as_ref()?;
                    let limit = b.limit.as_ref().map(|l| (l.setting, l.value));
                    Some(BusySample {
                        role: r.role.clone(),
                        mean: b.mean,
                        max: b.max,
                        limit,
                    })
                })
                .collect(),
            links: links(report),
            hop_own: report
                .chains
                .iter()
                .flat_map(|c| {
                    c.hops.iter().filter_map(|h| {
                        Some((h.role.clone(), c.root.clone(), h.own_ns? as f64 / 1e9))
                    })
                })
                .collect(),
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
            ..Self::default()
        }
    }

    /// The role's counts that counted anything.
    fn add_counts(&mut self, role: &str, activity: &Activity) {
        for (c, n) in activity.counts.iter() {
            if n.total > 0 {
                self.counts.push((role.to_string(), c, n.total));
            }
        }
    }

    /// The role's connects per destination, and those that failed.
    fn add_connects(&mut self, role: &str, activity: &Activity) {
        for (destination, c) in &activity.connects {
            for (l, m) in c.latency.iter() {
                if l.decl().per == Per::Destination {
                    self.connects
                        .extend(HistogramSample::of(role, l.name(), destination, m));
                }
            }
            if c.refused.total + c.failed.total + c.lost.total > 0 {
                self.connect_failures.push((
                    role.to_string(),
                    destination.clone(),
                    [c.refused.total, c.failed.total, c.lost.total],
                ));
            }
        }
    }

    /// The role's other latencies, per listener where they are kept so.
    fn add_latencies(&mut self, role: &str, activity: &Activity) {
        for (l, m) in activity.latency.iter() {
            let metric = l.name();
            match l.decl().per {
                Per::Process => self
                    .histograms
                    .extend(HistogramSample::of(role, metric, "", m)),
                // Per listener: together they are the role's.
                Per::Listener => {
                    for (listener, a) in &activity.listeners {
                        self.histograms.extend(HistogramSample::of(
                            role,
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
}

/// The report's links, summed by their labels.
fn links(report: &Report) -> Vec<(LinkLabels, LinkNumbers)> {
    let mut links: BTreeMap<LinkLabels, LinkNumbers> = BTreeMap::new();
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
    links.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use stackprobe_model::{
        event::HistMetric,
        fixtures::{self, kernel_hist, live},
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
}

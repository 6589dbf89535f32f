//! The report's rows per live process: its accepts.

use serde::Serialize;

use super::{Log2Bucket, Period, Summary};
use crate::{
    containers::Container,
    measure::{Count, Latency},
    process::ProcessTable,
};

#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    pub process: String,
    pub pid: u32,
    /// Its pid inside its container's pid namespace, where that differs.
    pub ns_pid: Option<u32>,
    /// The container it runs in (runtime, full id, name when known).
    pub container: Option<Container>,
    pub role: String,
    pub metric: &'static str,
    /// Accepts per second over the period.
    pub rate_per_s: f64,
    /// Accepts since the start (with a latency sample).
    pub total: u64,
    /// Accepts since the start whose latency is unknown (blocked in
    /// accept() when the probes attached).
    pub untimed: u64,
    /// The period's accept latency distribution; `count` is the period's accepts.
    #[serde(flatten)]
    pub latency: Summary,
    pub log2_buckets: Vec<Log2Bucket>,
    /// Processes this one forked in the period.
    pub forks: u64,
    pub children_alive: usize,
}

pub const ACCEPT_METRIC: &str = "accept_latency";

/// Every live process that has accepted anything gets a row, so a server
/// that went quiet shows 0 rather than vanishing; busiest first.
pub(super) fn process_rows(p: &Period, table: &ProcessTable) -> Vec<ProcessRow> {
    let mut processes: Vec<ProcessRow> = table
        .iter()
        .filter(|proc| {
            !proc.activity.latency[Latency::Accept].total.is_empty()
                || proc.activity.counts[Count::AcceptUntimed].total > 0
        })
        .map(|proc| {
            let accept = p.metric(&proc.activity.latency[Latency::Accept]);
            ProcessRow {
                process: proc.name.clone(),
                pid: proc.pid,
                ns_pid: proc.ns_pid,
                container: proc.container.clone(),
                role: proc.role(),
                metric: ACCEPT_METRIC,
                rate_per_s: accept.rate_per_s,
                total: accept.total,
                untimed: proc.activity.counts[Count::AcceptUntimed].total,
                latency: accept.latency,
                log2_buckets: accept.log2_buckets,
                forks: p.hist(&proc.activity.latency[Latency::Fork]).count(),
                children_alive: table.children_alive(proc.pid),
            }
        })
        .collect();
    processes.sort_by(|a, b| b.total.cmp(&a.total).then(a.pid.cmp(&b.pid)));
    processes
}

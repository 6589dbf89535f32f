//! What the collector hands every sink once per interval, and once more at
//! the end: the report, and the table it was built from for sinks that need
//! the histograms themselves (recordings, metrics).

use std::time::Duration;

use super::{process::ProcessTable, report::Report};

pub struct Frame<'a> {
    pub report: Report,
    pub table: &'a ProcessTable,
    /// The interval just ended: its start since the probes attached, and its
    /// length. For the summary, the last (partial) interval.
    pub interval_start: Duration,
    pub interval: Duration,
    /// stackprobe's own cost over the interval.
    pub cost: OwnCost,
    /// Watched processes alive now, by pid and name.
    pub watching: &'a [(u32, String)],
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OwnCost {
    /// ns per BPF program run, when the kernel's run-time statistics are on.
    pub ns_per_run: Option<f64>,
    /// stackprobe's CPU time as a share of one core, in percent.
    pub cpu_percent: f64,
    /// stackprobe's CPU time (user and system) since it started, in seconds.
    pub cpu_seconds: f64,
    /// Its resident memory now, in bytes (0 if unknown).
    pub resident_bytes: u64,
}

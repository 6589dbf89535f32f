//! What one interval (or the whole run) measured, ready for any view to
//! render: text, JSON, the dashboard.
//!
//! The report and the period it covers are here; each of its parts has a
//! file: the rows per role (`roles.rs`), the live processes' accept rows
//! (`processes.rs`), the TCP report (`tcp.rs`), a client's TCP and
//! unix paths to one server side by side (`paths.rs`), and the chains of
//! roles a request crosses, hop by hop (`chains.rs`).

use std::time::Duration;

use serde::Serialize;

use super::{
    counter::Counter,
    histogram::{LatencyHistogram, Log2Bucket, Summary},
    host::HostRow,
    probe_stats::{Drops, ProgramCost, RungInUse},
    process::{Metric, ProcessTable, Span},
};

mod chains;
mod cpu;
mod paths;
mod processes;
mod roles;
mod tcp;
#[cfg(test)]
mod tests;

pub use chains::{Chain, Hop, HopLatency, MIN_REQUESTS, PER_REQUEST_TOLERANCE, link_chains};
pub use cpu::CpuRow;
pub use paths::{PathComparison, PathNumbers, path_kind};
pub use processes::{ACCEPT_METRIC, ProcessRow};
pub use roles::{ConnectRow, ListenerLatencyRow, PIDS_SHOWN, RoleRow};
pub use tcp::{KernelRow, LinkRow, ListenerRow, PORT_PRESSURE_WARNING, TcpReport};

use self::{
    chains::chains,
    paths::compare_paths,
    processes::process_rows,
    roles::{attach_backlogs, role_rows},
    tcp::tcp_report,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    /// The last interval.
    Interval,
    /// Everything since stackprobe started.
    Summary,
}

/// The `--json` schema: bumped when a field changes meaning or goes away
/// (new fields may appear without a bump).
pub const SCHEMA: &str = "stackprobe.watch/5";

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
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
    /// Events received from the kernel (set by the collector).
    pub events: CountRow,
    /// Watched processes grouped by role (postmaster, backends, workers…).
    pub roles: Vec<RoleRow>,
    /// Live processes that have accepted anything.
    pub processes: Vec<ProcessRow>,
    /// Connections, listeners and the kernel's TCP counters.
    pub tcp: TcpReport,
    /// Clients that reach one watched server over TCP and over a unix
    /// socket: the two paths side by side.
    pub paths: Vec<PathComparison>,
    /// Each chain of watched roles a request crosses (nginx → php-fpm →
    /// postgres), hop by hop, with each hop's own time: rebuilt by
    /// [`link_chains`] once the collector has filled the roles' `busy`.
    pub chains: Vec<Chain>,
    /// Per-program BPF run-time statistics, with `--probe-cost` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub probe_cost: Vec<ProgramCost>,
    /// What the numbers mean, when there is enough data: filled by
    /// `insights::annotate`, a pass of its own.
    pub insights: Vec<String>,
    /// The hook each metric with a choice of hooks comes from on this
    /// kernel (set by the collector).
    #[serde(rename = "hooks")]
    pub rungs: Vec<RungInUse>,
    /// The host's CPUs and runnable threads at the report (set by the
    /// collector; null where /proc/stat could not be read).
    pub host: Option<HostRow>,
}

/// One latency metric over the period: its distribution (`count` is the
/// period's samples), rate and all-time total.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetricRow {
    #[serde(flatten)]
    pub latency: Summary,
    pub rate_per_s: f64,
    pub total: u64,
    pub log2_buckets: Vec<Log2Bucket>,
}

/// A count over the period, and since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountRow {
    pub count: u64,
    pub total: u64,
}

struct Period {
    kind: ReportKind,
    secs: f64,
}

impl Period {
    fn hist<'a>(&self, m: &'a Metric) -> &'a LatencyHistogram {
        match self.kind {
            ReportKind::Interval => &m.interval,
            ReportKind::Summary => &m.total,
        }
    }

    fn metric(&self, m: &Metric) -> MetricRow {
        let hist = self.hist(m);
        MetricRow {
            latency: hist.summary(),
            rate_per_s: self.rate(hist.count()),
            total: m.total_count(),
            log2_buckets: hist.log2_buckets(),
        }
    }

    fn count(&self, c: &Counter) -> CountRow {
        CountRow {
            count: match self.kind {
                ReportKind::Interval => c.interval,
                ReportKind::Summary => c.total,
            },
            total: c.total,
        }
    }

    fn rate(&self, count: u64) -> f64 {
        if self.secs > 0.0 {
            count as f64 / self.secs
        } else {
            0.0
        }
    }
}

impl Report {
    pub fn build(
        kind: ReportKind,
        table: &ProcessTable,
        period: Duration,
        elapsed: Duration,
        drops: Drops,
    ) -> Self {
        let p = Period {
            kind,
            secs: period.as_secs_f64(),
        };
        let span = match kind {
            ReportKind::Interval => Span::Interval,
            ReportKind::Summary => Span::Whole,
        };
        let mut roles = role_rows(&p, table, span);
        let processes = process_rows(&p, table);
        let tcp = tcp_report(&p, table);
        attach_backlogs(&mut roles, &tcp.listeners, table);
        let paths = compare_paths(&roles);
        let chains = chains(&roles);
        Self {
            schema: SCHEMA,
            kind,
            elapsed_s: elapsed.as_secs_f64(),
            period_s: p.secs,
            watched: table.watched_count(),
            drops: drops.total(),
            drops_by_cause: drops,
            events: CountRow::default(),
            roles,
            processes,
            tcp,
            paths,
            chains,
            probe_cost: Vec::new(),
            insights: Vec::new(),
            rungs: Vec::new(),
            host: None,
        }
    }
}

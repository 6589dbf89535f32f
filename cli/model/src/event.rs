//! What the probes report, in the model's terms: one type per kind of ring
//! buffer record (decoded in `probes`), and what the kernel's histograms of
//! accept and fork latency gained.

use std::net::SocketAddr;

/// What a clone created: the kernel files samples by the same rule.
pub use probes_common::fork::TaskKind;

use super::tcp::sockets::TcpState;

/// A watched process created a task (before the task first ran).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpawnSample {
    pub parent_tgid: u32,
    pub child: u32,
    pub kind: TaskKind,
    pub ts_ns: u64,
    /// The parent's comm, which the child starts with.
    pub comm: String,
}

/// A watched process exec'd `comm`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSample {
    pub tgid: u32,
    pub ts_ns: u64,
    pub comm: String,
}

/// A watched process's main thread exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitSample {
    pub tgid: u32,
    pub ts_ns: u64,
}

/// A TCP socket of a watched process changed state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpStateSample {
    pub owner: u32,
    /// The owner's comm, when the change ran in its context.
    pub comm: Option<String>,
    pub old: TcpState,
    pub new: TcpState,
    /// The owner's own syscall made the change (connect, listen, close).
    pub by_owner: bool,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub netns: super::tcp::sockets::Netns,
    pub ts_ns: u64,
}

/// A latency metric the kernel keeps histograms of, per process.
pub use probes_common::hist::HistMetric;

/// What one of the kernel's histograms (see probes_common::hist) gained
/// since it was last read: `count` samples of `metric` in process `tgid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistDelta {
    pub tgid: u32,
    /// The process's name, when it was still running to be asked.
    pub comm: Option<String>,
    /// Which path the samples took, when known: for accept metrics, the
    /// listening socket accepted from (`127.0.0.1:5432` or a unix path); for
    /// connect metrics, the destination (the same forms).
    pub path: Option<String>,
    /// The samples are of `tgid`'s children rather than its own: run-queue
    /// samples of processes it forked after the probes attached (see
    /// probes_common::run_queue::CHILDREN_PATH).
    pub of_children: bool,
    pub metric: HistMetric,
    pub count: u64,
    /// Exact sum of the samples.
    pub sum_ns: u64,
    /// The smallest and largest of these samples: exact when they are the
    /// smallest or largest since the start, else within their bucket's
    /// width (1/64) and never past the exact extremes since the start.
    pub min_ns: u64,
    pub max_ns: u64,
    /// (bucket midpoint, samples in that bucket), lowest first.
    pub buckets: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Spawn(SpawnSample),
    Exec(ExecSample),
    Exit(ExitSample),
    TcpState(TcpStateSample),
    Hist(HistDelta),
}

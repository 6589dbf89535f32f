//! What the probes say about themselves: events they could not deliver,
//! what each kernel program costs, and which rung of each hook ladder is in
//! use. The probes fill these in; reports carry them.

use serde::Serialize;

/// What a probe records: accept and fork samples go to the kernel's
/// histograms, the rest through the ring buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Accept,
    Fork,
    Spawn,
    Exec,
    Exit,
    TcpState,
    Connect,
}

/// Events the full ring buffer could not take, by kind, since the start.
/// Only these kinds cross the ring: accept and fork samples stay in the
/// kernel's histograms (see probes_common::hist), so none is lost there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RingLost {
    /// Process births: their children's lifetimes are missing.
    pub spawn: u64,
    pub exec: u64,
    /// Process exits: those processes retire two syncs late, lifetimes missing.
    pub exit: u64,
    /// TCP state changes: link counts are short by these.
    pub tcp_state: u64,
}

impl RingLost {
    pub fn total(&self) -> u64 {
        self.spawn + self.exec + self.exit + self.tcp_state
    }

    /// Each kind by the name views use.
    pub fn by_kind(&self) -> [(&'static str, u64); 4] {
        [
            ("spawn", self.spawn),
            ("exec", self.exec),
            ("exit", self.exit),
            ("tcp_state", self.tcp_state),
        ]
    }
}

/// Samples or events lost, by what each probe records, since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LostEvents {
    pub accept: u64,
    pub fork: u64,
    /// Process births: their children's lifetimes are missing.
    pub spawn: u64,
    pub exec: u64,
    /// Process exits: those processes retire two syncs late, lifetimes missing.
    pub exit: u64,
    /// TCP state changes: link counts are short by these.
    pub tcp_state: u64,
    /// Unix connects (or their enter half): not counted.
    pub connect: u64,
}

impl LostEvents {
    pub fn total(&self) -> u64 {
        self.accept + self.fork + self.spawn + self.exec + self.exit + self.tcp_state + self.connect
    }

    /// The counter for what probes of `kind` record.
    pub fn of_kind(&mut self, kind: ProbeKind) -> &mut u64 {
        match kind {
            ProbeKind::Accept => &mut self.accept,
            ProbeKind::Fork => &mut self.fork,
            ProbeKind::Spawn => &mut self.spawn,
            ProbeKind::Exec => &mut self.exec,
            ProbeKind::Exit => &mut self.exit,
            ProbeKind::TcpState => &mut self.tcp_state,
            ProbeKind::Connect => &mut self.connect,
        }
    }

    /// Each kind by the name views use.
    pub fn by_kind(&self) -> [(&'static str, u64); 7] {
        [
            ("accept", self.accept),
            ("fork", self.fork),
            ("spawn", self.spawn),
            ("exec", self.exec),
            ("exit", self.exit),
            ("tcp_state", self.tcp_state),
            ("connect", self.connect),
        ]
    }
}

/// Events the probes could not deliver, by cause, since the start. Each is
/// missing from the report's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Drops {
    /// Lost because the ring buffer was full.
    pub lost: RingLost,
    /// Probe runs the kernel skipped because a BPF program was already
    /// running on that CPU (a tracepoint hit in a softirq that interrupted
    /// one): its `recursion_misses`, by what the probe records.
    pub skipped: LostEvents,
    /// Accept or fork samples the kernel could not record: its histogram
    /// map was full.
    pub hist_full: u64,
    /// Accepts not timed because another watched thread's accept shared their slot.
    pub accept_slot_shared: u64,
    /// Processes not watched because their pid lies beyond the watch set.
    pub watch_out_of_range: u64,
    /// Clones not timed because another watched thread's clone shared their slot.
    pub fork_slot_shared: u64,
    /// Watched listening ports the kernel could not record (its map of
    /// listeners was full): connections arriving there are not attributed.
    pub listen_owners_full: u64,
    /// Watched sockets the kernel could not record: their later state
    /// changes made outside their owner's context are not reported, nor
    /// (for an arriving connection) its accept-queue wait.
    pub tracked_insert_failed: u64,
    /// Opens, closes or new TIME_WAIT the kernel could not count: its map
    /// of links was full.
    pub link_map_full: u64,
    /// TIME_WAIT sockets whose closer the kernel could not record, or that
    /// a walk could not count (its map was full).
    pub time_wait_map_full: u64,
}

impl Drops {
    /// Events that did not reach userspace, whatever the cause.
    pub fn total(&self) -> u64 {
        self.lost.total()
            + self.skipped.total()
            + self.accept_slot_shared
            + self.watch_out_of_range
            + self.fork_slot_shared
            + self.hist_full
            + self.listen_owners_full
            + self.tracked_insert_failed
            + self.link_map_full
            + self.time_wait_map_full
    }
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

/// One rung of a hook ladder, as picked at load.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RungInUse {
    /// `fork` or `accept_queue`.
    pub metric: &'static str,
    /// Its short name (`fentry`, `fexit`, `tracepoint`, `fd-walk`, …).
    pub hook: &'static str,
    /// What it is, in words.
    pub description: &'static str,
}

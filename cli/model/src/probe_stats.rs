//! What the probes say about themselves: events they could not deliver,
//! what each kernel program costs, and which rung of each hook ladder is in
//! use. The probes fill these in; reports carry them.

use probes_common::stats::STAT_COUNT;
pub use probes_common::stats::Stat;
use serde::{Serialize, Serializer, ser::SerializeMap as _};

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
    RunQueue,
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
    /// Wakeups and switches of watched threads: a wait not timed.
    pub run_queue: u64,
}

impl LostEvents {
    pub fn total(&self) -> u64 {
        self.accept
            + self.fork
            + self.spawn
            + self.exec
            + self.exit
            + self.tcp_state
            + self.connect
            + self.run_queue
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
            ProbeKind::RunQueue => &mut self.run_queue,
        }
    }

    /// Each kind by the name views use.
    pub fn by_kind(&self) -> [(&'static str, u64); 8] {
        [
            ("accept", self.accept),
            ("fork", self.fork),
            ("spawn", self.spawn),
            ("exec", self.exec),
            ("exit", self.exit),
            ("tcp_state", self.tcp_state),
            ("connect", self.connect),
            ("run_queue", self.run_queue),
        ]
    }
}

/// A count of what the kernel could not deliver, kept in its STATS map:
/// declared once here, with its JSON field and its words in the text.
#[derive(Debug)]
pub struct DropCause {
    pub stat: Stat,
    /// Its field in JSON's `drops_by_cause` (in `lost` for the ring's).
    pub name: &'static str,
    /// How the text's DROPS line names it.
    pub label: &'static str,
}

const fn cause(stat: Stat, name: &'static str, label: &'static str) -> DropCause {
    DropCause { stat, name, label }
}

/// Events the full ring buffer could not take, by the kind of event. Only
/// these kinds cross the ring: accept, fork and connect samples stay in
/// the kernel's histograms, so none is lost there. A lost spawn or exit
/// leaves children's lifetimes missing; a lost state change, link counts
/// short.
pub const RING_LOST: &[DropCause] = &[
    cause(Stat::LostSpawn, "spawn", "spawn"),
    cause(Stat::LostExec, "exec", "exec"),
    cause(Stat::LostExit, "exit", "exit"),
    cause(Stat::LostTcpState, "tcp_state", "tcp_state"),
];

/// Every other cause (their meanings: probes_common::stats::Stat).
pub const DROP_CAUSES: &[DropCause] = &[
    cause(Stat::HistFull, "hist_full", "histogram map full"),
    cause(
        Stat::AcceptSlotShared,
        "accept_slot_shared",
        "accept slot shared",
    ),
    cause(
        Stat::WatchOutOfRange,
        "watch_out_of_range",
        "pid beyond watch set",
    ),
    cause(Stat::ForkSlotShared, "fork_slot_shared", "fork slot shared"),
    cause(
        Stat::ListenOwnersFull,
        "listen_owners_full",
        "listener map full",
    ),
    cause(
        Stat::TrackedInsertFailed,
        "tracked_insert_failed",
        "socket map insert failed",
    ),
    cause(Stat::LinkMapFull, "link_map_full", "link map full"),
    cause(
        Stat::TimeWaitMapFull,
        "time_wait_map_full",
        "TIME_WAIT map full",
    ),
];

/// Events the probes could not deliver, by cause, since the start. Each is
/// missing from the report's numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// The kernel's counters, indexed by [`Stat`]; those declared in
    /// [`RING_LOST`] and [`DROP_CAUSES`] are drops.
    stats: [u64; STAT_COUNT as usize],
    /// Probe runs the kernel skipped because a BPF program was already
    /// running on that CPU (a tracepoint hit in a softirq that interrupted
    /// one): its `recursion_misses`, by what the probe records.
    pub skipped: LostEvents,
}

impl Drops {
    /// The drops the kernel's counters (`read`) and its skipped runs say.
    pub fn from_stats(read: impl Fn(Stat) -> u64, skipped: LostEvents) -> Self {
        let mut d = Self {
            skipped,
            ..Self::default()
        };
        for c in RING_LOST.iter().chain(DROP_CAUSES) {
            d.stats[c.stat as usize] = read(c.stat);
        }
        d
    }

    /// These drops with `n` more of `stat`.
    pub fn with(mut self, stat: Stat, n: u64) -> Self {
        self.stats[stat as usize] += n;
        self
    }

    pub fn stat(&self, stat: Stat) -> u64 {
        self.stats[stat as usize]
    }

    /// Events the full ring buffer could not take, by kind.
    pub fn ring_lost(&self) -> impl Iterator<Item = (&'static DropCause, u64)> + '_ {
        RING_LOST.iter().map(|c| (c, self.stat(c.stat)))
    }

    /// Every other cause.
    pub fn causes(&self) -> impl Iterator<Item = (&'static DropCause, u64)> + '_ {
        DROP_CAUSES.iter().map(|c| (c, self.stat(c.stat)))
    }

    /// Events that did not reach userspace, whatever the cause.
    pub fn total(&self) -> u64 {
        self.ring_lost()
            .chain(self.causes())
            .map(|(_, n)| n)
            .sum::<u64>()
            + self.skipped.total()
    }
}

/// JSON's `drops_by_cause`: `lost` by kind, `skipped`, then each cause by
/// its name.
impl Serialize for Drops {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Lost<'a>(&'a Drops);
        impl Serialize for Lost<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.ring_lost().map(|(c, n)| (c.name, n)))
            }
        }
        let mut map = s.serialize_map(Some(2 + DROP_CAUSES.len()))?;
        map.serialize_entry("lost", &Lost(self))?;
        map.serialize_entry("skipped", &self.skipped)?;
        for (c, n) in self.causes() {
            map.serialize_entry(c.name, &n)?;
        }
        map.end()
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

/// The `metric` of the rung service time comes from, and its `hook` when
/// only TCP connections' service is followed (no `--unix-service-time`).
pub const SERVICE_RUNG: &str = "service";
pub const SERVICE_TCP_ONLY: &str = "tcp-only";
/// The run-queue probe's entry in `hooks[]`: its BTF tracepoints, or off
/// (not asked for).
pub const RUN_QUEUE_METRIC: &str = "run_queue";
pub const RUN_QUEUE_TP_BTF: &str = "tp_btf";
pub const RUN_QUEUE_OFF: &str = "off";

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_counter_but_the_nested_copys_is_a_declared_drop_once() {
        let mut declared: Vec<Stat> = RING_LOST
            .iter()
            .chain(DROP_CAUSES)
            .map(|c| c.stat)
            .collect();
        declared.sort_by_key(|s| *s as u32);
        let mut all: Vec<Stat> = Stat::ALL
            .into_iter()
            .filter(|s| *s != Stat::TcpStateNested)
            .collect();
        all.sort_by_key(|s| *s as u32);
        assert_eq!(declared, all);
    }

    #[test]
    fn drops_add_up_and_serialize_by_their_declared_names() {
        let d = Drops::from_stats(
            |s| s as u64 + 1,
            LostEvents {
                fork: 100,
                ..LostEvents::default()
            },
        );
        // Every stat but TcpStateNested (12), whose read is not taken.
        assert_eq!(d.stat(Stat::TcpStateNested), 0);
        assert_eq!(d.total(), (1..=12).sum::<u64>() + 100);
        let v = serde_json::to_value(d).unwrap();
        assert_eq!(v["lost"]["tcp_state"], Stat::LostTcpState as u64 + 1);
        assert_eq!(v["time_wait_map_full"], Stat::TimeWaitMapFull as u64 + 1);
        assert_eq!(v["skipped"]["fork"], 100);
    }
}

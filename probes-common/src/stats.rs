//! Per-CPU counters of events the probes could not deliver: nothing vanishes
//! uncounted.

pub const STATS_MAP: &str = "STATS";

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// An event was lost because the ring buffer was full.
    RingbufFull = 0,
    /// An accept could not be timed because another watched thread's accept
    /// took its slot (only when `pid_max` exceeds the slot count).
    AcceptSlotShared = 1,
    /// A process could not be watched: its pid lies beyond the watch set,
    /// which is sized from `pid_max` at load (pid_max was raised since).
    WatchOutOfRange = 2,
    /// A clone could not be timed because another watched thread's clone
    /// took its slot (only when `pid_max` exceeds the slot count).
    ForkSlotShared = 3,
}

pub const STAT_COUNT: u32 = 4;

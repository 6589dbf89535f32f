//! Per-CPU counters of events the probes could not deliver: nothing vanishes
//! uncounted.

pub const STATS_MAP: &str = "STATS";

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// An accept could not be timed because another watched thread's accept
    /// took its slot (only when `pid_max` exceeds the slot count).
    AcceptSlotShared = 0,
    /// A process could not be watched: its pid lies beyond the watch set,
    /// which is sized from `pid_max` at load (pid_max was raised since).
    WatchOutOfRange = 1,
    /// A clone could not be timed because another watched thread's clone
    /// took its slot (only when `pid_max` exceeds the slot count).
    ForkSlotShared = 2,
    /// Events lost because the ring buffer was full, one counter per event
    /// kind. Accept and fork samples are folded into the overflow
    /// histograms instead (see `overflow`), unless `OverflowFull` counted
    /// them too.
    LostAccept = 3,
    LostFork = 4,
    LostSpawn = 5,
    LostExec = 6,
    LostExit = 7,
    LostTcpState = 8,
    /// A sample the ring could not take could not be folded either: the
    /// overflow map was full.
    OverflowFull = 9,
}

pub const STAT_COUNT: u32 = 10;

//! Per-CPU counters of events the probes could not deliver: nothing vanishes
//! uncounted.

pub const STATS_MAP: &str = "STATS";

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// An event was lost because the ring buffer was full.
    RingbufFull = 0,
    /// An accept could not be timed because the in-flight map was full.
    AcceptStartFull = 1,
    /// A process could not be added to the watch set because it was full.
    WatchFull = 2,
}

pub const STAT_COUNT: u32 = 3;

impl Stat {
    pub const ALL: [Stat; STAT_COUNT as usize] =
        [Stat::RingbufFull, Stat::AcceptStartFull, Stat::WatchFull];
}

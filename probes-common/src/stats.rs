//! Per-CPU counters of events the probes could not deliver: nothing vanishes
//! uncounted.

pub const STATS_MAP: &str = "STATS";

/// Declares [`Stat`] and [`Stat::ALL`] from one list, so a new counter is in
/// both (and so in the map's size) or in neither.
macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident = $index:literal,)+) => {
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Stat {
            $($(#[$doc])* $name = $index,)+
        }

        impl Stat {
            /// Every counter, in index order.
            pub const ALL: [Stat; [$($index),+].len()] = [$(Stat::$name),+];
        }
    };
}

stats! {
    /// An accept could not be timed because another watched thread's accept
    /// took its slot (only when `pid_max` exceeds the slot count).
    AcceptSlotShared = 0,
    /// A process could not be watched: its pid lies beyond the watch set,
    /// which is sized from `pid_max` at load (pid_max was raised since).
    WatchOutOfRange = 1,
    /// A clone could not be timed because another watched thread's clone
    /// took its slot (only when `pid_max` exceeds the slot count).
    ForkSlotShared = 2,
    /// Events lost because the ring buffer was full, one counter per kind
    /// of event that goes through it. Accept and fork samples never do:
    /// the kernel keeps them in its histograms (see `hist`).
    LostSpawn = 3,
    LostExec = 4,
    LostExit = 5,
    LostTcpState = 6,
    /// An accept or fork sample could not be recorded: the histogram map
    /// (see `hist`) was full.
    HistFull = 7,
    /// A watched process's listening port could not be recorded (the
    /// LISTEN_OWNERS map was full): connections arriving there are not
    /// attributed to it.
    ListenOwnersFull = 8,
    /// A watched socket could not be recorded in the TRACKED map, so its
    /// later state changes made outside its owner's context go unreported.
    /// A connection arriving at a watched listener then has no handshake
    /// time either: its accept-queue wait is unknown.
    TrackedInsertFailed = 9,
    /// A link's open, close or new TIME_WAIT could not be counted: the
    /// kernel's map of links was full.
    LinkMapFull = 10,
    /// A TIME_WAIT socket's closer could not be recorded, or a link's
    /// TIME_WAIT sockets could not be counted by the iterator (its map was
    /// full): those sockets show as of an unknown closer, or not at all.
    TimeWaitMapFull = 11,
    /// State changes the tp_btf state probe's second copy handled because
    /// the first did not run for them: they interrupted it on its CPU, and
    /// each program has its own recursion guard. Not a loss: userspace
    /// subtracts them from the first copy's skipped runs.
    TcpStateNested = 12,
}

/// How many counters there are: one per [`Stat`].
pub const STAT_COUNT: u32 = Stat::ALL.len() as u32;

/// Every counter, indexed by [`Stat`]: the STATS map's one per-CPU value,
/// so userspace reads them all in one lookup each interval (one per counter
/// before).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub by_stat: [u64; STAT_COUNT as usize],
}

crate::assert_layout!(Counters, 8 * STAT_COUNT as usize, { by_stat: 0 });

impl Counters {
    pub fn get(&self, stat: Stat) -> u64 {
        self.by_stat[stat as usize]
    }

    /// Adds `other` counter by counter (per-CPU values into a total).
    pub fn add(&mut self, other: &Counters) {
        for (sum, n) in self.by_stat.iter_mut().zip(other.by_stat) {
            *sum = sum.wrapping_add(n);
        }
    }
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::Counters {}
}

// The counters index an array: each one's index is its place in the list,
// so none is out of the array or shares a slot.
const _: () = {
    let mut i = 0;
    while i < Stat::ALL.len() {
        assert!(
            Stat::ALL[i] as usize == i,
            "Stat indexes must be 0, 1, 2, ..."
        );
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_its_own_slot_in_the_array() {
        assert_eq!(STAT_COUNT, 13);
        assert_eq!(Stat::ALL.first(), Some(&Stat::AcceptSlotShared));
        assert_eq!(Stat::ALL.last(), Some(&Stat::TcpStateNested));
        assert!(Stat::ALL.iter().all(|&s| (s as u32) < STAT_COUNT));
    }

    #[test]
    fn counters_add_up_by_stat() {
        let mut sum = Counters::default();
        let mut cpu = Counters::default();
        cpu.by_stat[Stat::LostExit as usize] = 2;
        sum.add(&cpu);
        sum.add(&cpu);
        assert_eq!(sum.get(Stat::LostExit), 4);
        assert_eq!(sum.get(Stat::HistFull), 0);
    }
}

//! What a link counts: the kernel's running totals, and a row's counters
//! for the interval and since the start.

use crate::counter::Counter;

/// A kernel link's counts since the probes loaded (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkTotals {
    pub opens: u64,
    pub closes: u64,
    pub aborts: u64,
    pub new_time_wait: u64,
}

impl LinkTotals {
    /// What grew since `earlier`; everything, if a count went down (the key
    /// was forgotten and counts from 0 again).
    pub(super) fn since(&self, earlier: &LinkTotals) -> LinkTotals {
        let went_down = self.opens < earlier.opens
            || self.closes < earlier.closes
            || self.aborts < earlier.aborts
            || self.new_time_wait < earlier.new_time_wait;
        if went_down {
            return *self;
        }
        LinkTotals {
            opens: self.opens - earlier.opens,
            closes: self.closes - earlier.closes,
            aborts: self.aborts - earlier.aborts,
            new_time_wait: self.new_time_wait - earlier.new_time_wait,
        }
    }

    pub(super) fn is_zero(&self) -> bool {
        *self == LinkTotals::default()
    }

    /// Every count added up (wrapping): a change in any moves it.
    pub fn changes(&self) -> u64 {
        self.opens
            .wrapping_add(self.closes)
            .wrapping_add(self.aborts)
            .wrapping_add(self.new_time_wait)
    }

    pub(super) fn plus(&self, other: &LinkTotals) -> LinkTotals {
        LinkTotals {
            opens: self.opens + other.opens,
            closes: self.closes + other.closes,
            aborts: self.aborts + other.aborts,
            new_time_wait: self.new_time_wait + other.new_time_wait,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub opens: Counter,
    pub closes: Counter,
    /// Connections that ended without the FIN handshake: reset, refused,
    /// aborted.
    pub aborts: Counter,
    /// TIME_WAIT sockets now (from the last snapshot).
    pub time_wait: u64,
    /// Sockets that went into TIME_WAIT.
    pub new_time_wait: Counter,
}

impl LinkStats {
    /// Adds `total` counts since the start, `interval` of them in this
    /// interval.
    pub(super) fn put(&mut self, total: &LinkTotals, interval: &LinkTotals) {
        for (c, t, i) in self.counters(total, interval) {
            c.total += t;
            c.interval += i;
        }
    }

    /// Takes away what [`put`](Self::put) added.
    pub(super) fn take(&mut self, total: &LinkTotals, interval: &LinkTotals) {
        for (c, t, i) in self.counters(total, interval) {
            c.total = c.total.saturating_sub(t);
            c.interval = c.interval.saturating_sub(i);
        }
    }

    fn counters(
        &mut self,
        total: &LinkTotals,
        interval: &LinkTotals,
    ) -> [(&mut Counter, u64, u64); 4] {
        [
            (&mut self.opens, total.opens, interval.opens),
            (&mut self.closes, total.closes, interval.closes),
            (&mut self.aborts, total.aborts, interval.aborts),
            (
                &mut self.new_time_wait,
                total.new_time_wait,
                interval.new_time_wait,
            ),
        ]
    }

    /// Nothing counted and no TIME_WAIT now: no row to show.
    pub(super) fn is_empty(&self) -> bool {
        *self == LinkStats::default()
    }
}

//! A plain count kept for the current interval and since the start: the
//! shape of every non-latency number a report shows.

/// A plain count, for the current interval and since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub interval: u64,
    pub total: u64,
}

impl Counter {
    pub fn bump(&mut self) {
        self.interval += 1;
        self.total += 1;
    }

    pub fn add_counter(&mut self, other: &Counter) {
        self.interval += other.interval;
        self.total += other.total;
    }

    pub fn add(&mut self, n: u64) {
        self.interval += n;
        self.total += n;
    }
}

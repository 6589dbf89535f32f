//! Busy servers: how many connections each server held, over the interval
//! and since the start, from the kernel's counts (see
//! probes_common::service): the time-weighted mean (connection-ns held over
//! the period's ns) and the most held at once. For servers whose workers
//! serve one connection at a time (php-fpm pools, postgres backends,
//! prefork servers) that is how many workers were busy; for event-driven
//! ones (nginx) the connections open.

use std::collections::HashMap;

use serde::Serialize;

/// One read of a server's kernel count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// The pid the kernel keeps the count under: the acceptor's watched
    /// parent (a master), else the acceptor.
    pub server: u32,
    /// Connections held at the read.
    pub open: u64,
    /// Connection-ns held since the probes loaded, up to the read.
    pub held_ns: u64,
    /// The most held at once since the previous read.
    pub max: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Track {
    /// The previous read's held time (0 before the first).
    before: u64,
    last: u64,
    /// The kernel's count at the last read, and what earlier counts of the
    /// same pid held: a count forgotten (its server exited) and started
    /// again (the pid reused) starts from 0.
    raw: u64,
    offset: u64,
    interval_max: u64,
    max: u64,
    open: u64,
}

/// What one server held over a period.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Held {
    /// Connections held on average over the period.
    pub mean: f64,
    /// The most held at once in the period.
    pub max: u64,
    /// Held at the end of the period.
    pub now: u64,
}

/// A role's busy connections over the report's period, against what it has
/// and what its configuration allows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BusyRow {
    /// Connections held on average over the period.
    pub mean: f64,
    /// The most held at once in the period.
    pub max: u64,
    /// Held at the end of the period.
    pub now: u64,
    /// The processes serving them: the server's live children (a pool's
    /// workers, a postmaster's backends and helpers), or 1 for a server
    /// that serves with threads.
    pub processes: usize,
    /// The most its configuration lets it hold at once, where stackprobe
    /// could read it.
    pub limit: Option<LimitRow>,
}

/// A connection limit from a server's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LimitRow {
    /// `pm.max_children`, `max_connections` or `worker_connections`.
    pub setting: &'static str,
    pub value: u32,
    /// The file it was read from, as the server sees it (its default: the
    /// main configuration file).
    pub source: String,
}

impl BusyRow {
    /// Adds another server's numbers (a role with two servers): the means
    /// add exactly; the max becomes their sum, an upper bound.
    pub fn add(&mut self, held: Held, processes: usize) {
        self.mean += held.mean;
        self.max += held.max;
        self.now += held.now;
        self.processes += processes;
    }

    /// Whether it held as many as it may: its limit, or, without one, all
    /// its processes (for servers that are not threaded).
    pub fn at_limit(&self) -> bool {
        match &self.limit {
            Some(l) => self.max >= u64::from(l.value),
            None => self.processes > 1 && self.max >= self.processes as u64,
        }
    }
}

/// Every server's reads, each interval's and since the start.
#[derive(Clone, Debug, Default)]
pub struct BusyTracker {
    servers: HashMap<u32, Track>,
    /// When the probes loaded and when the previous read was, on the
    /// probes' clock.
    start_ns: u64,
    before_ns: u64,
    last_ns: u64,
}

impl BusyTracker {
    /// Counting starts at `start_ns` (the probes' clock when they loaded).
    pub fn new(start_ns: u64) -> Self {
        Self {
            start_ns,
            before_ns: start_ns,
            last_ns: start_ns,
            ..Self::default()
        }
    }

    /// Takes in the reads of every server at `at_ns`; a server the kernel
    /// no longer lists (its process exited and was forgotten) stays at its
    /// last read.
    pub fn observe(&mut self, at_ns: u64, reads: impl IntoIterator<Item = Reading>) {
        self.before_ns = self.last_ns;
        self.last_ns = at_ns.max(self.last_ns);
        for t in self.servers.values_mut() {
            t.before = t.last;
            t.interval_max = t.open;
        }
        for r in reads {
            let t = self.servers.entry(r.server).or_default();
            if r.held_ns < t.raw {
                t.offset += t.raw;
            }
            t.raw = r.held_ns;
            t.last = t.offset + r.held_ns;
            t.interval_max = r.max.max(r.open);
            t.max = t.max.max(t.interval_max);
            t.open = r.open;
        }
    }

    /// What `server` held over the last interval (between the last two
    /// reads), None if it never accepted.
    pub fn interval(&self, server: u32) -> Option<Held> {
        let t = self.servers.get(&server)?;
        Some(Held {
            mean: mean(t.last - t.before, self.last_ns - self.before_ns),
            max: t.interval_max,
            now: t.open,
        })
    }

    /// What `server` held since the probes loaded.
    pub fn since_start(&self, server: u32) -> Option<Held> {
        let t = self.servers.get(&server)?;
        Some(Held {
            mean: mean(t.last, self.last_ns - self.start_ns),
            max: t.max,
            now: t.open,
        })
    }

    /// The servers ever read.
    pub fn servers(&self) -> impl Iterator<Item = u32> + '_ {
        self.servers.keys().copied()
    }
}

fn mean(held_ns: u64, period_ns: u64) -> f64 {
    if period_ns == 0 {
        return 0.0;
    }
    held_ns as f64 / period_ns as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn read(server: u32, open: u64, held_s: f64, max: u64) -> Reading {
        Reading {
            server,
            open,
            held_ns: (held_s * S as f64) as u64,
            max,
        }
    }

    #[test]
    fn a_pool_of_two_held_all_of_one_second_and_half_the_next() {
        let mut t = BusyTracker::new(10 * S);
        // 2 connections held through the first second.
        t.observe(11 * S, [read(7, 2, 2.0, 2)]);
        assert_eq!(
            t.interval(7),
            Some(Held {
                mean: 2.0,
                max: 2,
                now: 2
            })
        );
        // Then 1 for the next second, 3 at once for a moment.
        t.observe(12 * S, [read(7, 1, 3.0, 3)]);
        assert_eq!(
            t.interval(7),
            Some(Held {
                mean: 1.0,
                max: 3,
                now: 1
            })
        );
        assert_eq!(
            t.since_start(7),
            Some(Held {
                mean: 1.5,
                max: 3,
                now: 1
            })
        );
        assert_eq!(t.interval(8), None);
    }

    #[test]
    fn a_count_started_again_under_the_same_pid_adds_to_what_it_held() {
        let mut t = BusyTracker::new(0);
        t.observe(S, [read(7, 0, 0.5, 1)]);
        // Forgotten, then the pid serves again: the kernel counts from 0.
        t.observe(2 * S, [read(7, 0, 0.25, 1)]);
        assert_eq!(t.interval(7).unwrap().mean, 0.25);
        assert_eq!(t.since_start(7).unwrap().mean, 0.375);
    }

    #[test]
    fn a_server_gone_from_the_kernel_holds_nothing_more() {
        let mut t = BusyTracker::new(0);
        t.observe(S, [read(7, 0, 0.5, 1)]);
        t.observe(2 * S, []);
        let held = t.interval(7).unwrap();
        assert_eq!((held.mean, held.max, held.now), (0.0, 0, 0));
        assert_eq!(t.since_start(7).unwrap().mean, 0.25);
    }
}

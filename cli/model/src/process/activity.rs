//! What is measured about one process, or summed about a role: each
//! declared latency as a [`Metric`] (the interval's histogram and the
//! total), each declared count, and the latencies per listening socket and
//! the connects per destination.

use std::collections::BTreeMap;

use crate::{
    counter::Counter,
    event::HistDelta,
    histogram::LatencyHistogram,
    measure::{Counts, DestinationCount, Feeds, Latencies, Latency, Per},
};

/// Listeners kept apart per process or role; further ones are summed under
/// [`OTHER_LISTENERS`].
pub const MAX_LISTENERS: usize = 64;
pub const OTHER_LISTENERS: &str = "(other listeners)";
/// Accepts from a listener that could not be named (its process exited
/// before it was asked).
pub const UNKNOWN_LISTENER: &str = "(unknown listener)";
/// Destinations kept apart per process or role; further ones are summed
/// under [`OTHER_DESTINATIONS`].
pub const MAX_DESTINATIONS: usize = 64;
pub const OTHER_DESTINATIONS: &str = "(other destinations)";
/// Connects to a destination the kernel could not name (its table of
/// names was full).
pub const UNKNOWN_DESTINATION: &str = "(unknown destination)";

/// One latency metric: the current interval and everything since the start.
#[derive(Clone, Debug, Default)]
pub struct Metric {
    pub interval: LatencyHistogram,
    pub total: LatencyHistogram,
    /// Samples since the start that are counted but not in `total` (a sum
    /// over [`Span::Interval`] merges only the totals' counts).
    pub total_uncounted: u64,
}

/// What a sum of activities needs. An interval report needs the interval's
/// histograms and only the count of the totals: merging every process's
/// total histograms (213 KB each) was 40% of an interval's 80 ms at 1000
/// processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    Interval,
    Whole,
}

impl Metric {
    pub fn record(&mut self, ns: u64) {
        self.interval.record(ns);
        self.total.record(ns);
    }

    fn record_kernel(&mut self, d: &HistDelta) {
        for h in [&mut self.interval, &mut self.total] {
            h.record_kernel(&d.buckets, d.sum_ns, d.min_ns, d.max_ns);
        }
    }

    /// Samples since the start.
    pub fn total_count(&self) -> u64 {
        self.total.count() + self.total_uncounted
    }

    fn add(&mut self, other: &Metric, span: Span) {
        self.interval.add(&other.interval);
        match span {
            Span::Whole => {
                self.total.add(&other.total);
                self.total_uncounted += other.total_uncounted;
            }
            Span::Interval => self.total_uncounted += other.total_count(),
        }
    }

    fn reset_interval(&mut self) {
        self.interval.reset();
    }
}

/// Everything measured about one process (or, summed, about a role): each
/// declared latency and count, and the per-listener and per-destination
/// breakdowns of those declared so.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    pub latency: Latencies<Metric>,
    pub counts: Counts<Counter>,
    /// The [`Per::Listener`] latencies per listening socket accepted from,
    /// by its address or path.
    pub listeners: BTreeMap<String, ListenerActivity>,
    /// Connects per destination (TCP address:port or unix path).
    pub connects: BTreeMap<String, ConnectActivity>,
}

/// What one destination's connects measured.
#[derive(Clone, Debug, Default)]
pub struct ConnectActivity {
    /// The latencies declared [`Per::Destination`] (connect, held).
    pub latency: Latencies<Metric>,
    /// Connects refused (ECONNREFUSED).
    pub refused: Counter,
    /// Connects that failed otherwise.
    pub failed: Counter,
    /// Unix connects a full listener queue refused (EAGAIN).
    pub lost: Counter,
}

impl ConnectActivity {
    fn add(&mut self, other: &ConnectActivity, span: Span) {
        for (l, m) in self.latency.iter_mut() {
            m.add(&other.latency[l], span);
        }
        self.refused.add_counter(&other.refused);
        self.failed.add_counter(&other.failed);
        self.lost.add_counter(&other.lost);
    }

    fn reset_interval(&mut self) {
        for (_, m) in self.latency.iter_mut() {
            m.reset_interval();
        }
        self.refused.interval = 0;
        self.failed.interval = 0;
        self.lost.interval = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.latency.iter().all(|(_, m)| m.total.is_empty())
            && self.refused.total == 0
            && self.failed.total == 0
            && self.lost.total == 0
    }
}

/// `name`'s entry in `map`, which keeps at most `max` names apart: past
/// that, a new name's numbers go under `other`.
pub(super) fn bounded_entry<'a, T: Default>(
    map: &'a mut BTreeMap<String, T>,
    name: &str,
    max: usize,
    other: &str,
) -> &'a mut T {
    let name = if map.len() >= max && !map.contains_key(name) {
        other
    } else {
        name
    };
    // Looked up by the name borrowed: `entry` would copy it for every
    // sample and every sum, though it is there but the first time.
    if !map.contains_key(name) {
        map.insert(name.to_string(), T::default());
    }
    map.get_mut(name).expect("inserted if missing")
}

/// What one listening socket's accepts measured: its [`Per::Listener`]
/// latencies (the others stay empty).
#[derive(Clone, Debug, Default)]
pub struct ListenerActivity {
    pub latency: Latencies<Metric>,
}

impl ListenerActivity {
    fn add(&mut self, other: &ListenerActivity, span: Span) {
        for (l, m) in self.latency.iter_mut() {
            m.add(&other.latency[l], span);
        }
    }

    fn reset_interval(&mut self) {
        for (_, m) in self.latency.iter_mut() {
            m.reset_interval();
        }
    }
}

impl Activity {
    /// Nothing recorded since the start.
    pub fn is_empty(&self) -> bool {
        self.latency.iter().all(|(_, m)| m.total.is_empty())
            && self.counts.iter().all(|(_, c)| c.total == 0)
            && self.connects.values().all(ConnectActivity::is_empty)
    }

    /// The listener `name`'s numbers (past [`MAX_LISTENERS`], those of
    /// [`OTHER_LISTENERS`]).
    fn listener(&mut self, name: &str) -> &mut ListenerActivity {
        bounded_entry(&mut self.listeners, name, MAX_LISTENERS, OTHER_LISTENERS)
    }

    /// The destination `name`'s numbers (past [`MAX_DESTINATIONS`], those
    /// of [`OTHER_DESTINATIONS`]).
    fn destination(&mut self, name: &str) -> &mut ConnectActivity {
        bounded_entry(
            &mut self.connects,
            name,
            MAX_DESTINATIONS,
            OTHER_DESTINATIONS,
        )
    }

    pub fn add(&mut self, other: &Activity, span: Span) {
        for (name, l) in &other.listeners {
            self.listener(name).add(l, span);
        }
        for (name, c) in &other.connects {
            self.destination(name).add(c, span);
        }
        for (l, m) in self.latency.iter_mut() {
            m.add(&other.latency[l], span);
        }
        for (c, n) in self.counts.iter_mut() {
            n.add_counter(&other.counts[c]);
        }
    }

    /// Empties it as `default` makes one, in place (a retired row's,
    /// kept for reuse).
    pub(super) fn clear(&mut self) {
        let Activity {
            latency,
            counts,
            listeners,
            connects,
        } = self;
        for (_, m) in latency.iter_mut() {
            *m = Metric::default();
        }
        *counts = Counts::default();
        listeners.clear();
        connects.clear();
    }

    pub(super) fn reset_interval(&mut self) {
        for (_, m) in self.latency.iter_mut() {
            m.reset_interval();
        }
        for l in self.listeners.values_mut() {
            l.reset_interval();
        }
        for c in self.connects.values_mut() {
            c.reset_interval();
        }
        for (_, c) in self.counts.iter_mut() {
            c.interval = 0;
        }
    }

    /// Records what a kernel histogram gained, where its declaration says.
    pub(super) fn record_kernel(&mut self, d: &HistDelta) {
        let listener = || d.path.as_deref().unwrap_or(UNKNOWN_LISTENER);
        let destination = || d.path.as_deref().unwrap_or(UNKNOWN_DESTINATION);
        match Feeds::of(d.metric) {
            Feeds::Latency(l) => {
                self.latency[l].record_kernel(d);
                match l.decl().per {
                    Per::Process => {}
                    // What an accept whose listener is not known (its
                    // thread was blocked in accept() at attach) measured
                    // beyond the accept itself counts for the role only.
                    Per::Listener if d.path.is_none() && l != Latency::Accept => {}
                    Per::Listener => self.listener(listener()).latency[l].record_kernel(d),
                    Per::Destination => {
                        self.destination(destination()).latency[l].record_kernel(d);
                    }
                }
            }
            Feeds::Count(c) => self.counts[c].add(d.count),
            Feeds::Destination(DestinationCount::Refused) => {
                self.destination(destination()).refused.add(d.count);
            }
            Feeds::Destination(DestinationCount::Failed) => {
                self.destination(destination()).failed.add(d.count);
            }
            Feeds::Destination(DestinationCount::Lost) => {
                self.destination(destination()).lost.add(d.count);
            }
        }
    }
}

//! Connections lost at a listener's full queue, per listener: running
//! totals the kernel keeps turned into counts per interval and since the
//! start.
//!
//! - Unix: the kernel counts the connects a full queue refused (EAGAIN)
//!   per destination path since the probes loaded ([`Gains`] keeps the
//!   last total of each; the collector matches each path to a listener).
//! - TCP: each listener's `sk_drops`, read by the walks of the sockets
//!   ([`ListenDrops`](super::sockets::ListenDrops)), which counts since the
//!   socket was made ([`ListenerLost`] takes the first walk of a namespace
//!   as the baseline).

use std::{collections::HashMap, hash::Hash};

use super::sockets::{ListenDrops, Netns};
use crate::counter::Counter;

/// What running totals gained between looks, per key.
#[derive(Clone, Debug)]
pub struct Gains<K> {
    last: HashMap<K, u64>,
}

impl<K> Default for Gains<K> {
    fn default() -> Self {
        Self {
            last: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq> Gains<K> {
    /// What `key`'s total, `now`, gained since the last look at it. A key
    /// not seen before gained all of it (its count started with the
    /// probes); a total that went down counts from 0 again (the kernel's
    /// LRU map dropped the key and counted it anew).
    pub fn gained(&mut self, key: K, now: u64) -> u64 {
        match self.last.insert(key, now) {
            Some(before) if now >= before => now - before,
            _ => now,
        }
    }

    /// Forgets the keys `keep` says no (gone from the kernel's map).
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.last.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// A TCP listener: its network namespace and socket inode.
pub type ListenerKey = (Netns, u64);

#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// `sk_drops` at the last walk.
    drops: u32,
    lost: Counter,
}

/// Each TCP listener's connections dropped at a full queue since
/// stackprobe started, from its `sk_drops` at each walk of the sockets.
#[derive(Clone, Debug, Default)]
pub struct ListenerLost {
    seen: HashMap<ListenerKey, Seen>,
    /// Namespaces a walk went through.
    walked: std::collections::HashSet<Netns>,
}

impl ListenerLost {
    /// Takes in a walk of `namespaces` that found `listeners`. A listener
    /// seen before adds what its `sk_drops` gained (it wraps at 2^32); one
    /// first found in a namespace walked before was made since then, after
    /// stackprobe started: all of its drops count; one found by the first
    /// walk of its namespace is the baseline (its drops before count not).
    /// Listeners gone from a walked namespace are forgotten.
    pub fn observe(&mut self, namespaces: &[Netns], listeners: &[ListenDrops]) {
        let walked: std::collections::HashSet<Netns> = namespaces.iter().copied().collect();
        let mut seen = HashMap::with_capacity(listeners.len());
        for l in listeners {
            let key = (l.netns, l.ino);
            let gained = match self.seen.get(&key) {
                Some(before) => l.drops.wrapping_sub(before.drops),
                None if self.walked.contains(&l.netns) => l.drops,
                None => 0,
            };
            let mut lost = self.seen.get(&key).map_or(Counter::default(), |s| s.lost);
            lost.add(u64::from(gained));
            seen.insert(
                key,
                Seen {
                    drops: l.drops,
                    lost,
                },
            );
        }
        // A namespace this walk did not go through keeps its listeners.
        for (key, s) in &self.seen {
            if !walked.contains(&key.0) {
                seen.entry(*key).or_insert(*s);
            }
        }
        self.seen = seen;
        self.walked.extend(walked);
    }

    /// The connections `listener` lost, in this interval and since the
    /// start; None for a listener no walk found.
    pub fn get(&self, listener: ListenerKey) -> Option<Counter> {
        self.seen.get(&listener).map(|s| s.lost)
    }

    /// Starts a new interval.
    pub fn reset_interval(&mut self) {
        for s in self.seen.values_mut() {
            s.lost.interval = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gains_are_differences_of_the_kernels_totals() {
        let mut g = Gains::default();
        // Counted since the probes loaded: the first look takes it all.
        assert_eq!(g.gained(7u64, 3), 3);
        assert_eq!(g.gained(7, 3), 0);
        assert_eq!(g.gained(7, 10), 7);
        // The LRU map dropped the key, which counts from 0 again.
        assert_eq!(g.gained(7, 2), 2);
        assert_eq!(g.gained(8, 1), 1);
        g.retain(|&k| k == 8);
        assert_eq!(g.len(), 1);
        assert_eq!(g.gained(7, 4), 4);
    }

    fn drops(netns: Netns, ino: u64, drops: u32) -> ListenDrops {
        ListenDrops { netns, ino, drops }
    }

    #[test]
    fn a_listeners_drops_count_from_the_first_walk_per_interval() {
        let mut t = ListenerLost::default();
        let home = [None];
        // The first walk: 40 drops before stackprobe started, not counted.
        t.observe(&home, &[drops(None, 100, 40)]);
        assert_eq!(t.get((None, 100)), Some(Counter::default()));
        assert_eq!(t.get((None, 101)), None);
        // 5 more by the next walk, then 3 in the next interval.
        t.observe(&home, &[drops(None, 100, 45)]);
        assert_eq!(
            t.get((None, 100)),
            Some(Counter {
                interval: 5,
                total: 5
            })
        );
        t.reset_interval();
        t.observe(&home, &[drops(None, 100, 48)]);
        assert_eq!(
            t.get((None, 100)),
            Some(Counter {
                interval: 3,
                total: 8
            })
        );
        // No walk in an interval: the total stays, nothing new in it.
        t.reset_interval();
        assert_eq!(
            t.get((None, 100)),
            Some(Counter {
                interval: 0,
                total: 8
            })
        );
        // The counter wraps at 2^32.
        t.observe(&home, &[drops(None, 100, u32::MAX)]);
        t.observe(&home, &[drops(None, 100, 1)]);
        assert_eq!(
            t.get((None, 100)).unwrap().total,
            8 + u64::from(u32::MAX - 48) + 2
        );
    }

    #[test]
    fn a_listener_made_after_the_start_counts_all_its_drops() {
        let mut t = ListenerLost::default();
        t.observe(&[None], &[drops(None, 100, 40)]);
        // A new listener at home: made since the last walk. A container's
        // namespace walked for the first time: its listener's drops are
        // older than what stackprobe saw, the baseline.
        t.observe(
            &[None, Some(9)],
            &[
                drops(None, 100, 40),
                drops(None, 200, 6),
                drops(Some(9), 300, 7),
            ],
        );
        assert_eq!(t.get((None, 200)).unwrap().total, 6);
        assert_eq!(t.get((Some(9), 300)).unwrap().total, 0);
        // The container's namespace not walked this time: its listener
        // stays; the closed listener at home goes.
        t.observe(&[None], &[drops(None, 200, 9)]);
        assert_eq!(t.get((None, 100)), None);
        assert_eq!(t.get((None, 200)).unwrap().total, 9);
        assert_eq!(t.get((Some(9), 300)).unwrap().total, 0);
    }
}

//! What the kernel's per-CPU latency histograms gained between reads, as
//! model events: the pure half of reading them (the map reads are the
//! probes' side), so that fixtures and tests build the very deltas a run
//! hands over.

use std::collections::HashMap;

use probes_common::{
    hist::{BUCKETS, HistKey, HistMetric, HistValue, bucket_bounds, bucket_value},
    run_queue::CHILDREN_PATH,
};

use crate::event::HistDelta;

/// One histogram summed over the CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Totals {
    pub count: u64,
    pub sum: u64,
    /// Meaningless while `count` is 0.
    pub min: u64,
    pub max: u64,
    /// Sums modulo 2^32, like the per-CPU counts they add up.
    pub buckets: Box<[u32; BUCKETS]>,
}

impl Totals {
    pub fn zero() -> Self {
        Self {
            count: 0,
            sum: 0,
            min: 0,
            max: 0,
            buckets: Box::new([0; BUCKETS]),
        }
    }

    pub fn of_cpus<'a>(values: impl IntoIterator<Item = &'a HistValue>) -> Self {
        let mut t = Self::zero();
        for v in values {
            if v.count == 0 {
                continue;
            }
            t.min = if t.count == 0 {
                v.min
            } else {
                t.min.min(v.min)
            };
            t.max = t.max.max(v.max);
            t.count += v.count;
            t.sum = t.sum.wrapping_add(v.sum);
            for (sum, &n) in t.buckets.iter_mut().zip(&v.buckets) {
                *sum = sum.wrapping_add(n);
            }
        }
        t
    }

    /// Whether every sample counted is in a bucket: the kernel counts a
    /// sample before it adds it to its bucket, and a read can fall between.
    fn settled(&self) -> bool {
        let in_buckets = self.buckets.iter().fold(0u32, |n, &b| n.wrapping_add(b));
        in_buckets == self.count as u32
    }
}

/// What a histogram gained between two reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gain {
    pub count: u64,
    pub sum: u64,
    pub min: u64,
    pub max: u64,
    /// (bucket midpoint, samples gained), lowest first.
    pub buckets: Vec<(u64, u64)>,
}

/// What `now` gained over `before` (an earlier read of the same histogram),
/// or None if nothing. Bucket counts are
/// differences modulo 2^32, and the count is theirs: a read that catches
/// the kernel between its count and its bucket gets the sample at the next
/// read, whole. The extremes of the new samples are exact when they moved
/// the extremes since the start, else taken from the lowest and highest
/// bucket that gained, within the exact extremes.
pub fn delta(before: &Totals, now: &Totals) -> Option<Gain> {
    // Compared a run of buckets at a time, and bucket by bucket only where
    // the run differs: of a histogram's 2304 buckets, a read finds a few
    // that gained (the bucket by bucket scan was 3 % of watch's CPU under
    // new.php).
    const RUN: usize = 32;
    let mut buckets: Vec<(usize, u64)> = Vec::new();
    for (r, (b, n)) in before
        .buckets
        .chunks(RUN)
        .zip(now.buckets.chunks(RUN))
        .enumerate()
    {
        if b == n {
            continue;
        }
        for (i, (&b, &n)) in b.iter().zip(n).enumerate() {
            let gained = u64::from(n.wrapping_sub(b));
            if gained > 0 {
                buckets.push((r * RUN + i, gained));
            }
        }
    }
    let (&(lowest, _), &(highest, _)) = (buckets.first()?, buckets.last()?);
    let min = if before.count == 0 || now.min < before.min {
        now.min
    } else {
        bucket_bounds(lowest).0.max(now.min)
    };
    let max = if before.count == 0 || now.max > before.max {
        now.max
    } else {
        bucket_bounds(highest).1.min(now.max)
    };
    let count = buckets.iter().map(|&(_, n)| n).sum();
    let sum = now.sum.wrapping_sub(before.sum);
    let buckets = buckets
        .into_iter()
        .map(|(i, n)| (bucket_value(i).clamp(now.min, now.max), n))
        .collect();
    Some(Gain {
        count,
        sum,
        min,
        max,
        buckets,
    })
}

/// What has been read so far, per map and histogram.
#[derive(Clone, Debug, Default)]
pub struct HistReads {
    seen: HashMap<(usize, HistKey), Seen>,
}

/// A histogram's last read.
#[derive(Clone, Debug)]
struct Seen {
    totals: Totals,
    /// `totals.settled()`, worked out once: most reads find nothing
    /// gained, and summing each one's buckets again to tell was 0.8 % of
    /// watch's CPU under new.php.
    settled: bool,
}

impl Seen {
    fn zero() -> Self {
        Self::of(Totals::zero())
    }

    fn of(totals: Totals) -> Self {
        Self {
            settled: totals.settled(),
            totals,
        }
    }
}

impl HistReads {
    /// What `key`'s histogram gained since it was last read, given its
    /// per-CPU values now; None if nothing, or for a metric this build does
    /// not know. `last`: the histogram is read for the last time and
    /// forgotten. `comm` names the process, asked only if something was
    /// gained.
    pub fn read<'a, I>(
        &mut self,
        key: HistKey,
        per_cpu: I,
        last: bool,
        comm: impl FnOnce() -> Option<String>,
    ) -> Option<HistDelta>
    where
        I: IntoIterator<Item = &'a HistValue>,
        I::IntoIter: Clone,
    {
        self.read_in(0, key, per_cpu, last, comm)
    }

    /// `read`, of the histogram in map number `map` (the kernel keeps
    /// them in more than one).
    pub fn read_in<'a, I>(
        &mut self,
        map: usize,
        key: HistKey,
        per_cpu: I,
        last: bool,
        comm: impl FnOnce() -> Option<String>,
    ) -> Option<HistDelta>
    where
        I: IntoIterator<Item = &'a HistValue>,
        I::IntoIter: Clone,
    {
        let per_cpu = per_cpu.into_iter();
        let count: u64 = per_cpu.clone().map(|v| v.count).sum();
        if !last
            && self
                .seen
                .get(&(map, key))
                .is_some_and(|s| s.totals.count == count && s.settled)
        {
            // Nothing gained since a read that caught no sample half-added.
            return None;
        }
        let now = Totals::of_cpus(per_cpu);
        let gain = if last {
            let before = self.seen.remove(&(map, key)).unwrap_or_else(Seen::zero);
            delta(&before.totals, &now)
        } else {
            let before = self.seen.entry((map, key)).or_insert_with(Seen::zero);
            let gain = delta(&before.totals, &now);
            *before = Seen::of(now);
            gain
        }?;
        let metric = HistMetric::from_u32(key.metric)?;
        Some(HistDelta {
            tgid: key.tgid,
            comm: comm(),
            path: None,
            of_children: metric.is_run_queue() && key.path == CHILDREN_PATH,
            metric,
            count: gain.count,
            sum_ns: gain.sum,
            min_ns: gain.min,
            max_ns: gain.max,
            buckets: gain.buckets,
        })
    }
}

#[cfg(test)]
mod tests {
    use probes_common::hist::bucket_of;

    use super::*;

    fn cpu(samples: &[u64]) -> HistValue {
        let mut v = HistValue::ZERO;
        for &ns in samples {
            v.record(ns);
        }
        v
    }

    #[test]
    fn the_buckets_gained_are_those_a_scan_of_each_finds() {
        // Gains in scattered buckets, at the edges of the runs compared,
        // and a count that wrapped modulo 2^32.
        let mut before = Totals::zero();
        let mut now = Totals::zero();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % BUCKETS as u64) as usize;
            before.buckets[i] = (x >> 20) as u32;
            now.buckets[i] = before.buckets[i].wrapping_add((x >> 52) as u32 % 3);
        }
        for i in [0, 31, 32, 63, BUCKETS - 1] {
            now.buckets[i] = before.buckets[i].wrapping_add(1);
        }
        before.buckets[64] = u32::MAX;
        now.buckets[64] = 1;
        (now.count, now.min, now.max) = (1, 1, u64::MAX);
        let each: Vec<(u64, u64)> = (0..BUCKETS)
            .filter_map(|i| {
                let gained = u64::from(now.buckets[i].wrapping_sub(before.buckets[i]));
                (gained > 0).then(|| (bucket_value(i).clamp(now.min, now.max), gained))
            })
            .collect();
        let gain = delta(&before, &now).unwrap();
        assert_eq!(gain.buckets, each);
        assert_eq!(gain.count, each.iter().map(|&(_, n)| n).sum::<u64>());
    }

    #[test]
    fn cpus_add_up_and_idle_ones_do_not_spoil_the_minimum() {
        let t = Totals::of_cpus(&[cpu(&[]), cpu(&[500, 9_000]), cpu(&[700])]);
        assert_eq!((t.count, t.sum, t.min, t.max), (3, 10_200, 500, 9_000));
        assert_eq!(t.buckets.iter().map(|&n| u64::from(n)).sum::<u64>(), 3);
    }

    #[test]
    fn the_first_read_gives_everything_with_exact_extremes() {
        let now = Totals::of_cpus(&[cpu(&[10, 1_000_000, 2_000_000])]);
        let Gain {
            count,
            sum,
            min,
            max,
            buckets,
        } = delta(&Totals::zero(), &now).unwrap();
        assert_eq!((count, sum, min, max), (3, 3_000_010, 10, 2_000_000));
        assert_eq!(buckets.len(), 3);
        assert_eq!(buckets[0], (10, 1), "small values are exact");
        // Each within 1/128 of its sample.
        for ((ns, n), want) in buckets[1..].iter().zip([1_000_000u64, 2_000_000]) {
            assert_eq!(*n, 1);
            assert!(ns.abs_diff(want) * 128 <= want, "{ns} for {want}");
        }
    }

    #[test]
    fn later_reads_give_only_what_was_gained() {
        let before = Totals::of_cpus(&[cpu(&[100, 5_000])]);
        let now = Totals::of_cpus(&[cpu(&[100, 5_000, 3_000, 3_001])]);
        let Gain {
            count,
            sum,
            min,
            max,
            buckets,
        } = delta(&before, &now).unwrap();
        assert_eq!((count, sum), (2, 6_001));
        // Neither extreme moved: both come from the one bucket that gained,
        // within its width of the truth.
        assert_eq!(buckets, vec![(bucket_value(bucket_of(3_000)), 2)]);
        assert!(min.abs_diff(3_000) * 64 <= 3_000 && max.abs_diff(3_001) * 64 <= 3_001);
        assert_eq!(delta(&now, &now), None, "nothing gained, nothing told");
        // A new extreme is exact.
        let later = Totals::of_cpus(&[cpu(&[100, 5_000, 3_000, 3_001, 7, 90_000])]);
        let gain = delta(&now, &later).unwrap();
        assert_eq!((gain.min, gain.max), (7, 90_000));
    }

    #[test]
    fn bucket_counts_that_wrapped_still_give_the_right_difference() {
        let mut before = Totals::zero();
        before.count = 10;
        before.min = 64;
        before.max = 64;
        before.buckets[64] = u32::MAX - 1;
        let mut now = before.clone();
        now.count = 13;
        now.buckets[64] = 1;
        let gain = delta(&before, &now).unwrap();
        assert_eq!((gain.count, gain.buckets), (3, vec![(64, 3)]));
    }

    #[test]
    fn each_read_hands_over_what_was_gained_once_and_the_last_one_forgets() {
        let key = HistKey {
            tgid: 7,
            metric: HistMetric::Fork as u32,
            path: 0,
        };
        let name = || Some("srv".to_string());
        let mut hists = HistReads::default();
        let first = hists.read(key, &[cpu(&[1_000]), cpu(&[3_000])], false, name);
        let first = first.unwrap();
        assert_eq!(
            (
                first.metric,
                first.count,
                first.sum_ns,
                first.comm.as_deref()
            ),
            (HistMetric::Fork, 2, 4_000, Some("srv"))
        );
        let cpus = [cpu(&[1_000, 5_000]), cpu(&[3_000])];
        let second = hists.read(key, &cpus, false, name).unwrap();
        assert_eq!(
            (second.count, second.sum_ns, second.max_ns),
            (1, 5_000, 5_000)
        );
        assert_eq!(hists.read(key, &cpus, false, || panic!("not asked")), None);
        // The process exited: its last read, then its pid starts afresh.
        let cpus = [cpu(&[1_000, 5_000, 9]), cpu(&[3_000])];
        assert_eq!(hists.read(key, &cpus, true, || None).unwrap().count, 1);
        let reused = hists.read(key, &[cpu(&[8])], false, name).unwrap();
        assert_eq!((reused.count, reused.min_ns), (1, 8));
        let unknown = HistKey { metric: 99, ..key };
        assert_eq!(hists.read(unknown, &[cpu(&[8])], false, name), None);
    }

    #[test]
    fn a_sample_read_half_added_is_handed_over_when_its_bucket_lands() {
        let key = HistKey {
            tgid: 7,
            metric: HistMetric::Accept as u32,
            path: 0,
        };
        let mut hists = HistReads::default();
        assert_eq!(
            hists
                .read(key, &[cpu(&[1_000])], false, || None)
                .unwrap()
                .count,
            1
        );
        // The read falls between the kernel's count and its bucket.
        let mut torn = cpu(&[1_000]);
        torn.count += 1;
        torn.sum += 2_000;
        torn.max = 2_000;
        assert_eq!(hists.read(key, &[torn], false, || None), None);
        // Same count as that read, but the bucket has landed since.
        let whole = cpu(&[1_000, 2_000]);
        let late = hists.read(key, &[whole], false, || None).unwrap();
        assert_eq!((late.count, late.max_ns), (1, 2_000));
        assert_eq!(
            hists.read(key, &[cpu(&[1_000, 2_000])], false, || None),
            None
        );
    }
}

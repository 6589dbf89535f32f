//! Latency distributions: an HdrHistogram (1 ns .. 60 s at 2 significant
//! digits: 128 buckets per power of two, twice the kernel's, so a percentile
//! is within 1/128 of the true value) plus the exact count, min, max and sum,
//! which the histogram alone would round. Three digits would only refine what
//! the kernel's buckets already rounded, at 7× the size (220 KB, not 30 KB)
//! and the time of every merge, reset and percentile.
//!
//! The HdrHistogram (~220 KB) is allocated at the first sample: most processes
//! of a forking server never accept or fork, and their rows stay small. It is
//! shared on copy and copied on write: a role's sum of one member, rebuilt
//! for every report, then costs no copy of it.

use std::sync::Arc;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency the histogram resolves; longer samples are recorded as this
/// value but still counted, and `max` keeps their exact value.
pub const HIGHEST_NS: u64 = 60_000_000_000;
pub const SIGNIFICANT_DIGITS: u8 = 2;

#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    hist: Option<Arc<Histogram<u64>>>,
    min: u64,
    max: u64,
    sum: u128,
}

/// The numbers a view shows for one distribution, all in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

/// Samples each side needs before two distributions are compared.
pub const MIN_COMPARED: u64 = 20;

impl Summary {
    /// Whether this distribution is slower than `other` beyond noise: each
    /// has at least [`MIN_COMPARED`] samples, its median is at least 1.2×
    /// the other's, and 90 % of the other's samples are below its median
    /// (p90 under it), so the two barely overlap. Run-to-run wobble on a
    /// busy machine moves a median by a few percent and leaves the bulk of
    /// two like distributions overlapping.
    pub fn clearly_slower_than(&self, other: &Summary) -> bool {
        self.count >= MIN_COMPARED
            && other.count >= MIN_COMPARED
            && self.p50_ns as f64 >= 1.2 * other.p50_ns as f64
            && other.p90_ns < self.p50_ns
    }
}

/// One row of a bpftrace-style power-of-two histogram: `[lo, hi)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Log2Bucket {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self {
            hist: None,
            min: u64::MAX,
            max: 0,
            sum: 0,
        }
    }

    /// Sum of every sample, in ns (exact).
    pub fn sum_ns(&self) -> u128 {
        self.sum
    }

    /// How many samples are at most `ns` — exact when `ns + 1` is a power
    /// of two (HdrHistogram's sub-buckets never straddle one).
    pub fn count_at_most(&self, ns: u64) -> u64 {
        self.hist.as_ref().map_or(0, |h| {
            h.iter_recorded()
                .filter(|v| h.lowest_equivalent(v.value_iterated_to()) <= ns)
                .map(|v| v.count_at_value())
                .sum()
        })
    }

    /// The HdrHistogram itself (None before the first sample), for exporters.
    pub fn hdr(&self) -> Option<&Histogram<u64>> {
        self.hist.as_deref()
    }

    /// A distribution read back from a recording: count and percentiles as
    /// recorded; min, max and mean within HdrHistogram's precision.
    pub fn from_hdr(hist: Histogram<u64>) -> Self {
        let (min, max) = if hist.is_empty() {
            (u64::MAX, 0)
        } else {
            (hist.min(), hist.max())
        };
        let sum = (hist.mean() * hist.len() as f64).round() as u128;
        Self {
            hist: Some(Arc::new(hist)),
            min,
            max,
            sum,
        }
    }

    fn hist_mut(&mut self) -> &mut Histogram<u64> {
        let hist = self.hist.get_or_insert_with(|| {
            Arc::new(
                Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
                    .expect("constant histogram bounds are valid"),
            )
        });
        Arc::make_mut(hist)
    }

    pub fn record(&mut self, ns: u64) {
        self.hist_mut().saturating_record(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        self.sum += u128::from(ns);
    }

    /// Merges samples the kernel kept in its histograms: `buckets` as
    /// (bucket midpoint, samples), with their exact sum and their min and
    /// max. The count is the buckets' total; sum, min and max stay exact
    /// (as exact as given), only percentiles take the buckets' precision.
    pub fn record_kernel(&mut self, buckets: &[(u64, u64)], sum_ns: u64, min_ns: u64, max_ns: u64) {
        if buckets.iter().all(|&(_, n)| n == 0) {
            return;
        }
        let hist = self.hist_mut();
        for &(ns, n) in buckets {
            // A kernel bucket is two of ours and its midpoint opens the upper
            // one, which reports the highest value it holds: one below, the
            // midpoint is what a percentile shows.
            let at = [ns, ns.saturating_sub(1)]
                .into_iter()
                .min_by_key(|&v| hist.highest_equivalent(v).abs_diff(ns))
                .unwrap_or(ns);
            hist.saturating_record_n(at, n);
        }
        self.min = self.min.min(min_ns);
        self.max = self.max.max(max_ns);
        self.sum += u128::from(sum_ns);
    }

    pub fn count(&self) -> u64 {
        self.hist.as_ref().map_or(0, |h| h.len())
    }

    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    pub fn add(&mut self, other: &LatencyHistogram) {
        // Adding walks every bucket of the other histogram, empty or not.
        let Some(theirs) = other.hist.as_ref().filter(|h| !h.is_empty()) else {
            return;
        };
        match &mut self.hist {
            // Shared, not copied: a role of one process, or the first member.
            None => self.hist = Some(Arc::clone(theirs)),
            Some(mine) => Arc::make_mut(mine)
                .add(theirs.as_ref())
                .expect("histograms with equal bounds always add"),
        }
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    pub fn reset(&mut self) {
        // Resetting clears every bucket: skip it when nothing was recorded,
        // and let go of a histogram shared with a sum instead.
        if let Some(h) = self.hist.as_mut().filter(|h| !h.is_empty()) {
            match Arc::get_mut(h) {
                Some(h) => h.reset(),
                None => self.hist = None,
            }
        }
        self.min = u64::MAX;
        self.max = 0;
        self.sum = 0;
    }

    /// The value at quantile `q` (0..=1), clamped to the exact min and max so a
    /// percentile never lies outside what was observed.
    pub fn quantile(&self, q: f64) -> u64 {
        match &self.hist {
            Some(h) if !h.is_empty() => h.value_at_quantile(q).clamp(self.min, self.max),
            _ => 0,
        }
    }

    pub fn summary(&self) -> Summary {
        let count = self.count();
        if count == 0 {
            return Summary::default();
        }
        Summary {
            count,
            min_ns: self.min,
            mean_ns: (self.sum / u128::from(count)) as u64,
            p50_ns: self.quantile(0.50),
            p90_ns: self.quantile(0.90),
            p99_ns: self.quantile(0.99),
            p999_ns: self.quantile(0.999),
            max_ns: self.max,
        }
    }

    /// Power-of-two buckets from the lowest to the highest non-empty one, empty
    /// ones in between included (as bpftrace prints them). HdrHistogram's
    /// sub-buckets never straddle a power of two, so these counts are exact.
    pub fn log2_buckets(&self) -> Vec<Log2Bucket> {
        let Some(hist) = self.hist.as_ref().filter(|h| !h.is_empty()) else {
            return Vec::new();
        };
        // One sum over each power of two's slice of the counts, from the
        // lowest to the highest recorded: HdrHistogram's value iterator
        // costs several times more per counter (5 % of the collector's
        // time under new.php when it was used here).
        (log2_index(hist.min())..=log2_index(hist.max()))
            .map(|i| {
                let (lo, hi) = log2_bounds(i);
                Log2Bucket {
                    lo,
                    hi,
                    count: hist.count_between(lo, hi.saturating_sub(1).max(lo)),
                }
            })
            .collect()
    }
}

/// A latency in the unit that keeps 3–4 significant digits.
pub fn duration(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.3}s", ns as f64 / 1e9),
    }
}

/// Index 0 holds the value 0; index i > 0 holds [2^(i-1), 2^i).
fn log2_index(value: u64) -> usize {
    (u64::BITS - value.leading_zeros()) as usize
}

fn log2_bounds(index: usize) -> (u64, u64) {
    match index {
        0 => (0, 1),
        64 => (1 << 63, u64::MAX),
        i => (1 << (i - 1), 1 << i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_histogram_summarises_to_zeroes() {
        let h = LatencyHistogram::new();
        assert_eq!(h.summary(), Summary::default());
        assert!(h.log2_buckets().is_empty());
    }

    #[test]
    fn kernel_buckets_keep_count_sum_min_and_max_exact() {
        let mut h = LatencyHistogram::new();
        h.record_kernel(&[], 0, 0, 0);
        assert!(h.hdr().is_none(), "nothing to merge allocates nothing");
        // 3 samples (1000, 1003, 5000) as the kernel's buckets hold them.
        h.record_kernel(&[(1_001, 2), (5_008, 1)], 7_003, 1_000, 5_000);
        h.record(2_000);
        let s = h.summary();
        assert_eq!((s.count, s.min_ns, s.max_ns), (4, 1_000, 5_000));
        assert_eq!(h.sum_ns(), 9_003);
        assert_eq!(s.mean_ns, 9_003 / 4);
        // Percentiles never leave the exact extremes, though 5008 was recorded.
        assert_eq!(s.p999_ns, 5_000);
        let mut sum = LatencyHistogram::new();
        sum.add(&h);
        assert_eq!((sum.count(), sum.summary().max_ns), (4, 5_000));
    }

    #[test]
    fn percentiles_of_one_to_thousand() {
        let mut h = LatencyHistogram::new();
        for v in 1..=1000 {
            h.record(v * 1000);
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        assert_eq!(s.min_ns, 1000);
        assert_eq!(s.max_ns, 1_000_000);
        assert_eq!(s.mean_ns, 500_500);
        // Within 1/128 of the exact order statistics.
        for (got, want) in [
            (s.p50_ns, 500_000),
            (s.p90_ns, 900_000),
            (s.p99_ns, 990_000),
            (s.p999_ns, 999_000),
        ] {
            let err = got.abs_diff(want) as f64 / want as f64;
            assert!(err <= 1.0 / 128.0, "got {got}, want {want}");
        }
    }

    #[test]
    fn percentiles_never_exceed_exact_extremes() {
        let mut h = LatencyHistogram::new();
        h.record(123_457);
        let s = h.summary();
        assert_eq!(
            (s.min_ns, s.p50_ns, s.p999_ns, s.max_ns),
            (123_457, 123_457, 123_457, 123_457)
        );
    }

    #[test]
    fn samples_beyond_the_range_are_counted_and_max_is_exact() {
        let mut h = LatencyHistogram::new();
        h.record(HIGHEST_NS * 2);
        assert_eq!(h.count(), 1);
        assert_eq!(h.summary().max_ns, HIGHEST_NS * 2);
    }

    #[test]
    fn log2_buckets_match_bpftrace_bounds() {
        let mut h = LatencyHistogram::new();
        for v in [0, 1, 3, 1023, 1024, 2047, 2048, 5000] {
            h.record(v);
        }
        let b = h.log2_buckets();
        let rows: Vec<(u64, u64, u64)> = b.iter().map(|b| (b.lo, b.hi, b.count)).collect();
        assert_eq!(
            rows,
            vec![
                (0, 1, 1),
                (1, 2, 1),
                (2, 4, 1),
                (4, 8, 0),
                (8, 16, 0),
                (16, 32, 0),
                (32, 64, 0),
                (64, 128, 0),
                (128, 256, 0),
                (256, 512, 0),
                (512, 1024, 1),
                (1024, 2048, 2),
                (2048, 4096, 1),
                (4096, 8192, 1),
            ]
        );
    }

    #[test]
    fn log2_buckets_are_exact_for_large_values() {
        let mut h = LatencyHistogram::new();
        // Both sides of 2^30 with HdrHistogram's coarse sub-buckets up there.
        h.record((1 << 30) - 1);
        h.record(1 << 30);
        let b = h.log2_buckets();
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].lo, b[0].count), (1 << 29, 1));
        assert_eq!((b[1].lo, b[1].count), (1 << 30, 1));
    }

    /// Values spread over every power of two up to 2^35 ns (34 s).
    fn any_magnitude() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::strategy::Strategy as _;
        (0u32..36).prop_flat_map(|bits| 0u64..(1u64 << bits))
    }

    proptest::proptest! {
        /// Every sample lands in the power of two its own value falls in,
        /// at any magnitude and across merges.
        #[test]
        fn log2_buckets_count_each_sample_in_its_power_of_two(
            a in proptest::collection::vec(any_magnitude(), 1..200),
            b in proptest::collection::vec(any_magnitude(), 0..50),
        ) {
            let (mut ha, mut hb) = (LatencyHistogram::new(), LatencyHistogram::new());
            a.iter().for_each(|&v| ha.record(v));
            b.iter().for_each(|&v| hb.record(v));
            ha.add(&hb);
            let mut want = std::collections::BTreeMap::new();
            for &v in a.iter().chain(&b) {
                *want.entry(log2_index(v)).or_insert(0u64) += 1;
            }
            let (first, last) = (*want.keys().next().unwrap(), *want.keys().last().unwrap());
            let got = ha.log2_buckets();
            proptest::prop_assert_eq!(got.len(), last - first + 1);
            for (i, bucket) in (first..).zip(&got) {
                proptest::prop_assert_eq!((bucket.lo, bucket.hi), log2_bounds(i));
                proptest::prop_assert_eq!(bucket.count, want.get(&i).copied().unwrap_or(0));
            }
        }
    }

    #[test]
    fn an_unused_histogram_allocates_nothing() {
        let mut h = LatencyHistogram::new();
        assert!(h.hist.is_none());
        h.add(&LatencyHistogram::new());
        h.reset();
        assert!(h.hist.is_none());
        h.record(1);
        assert!(h.hist.is_some());
    }

    #[test]
    fn add_and_reset() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record(10);
        b.record(30);
        a.add(&b);
        assert_eq!(a.summary().count, 2);
        assert_eq!(a.summary().mean_ns, 20);
        assert_eq!(a.summary().max_ns, 30);
        a.reset();
        assert!(a.is_empty());
        a.record(5);
        assert_eq!(a.summary().min_ns, 5);
    }

    #[test]
    fn a_sum_of_one_shares_its_histogram_and_neither_sees_the_others_changes() {
        let mut member = LatencyHistogram::new();
        member.record(1_000);
        let mut sum = LatencyHistogram::new();
        sum.add(&member);
        assert!(Arc::ptr_eq(
            sum.hist.as_ref().unwrap(),
            member.hist.as_ref().unwrap()
        ));
        member.record(2_000);
        assert_eq!((sum.count(), member.count()), (1, 2));
        sum.record(3_000);
        member.reset();
        assert_eq!((sum.count(), sum.summary().max_ns), (2, 3_000));
        assert!(member.is_empty());
        member.record(4_000);
        assert_eq!((sum.count(), member.count()), (2, 1));
    }

    #[test]
    fn a_kernel_bucket_reads_back_as_its_midpoint() {
        use probes_common::hist::{bucket_bounds, bucket_of, bucket_value};
        let mut checked = 0;
        for ns in (0..35)
            .map(|e| 1u64 << e)
            .flat_map(|p| [p, p + p / 3, p + p / 2 + 7])
        {
            let b = bucket_of(ns);
            let (low, high) = bucket_bounds(b);
            let mid = bucket_value(b);
            let mut h = LatencyHistogram::new();
            // The extremes are the bucket's own, so clamping does not help.
            h.record_kernel(&[(mid, 1)], mid, low, high);
            let got = h.quantile(0.5);
            assert!(
                got.abs_diff(mid) <= 1,
                "{ns} ns: bucket {low}..={high}, read back {got}"
            );
            checked += 1;
        }
        assert_eq!(checked, 105, "1 ns to 51 s, below HIGHEST_NS");
    }
}

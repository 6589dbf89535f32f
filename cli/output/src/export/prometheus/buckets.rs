//! A histogram's buckets as Prometheus takes them: classic ones at powers
//! of two, and native ones (sparse, exponential, about 1 % wide).

use std::collections::BTreeMap;

use stackprobe_model::histogram::LatencyHistogram;

/// Bucket upper bounds: 2^k − 1 ns for k = 10..=36 (1 µs .. 69 s), so that
/// "≤ le" is exact for HdrHistogram's counts.
const BUCKET_EXPONENTS: std::ops::RangeInclusive<u32> = 10..=36;

/// The native histograms' schema: bucket bounds grow by 2^(2^-6) ≈ 1.011,
/// so a bucket is about 1 % wide (stackprobe's own: 1/128).
pub(super) const NATIVE_SCHEMA: i32 = 6;

/// `h`'s classic buckets: (le in seconds, count in this bucket alone), the
/// last one +Inf; the encoder accumulates.
pub(super) fn classic(h: &LatencyHistogram) -> Vec<(f64, u64)> {
    let mut below = 0;
    let mut buckets: Vec<(f64, u64)> = BUCKET_EXPONENTS
        .map(|k| {
            let le_ns = (1u64 << k) - 1;
            let at_most = h.count_at_most(le_ns);
            let in_bucket = at_most - below;
            below = at_most;
            (le_ns as f64 / 1e9, in_bucket)
        })
        .collect();
    buckets.push((f64::INFINITY, h.count() - below));
    buckets
}

/// `h`'s native buckets: each of the HdrHistogram's buckets at the value
/// its percentiles report.
pub(super) fn native(h: &LatencyHistogram) -> NativeBuckets {
    native_buckets(h.hdr().into_iter().flat_map(|h| {
        h.iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
    }))
}

/// A native histogram's positive buckets as Prometheus encodes them: spans
/// of consecutive bucket indexes (offset from the end of the previous span,
/// length) and each bucket's count as a delta from the previous one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct NativeBuckets {
    pub spans: Vec<(i32, u32)>,
    pub deltas: Vec<i64>,
}

/// The bucket of a value of `seconds` in schema [`NATIVE_SCHEMA`]: index i
/// holds (2^((i-1)/64), 2^(i/64)].
fn native_index(seconds: f64) -> i32 {
    (seconds.log2() * f64::from(1u32 << NATIVE_SCHEMA)).ceil() as i32
}

/// Native buckets from (value in ns, samples) pairs, any order.
fn native_buckets(values: impl IntoIterator<Item = (u64, u64)>) -> NativeBuckets {
    let mut counts: BTreeMap<i32, u64> = BTreeMap::new();
    for (ns, n) in values {
        if n > 0 {
            *counts
                .entry(native_index(ns.max(1) as f64 / 1e9))
                .or_default() += n;
        }
    }
    let mut out = NativeBuckets::default();
    let (mut next, mut last) = (None::<i32>, 0u64);
    for (i, n) in counts {
        match (next, out.spans.last_mut()) {
            (Some(at), Some(span)) if at == i => span.1 += 1,
            (Some(at), _) => out.spans.push((i - at, 1)),
            (None, _) => out.spans.push((i, 1)),
        }
        out.deltas.push(n as i64 - last as i64);
        (next, last) = (Some(i + 1), n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_buckets_are_spans_of_consecutive_indexes_and_count_deltas() {
        // 1 s is the top of bucket 0 ((2^-1/64, 1] s); 1.01 s lies in bucket
        // 1 (up to 2^(1/64) ≈ 1.0109 s), 1.1 s in bucket 9.
        let b = native_buckets([
            (1_100_000_000, 1),
            (1_000_000_000, 3),
            (1_010_000_000, 2),
            (5, 0),
        ]);
        assert_eq!(b.spans, [(0, 2), (7, 1)]);
        assert_eq!(b.deltas, [3, -1, -1]);
        assert_eq!(native_buckets([]), NativeBuckets::default());
        // A bucket is about 1 % wide: 1000 ns and 1010 ns fall apart.
        let b = native_buckets([(1_000, 1), (1_011, 1)]);
        assert_eq!(b.spans.iter().map(|s| s.1).sum::<u32>(), 2);
    }
}

//! When the ring buffer is full, the latency probes fold the sample they
//! could not send into an in-kernel log-linear histogram per process and
//! metric, which userspace merges each interval: overload then costs
//! precision (a sample becomes its bucket's midpoint, within 6.25%), never
//! the count.

use crate::fork::TaskKind;

/// Per-CPU hash of [`OverflowKey`] → samples in that bucket.
pub const OVERFLOW_MAP: &str = "OVERFLOW";
/// Distinct (process, metric, bucket) triples kept; past that a folded
/// sample is lost and counted as `Stat::OverflowFull`. A process's
/// latencies typically span a few dozen buckets per metric.
pub const OVERFLOW_ENTRIES: u32 = 8192;

/// What a folded sample measured.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OverflowMetric {
    /// accept(2) latency.
    Accept = 0,
    /// Accept-queue wait of an accepted connection.
    AcceptQueue = 1,
    /// A clone that created a process.
    Fork = 2,
    /// A clone that created a thread.
    Thread = 3,
    /// A clone whose flags were not seen: counted, in bucket 0.
    ForkUnknown = 4,
    /// A failed clone: counted, in bucket 0.
    ForkFailed = 5,
}

impl OverflowMetric {
    /// The metric a clone's sample is folded under: a failed clone (`ret` a
    /// negative errno) first, then by what it created, as userspace counts
    /// the samples it receives.
    #[inline(always)]
    pub fn of_clone(ret: i64, kind: TaskKind) -> Self {
        if ret < 0 {
            return Self::ForkFailed;
        }
        match kind {
            TaskKind::Process => Self::Fork,
            TaskKind::Thread => Self::Thread,
            TaskKind::Unknown => Self::ForkUnknown,
        }
    }

    pub fn from_u16(metric: u16) -> Option<Self> {
        match metric {
            0 => Some(Self::Accept),
            1 => Some(Self::AcceptQueue),
            2 => Some(Self::Fork),
            3 => Some(Self::Thread),
            4 => Some(Self::ForkUnknown),
            5 => Some(Self::ForkFailed),
            _ => None,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OverflowKey {
    pub tgid: u32,
    /// An [`OverflowMetric`].
    pub metric: u16,
    /// See [`bucket_of`].
    pub bucket: u16,
}

crate::assert_layout!(OverflowKey, 8, { tgid: 0, metric: 4, bucket: 6 });

/// Sub-buckets per power of two: 2^3 = 8, so a bucket is at most 1/8 of its
/// lower bound wide.
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;

/// The log-linear bucket of `ns`: values below 8 have a bucket each; above,
/// each power of two is split into 8 equal buckets.
#[inline(always)]
pub fn bucket_of(ns: u64) -> u16 {
    if ns < SUB {
        return ns as u16;
    }
    let exp = log2(ns);
    let sub = (ns >> (exp - SUB_BITS)) & (SUB - 1);
    (SUB + u64::from(exp - SUB_BITS) * SUB + sub) as u16
}

/// The lowest and highest value (inclusive) that fall in `bucket`.
pub fn bucket_bounds(bucket: u16) -> (u64, u64) {
    let b = u64::from(bucket);
    if b < SUB {
        return (b, b);
    }
    let exp = (b - SUB) / SUB + u64::from(SUB_BITS);
    if exp > 63 {
        return (u64::MAX, u64::MAX);
    }
    let width = 1u64 << (exp - u64::from(SUB_BITS));
    let low = (1u64 << exp) + (b % SUB) * width;
    (low, low.saturating_add(width - 1))
}

/// The value a folded sample is recorded as: its bucket's midpoint.
pub fn bucket_value(bucket: u16) -> u64 {
    let (low, high) = bucket_bounds(bucket);
    low + (high - low) / 2
}

/// floor(log2(v)) for v > 0, by binary search: the BPF target has no
/// count-leading-zeros instruction.
#[inline(always)]
fn log2(mut v: u64) -> u32 {
    let mut exp = 0;
    for shift in [32, 16, 8, 4, 2, 1] {
        if v >> shift != 0 {
            v >>= shift;
            exp += shift;
        }
    }
    exp
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::OverflowKey {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_clones_are_told_apart_before_their_kind() {
        use OverflowMetric::*;
        assert_eq!(OverflowMetric::of_clone(-11, TaskKind::Thread), ForkFailed);
        assert_eq!(OverflowMetric::of_clone(-1, TaskKind::Unknown), ForkFailed);
        assert_eq!(OverflowMetric::of_clone(0, TaskKind::Process), Fork);
        assert_eq!(OverflowMetric::of_clone(42, TaskKind::Thread), Thread);
        assert_eq!(OverflowMetric::of_clone(42, TaskKind::Unknown), ForkUnknown);
    }

    #[test]
    fn log2_matches_leading_zeros() {
        for v in [1u64, 2, 3, 7, 8, 1000, 1 << 40, u64::MAX] {
            assert_eq!(log2(v), 63 - v.leading_zeros(), "{v}");
        }
    }

    #[test]
    fn every_value_falls_inside_its_buckets_bounds() {
        let mut values: [u64; 12] = [0, 1, 7, 8, 9, 15, 16, 1000, 65_535, 1 << 33, 0, u64::MAX];
        values[10] = 123_456_789;
        for v in values {
            let (low, high) = bucket_bounds(bucket_of(v));
            assert!(low <= v && v <= high, "{v}: [{low}, {high}]");
        }
    }

    #[test]
    fn buckets_are_contiguous_and_at_most_an_eighth_wide() {
        let mut next = 0u64;
        for b in 0..=bucket_of(u64::MAX) {
            let (low, high) = bucket_bounds(b);
            assert_eq!(
                low,
                next,
                "bucket {b} starts where {} ended",
                b.wrapping_sub(1)
            );
            assert!(high - low <= low / 8, "bucket {b} [{low}, {high}]");
            if high == u64::MAX {
                return;
            }
            next = high + 1;
        }
        panic!("the last bucket does not reach u64::MAX");
    }

    #[test]
    fn the_midpoint_is_within_a_sixteenth_of_any_value_in_the_bucket() {
        for v in [9u64, 100, 4095, 4096, 1_000_000, 987_654_321] {
            let mid = bucket_value(bucket_of(v));
            assert!(mid.abs_diff(v) * 16 <= v, "{v} → {mid}");
        }
        assert_eq!(bucket_value(bucket_of(5)), 5);
    }
}

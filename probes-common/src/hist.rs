//! Latency histograms kept in the kernel, per process and metric: the accept
//! and fork probes record every sample here instead of sending it through
//! the ring buffer, and userspace reads what changed each interval.
//!
//! Buckets are log-linear: values below 64 ns have a bucket each; above,
//! each power of two is split into 64 equal buckets, so a bucket is at most
//! 1/64 of its lower bound wide and its midpoint is within 1/128 of any
//! value in it. Count, sum, min and max are kept exactly besides.

use crate::fork::TaskKind;

/// Per-CPU hash of [`HistKey`] → [`HistValue`].
pub const HISTS_MAP: &str = "HISTS";
/// Distinct (process, metric) pairs kept. The map allocates as keys
/// appear (BPF_F_NO_PREALLOC), so memory follows the processes that accept
/// or fork; userspace removes the keys of processes that exited. Past this a
/// sample is lost and counted as `Stat::HistFull`.
pub const HIST_ENTRIES: u32 = 4096;
/// Preallocated per-CPU hash with the same keys and values, for the keys
/// HISTS could not allocate at once (its allocator keeps few values ready);
/// userspace reads both alike, and gives each key found here an entry in
/// HISTS, where the kernel looks first, within an interval or a few.
/// 64 × 9 KB per CPU.
pub const HISTS_SPARE_MAP: &str = "HISTS_SPARE";
pub const HIST_SPARE_ENTRIES: u32 = 64;

/// Sub-buckets per power of two: 2^6 = 64.
pub const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// The highest power of two with buckets of its own: values up to
/// 2^(MAX_EXP+1) - 1 ns (about 36 minutes) are resolved; longer ones go to
/// the last bucket, and count, sum and max keep them exactly.
pub const MAX_EXP: u32 = 40;
/// Buckets in a [`HistValue`].
pub const BUCKETS: usize = (SUB + (MAX_EXP - SUB_BITS + 1) as u64 * SUB) as usize;

/// What a histogram measures.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HistMetric {
    /// accept(2) latency.
    Accept = 0,
    /// Accept-queue wait of an accepted connection.
    AcceptQueue = 1,
    /// A clone that created a process.
    Fork = 2,
    /// A clone that created a thread.
    Thread = 3,
    /// A clone whose flags were not seen: only its count matters.
    ForkUnknown = 4,
    /// A failed clone: only its count matters.
    ForkFailed = 5,
    /// Accepts whose start was not seen (the thread was already blocked in
    /// accept() when the probes attached): counted, with no latency. Their
    /// samples are recorded as 0 ns; only the count means anything.
    AcceptUntimed = 6,
    /// A connect that succeeded: TCP, from SYN to ESTABLISHED; unix, the
    /// syscall.
    Connect = 7,
    /// A connect refused (ECONNREFUSED): only its count matters.
    ConnectRefused = 8,
    /// A connect that failed otherwise (timed out, unreachable, no such
    /// socket file, closed before it completed): only
    /// its count matters.
    ConnectFailed = 9,
    /// A non-blocking accept that found no connection waiting (EAGAIN):
    /// only its count matters.
    AcceptEmpty = 10,
    /// A unix connect a full listener queue refused (EAGAIN): only its
    /// count matters.
    ConnectLost = 11,
    /// How long a server held a connection it accepted: accept to its end
    /// (see [`crate::service`]).
    Service = 12,
    /// How long a client held a TCP connection it opened: its SYN to its
    /// first FIN or a reset, by destination.
    Held = 13,
    /// How long a watched thread was runnable before it ran (see
    /// [`crate::run_queue`]).
    RunQueue = 14,
    /// How long a watched thread ran, from a switch-in to its switch-out.
    OnCpu = 15,
    /// A switch-out of a watched thread that was still runnable
    /// (involuntary): only its count matters.
    Preempted = 16,
}

impl HistMetric {
    pub const ALL: [HistMetric; 17] = [
        Self::Accept,
        Self::AcceptQueue,
        Self::Fork,
        Self::Thread,
        Self::ForkUnknown,
        Self::ForkFailed,
        Self::AcceptUntimed,
        Self::Connect,
        Self::ConnectRefused,
        Self::ConnectFailed,
        Self::AcceptEmpty,
        Self::ConnectLost,
        Self::Service,
        Self::Held,
        Self::RunQueue,
        Self::OnCpu,
        Self::Preempted,
    ];

    /// The metric a clone's sample goes under: a failed clone (`ret` a
    /// negative errno) first, then by what it created.
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

    /// Whether the samples are connects (their path is a destination).
    pub fn is_connect(self) -> bool {
        matches!(
            self,
            Self::Connect
                | Self::ConnectRefused
                | Self::ConnectFailed
                | Self::ConnectLost
                | Self::Held
        )
    }

    /// Whether the samples are the run-queue probe's (their path says
    /// whose process they are, see run_queue::CHILDREN_PATH).
    pub fn is_run_queue(self) -> bool {
        matches!(self, Self::RunQueue | Self::OnCpu | Self::Preempted)
    }

    pub fn from_u32(metric: u32) -> Option<Self> {
        Self::ALL.get(metric as usize).copied()
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HistKey {
    pub tgid: u32,
    /// A [`HistMetric`].
    pub metric: u32,
    /// Which path the samples took: for accept metrics, the fd of the
    /// listening socket accepted from, plus one (0: not known), which
    /// userspace names from the process's fd table; for connect metrics,
    /// the destination's id (see [`crate::connect`]), which
    /// the kernel names; 0 for every other metric. A listener's samples
    /// the state probe's nested copy takes carry [`LISTENER_NESTED`] too.
    pub path: u64,
}

/// Set in a listener path by the state probe's nested copy, whose samples
/// must not share a histogram with the copy it interrupts (see the probe):
/// userspace names both alike.
pub const LISTENER_NESTED: u64 = 1 << 32;

crate::assert_layout!(HistKey, 16, { tgid: 0, metric: 4, path: 8 });

/// One CPU's share of a histogram. Bucket counts are u32 and may wrap:
/// userspace takes differences modulo 2^32 between reads, which is exact as
/// long as no bucket gains 2^32 samples on one CPU between two reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HistValue {
    pub count: u64,
    /// Sum of the samples in ns (wraps after 584 years of latency).
    pub sum: u64,
    /// Smallest and largest sample; `min` is meaningless while `count` is 0.
    pub min: u64,
    pub max: u64,
    pub buckets: [u32; BUCKETS],
}

crate::assert_layout!(HistValue, 32 + 4 * BUCKETS, {
    count: 0, sum: 8, min: 16, max: 24, buckets: 32,
});

// The kernel refuses per-CPU values over 32 KB.
const _: () = assert!(core::mem::size_of::<HistValue>() <= 32 * 1024);

impl HistValue {
    pub const ZERO: Self = Self {
        count: 0,
        sum: 0,
        min: 0,
        max: 0,
        buckets: [0; BUCKETS],
    };

    /// Adds one sample of `ns`: what the kernel does to its CPU's value, and
    /// what userspace's tests and benchmarks do to make what it would.
    #[inline(always)]
    pub fn record(&mut self, ns: u64) {
        if self.count == 0 || ns < self.min {
            self.min = ns;
        }
        if ns > self.max {
            self.max = ns;
        }
        self.count += 1;
        self.sum = self.sum.wrapping_add(ns);
        // bucket_of is below BUCKETS by construction; the mask-free check
        // keeps the verifier sure of it too.
        if let Some(bucket) = self.buckets.get_mut(bucket_of(ns).min(BUCKETS - 1)) {
            *bucket = bucket.wrapping_add(1);
        }
    }
}

/// The bucket of `ns`; values past the last bucket's range clamp to it.
#[inline(always)]
pub fn bucket_of(ns: u64) -> usize {
    if ns < SUB {
        return ns as usize;
    }
    let exp = log2(ns);
    if exp > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (ns >> (exp - SUB_BITS)) & (SUB - 1);
    (SUB + u64::from(exp - SUB_BITS) * SUB + sub) as usize
}

/// The lowest and highest value (inclusive) of `bucket`'s own range (the
/// last bucket also holds every longer value).
pub fn bucket_bounds(bucket: usize) -> (u64, u64) {
    let b = bucket as u64;
    if b < SUB {
        return (b, b);
    }
    let exp = (b - SUB) / SUB + u64::from(SUB_BITS);
    let width = 1u64 << (exp - u64::from(SUB_BITS));
    let low = (1u64 << exp) + (b % SUB) * width;
    (low, low + (width - 1))
}

/// The value a sample in `bucket` is taken as: the bucket's midpoint.
pub fn bucket_value(bucket: usize) -> u64 {
    let (low, high) = bucket_bounds(bucket);
    low + (high - low).div_ceil(2)
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
    unsafe impl aya::Pod for super::HistKey {}
    unsafe impl aya::Pod for super::HistValue {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_clones_are_told_apart_before_their_kind() {
        use HistMetric::*;
        assert_eq!(HistMetric::of_clone(-11, TaskKind::Thread), ForkFailed);
        assert_eq!(HistMetric::of_clone(-1, TaskKind::Unknown), ForkFailed);
        assert_eq!(HistMetric::of_clone(0, TaskKind::Process), Fork);
        assert_eq!(HistMetric::of_clone(42, TaskKind::Thread), Thread);
        assert_eq!(HistMetric::of_clone(42, TaskKind::Unknown), ForkUnknown);
    }

    #[test]
    fn metrics_round_trip_through_their_number() {
        for m in HistMetric::ALL {
            assert_eq!(HistMetric::from_u32(m as u32), Some(m));
        }
        assert_eq!(HistMetric::from_u32(HistMetric::ALL.len() as u32), None);
    }

    #[test]
    fn log2_matches_leading_zeros() {
        for v in [1u64, 2, 3, 7, 8, 63, 64, 1000, 1 << 40, u64::MAX] {
            assert_eq!(log2(v), 63 - v.leading_zeros(), "{v}");
        }
    }

    #[test]
    fn the_value_fits_a_per_cpu_map_and_covers_2_to_the_40() {
        assert_eq!(BUCKETS, 2304);
        assert_eq!(size_of::<HistValue>(), 9248);
        let (_, high) = bucket_bounds(BUCKETS - 1);
        assert_eq!(high, (1 << 41) - 1);
    }

    #[test]
    fn buckets_are_contiguous_monotonic_and_at_most_a_64th_wide() {
        let mut next = 0u64;
        for b in 0..BUCKETS {
            let (low, high) = bucket_bounds(b);
            assert_eq!(low, next, "bucket {b} starts where the one before ended");
            assert!(low <= high);
            assert!((high - low) * 64 <= low, "bucket {b} [{low}, {high}]");
            // Both ends of every bucket map back to it.
            assert_eq!((bucket_of(low), bucket_of(high)), (b, b), "[{low}, {high}]");
            next = high + 1;
        }
    }

    #[test]
    fn the_midpoint_is_within_a_128th_of_any_value_in_the_bucket() {
        for b in 0..BUCKETS {
            let (low, high) = bucket_bounds(b);
            let mid = bucket_value(b);
            assert!(low <= mid && mid <= high);
            // The farthest values are the bucket's ends.
            for v in [low, high] {
                assert!(mid.abs_diff(v) * 128 <= v, "bucket {b}: {v} → {mid}");
            }
        }
    }

    #[test]
    fn edges_fall_where_they_should() {
        for v in 0..64u64 {
            assert_eq!(bucket_of(v), v as usize);
            assert_eq!(bucket_value(v as usize), v, "small values are exact");
        }
        assert_eq!(bucket_of(64), 64);
        assert_eq!(bucket_of(127), 127);
        assert_eq!(bucket_of(128), 128);
        assert_eq!(bucket_of(129), 128, "128 and 129 share a 2-wide bucket");
        for k in 7..=MAX_EXP {
            let p = 1u64 << k;
            assert_eq!(bucket_of(p) - bucket_of(p - 1), 1, "2^{k}");
            assert_eq!(bucket_bounds(bucket_of(p)).0, p, "2^{k} starts a bucket");
            assert_eq!(bucket_of(p + 1), bucket_of(p), "2^{k}+1");
        }
        // Past the range: clamped to the last bucket, still counted.
        for v in [1u64 << 41, (1 << 41) + 1, 1 << 63, u64::MAX] {
            assert_eq!(bucket_of(v), BUCKETS - 1, "{v}");
        }
        assert_eq!(bucket_of((1 << 41) - 1), BUCKETS - 1);
    }
}

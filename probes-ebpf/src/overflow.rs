//! Where latency samples go when the ring buffer is full (see
//! probes_common::overflow): counted per process, metric and log-linear
//! bucket, so the count survives an overload.

use aya_ebpf::{bindings::BPF_NOEXIST, macros::map, maps::PerCpuHashMap};
use aya_log_ebpf::debug;
use probes_common::{
    overflow::{OVERFLOW_ENTRIES, OverflowKey, OverflowMetric, bucket_of},
    stats::Stat,
};

use crate::events;

#[map]
static OVERFLOW: PerCpuHashMap<OverflowKey, u64> =
    PerCpuHashMap::with_max_entries(OVERFLOW_ENTRIES, 0);

/// Adds one sample of `ns` to `tgid`'s `metric`.
pub fn fold(tgid: u32, metric: OverflowMetric, ns: u64) {
    let key = OverflowKey {
        tgid,
        metric: metric as u16,
        bucket: bucket_of(ns),
    };
    if let Some(n) = OVERFLOW.get_ptr_mut(key) {
        // SAFETY: the pointer is this CPU's copy of the value, in the map's
        // preallocated memory; the probes do not nest on one CPU, so nothing
        // else writes it meanwhile. Userspace deletes a key only once its
        // process has exited and so can fold nothing more.
        unsafe { *n += 1 };
        return;
    }
    // A new key starts at 1 on this CPU (0 on the others); if another CPU
    // created it meanwhile, ours is there now too.
    if OVERFLOW.insert(key, 1, u64::from(BPF_NOEXIST)).is_ok() {
        return;
    }
    match OVERFLOW.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(n) => unsafe { *n += 1 },
        None => {
            events::count(Stat::OverflowFull);
            debug!(
                &(),
                "OVERFLOW map full: a sample of {} could not be folded", tgid
            );
        }
    }
}

//! Latency histograms per process and metric (see probes_common::hist):
//! every accept and clone sample is recorded here, in place, so no sample
//! crosses to userspace one by one and none can be lost to a full ring.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap},
};
use aya_log_ebpf::debug;
use probes_common::{
    hist::{HIST_ENTRIES, HIST_SPARE_ENTRIES, HistKey, HistMetric, HistValue},
    stats::Stat,
};

use crate::events;

#[map]
static HISTS: PerCpuHashMap<HistKey, HistValue> =
    PerCpuHashMap::with_max_entries(HIST_ENTRIES, BPF_F_NO_PREALLOC);

/// Preallocated, so an insert never needs memory: it takes the keys HISTS
/// could not allocate. HISTS's per-CPU allocator keeps only one to three
/// values ready per CPU and refills later, so a burst of new keys (the
/// workers a load wakes, accepting at once) can find it empty.
#[map]
static HISTS_SPARE: PerCpuHashMap<HistKey, HistValue> =
    PerCpuHashMap::with_max_entries(HIST_SPARE_ENTRIES, 0);

/// Never written: the zeroed value a new key starts from.
#[map]
static HIST_ZERO: PerCpuArray<HistValue> = PerCpuArray::with_max_entries(1, 0);

/// Adds one sample of `ns` to `tgid`'s `metric` (by `path`, see
/// [`HistKey::path`]).
///
/// The hot path is a lookup and plain stores into this CPU's value: a hash
/// lookup takes no lock (only inserts and deletes take the bucket lock, and
/// an insert happens once per key). Plain stores suffice because the value
/// is this CPU's alone and a program cannot run twice at once on one CPU
/// (classic tracepoints and kprobes share a per-CPU guard, tp_btf/fentry
/// programs have one each); a reader on another CPU may see a sample half
/// recorded, which the next read completes.
#[inline(always)]
pub fn record(tgid: u32, metric: HistMetric, path: u64, ns: u64) {
    let key = HistKey {
        tgid,
        metric: metric as u32,
        path,
    };
    let value = match HISTS
        .get_ptr_mut(key)
        .or_else(|| HISTS_SPARE.get_ptr_mut(key))
    {
        Some(value) => value,
        None => {
            let Some(zero) = HIST_ZERO.get(0) else {
                return;
            };
            // Another CPU may create the key meanwhile: either way it
            // exists after this, unless both maps are out of room.
            let _ = HISTS.insert(key, zero, u64::from(BPF_NOEXIST));
            match HISTS.get_ptr_mut(key).or_else(|| {
                let _ = HISTS_SPARE.insert(key, zero, u64::from(BPF_NOEXIST));
                HISTS_SPARE.get_ptr_mut(key)
            }) {
                Some(value) => value,
                None => {
                    events::count(Stat::HistFull);
                    debug!(
                        &(),
                        "HISTS and HISTS_SPARE full: a sample of {} could not be recorded", tgid
                    );
                    return;
                }
            }
        }
    };
    // SAFETY: the pointer is to this CPU's value of a live map entry, which
    // nothing else writes while this program runs on this CPU (see above);
    // the entry may be deleted by userspace, but its memory stays valid
    // until this program ends (RCU).
    unsafe { &mut *value }.record(ns);
}

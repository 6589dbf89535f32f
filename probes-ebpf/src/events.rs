//! The ring buffer every probe writes to, and the drop counters.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{PerCpuArray, RingBuf, ring_buf::RingBufEntry},
};
use probes_common::{
    event::{EVENTS_RING_BYTES, EVENTS_WAKEUP_BYTES},
    stats::{Counters, Stat},
};

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

#[map]
static STATS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(1, 0);

pub fn count(stat: Stat) {
    if let Some(counters) = STATS.get_ptr_mut(0) {
        // SAFETY: the pointer is this CPU's copy of the array's value, which
        // lives as long as the map. The probes do not nest on one CPU (the
        // kernel skips a program that would, counting a recursion miss), so
        // nothing else writes it meanwhile: no atomics needed.
        if let Some(n) = unsafe { (*counters).by_stat.get_mut(stat as usize) } {
            *n += 1;
        }
    }
}

/// Reserves room for one event, counting a drop under `lost` (the event's
/// kind) when the ring is full.
pub fn reserve<T: 'static>(lost: Stat) -> Option<RingBufEntry<T>> {
    let entry = EVENTS.reserve::<T>(0);
    if entry.is_none() {
        count(lost);
    }
    entry
}

/// Submits without a wakeup unless the consumer has fallen behind: a wakeup per
/// event would cost microseconds per accept.
pub fn submit<T>(entry: RingBufEntry<T>) {
    let flags = if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= EVENTS_WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(flags as u64);
}

//! The watch set (see probes_common::watch): one byte per pid, which every
//! probe reads first (an inlined array load is all an unwatched process
//! costs) and the lifecycle programs in watch.rs keep.

use aya_ebpf::{bindings::BPF_F_MMAPABLE, macros::map, maps::Array};
use aya_log_ebpf::debug;
use probes_common::{
    stats::Stat,
    watch::{PIDS_PER_CHUNK, WATCHED_DEFAULT_CHUNKS, WatchChunk, WatchReason},
};

use crate::events;

#[map]
static WATCHED: Array<WatchChunk> = Array::with_max_entries(WATCHED_DEFAULT_CHUNKS, BPF_F_MMAPABLE);

/// The byte for `pid`, or None past the array (pid_max raised after load).
#[inline(always)]
fn byte(pid: u32) -> Option<*mut u8> {
    let chunk = WATCHED.get_ptr_mut(pid / PIDS_PER_CHUNK as u32)?;
    // SAFETY: the offset is below PIDS_PER_CHUNK, the size of the chunk the
    // pointer is to, so the result stays inside that array value.
    Some(unsafe { chunk.cast::<u8>().add(pid as usize % PIDS_PER_CHUNK) })
}

#[inline(always)]
pub fn is_watched(tgid: u32) -> bool {
    // SAFETY: `byte` points into an array value, which lives as long as the
    // map; bytes are read and written whole (userspace maps the array and
    // does the same), so a read never sees a torn value.
    byte(tgid).is_some_and(|b| unsafe { *b } != 0)
}

/// Whether `tgid` is watched because a watched process forked it (see
/// [`WatchReason::Forked`]).
#[inline(always)]
pub fn is_forked(tgid: u32) -> bool {
    // SAFETY: as in `is_watched`.
    byte(tgid).is_some_and(|b| unsafe { *b } == WatchReason::Forked as u8)
}

/// Adds `pid` to the set, or counts it as a drop if it lies past the set.
pub fn watch(pid: u32, reason: WatchReason) {
    match byte(pid) {
        // SAFETY: as in `is_watched`; a single byte store.
        Some(b) => unsafe { *b = reason as u8 },
        None => {
            events::count(Stat::WatchOutOfRange);
            debug!(
                &(),
                "pid {} lies beyond the watch set (pid_max raised after load): not watched", pid
            );
        }
    }
}

/// Removes `pid` from the set; returns whether it was in it.
#[inline(always)]
pub fn forget(pid: u32) -> bool {
    let Some(b) = byte(pid) else {
        return false;
    };
    // SAFETY: as in `is_watched`. Read before the store: this runs at every
    // exit on the machine, and most bytes are already 0.
    if unsafe { *b } == 0 {
        return false;
    }
    // SAFETY: as in `is_watched`; a single byte store.
    unsafe { *b = 0 };
    true
}

//! The watched processes' sockets the state probe follows, by address: the
//! link each counts on, who closed it first, and, for a connection arriving
//! at a watched listener, when its handshake completed (the accept probe
//! takes that for the accept-queue wait). One record per socket, inserted
//! once and removed when it closes.

use aya_ebpf::{macros::map, maps::HashMap};
use aya_log_ebpf::debug;
use probes_common::{
    sock::{TRACKED_MAX_ENTRIES, TrackedSocket},
    stats::Stat,
};

use crate::events;

/// A plain hash, not an LRU one: every entry goes when its socket closes,
/// and an LRU insert rotates its lists under a lock.
#[map]
static TRACKED: HashMap<u64, TrackedSocket> = HashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

/// The record of the socket at `sk`, if it is followed.
///
/// The map is preallocated, so the pointer stays inside the map's memory
/// for the program's life even if the entry is deleted and its element
/// reused meanwhile: at worst a read or write lands on another watched
/// socket's record.
#[inline(always)]
pub fn get(sk: u64) -> Option<*mut TrackedSocket> {
    TRACKED.get_ptr_mut(sk)
}

/// Starts following the socket at `sk` (a failure counted, never silent).
#[inline(always)]
pub fn insert(sk: u64, entry: &TrackedSocket) {
    if TRACKED.insert(sk, entry, 0).is_err() {
        // Full: as many watched sockets open at once as the map holds.
        events::count(Stat::TrackedInsertFailed);
        debug!(
            &(),
            "TRACKED: socket {:x} of {} not recorded", sk, entry.owner
        );
    }
}

#[inline(always)]
pub fn remove(sk: u64) {
    let _ = TRACKED.remove(sk);
}

/// When the socket at `sk` entered its listener's accept queue, if seen;
/// taken once (the accept).
#[inline(always)]
pub fn take_established(sk: u64) -> Option<u64> {
    take_since(get(sk)?)
}

/// The entry's `since_ns` (see [`TrackedSocket::since_ns`]), if set; taken
/// once.
#[inline(always)]
pub fn take_since(entry: *mut TrackedSocket) -> Option<u64> {
    // SAFETY: see `get`; a reused node at worst loses that socket's time,
    // which then reads as not seen.
    let at = unsafe { core::mem::replace(&mut (*entry).since_ns, 0) };
    (at != 0).then_some(at)
}

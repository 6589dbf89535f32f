//! When connections to watched listeners completed their handshake, by
//! socket: the state probe (sock.rs) notes it, the accept probe takes it to
//! compute the accept-queue wait.

use aya_ebpf::{macros::map, maps::LruHashMap};
use aya_log_ebpf::debug;
use probes_common::{sock::TRACKED_MAX_ENTRIES, stats::Stat};

use crate::events;

#[map]
static ESTABLISHED_AT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

/// Notes that `sk` entered its listener's accept queue at `ts_ns`.
#[inline(always)]
pub fn note(sk: u64, ts_ns: u64) {
    if let Err(error) = ESTABLISHED_AT.insert(sk, ts_ns, 0) {
        // An LRU map evicts to make room: this fails only when the kernel
        // found no free node (contention across CPUs).
        events::count(Stat::HandshakeInsertFailed);
        debug!(
            &(),
            "ESTABLISHED_AT: socket {:x} not recorded (error {}): its accept-queue wait is lost",
            sk,
            error
        );
    }
}

/// When `sk` entered its listener's accept queue, if seen; forgets it.
#[inline(always)]
pub fn take(sk: u64) -> Option<u64> {
    let at = ESTABLISHED_AT.get_ptr_mut(sk)?;
    // Zeroed, not removed: an LRU delete costs more than the rest of the
    // accept probe, and a zero reads as "not seen" just like a missing key.
    // SAFETY: LRU maps are preallocated, so the pointer stays inside the
    // map's memory for the program's life. If the entry is deleted meanwhile
    // (the socket closed) and its node reused for another socket, this zeroes
    // that socket's time, which then reads as not seen: a lost accept-queue
    // wait, never a write outside the map.
    let value = unsafe { core::mem::replace(&mut *at, 0) };
    (value != 0).then_some(value)
}

/// Forgets `sk` (it closed), if its time is still there: one taken by an
/// accept is zero already and reads as not seen, and an LRU delete costs
/// several lookups (the entry then ages out).
#[inline(always)]
pub fn forget(sk: u64) {
    // SAFETY: as in `take`; copied out at once.
    let seen = unsafe { ESTABLISHED_AT.get(sk) }.is_some_and(|&at| at != 0);
    if seen {
        let _ = ESTABLISHED_AT.remove(sk);
    }
}

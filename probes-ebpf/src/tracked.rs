//! The watched processes' sockets the state probe follows, by address: the
//! link each counts on, who closed it first, and, for a connection arriving
//! at a watched listener, when its handshake completed (the accept probe
//! takes that for the accept-queue wait). One record per socket, inserted
//! once and removed when it closes.
//!
//! A record lives in the one slot of an array its address picks, a cache
//! line: following a socket in a hash map cost its bucket's line and its
//! element's, each a likely miss (another CPU wrote them, or the stack's
//! own work evicted them between a connection's changes), plus a lock and
//! a free list for every insert and delete: half of the state probe's time.
//! A socket whose slot another socket holds goes to the hash map, which
//! lookups ask only while it holds something.
//!
//! Two CPUs may open sockets of one slot at once, and the verifier offers
//! no compare-and-swap on every kernel we load on, only an atomic add: a
//! claimer adds 1 to the slot's `claims` and holds the slot if it then reads
//! 1 (no one else holds or is claiming it), else takes its 1 back. Whoever
//! reads 1 after its own add is alone, so at most one holds a slot; two
//! racing claimers may both back off, to the hash map, which is no loss.

use core::ptr::NonNull;

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, HashMap},
};
use aya_log_ebpf::debug;
use probes_common::{
    sock::{TRACKED_MAX_ENTRIES, TRACKED_SLOT_COUNT, TrackedSlot, TrackedSocket},
    stats::Stat,
};

use crate::{atomic, events};

/// Mappable only for its layout: such an array's values start on a page,
/// so each slot is one whole line (a plain array's start 16 bytes into
/// one, and each slot then spans two).
#[map]
static TRACKED_SLOTS: Array<TrackedSlot> =
    Array::with_max_entries(TRACKED_SLOT_COUNT, BPF_F_MMAPABLE);

/// A plain hash, not an LRU one: every entry goes when its socket closes,
/// and an LRU insert rotates its lists under a lock.
#[map]
static TRACKED: HashMap<u64, TrackedSocket> = HashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

/// How many sockets [`TRACKED`] holds: while none, a socket not in its slot
/// is not followed, with no hash lookup to say so.
#[map]
static TRACKED_SPILLED: Array<u64> = Array::with_max_entries(1, 0);

const _: () = assert!(TRACKED_SLOT_COUNT.is_power_of_two());

/// The slot of the socket at `sk`. Sockets are slab objects of a few
/// hundred bytes or more: the address's low bits say little, so it is mixed.
#[inline(always)]
fn slot(sk: u64) -> Option<*mut TrackedSlot> {
    let index = ((sk >> 6).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        >> (64 - TRACKED_SLOT_COUNT.trailing_zeros())) as u32;
    TRACKED_SLOTS.get_ptr_mut(index)
}

/// The count of sockets in [`TRACKED`], null if the array cannot be read.
#[inline(always)]
fn spilled() -> *mut u64 {
    TRACKED_SPILLED
        .get_ptr_mut(0)
        .unwrap_or(core::ptr::null_mut())
}

/// Whether [`TRACKED`] holds any socket: if not, no hash lookup is needed.
#[inline(always)]
fn any_spilled(spilled: *mut u64) -> bool {
    // SAFETY: a word of a one-entry array, which lives as long as the map,
    // read whole.
    !spilled.is_null() && unsafe { core::ptr::read_volatile(spilled) } != 0
}

/// Adds `n` to the counter at `p` (a slot's claims, or the spill count),
/// if it could be had.
#[inline(always)]
fn add(p: *mut u64, n: u64) {
    if !p.is_null() {
        // SAFETY: a word of a map value, which lives as long as the map;
        // every writer of these words adds atomically.
        unsafe { atomic::add(p, n) };
    }
}

/// The record of the socket at `sk`, if it is followed. A `NonNull`: its
/// `None` is a null pointer, where an `Option` of a raw pointer leaves an
/// undefined payload that LLVM may spill and the verifier then refuses.
///
/// Slots and the hash map are preallocated, so the pointer stays inside a
/// map's memory for the program's life even if the socket closes and its
/// place is reused meanwhile: at worst a read or write lands on another
/// watched socket's record.
#[inline(always)]
pub fn get(sk: u64) -> Option<NonNull<TrackedSocket>> {
    let s = slot(sk)?;
    // SAFETY: a value of a preallocated array (see above); read whole.
    unsafe {
        if (*s).sk == sk {
            return NonNull::new(&raw mut (*s).socket);
        }
    }
    if !any_spilled(spilled()) {
        return None;
    }
    TRACKED.get_ptr_mut(sk).and_then(NonNull::new)
}

/// Starts following the socket at `sk` (a failure counted, never silent).
/// A slot still holding `sk` is a closed socket's whose close went unseen
/// (the kernel reuses the memory at once): the new socket takes it over.
#[inline(always)]
pub fn insert(sk: u64, entry: &TrackedSocket) {
    let Some(s) = slot(sk) else {
        return;
    };
    // SAFETY: a value of a preallocated array; `claims` only ever changes
    // by atomic adds, and the fields are written only by the slot's holder.
    unsafe {
        if (*s).sk == sk || claim(s) {
            (*s).socket = *entry;
            (*s).sk = sk;
            return;
        }
    }
    if TRACKED.insert(sk, entry, 0).is_ok() {
        add(spilled(), 1);
    } else {
        // Full: as many watched sockets open at once as the maps hold.
        events::count(Stat::TrackedInsertFailed);
        debug!(
            &(),
            "TRACKED: socket {:x} of {} not recorded", sk, entry.owner
        );
    }
}

/// Whether this CPU now holds the free slot at `s`, a slot of the array.
#[inline(always)]
fn claim(s: *mut TrackedSlot) -> bool {
    // SAFETY: `s` is a slot of the array (see `insert`); `claims` is read
    // whole and changed only by atomic adds.
    let claims = unsafe { &raw mut (*s).claims };
    let read = || unsafe { core::ptr::read_volatile(claims) };
    // A held slot is the common case of a taken one: no atomic for it.
    if read() != 0 {
        return false;
    }
    add(claims, 1);
    if read() == 1 {
        return true;
    }
    add(claims, u64::MAX);
    false
}

#[inline(always)]
pub fn remove(sk: u64) {
    if let Some(s) = slot(sk) {
        // SAFETY: see `insert`; the holder frees its slot, sk first, so
        // that no lookup finds it half reused.
        unsafe {
            if (*s).sk == sk {
                (*s).sk = 0;
                add(&raw mut (*s).claims, u64::MAX);
                return;
            }
        }
    }
    let spilled = spilled();
    if any_spilled(spilled) && TRACKED.remove(sk).is_ok() {
        add(spilled, u64::MAX);
    }
}

/// The entry's `since_ns` (see [`TrackedSocket::since_ns`]), if set; taken
/// once.
#[inline(always)]
pub fn take_since(entry: NonNull<TrackedSocket>) -> Option<u64> {
    // SAFETY: see `get`; a reused node at worst loses that socket's time,
    // which then reads as not seen.
    let at = unsafe { core::mem::replace(&mut (*entry.as_ptr()).since_ns, 0) };
    (at != 0).then_some(at)
}

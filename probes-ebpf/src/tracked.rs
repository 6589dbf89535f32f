//! Where the state probe keeps each watched socket's entry (who owns it,
//! who closed it first): in the socket itself, as socket local storage,
//! when the hook hands over a pointer the verifier trusts (tp_btf); else in
//! TRACKED, a hash keyed by the socket's address (the classic tracepoint).
//!
//! Socket storage is one pointer walk from the socket, takes no hash
//! bucket or LRU lock, and the kernel frees it with the socket; an LRU
//! insert and delete per socket were most of the tp_btf program's cost.

use core::ptr;

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    btf_maps::SkStorage,
    helpers::generated::bpf_sk_storage_get,
    macros::{btf_map, map},
    maps::LruHashMap,
};
use probes_common::sock::{TRACKED_MAX_ENTRIES, TrackedSocket};

/// Entries of sockets a classic-tracepoint run saw, by address.
#[map]
static TRACKED: LruHashMap<u64, TrackedSocket> =
    LruHashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

/// Entries of sockets a tp_btf run saw, in the sockets themselves. Not
/// BPF_F_CLONE: a connection a listener accepts starts without one.
#[btf_map]
static SK_TRACKED: SkStorage<TrackedSocket> = SkStorage::new();

/// A socket's entry, wherever it lives.
pub trait Entries {
    /// The entry of the socket at `sk`, if it is followed.
    fn get(&self, sk: u64) -> Option<*mut TrackedSocket>;
    /// Starts following the socket at `sk`; false if the kernel had no room.
    fn create(&self, sk: u64, entry: TrackedSocket) -> bool;
    /// Stops following the socket at `sk` (it closed), whose entry is at
    /// `at`.
    fn forget(&self, sk: u64, at: *mut TrackedSocket);
}

/// TRACKED, for the classic tracepoint: its socket address is a plain
/// number the verifier cannot let a helper dereference.
pub struct ByAddress;

impl Entries for ByAddress {
    #[inline(always)]
    fn get(&self, sk: u64) -> Option<*mut TrackedSocket> {
        TRACKED.get_ptr_mut(sk)
    }

    #[inline(always)]
    fn create(&self, sk: u64, entry: TrackedSocket) -> bool {
        // An LRU map evicts to make room: this fails only when the kernel
        // found no free node (contention across CPUs).
        TRACKED.insert(sk, entry, 0).is_ok()
    }

    #[inline(always)]
    fn forget(&self, sk: u64, _at: *mut TrackedSocket) {
        let _ = TRACKED.remove(sk);
    }
}

/// Socket storage, for tp_btf: `sk` must be the hook's own argument,
/// untouched, which the verifier types as a trusted `struct sock *`.
pub struct InSocket;

impl InSocket {
    #[inline(always)]
    fn storage(sk: u64, flags: u32) -> *mut TrackedSocket {
        // SAFETY: the map is socket storage of TrackedSocket; `sk` is the
        // tracepoint's socket, which the verifier checks is a trusted
        // socket pointer (it refuses the program otherwise). A null value
        // creates a zeroed entry.
        unsafe {
            bpf_sk_storage_get(
                ptr::from_ref(&SK_TRACKED).cast_mut().cast(),
                sk as *mut _,
                ptr::null_mut(),
                u64::from(flags),
            )
        }
        .cast()
    }
}

impl Entries for InSocket {
    #[inline(always)]
    fn get(&self, sk: u64) -> Option<*mut TrackedSocket> {
        let at = Self::storage(sk, 0);
        // Owner 0 is a forgotten entry (see `forget`): no process has tgid 0.
        // SAFETY: a non-null result is this socket's storage, which lives at
        // least until the program returns (freed after an RCU grace period).
        (!at.is_null() && unsafe { (*at).owner } != 0).then_some(at)
    }

    #[inline(always)]
    fn create(&self, sk: u64, entry: TrackedSocket) -> bool {
        let at = Self::storage(sk, BPF_SK_STORAGE_GET_F_CREATE);
        if at.is_null() {
            // Out of memory, or the socket is being freed.
            return false;
        }
        // SAFETY: as in `get`. Written here, not passed to the helper: a
        // socket that connects again after a close has a forgotten entry,
        // which the helper would return as it is.
        unsafe { *at = entry };
        true
    }

    #[inline(always)]
    fn forget(&self, _sk: u64, at: *mut TrackedSocket) {
        // Zeroed, not deleted: a delete takes the storage's lock and frees
        // through RCU, and the kernel frees the entry with the socket
        // anyway.
        // SAFETY: as in `get`; `at` came from it in this run.
        unsafe { (*at).owner = 0 };
    }
}

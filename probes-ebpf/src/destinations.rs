//! The names of connect destinations, by the id their histograms carry
//! (see probes_common::connect): written once per destination, read by
//! userspace when a histogram with a new id appears.

use core::mem::offset_of;

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use probes_common::connect::{DESTINATIONS_MAX_ENTRIES, TcpDestination, UnixDestination};

use crate::{closers, tcp_sock::Ends};

/// LRU: entries are never deleted (many processes share a destination),
/// and one not connected to for long may make room. An insert takes a
/// lock, but happens once per destination.
#[map]
static TCP_DESTINATIONS: LruHashMap<u64, TcpDestination> =
    LruHashMap::with_max_entries(DESTINATIONS_MAX_ENTRIES, 0);

#[map]
static UNIX_DESTINATIONS: LruHashMap<u64, UnixDestination> =
    LruHashMap::with_max_entries(DESTINATIONS_MAX_ENTRIES, 0);

/// Where the connect probe reads a unix address into: too big for its
/// stack beside the rest. Only that probe uses it, and it does not nest on
/// a CPU (the classic tracepoints share a per-CPU guard).
#[map]
static UNIX_SCRATCH: PerCpuArray<UnixScratch> = PerCpuArray::with_max_entries(1, 0);

/// The largest length a read into the scratch record may be given: a
/// mask, which bounds the length for every verifier (see connect.rs).
pub const UNIX_READ_MASK: usize = 127;

/// A unix destination with room behind its path for a read of up to
/// [`UNIX_READ_MASK`] bytes, the bound older verifiers (6.1) check the read
/// against: they do not carry the probe's tighter check over to a copy of
/// the length reloaded from the stack.
#[repr(C)]
pub struct UnixScratch {
    pub d: UnixDestination,
    room: [u8; offset_of!(UnixDestination, path) + UNIX_READ_MASK - size_of::<UnixDestination>()],
}

/// This CPU's unix scratch record, zeroed.
#[inline(always)]
pub fn unix_scratch() -> Option<&'static mut UnixDestination> {
    let ptr = UNIX_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's value of a one-entry array, which lives as long as
    // the map; only the connect probe uses it (see above).
    let d = unsafe { &mut (*ptr).d };
    *d = UnixDestination::ZERO;
    Some(d)
}

/// Names a unix destination unless it is named already (a failed insert
/// leaves it unnamed, which userspace says).
#[inline(always)]
pub fn name_unix(id: u64, d: &UnixDestination) {
    name(&UNIX_DESTINATIONS, UNIX, id, d);
}

impl Ends {
    /// Where an active socket connects to, and the id its connect samples
    /// carry: a hash of the remote address, port and namespace (a unix
    /// destination's id hashes its path; see probes_common::connect).
    #[inline(always)]
    pub fn destination(&self) -> (u64, TcpDestination) {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&self.raddr[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let port = u16::from_be(self.rport_be);
        let mut h = closers::mix(0, u64::from(self.family) | u64::from(port) << 16);
        h = closers::mix(h, u64::from(self.netns));
        h = closers::mix(h, word(0));
        h = closers::mix(h, word(1));
        let d = TcpDestination {
            family: self.family,
            port,
            netns: self.netns,
            addr: self.raddr,
        };
        (closers::finish(h) | 1, d)
    }
}

/// Names a TCP destination unless it is named already.
#[inline(always)]
pub fn name_tcp(id: u64, d: &TcpDestination) {
    name(&TCP_DESTINATIONS, TCP, id, d);
}

/// Puts `d` under `id` in `names` (the map of `kind`'s names) unless this
/// CPU named it lately or the map has it already.
#[inline(always)]
fn name<V>(names: &LruHashMap<u64, V>, kind: u32, id: u64, d: &V) {
    if named_lately(kind, id) {
        return;
    }
    // SAFETY: only whether the entry exists is used.
    let named = unsafe { names.get(id) }.is_some() || names.insert(id, d, 0).is_ok();
    if named {
        note_named(kind, id);
    }
}

/// [`NAMED_HERE`]'s entries.
const TCP: u32 = 0;
const UNIX: u32 = 1;

/// How many destinations of each kind a CPU remembers naming.
const NAMED_HERE_IDS: usize = 4;

/// The destinations this CPU named last, per kind (TCP, unix), newest
/// first: a connect to one of them skips the names' map, whose lookup was
/// a cold line or two per connect (a quarter of the unix connect's exit
/// under the lab's new.php), while most connects go to a few places.
/// Every id here was named when it was put here, and ids have their
/// lowest bit set, so the zeroed start matches none. An id stays here while
/// this CPU keeps connecting to it, which no longer refreshes its entry in
/// the LRU map: should more than [`DESTINATIONS_MAX_ENTRIES`] other
/// destinations push it out meanwhile, userspace, which keeps the names it
/// read (as many), shows it as unknown if it had not read it yet.
#[map]
static NAMED_HERE: PerCpuArray<[u64; NAMED_HERE_IDS]> = PerCpuArray::with_max_entries(2, 0);

/// Whether this CPU named `id` (of `kind`) among its last few.
#[inline(always)]
fn named_lately(kind: u32, id: u64) -> bool {
    let Some(ids) = NAMED_HERE.get_ptr(kind) else {
        return false;
    };
    // SAFETY: this CPU's value of an array, which lives as long as the map,
    // read word by word; a nested run (the state probe's second copy)
    // writes only ids it named.
    unsafe { (*ids).contains(&id) }
}

/// Notes that this CPU named `id` (of `kind`): newest first, the oldest
/// dropped.
#[inline(always)]
fn note_named(kind: u32, id: u64) {
    if let Some(ids) = NAMED_HERE.get_ptr_mut(kind) {
        // SAFETY: as above; a nested run writing meanwhile at worst drops
        // an id from the list, which costs a lookup later.
        unsafe {
            let ids = &mut *ids;
            for i in (1..NAMED_HERE_IDS).rev() {
                ids[i] = ids[i - 1];
            }
            ids[0] = id;
        }
    }
}

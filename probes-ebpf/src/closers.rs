//! Who closed each watched TIME_WAIT socket first, by its ends: the state
//! probe notes it as the socket goes into TIME_WAIT, the socket iterator
//! reads it to count the socket on its closer's link.
//!
//! A table in a plain array rather than a hash map: the kernel frees a
//! timewait socket without any event, so entries cannot be deleted, and an
//! LRU map pays for that on every insert (it rotates and shrinks its lists
//! under a lock: half of the state probe's time under connection churn).
//! Here a note is a few plain stores, with no lock, into one of the 8 slots
//! of the set the ends' hash picks: the slot of the same ends, else the
//! first free, else the oldest.
//!
//! A slot is 16 bytes, so a set is two cache lines: the ends are kept as
//! their 64-bit hash (two ends that differ share one with a chance of 2^-62
//! per slot looked at). With the whole ends (56-byte slots) the 8 ways
//! spanned 7 lines, each a likely miss, for every note and every TIME_WAIT
//! socket a walk counts.

use aya_ebpf::{bindings::BPF_F_MMAPABLE, macros::map, maps::Array};
use probes_common::{
    sock::{Closer, TW_CLOSERS_MAX_ENTRIES},
    stats::Stat,
};

use crate::{clock::now, events, tcp_sock::Ends};

/// How long a timewait socket lives (TCP_TIMEWAIT_LEN, fixed in Linux), with
/// a margin for a timer that fires late. A peer's retransmitted FIN restarts
/// it: such a socket may outlive its note and then counts under an unknown
/// closer, never under another's.
const LIFETIME_NS: u64 = 65_000_000_000;

/// A note's time is kept in units of 2^21 ns (2.1 ms) in 32 bits: it wraps
/// after 104 days, far past a timewait socket's life.
const UNIT_SHIFT: u32 = 21;
const LIFETIME_UNITS: u32 = (LIFETIME_NS >> UNIT_SHIFT) as u32 + 1;

const WAYS: u32 = 8;
const SETS: u32 = TW_CLOSERS_MAX_ENTRIES / WAYS;
const _: () = assert!(SETS.is_power_of_two() && SETS * WAYS == TW_CLOSERS_MAX_ENTRIES);

/// The tag's low bits hold the closer's side (SIDE_ACTIVE or SIDE_PASSIVE).
const SIDE_BITS: u64 = 0b11;

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot {
    /// The ends' hash, its low bits replaced by the closer's side.
    tag: u64,
    /// When the note was written (see [`UNIT_SHIFT`]), its lowest bit set;
    /// 0 for a slot never written.
    stamp: u32,
    owner: u32,
}

const _: () = assert!(size_of::<Slot>() == 16);

/// Mappable only for its layout: such an array's values start on a page,
/// so a set is two whole lines (a plain array's start 16 bytes into one,
/// and a set then spans three).
#[map]
static TW_CLOSERS: Array<Slot> = Array::with_max_entries(TW_CLOSERS_MAX_ENTRIES, BPF_F_MMAPABLE);

/// One word into a connection's 64-bit hash (a multiplicative mix): see
/// [`Ends::connection_hash`] (and a destination's id, which folds its words
/// the same way).
#[inline(always)]
pub fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(GOLDEN).rotate_left(29)
}

/// The hash after its last word: its top bits pick the set.
#[inline(always)]
pub fn finish(h: u64) -> u64 {
    h.wrapping_mul(GOLDEN)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The first slot of the ends' set (from the hash's top bits; the tag
/// compares all of them).
#[inline(always)]
fn set(hash: u64) -> u32 {
    (hash >> (64 - SETS.trailing_zeros())) as u32 * WAYS
}

#[inline(always)]
fn stamp(now_ns: u64) -> u32 {
    (now_ns >> UNIT_SHIFT) as u32 | 1
}

/// How long ago, in units, a note stamped `stamp` was written.
#[inline(always)]
fn age(stamp: u32, now: u32) -> u32 {
    now.wrapping_sub(stamp)
}

#[inline(always)]
fn same_ends(tag: u64, hash: u64) -> bool {
    (tag ^ hash) & !SIDE_BITS == 0
}

#[inline(always)]
fn slot(i: u32) -> Option<*mut Slot> {
    TW_CLOSERS.get_ptr_mut(i & (TW_CLOSERS_MAX_ENTRIES - 1))
}

/// Notes who closed the socket with these ends first (`owner`, from its
/// `side`): its timewait socket, which has the same ends, is theirs. Not
/// inlined, to keep the state probe's own stack small.
#[inline(never)]
pub fn note_closer(e: &Ends, owner: u32, side: u8) {
    let closer = Closer {
        owner,
        side,
        _pad: [0; 3],
    };
    if !note(e.connection_hash(), closer) {
        events::count(Stat::TimeWaitMapFull);
    }
}

impl Ends {
    /// What names the connection, whatever its state (a timewait socket has
    /// the same), as one hash: its family, ports, addresses and namespace.
    #[inline(always)]
    pub fn connection_hash(&self) -> u64 {
        let word = |b: &[u8; 16], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let ports =
            u64::from(self.family) | u64::from(self.lport) << 16 | u64::from(self.rport_be) << 32;
        let mut h = mix(0, ports);
        h = mix(h, u64::from(self.netns));
        h = mix(h, word(&self.laddr, 0));
        h = mix(h, word(&self.laddr, 1));
        h = mix(h, word(&self.raddr, 0));
        h = mix(h, word(&self.raddr, 1));
        finish(h)
    }
}

/// Notes who closed the socket with these ends first. When all its set's
/// slots hold notes younger than a timewait socket's life, the oldest gives
/// way, and false says a closer may be lost (that socket then counts under
/// an unknown closer).
#[inline(always)]
pub fn note(hash: u64, closer: Closer) -> bool {
    let first = set(hash);
    let now = stamp(now());
    // The slot to write (null: none yet) and the age of the note it holds
    // (0: none). Not an Option of a pair: LLVM may read its undefined age
    // while it is None, which 5.10's verifier refuses.
    let mut take: *mut Slot = core::ptr::null_mut();
    let mut take_age: u32 = 0;
    let mut visit = |way: u32| -> bool {
        let Some(s) = slot(first + way) else {
            return false;
        };
        // SAFETY: a value of an array map, which lives as long as the map.
        // Two CPUs noting different ends into one slot at the same instant
        // leave one of them, or a mix whose tag matches no ends (a socket
        // then counts under an unknown closer), or one's ends with the
        // other's closer, a chance as small as the race is rare.
        let (stamp, tag) = unsafe { ((*s).stamp, (*s).tag) };
        // Same ends: a reused 4-tuple, whose older timewait socket the
        // kernel has just killed. Never written: no later slot holds these
        // ends either (a note goes to the first slot not live, and written
        // slots stay written).
        if stamp == 0 || same_ends(tag, hash) {
            take = s;
            take_age = 0;
            return true;
        }
        let age = age(stamp, now);
        if take.is_null() || age > take_age {
            take = s;
            take_age = age;
        }
        false
    };
    // Unrolled by hand: 6.1's verifier refuses the loop LLVM makes of it
    // (a back-edge through a fall-through).
    let _ = visit(0)
        || visit(1)
        || visit(2)
        || visit(3)
        || visit(4)
        || visit(5)
        || visit(6)
        || visit(7);
    if take.is_null() {
        return false;
    }
    // SAFETY: as above.
    unsafe {
        *take = Slot {
            tag: (hash & !SIDE_BITS) | u64::from(closer.side) & SIDE_BITS,
            stamp: now,
            owner: closer.owner,
        };
    }
    take_age == 0 || take_age > LIFETIME_UNITS
}

/// Who closed the socket with these ends first, if noted within a
/// timewait socket's life.
#[inline(always)]
pub fn find(hash: u64) -> Option<Closer> {
    let first = set(hash);
    let now = stamp(now());
    // Some(answer) once a slot settles it.
    let visit = |way: u32| -> Option<Option<Closer>> {
        let s = slot(first + way)?;
        // SAFETY: as in `note`; the copy is checked whole after it is taken.
        let seen = unsafe { *s };
        if seen.stamp == 0 {
            return Some(None);
        }
        same_ends(seen.tag, hash).then(|| {
            (age(seen.stamp, now) <= LIFETIME_UNITS).then_some(Closer {
                owner: seen.owner,
                side: (seen.tag & SIDE_BITS) as u8,
                _pad: [0; 3],
            })
        })
    };
    // Unrolled by hand, as in `note`.
    visit(0)
        .or_else(|| visit(1))
        .or_else(|| visit(2))
        .or_else(|| visit(3))
        .or_else(|| visit(4))
        .or_else(|| visit(5))
        .or_else(|| visit(6))
        .or_else(|| visit(7))
        .flatten()
}

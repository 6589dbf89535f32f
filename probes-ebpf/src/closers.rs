//! Who closed each watched TIME_WAIT socket first, by its ends: the state
//! probe notes it as the socket goes into TIME_WAIT, the socket iterator
//! reads it to count the socket on its closer's link.
//!
//! A table in a plain array rather than a hash map: the kernel frees a
//! timewait socket without any event, so entries cannot be deleted, and an
//! LRU map pays for that on every insert (it rotates and shrinks its lists
//! under a lock: half of the state probe's time under connection churn).
//! Here a note is a few plain stores, with no lock, into one of 8
//! slots from the ends' hash on: the slot of the same ends, else the first
//! free, else the oldest.

use aya_ebpf::{macros::map, maps::Array};
use probes_common::sock::{Closer, TW_CLOSERS_MAX_ENTRIES, Tuple};

use crate::clock::now;

/// How long a timewait socket lives (TCP_TIMEWAIT_LEN, fixed in Linux), with
/// a margin for a timer that fires late. A peer's retransmitted FIN restarts
/// it: such a socket may outlive its note and then counts under an unknown
/// closer, never under another's.
const LIFETIME_NS: u64 = 65_000_000_000;

const _: () = assert!(TW_CLOSERS_MAX_ENTRIES.is_power_of_two());

#[derive(Clone, Copy)]
#[repr(C)]
struct Slot {
    /// When the note was written; 0 for a slot never written.
    noted_ns: u64,
    ends: [u64; ENDS_WORDS],
    closer: Closer,
}

const ENDS_WORDS: usize = size_of::<Tuple>() / 8;
const _: () = assert!(size_of::<Tuple>() == ENDS_WORDS * 8);

#[map]
static TW_CLOSERS: Array<Slot> = Array::with_max_entries(TW_CLOSERS_MAX_ENTRIES, 0);

/// The ends as whole words: compared and hashed word by word.
#[inline(always)]
fn words(tuple: &Tuple) -> [u64; ENDS_WORDS] {
    // SAFETY: Tuple is repr(C) with no gaps (asserted in probes-common), so
    // all its bytes are initialised; any bytes are valid u64s.
    unsafe { core::mem::transmute::<Tuple, [u64; ENDS_WORDS]>(*tuple) }
}

/// The first slot the ends may take (a multiplicative hash's top bits).
#[inline(always)]
fn home(ends: &[u64; ENDS_WORDS]) -> u32 {
    let mut h: u64 = 0;
    for w in ends {
        h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - TW_CLOSERS_MAX_ENTRIES.trailing_zeros())) as u32
}

/// Whether a note written at `noted_ns` may still be its socket's: written,
/// and within a timewait socket's life.
#[inline(always)]
fn live(noted_ns: u64, now: u64) -> bool {
    noted_ns != 0 && now.saturating_sub(noted_ns) <= LIFETIME_NS
}

#[inline(always)]
fn slot(i: u32) -> Option<*mut Slot> {
    TW_CLOSERS.get_ptr_mut(i & (TW_CLOSERS_MAX_ENTRIES - 1))
}

/// Whether two ends are the same, word by word: an `==` on the arrays
/// compiles to a call to a byte-by-byte memcmp.
#[inline(always)]
fn same(a: &[u64; ENDS_WORDS], b: &[u64; ENDS_WORDS]) -> bool {
    let mut diff = 0;
    for i in 0..ENDS_WORDS {
        diff |= a[i] ^ b[i];
    }
    diff == 0
}

/// Notes who closed the socket with these ends first. When all its slots
/// hold notes younger than a timewait socket's life, the oldest gives way,
/// and false says a closer may be lost (that socket then counts under an
/// unknown closer).
#[inline(always)]
pub fn note(tuple: &Tuple, closer: Closer) -> bool {
    let ends = words(tuple);
    let home = home(&ends);
    let now = now();
    // The slot to write and when its note was written.
    let mut take: Option<(*mut Slot, u64)> = None;
    let mut visit = |way: u32| -> bool {
        let Some(s) = slot(home + way) else {
            return false;
        };
        // SAFETY: a value of an array map, which lives as long as the map.
        // Two CPUs noting different ends into one slot at the same instant
        // leave one of them, or a mix that matches no ends: a socket then
        // counts under an unknown closer, never under another's.
        let noted_ns = unsafe { (*s).noted_ns };
        // Same ends: a reused 4-tuple, whose older timewait socket the
        // kernel has just killed. Never written: no later slot holds these
        // ends either (a note goes to the first slot not live, and written
        // slots stay written).
        if noted_ns == 0 || same(unsafe { &(*s).ends }, &ends) {
            take = Some((s, 0));
            return true;
        }
        if take.is_none_or(|(_, oldest)| noted_ns < oldest) {
            take = Some((s, noted_ns));
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
    let Some((s, replaced_ns)) = take else {
        return false;
    };
    // SAFETY: as above.
    unsafe {
        *s = Slot {
            noted_ns: now,
            ends,
            closer,
        };
    }
    !live(replaced_ns, now)
}

/// Who closed the socket with these ends first, if noted within a
/// timewait socket's life.
#[inline(always)]
pub fn find(tuple: &Tuple) -> Option<Closer> {
    let ends = words(tuple);
    let home = home(&ends);
    let now = now();
    // Some(answer) once a slot settles it.
    let visit = |way: u32| -> Option<Option<Closer>> {
        let s = slot(home + way)?;
        // SAFETY: as in `note`; the copy is checked whole after it is taken.
        let seen = unsafe { *s };
        if seen.noted_ns == 0 {
            return Some(None);
        }
        same(&seen.ends, &ends).then(|| live(seen.noted_ns, now).then_some(seen.closer))
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

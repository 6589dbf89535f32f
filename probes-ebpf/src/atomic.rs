//! The one atomic the probes need: adding to a u64 in a map value that
//! another CPU, or a nested program on this one, may add to at once. BPF
//! has an atomic add on every kernel we load on; core's AtomicU64 offers no
//! fetch_add on this target, so it is the intrinsic.

use core::intrinsics::{AtomicOrdering::Relaxed, atomic_xadd};

/// Adds `n` to the word at `p` (wrapping: `u64::MAX` takes one away).
///
/// # Safety
/// `p` points at a live, 8-byte aligned u64 of a map value (every map
/// value is 8-byte aligned), which every writer changes only by this add.
#[inline(always)]
pub unsafe fn add(p: *mut u64, n: u64) {
    // SAFETY: as the caller promises.
    unsafe { atomic_xadd::<u64, u64, { Relaxed }>(p, n) };
}

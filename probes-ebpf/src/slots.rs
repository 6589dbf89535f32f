//! Per-thread slots for syscalls in flight (see probes_common::DEFAULT_SLOTS).

use aya_ebpf::{Global, maps::Array};
use probes_common::DEFAULT_SLOTS;

/// Slot count minus one, set by userspace from pid_max.
#[unsafe(no_mangle)]
static SLOT_MASK: Global<u32> = Global::new(DEFAULT_SLOTS - 1);

/// The slot of thread `tid` in `map`.
#[inline(always)]
pub fn slot<T>(map: &'static Array<T>, tid: u32) -> Option<&'static mut T> {
    let ptr = map.get_ptr_mut(tid & SLOT_MASK.load())?;
    // SAFETY: array values live as long as the map; a slot is written only by
    // the thread whose id maps to it (or, when pid_max exceeds the slot count,
    // a thread sharing it, which the probes detect and count).
    Some(unsafe { &mut *ptr })
}

//! The clock every probe timestamps with.

use aya_ebpf::helpers::bpf_ktime_get_ns;

/// Nanoseconds of CLOCK_MONOTONIC (suspend excluded), as userspace reads it.
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: the helper takes no arguments and touches no memory; aya-ebpf
    // marks every raw helper unsafe.
    unsafe { bpf_ktime_get_ns() }
}

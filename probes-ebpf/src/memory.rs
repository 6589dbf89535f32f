//! Reads of kernel memory, user memory and tracepoint records, through the
//! kernel's fault-handling copy helpers: a bad address is an error, never a
//! fault. Safe for [`Bits`] types, since any bytes read are a valid value.

use core::{ffi::c_void, mem::MaybeUninit};

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user, generated},
    programs::TracePointContext,
};

/// Types of which every bit pattern is a valid value.
///
/// # Safety
/// Implement only for such types: reads fill them with whatever bytes the
/// kernel holds at the address, right or wrong.
pub unsafe trait Bits: Copy {}

// SAFETY: integers and byte arrays have no invalid bit patterns.
unsafe impl Bits for u8 {}
// SAFETY: as above.
unsafe impl Bits for u16 {}
// SAFETY: as above.
unsafe impl Bits for u32 {}
// SAFETY: as above.
unsafe impl Bits for u64 {}
// SAFETY: as above.
unsafe impl Bits for i32 {}
// SAFETY: as above.
unsafe impl Bits for i64 {}
// SAFETY: as above.
unsafe impl<const N: usize> Bits for [u8; N] {}
// SAFETY: as above.
unsafe impl<const N: usize> Bits for [u64; N] {}

/// The `T` at kernel address `at`, None if the read fails.
#[inline(always)]
pub fn kernel<T: Bits>(at: u64) -> Option<T> {
    // SAFETY: the helper copies size_of::<T>() bytes into a local through the
    // kernel's fault-handling accessor, failing on a bad address; T: Bits,
    // so those bytes are a valid T.
    unsafe { bpf_probe_read_kernel(at as *const T) }.ok()
}

/// Copies the `T` at kernel address `at` into `out`, which needs no
/// zeroing first (zeroing a large buffer costs a byte-at-a-time memset
/// loop in BPF); the reference to it, None if the read fails.
#[inline(always)]
pub fn kernel_in_place<T: Bits>(at: u64, out: &mut MaybeUninit<T>) -> Option<&T> {
    // SAFETY: the helper writes size_of::<T>() bytes to `out` through the
    // kernel's fault-handling accessor, all of them on success; T: Bits, so
    // those bytes are a valid T.
    let ret = unsafe {
        generated::bpf_probe_read_kernel(
            out.as_mut_ptr().cast(),
            size_of::<T>() as u32,
            at as *const c_void,
        )
    };
    // SAFETY: as above: on success every byte was written.
    (ret == 0).then(|| unsafe { out.assume_init_ref() })
}

/// The `T` at the offset in `offset` of the struct at `base`, a pointer the
/// verifier knows the type of from BTF (a tp_btf argument, a member loaded
/// through one, `bpf_get_current_task_btf`): a plain load, which the
/// verifier checks against that type (the offset is a read-only global, a
/// constant to it), and which reads 0 where it faults. A helper call saved.
#[inline(always)]
pub fn btf<T: Bits>(base: *const u8, offset: &Global<u32>) -> T {
    // SAFETY: the verifier allows the load only inside a member of the
    // struct `base` points to, and the JIT makes a faulting one read 0;
    // T: Bits, so any bytes are a valid T.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset.load() as usize).cast::<T>()) }
}

/// The `T` at user address `at` in the current task, None if the read
/// fails (unmapped, or paged out where the probe cannot wait).
#[inline(always)]
pub fn user<T: Bits>(at: u64) -> Option<T> {
    // SAFETY: as in `kernel`, for user memory.
    unsafe { bpf_probe_read_user(at as *const T) }.ok()
}

/// The `T` at the offset in `offset` of the tracepoint record, None if the
/// read fails. The offsets come from this kernel's tracefs `format` files
/// at load; a wrong one reads wrong bytes, never outside the checked copy.
#[inline(always)]
pub fn field<T: Bits>(ctx: &TracePointContext, offset: &Global<u32>) -> Option<T> {
    kernel(ctx.as_ptr() as u64 + u64::from(offset.load()))
}

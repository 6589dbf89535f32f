//! Per-thread slots for syscalls in flight (see probes_common::DEFAULT_SLOTS):
//! the accept, clone and connect probes keep their start here, the clone probe's flags
//! are read here by `sched_process_fork`, and a thread's exit frees its slots.

use aya_ebpf::{Global, macros::map, maps::Array};
use probes_common::{
    DEFAULT_SLOTS, accept::AcceptStart, connect::ConnectStart, fork::ForkStart, run_queue::RunSlot,
};

/// Slot count minus one, set by userspace from pid_max.
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static SLOT_MASK: Global<u32> = Global::new(DEFAULT_SLOTS - 1);

#[map]
static ACCEPT_START: Array<AcceptStart> = Array::with_max_entries(DEFAULT_SLOTS, 0);

#[map]
static CONNECT_START: Array<ConnectStart> = Array::with_max_entries(DEFAULT_SLOTS, 0);

#[map]
static FORK_START: Array<ForkStart> = Array::with_max_entries(DEFAULT_SLOTS, 0);

#[map]
static RUN_SLOTS: Array<RunSlot> = Array::with_max_entries(DEFAULT_SLOTS, 0);

/// The slot of thread `tid` in `map`.
#[inline(always)]
#[expect(
    clippy::mut_from_ref,
    reason = "the slot is the kernel's map memory, not borrowed from the map handle"
)]
fn slot<T>(map: &'static Array<T>, tid: u32) -> Option<&'static mut T> {
    let ptr = map.get_ptr_mut(tid & SLOT_MASK.load())?;
    // SAFETY: the pointer is to an array value, which lives as long as the
    // map and so the program. Only the thread whose id maps to the slot
    // writes it, one program at a time (its syscall enter, the exit, its
    // own exit); when pid_max exceeds the slot count two threads can share
    // a slot, which the probes detect by its `tid` and count as a drop.
    Some(unsafe { &mut *ptr })
}

/// Thread `tid`'s accept slot.
#[inline(always)]
pub fn accept(tid: u32) -> Option<&'static mut AcceptStart> {
    slot(&ACCEPT_START, tid)
}

/// Thread `tid`'s connect slot.
#[inline(always)]
pub fn connect(tid: u32) -> Option<&'static mut ConnectStart> {
    slot(&CONNECT_START, tid)
}

/// Thread `tid`'s connect in flight sent a TCP SYN: the state probe times
/// it, so the connect probe lets it go.
#[inline(always)]
pub fn connect_went_tcp(tid: u32) {
    if let Some(slot) = connect(tid)
        && slot.tid == tid
    {
        slot.start_ns = 0;
    }
}

/// Thread `tid`'s run-queue slot. Unlike the syscall slots it is written
/// from other CPUs than the thread's own (its wakeup), but never at once:
/// a wakeup waits for the thread to be off its CPU, past its switch-out.
#[inline(always)]
pub fn run(tid: u32) -> Option<&'static mut RunSlot> {
    slot(&RUN_SLOTS, tid)
}

/// Thread `tid`'s clone slot.
#[inline(always)]
pub fn fork(tid: u32) -> Option<&'static mut ForkStart> {
    slot(&FORK_START, tid)
}

/// The clone flags of `tid`'s clone in flight, if it is in one and they
/// were read.
#[inline(always)]
pub fn fork_flags_in_flight(tid: u32) -> Option<u64> {
    let slot = fork(tid)?;
    (slot.start_ns != 0 && slot.tid == tid && slot.flags_known != 0).then_some(slot.flags)
}

/// Frees the slots of an exiting thread, so a syscall its exit interrupted is
/// not finished by a later thread that reuses its id.
#[inline(always)]
pub fn forget_thread(tid: u32) {
    if let Some(slot) = accept(tid)
        && slot.tid == tid
    {
        slot.start_ns = 0;
    }
    if let Some(slot) = fork(tid)
        && slot.tid == tid
    {
        slot.start_ns = 0;
    }
    if let Some(slot) = connect(tid)
        && slot.tid == tid
    {
        slot.start_ns = 0;
    }
}

//! clone/clone3/fork/vfork latency as the parent sees it, on one of three
//! rungs that userspace picks at load (the best this kernel offers):
//! fentry/fexit on `kernel_clone`, which all four syscalls call; a
//! kprobe/kretprobe pair on it; or the syscall tracepoints, one enter
//! program per argument layout and one exit for all four. Every rung records
//! the start and the clone flags in the thread's slot and records the same
//! sample at exit. The flags also tell `sched_process_fork` (watch.rs)
//! whether the new task is a thread.

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, fexit, kprobe, kretprobe, tracepoint},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
};
use aya_log_ebpf::debug;
use probes_common::{
    fork::{FORK_FLAGS, TaskKind},
    hist::HistMetric,
    stats::Stat,
};

use crate::{
    clock::now, events, hist, memory, offsets::offset_globals, slots, watch_set::is_watched,
};

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static CLONE_FLAGS_OFFSET: Global<u32> = Global::new(16);
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static CLONE3_UARGS_OFFSET: Global<u32> = Global::new(16);
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static FORK_EXIT_RET_OFFSET: Global<u32> = Global::new(16);
probes_common::fork_kernel_clone_members!(offset_globals);

/// Records the start of a clone by a watched process, with its flags if they
/// can be read (only read once the process is known to be watched).
#[inline(always)]
fn start(read_flags: impl FnOnce() -> Option<u64>) {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_watched((pid_tgid >> 32) as u32) {
        return;
    }
    // Two plain values, not an Option kept across what follows: LLVM may
    // read an Option's undefined payload while it is None, a read of
    // uninitialized stack that 5.10's verifier refuses.
    let (flags, flags_known) = match read_flags() {
        Some(flags) => (flags, 1),
        None => (0, 0),
    };
    let tid = pid_tgid as u32;
    let Some(slot) = slots::fork(tid) else {
        return;
    };
    if slot.start_ns != 0 && slot.tid != tid {
        events::count(Stat::ForkSlotShared);
        // Called from several program types: the log needs no context.
        debug!(
            &(),
            "clone slot of thread {} taken by thread {}: that clone is not timed", slot.tid, tid
        );
    }
    slot.tid = tid;
    slot.flags = flags;
    slot.flags_known = flags_known;
    slot.start_ns = now();
}

#[tracepoint]
pub fn clone_enter(ctx: TracePointContext) -> u32 {
    start(|| memory::field(&ctx, &CLONE_FLAGS_OFFSET));
    0
}

#[tracepoint]
pub fn clone3_enter(ctx: TracePointContext) -> u32 {
    // struct clone_args starts with its u64 flags.
    start(|| {
        let uargs: u64 = memory::field(&ctx, &CLONE3_UARGS_OFFSET)?;
        memory::user(uargs)
    });
    0
}

#[tracepoint]
pub fn fork_enter(_ctx: TracePointContext) -> u32 {
    // vfork's extra flags do not matter here: both create a process.
    start(|| Some(FORK_FLAGS));
    0
}

#[tracepoint]
pub fn clone_exit(ctx: TracePointContext) -> u32 {
    if let Some(ret) = memory::field::<i64>(&ctx, &FORK_EXIT_RET_OFFSET) {
        finish(ret);
    }
    0
}

/// The flags of a `struct kernel_clone_args` in kernel memory.
#[inline(always)]
fn kernel_clone_flags(args: u64) -> Option<u64> {
    memory::kernel(args + u64::from(KERNEL_CLONE_FLAGS_OFFSET.load()))
}

#[fentry(function = "kernel_clone")]
pub fn kernel_clone_fentry(ctx: FEntryContext) -> u32 {
    start(|| kernel_clone_flags(ctx.arg::<u64>(0)));
    0
}

#[fexit(function = "kernel_clone")]
pub fn kernel_clone_fexit(ctx: FExitContext) -> u32 {
    // pid_t kernel_clone(struct kernel_clone_args *): the return value
    // follows the one argument.
    finish(i64::from(ctx.arg::<i32>(1)));
    0
}

#[kprobe]
pub fn kernel_clone_kprobe(ctx: ProbeContext) -> u32 {
    start(|| kernel_clone_flags(ctx.arg::<u64>(0)?));
    0
}

#[kretprobe]
pub fn kernel_clone_kretprobe(ctx: RetProbeContext) -> u32 {
    finish(i64::from(ctx.ret::<i32>()));
    0
}

/// Records the sample of the clone the current thread started, which returned `ret`.
#[inline(always)]
fn finish(ret: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // The child also returns from clone (ret 0) with a fresh tid, which never
    // owns a slot: only the parent gets past this check.
    let Some(slot) = slots::fork(tid) else {
        return;
    };
    if slot.start_ns == 0 || slot.tid != tid {
        return;
    }
    let start_ns = slot.start_ns;
    let (flags, flags_known) = (slot.flags, slot.flags_known);
    slot.start_ns = 0;
    let end_ns = now();
    let tgid = (pid_tgid >> 32) as u32;
    let kind = TaskKind::from_flags((flags_known != 0).then_some(flags));
    hist::record(
        tgid,
        HistMetric::of_clone(ret, kind),
        0,
        end_ns.saturating_sub(start_ns),
    );
}

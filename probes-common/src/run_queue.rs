//! Run-queue latency: how long a watched thread was runnable but not
//! running, the time it then ran, and how often it was preempted.
//!
//! Three BTF tracepoints (tp_btf: the task's process id is a load from its
//! `task_struct`, so an unwatched task costs one watch-set lookup):
//! - `sched_wakeup` and `sched_wakeup_new` stamp a watched thread as
//!   runnable, unless it already is (the kernel's own `sched_info` keeps the
//!   first enqueue the same way);
//! - `sched_switch`'s `prev`, watched: still runnable (preempted, or its
//!   state back to running) it is stamped runnable now and its preemption
//!   counted; blocked, its stamp is cleared. Either way the slice it ran
//!   since its switch-in is recorded ([`crate::hist::HistMetric::OnCpu`]).
//! - `sched_switch`'s `next`, watched: the time since its stamp is one
//!   run-queue sample ([`crate::hist::HistMetric::RunQueue`]).
//!
//! What the kernel itself accounts per thread in
//! `/proc/PID/task/TID/schedstat` (time on CPU, time waiting on a run queue,
//! times it ran): the tests compare the two.

use crate::offsets::MemberOffset;

/// Array of [`RunSlot`], one per thread id modulo its size (the slots'
/// count, see [`crate::DEFAULT_SLOTS`]).
pub const RUN_SLOTS_MAP: &str = "RUN_SLOTS";

/// Names short enough for the kernel to keep whole (15 bytes), so tools
/// such as bpftool tell them apart.
pub const WAKEUP_PROGRAM: &str = "runq_wakeup";
pub const WAKEUP_NEW_PROGRAM: &str = "runq_wakeup_new";
pub const SWITCH_PROGRAM: &str = "runq_switch";
/// Each program's BTF tracepoint.
pub const PROGRAMS: [(&str, &str); 3] = [
    (WAKEUP_PROGRAM, "sched_wakeup"),
    (WAKEUP_NEW_PROGRAM, "sched_wakeup_new"),
    (SWITCH_PROGRAM, "sched_switch"),
];

/// `task_struct.__state` (5.14 and later) or `.state` (before): a global
/// of its own, since the member's name depends on the kernel.
pub const TASK_STATE_GLOBAL: &str = "RUNQ_TASK_STATE";

/// The members the probe reads, each at the offset in its global.
#[macro_export]
macro_rules! run_queue_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            RUNQ_TASK_TGID: task_struct.tgid,
            RUNQ_TASK_PID: task_struct.pid,
            RUNQ_TASK_REAL_PARENT: task_struct.real_parent,
        }
    };
}
pub const RUN_QUEUE_MEMBERS: &[MemberOffset] = &run_queue_members!(crate::member_table);

/// The histogram path of a process's samples kept under its parent: those
/// of every watched process forked after the probes attached, whose parent
/// is watched too. A histogram is a 9 KB value per CPU, which the kernel
/// allocates without sleeping in the switch path: where a process is
/// forked per request (postgres without persistent connections) those
/// allocations failed by the hundred a second, and the samples with them.
/// One histogram per parent is allocated once; userspace counts it in the
/// role of the parent's children.
pub const CHILDREN_PATH: u64 = 1;

/// One thread's slot: whose it is, since when it has been runnable (0: not
/// waiting) and when it last went on a CPU (0: not seen).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RunSlot {
    pub tid: u32,
    pub _pad: u32,
    pub runnable_ns: u64,
    pub ran_ns: u64,
}

crate::assert_layout!(RunSlot, 24, { tid: 0, _pad: 4, runnable_ns: 8, ran_ns: 16 });

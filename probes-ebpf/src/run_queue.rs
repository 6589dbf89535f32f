//! Run-queue latency, on-CPU slices and preemptions of watched threads (see
//! probes_common::run_queue). The switch hook fires for every task on the
//! host, so an unwatched one costs a load of its process id and one
//! watch-set lookup, nothing more.

use aya_ebpf::{Global, macros::btf_tracepoint, programs::BtfTracePointContext};
use probes_common::{hist::HistMetric, run_queue::CHILDREN_PATH};

use crate::{
    clock::now,
    hist, memory,
    offsets::offset_globals,
    slots,
    watch_set::{is_forked, is_watched},
};

probes_common::run_queue_members!(offset_globals);

/// `task_struct.__state` or `.state` (see probes_common::run_queue).
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static RUNQ_TASK_STATE: Global<u32> = Global::new(0);

/// A `struct task_struct *` the verifier knows from BTF.
#[derive(Clone, Copy)]
struct Task(*const u8);

impl Task {
    #[inline(always)]
    fn tgid(self) -> u32 {
        memory::btf(self.0, &RUNQ_TASK_TGID)
    }

    #[inline(always)]
    fn tid(self) -> u32 {
        memory::btf(self.0, &RUNQ_TASK_PID)
    }

    /// Its parent's process id (`real_parent`: the forker, not a tracer).
    #[inline(always)]
    fn parent_tgid(self) -> u32 {
        // The verifier types the loaded pointer as the task it is.
        let parent = memory::btf::<u64>(self.0, &RUNQ_TASK_REAL_PARENT) as *const u8;
        if parent.is_null() {
            return 0;
        }
        memory::btf(parent, &RUNQ_TASK_TGID)
    }

    /// Where its process's samples go: its own histograms, or for a process
    /// forked by a watched one after the probes attached, its parent's
    /// children's (see [`CHILDREN_PATH`]).
    #[inline(always)]
    fn hist_owner(self, tgid: u32) -> (u32, u64) {
        if is_forked(tgid) {
            let parent = self.parent_tgid();
            if is_watched(parent) {
                return (parent, CHILDREN_PATH);
            }
        }
        (tgid, 0)
    }

    /// Its state is TASK_RUNNING (0). The low 32 bits of the older `long
    /// state` say as much.
    #[inline(always)]
    fn is_running(self) -> bool {
        memory::btf::<u32>(self.0, &RUNQ_TASK_STATE) == 0
    }
}

/// `sched_wakeup(struct task_struct *p)`.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn runq_wakeup(ctx: BtfTracePointContext) -> u32 {
    woken(Task(ctx.arg(0)));
    0
}

/// `sched_wakeup_new(struct task_struct *p)`: a new task's first wakeup.
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn runq_wakeup_new(ctx: BtfTracePointContext) -> u32 {
    woken(Task(ctx.arg(0)));
    0
}

/// A watched thread became runnable: its wait starts, unless it is already
/// waiting (woken again while queued, it has been runnable since the first).
#[inline(always)]
fn woken(task: Task) {
    if !is_watched(task.tgid()) {
        return;
    }
    let tid = task.tid();
    let Some(slot) = slots::run(tid) else {
        return;
    };
    if slot.tid == tid {
        if slot.runnable_ns == 0 {
            slot.runnable_ns = now();
        }
    } else {
        slot.tid = tid;
        slot.runnable_ns = now();
        slot.ran_ns = 0;
    }
}

/// `sched_switch(bool preempt, struct task_struct *prev, struct
/// task_struct *next, ...)`; the `prev_state` argument came in 5.18 and
/// can be stale before 6.16, so the state is read from `prev` itself.
#[btf_tracepoint(function = "sched_switch")]
pub fn runq_switch(ctx: BtfTracePointContext) -> u32 {
    let preempt = ctx.arg::<u64>(0) as u8 != 0;
    let prev = Task(ctx.arg(1));
    let next = Task(ctx.arg(2));
    let prev_tgid = prev.tgid();
    let next_tgid = next.tgid();
    let prev_watched = is_watched(prev_tgid);
    let next_watched = is_watched(next_tgid);
    if !prev_watched && !next_watched {
        return 0;
    }
    let now = now();
    if prev_watched {
        switched_out(prev, prev_tgid, preempt, now);
    }
    if next_watched {
        switched_in(next, next_tgid, now);
    }
    0
}

/// `task` leaves its CPU: its slice ends; still runnable (preempted, or
/// yielding) it waits again from now, else (blocked) it waits for nothing.
#[inline(always)]
fn switched_out(task: Task, tgid: u32, preempt: bool, now: u64) {
    let tid = task.tid();
    let Some(slot) = slots::run(tid) else {
        return;
    };
    let ran = slot.tid == tid && slot.ran_ns != 0;
    let runnable = preempt || task.is_running();
    if ran || runnable {
        let (owner, path) = task.hist_owner(tgid);
        if ran {
            hist::record(
                owner,
                HistMetric::OnCpu,
                path,
                now.saturating_sub(slot.ran_ns),
            );
        }
        if runnable {
            hist::record(owner, HistMetric::Preempted, path, 0);
        }
    }
    slot.tid = tid;
    slot.ran_ns = 0;
    slot.runnable_ns = if runnable { now } else { 0 };
}

/// `task` gets a CPU: its wait, if one was seen to start, is a sample.
#[inline(always)]
fn switched_in(task: Task, tgid: u32, now: u64) {
    let tid = task.tid();
    let Some(slot) = slots::run(tid) else {
        return;
    };
    if slot.tid == tid && slot.runnable_ns != 0 {
        let (owner, path) = task.hist_owner(tgid);
        hist::record(
            owner,
            HistMetric::RunQueue,
            path,
            now.saturating_sub(slot.runnable_ns),
        );
    }
    slot.tid = tid;
    slot.runnable_ns = 0;
    slot.ran_ns = now;
}

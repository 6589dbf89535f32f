//! The watch set follows the process tree: a watched process's children are
//! watched from fork, a process that execs into a watched name from exec, and
//! exiting tasks leave the map so a recycled pid is not watched by mistake.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use probes_common::{
    TASK_COMM_LEN,
    stats::Stat,
    watch::{WATCHED_MAX_ENTRIES, WATCHED_NAMES_MAX_ENTRIES, WatchReason},
};

use crate::events::count;

#[map]
static WATCHED: HashMap<u32, u32> = HashMap::with_max_entries(WATCHED_MAX_ENTRIES, 0);

#[map]
static WATCHED_NAMES: HashMap<[u8; TASK_COMM_LEN], u32> =
    HashMap::with_max_entries(WATCHED_NAMES_MAX_ENTRIES, 0);

/// Offset of `child_pid` in the `sched_process_fork` record, read from tracefs
/// at load time (6.18 moved it).
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: Global<u32> = Global::new(0);

#[inline(always)]
pub fn is_watched(tgid: u32) -> bool {
    WATCHED.get_ptr(tgid).is_some()
}

fn watch(pid: u32, reason: WatchReason) {
    if WATCHED.insert(pid, reason as u32, 0).is_err() {
        count(Stat::WatchFull);
    }
}

#[tracepoint]
pub fn watch_fork(ctx: TracePointContext) -> u32 {
    let parent_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_watched(parent_tgid) {
        return 0;
    }
    // The record does not say whether the child is a thread. A thread's tid
    // entry is harmless while it lives (no process can hold that number) and
    // leaves at its exit.
    let Ok(child) = (unsafe { ctx.read_at::<i32>(FORK_CHILD_PID_OFFSET.load() as usize) }) else {
        return 0;
    };
    watch(child as u32, WatchReason::Forked);
    0
}

#[tracepoint]
pub fn watch_exec(_ctx: TracePointContext) -> u32 {
    // comm is already the new program's name when sched_process_exec fires.
    let Ok(mut comm) = bpf_get_current_comm() else {
        return 0;
    };
    let named = unsafe { WATCHED_NAMES.get(comm) }.is_some()
        || (strip_version(&mut comm) && unsafe { WATCHED_NAMES.get(comm) }.is_some());
    if named {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if !is_watched(tgid) {
            watch(tgid, WatchReason::Exec);
        }
    }
    0
}

#[tracepoint]
pub fn watch_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Removes a thread's own entry, or the process's entry when its main
    // thread (tid == tgid) exits.
    let _ = WATCHED.remove(tid);
    crate::accept::forget_thread(tid);
    0
}

/// Cuts a trailing run of digits and dots (`php-fpm8.2` → `php-fpm`), unless
/// that would leave nothing; returns whether it cut. The same rule as
/// `Selector::matches_name` in userspace.
#[inline(always)]
fn strip_version(comm: &mut [u8; TASK_COMM_LEN]) -> bool {
    const NONE: usize = TASK_COMM_LEN;
    let mut len = TASK_COMM_LEN;
    let mut run_start = NONE;
    for (i, &c) in comm.iter().enumerate() {
        if c == 0 {
            len = i;
            break;
        }
        if c.is_ascii_digit() || c == b'.' {
            if run_start == NONE {
                run_start = i;
            }
        } else {
            run_start = NONE;
        }
    }
    if run_start == 0 || run_start >= len {
        return false;
    }
    for (i, c) in comm.iter_mut().enumerate() {
        if i >= run_start {
            *c = 0;
        }
    }
    true
}

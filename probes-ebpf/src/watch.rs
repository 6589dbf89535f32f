//! The watch set follows the process tree: a watched process's children are
//! watched from fork, a process that execs into a watched name from exec, and
//! exiting tasks leave the map so a recycled pid is not watched by mistake.

use aya_ebpf::{
    Global,
    bindings::BPF_F_MMAPABLE,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use probes_common::{
    TASK_COMM_LEN,
    stats::Stat,
    watch::{
        PIDS_PER_CHUNK, WATCHED_DEFAULT_CHUNKS, WATCHED_NAMES_MAX_ENTRIES, WatchChunk, WatchReason,
    },
};

use crate::events::count;

#[map]
static WATCHED: Array<WatchChunk> = Array::with_max_entries(WATCHED_DEFAULT_CHUNKS, BPF_F_MMAPABLE);

#[map]
static WATCHED_NAMES: HashMap<[u8; TASK_COMM_LEN], u32> =
    HashMap::with_max_entries(WATCHED_NAMES_MAX_ENTRIES, 0);

/// Offset of `child_pid` in the `sched_process_fork` record, read from tracefs
/// at load time (6.18 moved it).
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: Global<u32> = Global::new(0);

/// The byte for `pid`, or None past the array (pid_max raised after load).
#[inline(always)]
fn byte(pid: u32) -> Option<*mut u8> {
    let chunk = WATCHED.get_ptr_mut(pid / PIDS_PER_CHUNK as u32)?;
    // SAFETY: the index is below PIDS_PER_CHUNK, inside the chunk.
    Some(unsafe { chunk.cast::<u8>().add(pid as usize % PIDS_PER_CHUNK) })
}

#[inline(always)]
pub fn is_watched(tgid: u32) -> bool {
    byte(tgid).is_some_and(|b| unsafe { *b } != 0)
}

fn watch(pid: u32, reason: WatchReason) {
    match byte(pid) {
        Some(b) => unsafe { *b = reason as u8 },
        None => count(Stat::WatchOutOfRange),
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
    // Clears a thread's own entry, or the process's entry when its main
    // thread (tid == tgid) exits. Read first: this runs at every exit on the
    // machine, and most bytes are already 0.
    if let Some(b) = byte(tid)
        && unsafe { *b } != 0
    {
        unsafe { *b = 0 };
    }
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

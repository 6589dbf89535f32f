//! The watch set follows the process tree: a watched process's children are
//! watched from fork, a process that execs into a watched name from exec, and
//! exiting tasks leave the map so a recycled pid is not watched by mistake.
//! The same three tracepoints report the lifecycle of watched processes.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use probes_common::{
    TASK_COMM_LEN,
    event::EventKind,
    lifecycle::{ExecEvent, ExitEvent, SpawnEvent},
    stats::Stat,
    watch::{WATCHED_CGROUPS_MAX_ENTRIES, WATCHED_NAMES_MAX_ENTRIES, WatchReason, version_start},
};

use crate::{
    clock::now,
    events, memory, slots,
    watch_set::{self, is_watched, watch},
};

#[map]
static WATCHED_NAMES: HashMap<[u8; TASK_COMM_LEN], u32> =
    HashMap::with_max_entries(WATCHED_NAMES_MAX_ENTRIES, 0);

#[map]
static WATCHED_CGROUPS: HashMap<u64, u32> =
    HashMap::with_max_entries(WATCHED_CGROUPS_MAX_ENTRIES, 0);

/// Offset of `child_pid` in the `sched_process_fork` record, read from tracefs
/// at load time (6.18 moved it).
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: Global<u32> = Global::new(0);

#[tracepoint]
pub fn watch_fork(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let parent_tgid = (pid_tgid >> 32) as u32;
    if !is_watched(parent_tgid) {
        return 0;
    }
    let Some(child) = memory::field::<i32>(&ctx, &FORK_CHILD_PID_OFFSET) else {
        return 0;
    };
    // A thread's tid entry is harmless while it lives (no process can hold
    // that number) and leaves at its exit.
    watch(child as u32, WatchReason::Forked);
    // This runs inside the parent's clone, before the child is woken: the
    // flags the clone probe saw tell a thread from a process, and this event
    // reaches the ring before anything the child does.
    let flags = slots::fork_flags_in_flight(pid_tgid as u32);
    let Some(mut entry) = events::reserve::<SpawnEvent>(Stat::LostSpawn) else {
        return 0;
    };
    entry.write(SpawnEvent {
        kind: EventKind::Spawn as u32,
        parent_tgid,
        parent_tid: pid_tgid as u32,
        child: child as u32,
        flags: flags.unwrap_or(0),
        flags_known: flags.is_some() as u32,
        _pad: 0,
        ts_ns: now(),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    events::submit(entry);
    0
}

#[tracepoint]
pub fn watch_exec(_ctx: TracePointContext) -> u32 {
    // comm is already the new program's name when sched_process_exec fires.
    let Ok(comm) = bpf_get_current_comm() else {
        return 0;
    };
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_watched(tgid) {
        let mut key = comm;
        let named = is_watched_name(&key) || (strip_version(&mut key) && is_watched_name(&key));
        if !named && !in_watched_cgroup() {
            return 0;
        }
        watch(tgid, WatchReason::Exec);
    }
    let Some(mut entry) = events::reserve::<ExecEvent>(Stat::LostExec) else {
        return 0;
    };
    entry.write(ExecEvent {
        kind: EventKind::Exec as u32,
        tgid,
        ts_ns: now(),
        comm,
    });
    events::submit(entry);
    0
}

#[tracepoint]
pub fn watch_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // A dying thread's syscalls in flight must not be finished by a later
    // thread that reuses its id (inlined array loads: cheap for every exit).
    slots::forget_thread(tid);
    // Clears a thread's own entry, or the process's entry when its main
    // thread (tid == tgid) exits.
    if !watch_set::forget(tid) {
        return 0;
    }
    let tgid = (pid_tgid >> 32) as u32;
    if tid == tgid
        && let Some(mut entry) = events::reserve::<ExitEvent>(Stat::LostExit)
    {
        entry.write(ExitEvent {
            kind: EventKind::Exit as u32,
            tgid,
            ts_ns: now(),
        });
        events::submit(entry);
    }
    0
}

/// Whether processes that exec into `comm` are watched.
#[inline(always)]
fn is_watched_name(comm: &[u8; TASK_COMM_LEN]) -> bool {
    // SAFETY: only whether the key is there is used, never the value the
    // reference points to (which userspace could change meanwhile).
    unsafe { WATCHED_NAMES.get(comm) }.is_some()
}

/// Whether the current task runs in a selected cgroup (its cgroup v2
/// one). Asked only at the exec of an unwatched process with an unwatched
/// name: rare enough for one lookup, selected cgroups or not.
#[inline(always)]
fn in_watched_cgroup() -> bool {
    // SAFETY: as in `is_watched_name`.
    unsafe { WATCHED_CGROUPS.get(bpf_get_current_cgroup_id()) }.is_some()
}

/// Cuts comm's trailing version (`php-fpm8.2` → `php-fpm`, see
/// `version_start`); returns whether there was one.
#[inline(always)]
fn strip_version(comm: &mut [u8; TASK_COMM_LEN]) -> bool {
    let Some(start) = version_start(comm) else {
        return false;
    };
    for (i, c) in comm.iter_mut().enumerate() {
        if i >= start {
            *c = 0;
        }
    }
    true
}

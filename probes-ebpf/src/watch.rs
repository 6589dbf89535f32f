//! The watch set follows the process tree: a watched process's children are
//! watched from fork, a process that execs into a watched name from exec, and
//! exiting tasks leave the map so a recycled pid is not watched by mistake.
//! The same three tracepoints report the lifecycle of watched processes.

use aya_ebpf::{
    Global,
    bindings::BPF_F_MMAPABLE,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use probes_common::{
    TASK_COMM_LEN,
    event::EventKind,
    lifecycle::{ExecEvent, ExitEvent, SpawnEvent},
    stats::Stat,
    watch::{
        PIDS_PER_CHUNK, WATCHED_DEFAULT_CHUNKS, WATCHED_NAMES_MAX_ENTRIES, WatchChunk, WatchReason,
        version_start,
    },
};

use crate::{events, events::count, fork};

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
    let pid_tgid = bpf_get_current_pid_tgid();
    let parent_tgid = (pid_tgid >> 32) as u32;
    if !is_watched(parent_tgid) {
        return 0;
    }
    let Ok(child) = (unsafe { ctx.read_at::<i32>(FORK_CHILD_PID_OFFSET.load() as usize) }) else {
        return 0;
    };
    // A thread's tid entry is harmless while it lives (no process can hold
    // that number) and leaves at its exit.
    watch(child as u32, WatchReason::Forked);
    // This runs inside the parent's clone, before the child is woken: the
    // flags the clone probe saw tell a thread from a process, and this event
    // reaches the ring before anything the child does.
    let flags = fork::flags_in_flight(pid_tgid as u32);
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
        ts_ns: unsafe { bpf_ktime_get_ns() },
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
        let named = unsafe { WATCHED_NAMES.get(key) }.is_some()
            || (strip_version(&mut key) && unsafe { WATCHED_NAMES.get(key) }.is_some());
        if !named {
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
        ts_ns: unsafe { bpf_ktime_get_ns() },
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
    crate::accept::forget_thread(tid);
    fork::forget_thread(tid);
    // Clears a thread's own entry, or the process's entry when its main
    // thread (tid == tgid) exits. Read first: this runs at every exit on the
    // machine, and most bytes are already 0.
    let Some(b) = byte(tid) else {
        return 0;
    };
    if unsafe { *b } == 0 {
        return 0;
    }
    unsafe { *b = 0 };
    let tgid = (pid_tgid >> 32) as u32;
    if tid == tgid
        && let Some(mut entry) = events::reserve::<ExitEvent>(Stat::LostExit)
    {
        entry.write(ExitEvent {
            kind: EventKind::Exit as u32,
            tgid,
            ts_ns: unsafe { bpf_ktime_get_ns() },
        });
        events::submit(entry);
    }
    0
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

//! accept(2)/accept4(2) latency. One program for both syscalls' enter and one
//! for both exits: the records share a layout (checked by userspace).

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use probes_common::{
    accept::{ACCEPT_START_MAX_ENTRIES, AcceptEvent, AcceptStart},
    event::EventKind,
    stats::Stat,
};

use crate::{events, watch::is_watched};

#[map]
static ACCEPT_START: HashMap<u64, AcceptStart> =
    HashMap::with_max_entries(ACCEPT_START_MAX_ENTRIES, 0);

#[unsafe(no_mangle)]
static ACCEPT_ENTER_FD_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static ACCEPT_EXIT_RET_OFFSET: Global<u32> = Global::new(16);

#[tracepoint]
pub fn accept_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_watched((pid_tgid >> 32) as u32) {
        return 0;
    }
    let listen_fd = unsafe { ctx.read_at::<u64>(ACCEPT_ENTER_FD_OFFSET.load() as usize) }
        .map(|fd| fd as i32)
        .unwrap_or(-1);
    let start = AcceptStart {
        start_ns: unsafe { bpf_ktime_get_ns() },
        listen_fd,
        _pad: 0,
    };
    if ACCEPT_START.insert(pid_tgid, start, 0).is_err() {
        events::count(Stat::AcceptStartFull);
    }
    0
}

#[tracepoint]
pub fn accept_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // Only watched threads have an entry: this lookup is the whole cost for
    // everyone else.
    let Some(start) = (unsafe { ACCEPT_START.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = ACCEPT_START.remove(pid_tgid);
    let now = unsafe { bpf_ktime_get_ns() };
    let Ok(ret) = (unsafe { ctx.read_at::<i64>(ACCEPT_EXIT_RET_OFFSET.load() as usize) }) else {
        return 0;
    };
    if ret < 0 {
        // EAGAIN from a non-blocking listener, EINTR, ...: no connection was accepted.
        return 0;
    }
    let Some(mut entry) = events::reserve::<AcceptEvent>() else {
        return 0;
    };
    entry.write(AcceptEvent {
        kind: EventKind::Accept as u32,
        tgid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        listen_fd: start.listen_fd,
        conn_fd: ret as i32,
        _pad: 0,
        start_ns: start.start_ns,
        latency_ns: now.saturating_sub(start.start_ns),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    events::submit(entry);
    0
}

/// Called when a thread exits, so an accept interrupted by exit leaves no entry.
pub fn forget_thread(pid_tgid: u64) {
    let _ = ACCEPT_START.remove(pid_tgid);
}

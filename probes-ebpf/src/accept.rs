//! accept(2)/accept4(2) latency. One program for both syscalls' enter and one
//! for both exits: the records share a layout (checked by userspace).

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::Array,
    programs::TracePointContext,
};
use probes_common::{
    DEFAULT_SLOTS,
    accept::{AcceptEvent, AcceptStart},
    event::EventKind,
    stats::Stat,
};

use crate::{events, slots, watch::is_watched};

#[map]
static ACCEPT_START: Array<AcceptStart> = Array::with_max_entries(DEFAULT_SLOTS, 0);
#[unsafe(no_mangle)]
static ACCEPT_EXIT_RET_OFFSET: Global<u32> = Global::new(16);

#[inline(always)]
fn slot(tid: u32) -> Option<&'static mut AcceptStart> {
    slots::slot(&ACCEPT_START, tid)
}

#[tracepoint]
pub fn accept_enter(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_watched((pid_tgid >> 32) as u32) {
        return 0;
    }
    let tid = pid_tgid as u32;
    let Some(slot) = slot(tid) else {
        return 0;
    };
    if slot.start_ns != 0 && slot.tid != tid {
        // Another watched thread's accept is in flight in this slot and is
        // about to lose its start time.
        events::count(Stat::AcceptSlotShared);
    }
    slot.tid = tid;
    slot.start_ns = unsafe { bpf_ktime_get_ns() };
    0
}

#[tracepoint]
pub fn accept_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Only a watched thread finds its own start here: this inlined array
    // lookup is the whole cost for everyone else.
    let Some(slot) = slot(tid) else {
        return 0;
    };
    if slot.start_ns == 0 || slot.tid != tid {
        return 0;
    }
    let start_ns = slot.start_ns;
    slot.start_ns = 0;
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
        tid,
        conn_fd: ret as i32,
        start_ns,
        latency_ns: now.saturating_sub(start_ns),
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    events::submit(entry);
    0
}

/// Called when a thread exits, so an accept interrupted by exit frees its slot.
pub fn forget_thread(tid: u32) {
    if let Some(slot) = slot(tid)
        && slot.tid == tid
    {
        slot.start_ns = 0;
    }
}

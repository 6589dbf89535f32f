//! Where a served unix connection ends (see services), on one of two
//! rungs. Where the kernel takes fentry: the release of the unix socket's
//! last file reference (`unix_release`), whoever drops it, at one run per
//! unix socket released on the host. Else: the close(2) of a watched
//! process that drops its last reference, or the exit of a watched process
//! that holds it; every other process's close or exit costs the watch-set
//! load, and a watched one's that holds none two lookups; a program of its
//! own for the exit, whose look through the fd table the lifecycle probe's
//! verification need not carry.

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_pid_tgid,
    macros::{fentry, tracepoint},
    programs::{FEntryContext, TracePointContext},
};

use crate::{memory, services, watch_set::is_watched};

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static CLOSE_FD_OFFSET: Global<u32> = Global::new(16);

#[tracepoint]
pub fn service_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    // The process's exit: its main thread's.
    if pid_tgid as u32 == (pid_tgid >> 32) as u32 && is_watched(pid_tgid as u32) {
        services::exiting();
    }
    0
}

#[tracepoint]
pub fn service_close(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !is_watched(tgid) {
        return 0;
    }
    if let Some(fd) = memory::field::<u64>(&ctx, &CLOSE_FD_OFFSET) {
        services::closing(tgid, fd as u32);
    }
    0
}

#[fentry(function = "unix_release")]
pub fn service_release(ctx: FEntryContext) -> u32 {
    services::released(ctx.arg(0));
    0
}

//! Lifecycle events of watched processes, from the `sched` tracepoints that
//! also keep the watch set (probes-ebpf/src/watch.rs).

use crate::TASK_COMM_LEN;

/// `sched_process_fork` in a watched process. Emitted before the child can
/// run, so it precedes every event of the child in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SpawnEvent {
    /// Always [`crate::event::EventKind::Spawn`].
    pub kind: u32,
    pub parent_tgid: u32,
    pub parent_tid: u32,
    /// The new task's id (a pid for a process, a tid for a thread).
    pub child: u32,
    /// The clone flags of the parent's syscall in flight, when known.
    pub flags: u64,
    pub flags_known: u32,
    pub _pad: u32,
    pub ts_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::assert_layout!(SpawnEvent, 56, {
    kind: 0,
    parent_tgid: 4,
    parent_tid: 8,
    child: 12,
    flags: 16,
    flags_known: 24,
    _pad: 28,
    ts_ns: 32,
    comm: 40,
});

/// `sched_process_exec` in a watched process; `comm` is the new program's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExecEvent {
    /// Always [`crate::event::EventKind::Exec`].
    pub kind: u32,
    pub tgid: u32,
    pub ts_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

crate::assert_layout!(ExecEvent, 32, { kind: 0, tgid: 4, ts_ns: 8, comm: 16 });

/// `sched_process_exit` of a watched process's main thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitEvent {
    /// Always [`crate::event::EventKind::Exit`].
    pub kind: u32,
    pub tgid: u32,
    pub ts_ns: u64,
}

crate::assert_layout!(ExitEvent, 16, { kind: 0, tgid: 4, ts_ns: 8 });

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::SpawnEvent {}
    unsafe impl aya::Pod for super::ExecEvent {}
    unsafe impl aya::Pod for super::ExitEvent {}
}

//! accept(2)/accept4(2) latency: the syscall tracepoints' enter and exit are
//! paired per thread in the kernel, and each successful accept becomes one
//! [`AcceptEvent`].

use crate::TASK_COMM_LEN;

/// Array of [`AcceptStart`] slots (see [`crate::DEFAULT_SLOTS`]).
pub const ACCEPT_START_MAP: &str = "ACCEPT_START";
/// Global holding the offset of `ret` in `sys_exit_accept{,4}`.
pub const EXIT_RET_OFFSET_GLOBAL: &str = "ACCEPT_EXIT_RET_OFFSET";

/// Offsets for walking from the accepted fd to its socket
/// (current->files->fdt->fd[fd]->private_data->sk), from BTF.
pub const FD_WALK_GLOBALS: [&str; 5] = [
    "TASK_FILES",
    "FILES_FDT",
    "FDTABLE_FD",
    "FILE_PRIVATE_DATA",
    "SOCKET_SK",
];

/// `queue_wait_ns` when the accepted connection's establishment was not seen
/// (a unix socket, an unwatched listener, or established before attach).
pub const QUEUE_WAIT_UNKNOWN: u64 = u64::MAX;

/// Programs and the tracepoints each one attaches to.
pub const ENTER_PROGRAM: &str = "accept_enter";
pub const EXIT_PROGRAM: &str = "accept_exit";
pub const ENTER_TRACEPOINTS: [&str; 2] = ["sys_enter_accept", "sys_enter_accept4"];
pub const EXIT_TRACEPOINTS: [&str; 2] = ["sys_exit_accept", "sys_exit_accept4"];

/// An accept in flight: `start_ns` is 0 when the slot is free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AcceptStart {
    pub start_ns: u64,
    pub tid: u32,
    /// Explicit so the type has no implicit padding.
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AcceptEvent {
    /// Always [`crate::event::EventKind::Accept`].
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// The accepted connection's fd (the syscall's return value).
    pub conn_fd: i32,
    /// `bpf_ktime_get_ns()` when the thread entered accept.
    pub start_ns: u64,
    /// Time spent inside the syscall, including any wait for a connection.
    pub latency_ns: u64,
    /// Accept-queue wait: from the TCP handshake completing to this accept
    /// returning it, or [`QUEUE_WAIT_UNKNOWN`].
    pub queue_wait_ns: u64,
    pub comm: [u8; TASK_COMM_LEN],
}

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::AcceptStart {}
    unsafe impl aya::Pod for super::AcceptEvent {}
}

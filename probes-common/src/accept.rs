//! accept(2)/accept4(2) latency: the syscall tracepoints' enter and exit are
//! paired per thread in the kernel, and each successful accept's latency and
//! accept-queue wait go to the kernel's histograms ([`crate::hist`]).

use crate::offsets::MemberOffset;

/// Array of [`AcceptStart`] slots (see [`crate::DEFAULT_SLOTS`]).
pub const ACCEPT_START_MAP: &str = "ACCEPT_START";
/// Global holding the offset of `ret` in `sys_exit_accept{,4}`.
pub const EXIT_RET_OFFSET_GLOBAL: &str = "ACCEPT_EXIT_RET_OFFSET";
/// Global holding the offset of `fd` (the listening socket) in
/// `sys_enter_accept{,4}`.
pub const ENTER_FD_OFFSET_GLOBAL: &str = "ACCEPT_ENTER_FD_OFFSET";

/// Global set to 1 where the kernel has `bpf_get_current_task_btf` (5.11
/// and later; its `enum bpf_func_id` value is [`TASK_BTF_HELPER`]): the
/// walk's steps up to the fd array are then plain loads, not helper calls.
pub const TASK_BTF_GLOBAL: &str = "ACCEPT_TASK_BTF";
pub const TASK_BTF_HELPER: &str = "BPF_FUNC_get_current_task_btf";

/// The members walked from the accepted fd to its socket
/// (current->files->fdt->fd[fd]->private_data->sk), each at the offset in
/// its global (see [`crate::offsets`]).
#[macro_export]
macro_rules! accept_fd_walk_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            TASK_FILES: task_struct.files,
            FILES_FDT: files_struct.fdt,
            FDTABLE_FD: fdtable.fd,
            FILE_PRIVATE_DATA: file.private_data,
            SOCKET_SK: socket.sk,
        }
    };
}
pub const FD_WALK_MEMBERS: &[MemberOffset] = &accept_fd_walk_members!(crate::member_table);

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
    /// The `struct sock` `inet_csk_accept` returned inside this accept, when
    /// a kernel_clone-style hook on it is attached (0: not seen).
    pub sk: u64,
    pub tid: u32,
    /// The listening socket's fd plus one (0: not known).
    pub listener: u32,
}

crate::assert_layout!(AcceptStart, 24, { start_ns: 0, sk: 8, tid: 16, listener: 20 });

/// One-entry array: [`SOCK_FROM_HOOK`] when the hook on `inet_csk_accept`
/// is attached and fills [`AcceptStart::sk`], so the exit skips the fd walk.
pub const ACCEPT_CONFIG_MAP: &str = "ACCEPT_CONFIG";
pub const SOCK_FROM_HOOK: u32 = 1;
/// The kernel function that hands a TCP listener's queued connection over.
pub const INET_CSK_ACCEPT: &str = "inet_csk_accept";
/// fexit programs by the number of arguments `inet_csk_accept` takes (its
/// return value follows them in the context): 4 before 6.10, 2 since.
pub const FEXIT_PROGRAMS: [(u32, &str); 2] =
    [(4, "inet_csk_accept_fexit4"), (2, "inet_csk_accept_fexit2")];
pub const KRETPROBE_PROGRAM: &str = "inet_csk_accept_kretprobe";

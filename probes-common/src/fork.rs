//! clone/clone3/fork/vfork latency as the parent sees it: the syscall's enter
//! and exit are paired per thread, and each call's latency goes to the
//! kernel's histograms ([`crate::hist`]) under what it created.

use crate::offsets::MemberOffset;

/// Array of [`ForkStart`] slots (see [`crate::DEFAULT_SLOTS`]).
pub const FORK_START_MAP: &str = "FORK_START";

/// `clone_flags` in `sys_enter_clone`.
pub const CLONE_FLAGS_OFFSET_GLOBAL: &str = "CLONE_FLAGS_OFFSET";
/// `uargs` (a user pointer to `struct clone_args`, flags first) in `sys_enter_clone3`.
pub const CLONE3_UARGS_OFFSET_GLOBAL: &str = "CLONE3_UARGS_OFFSET";
/// `ret` in the four `sys_exit_*` records.
pub const EXIT_RET_OFFSET_GLOBAL: &str = "FORK_EXIT_RET_OFFSET";

/// `flags` in `struct kernel_clone_args`, for the kernel_clone rungs (see
/// [`crate::offsets`]). Kernels before 5.10 have neither.
#[macro_export]
macro_rules! fork_kernel_clone_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            KERNEL_CLONE_FLAGS_OFFSET: kernel_clone_args.flags,
        }
    };
}
pub const KERNEL_CLONE_MEMBERS: &[MemberOffset] = &fork_kernel_clone_members!(crate::member_table);
/// The kernel function every clone/fork syscall calls (5.10+; `_do_fork` before).
pub const KERNEL_CLONE: &str = "kernel_clone";
pub const FENTRY_PROGRAM: &str = "kernel_clone_fentry";
pub const FEXIT_PROGRAM: &str = "kernel_clone_fexit";
pub const KPROBE_PROGRAM: &str = "kernel_clone_kprobe";
pub const KRETPROBE_PROGRAM: &str = "kernel_clone_kretprobe";

pub const ENTER_CLONE_PROGRAM: &str = "clone_enter";
pub const ENTER_CLONE3_PROGRAM: &str = "clone3_enter";
/// fork(2) and vfork(2): no arguments, always a new process.
pub const ENTER_FORK_PROGRAM: &str = "fork_enter";
pub const EXIT_PROGRAM: &str = "clone_exit";
pub const ENTER_FORK_TRACEPOINTS: [&str; 2] = ["sys_enter_fork", "sys_enter_vfork"];
pub const EXIT_TRACEPOINTS: [&str; 4] = [
    "sys_exit_clone",
    "sys_exit_clone3",
    "sys_exit_fork",
    "sys_exit_vfork",
];

/// The new task shares the caller's thread group: a thread, not a process.
pub const CLONE_THREAD: u64 = 0x0001_0000;
/// fork(2) is clone with just the exit signal set.
pub const FORK_FLAGS: u64 = 17; // SIGCHLD
/// vfork(2): CLONE_VFORK | CLONE_VM | SIGCHLD.
pub const VFORK_FLAGS: u64 = 0x4000 | 0x100 | 17;

/// What a clone created, from its flags: the rule both the kernel (folding
/// a sample under a metric) and userspace (reading a spawn event) apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    Process,
    Thread,
    /// The clone started before the probes attached, so its flags were not seen.
    Unknown,
}

impl TaskKind {
    /// `flags`: the clone's flags, None when they were not seen.
    #[inline(always)]
    pub fn from_flags(flags: Option<u64>) -> Self {
        match flags {
            Some(f) if f & CLONE_THREAD != 0 => Self::Thread,
            Some(_) => Self::Process,
            None => Self::Unknown,
        }
    }
}

/// A clone in flight: `start_ns` is 0 when the slot is free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ForkStart {
    pub start_ns: u64,
    pub flags: u64,
    pub tid: u32,
    /// 1 when `flags` was read (clone3's are in user memory, which can fail).
    pub flags_known: u32,
}

crate::assert_layout!(ForkStart, 24, { start_ns: 0, flags: 8, tid: 16, flags_known: 20 });

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_thread_makes_a_thread_and_unseen_flags_an_unknown() {
        assert_eq!(TaskKind::from_flags(Some(FORK_FLAGS)), TaskKind::Process);
        assert_eq!(TaskKind::from_flags(Some(VFORK_FLAGS)), TaskKind::Process);
        // pthread_create's flags: CLONE_VM | CLONE_FS | CLONE_FILES |
        // CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM | CLONE_SETTLS |
        // CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID.
        assert_eq!(TaskKind::from_flags(Some(0x003d_0f00)), TaskKind::Thread);
        assert_eq!(TaskKind::from_flags(Some(CLONE_THREAD)), TaskKind::Thread);
        assert_eq!(TaskKind::from_flags(None), TaskKind::Unknown);
    }
}

//! The watch set: which processes the probes report on. It lives in the
//! kernel so unwatched processes cost one map lookup and children are watched
//! from their first instruction.

/// Map from tgid (or, for a thread created by a watched process, its tid until
/// it exits) to the [`WatchReason`] as a `u32`.
pub const WATCHED_MAP: &str = "WATCHED";
pub const WATCHED_MAX_ENTRIES: u32 = 65536;

/// Map from a NUL-padded `comm` to 1: a process that execs into a matching
/// name starts being watched.
pub const WATCHED_NAMES_MAP: &str = "WATCHED_NAMES";
pub const WATCHED_NAMES_MAX_ENTRIES: u32 = 64;

/// Global holding the offset of `child_pid` in `sched/sched_process_fork`.
pub const FORK_CHILD_PID_OFFSET_GLOBAL: &str = "FORK_CHILD_PID_OFFSET";

pub const FORK_PROGRAM: &str = "watch_fork";
pub const EXEC_PROGRAM: &str = "watch_exec";
pub const EXIT_PROGRAM: &str = "watch_exit";

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchReason {
    /// Selected by userspace at start (by `--pid` or a name match in /proc).
    Selected = 1,
    /// Exec'd into a watched name after stackprobe started.
    Exec = 2,
    /// Forked by a watched process.
    Forked = 3,
}

impl WatchReason {
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Selected),
            2 => Some(Self::Exec),
            3 => Some(Self::Forked),
            _ => None,
        }
    }
}

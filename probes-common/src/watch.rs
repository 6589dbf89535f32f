//! The watch set: which processes the probes report on. It lives in the
//! kernel so unwatched processes cost one inlined array load and children are
//! watched from their first instruction.

/// Array with one byte per pid ([`WatchReason`], 0 = not watched), grouped in
/// chunks of [`PIDS_PER_CHUNK`] so no array value is padded. Sized from
/// `pid_max` at load; userspace maps it (`BPF_F_MMAPABLE`) and writes single
/// bytes, so it never overwrites a byte the kernel is changing.
pub const WATCHED_MAP: &str = "WATCHED";
pub const PIDS_PER_CHUNK: usize = 64;
pub type WatchChunk = [u8; PIDS_PER_CHUNK];
/// Chunks before userspace sizes the map (covers pid_max 32768).
pub const WATCHED_DEFAULT_CHUNKS: u32 = 512;
/// At most 4 MiB: pid_max is at most 2^22.
pub const WATCHED_MAX_CHUNKS: u32 = (1 << 22) / PIDS_PER_CHUNK as u32;

/// Map from a NUL-padded `comm` to 1: a process that execs into a matching
/// name starts being watched.
pub const WATCHED_NAMES_MAP: &str = "WATCHED_NAMES";
pub const WATCHED_NAMES_MAX_ENTRIES: u32 = 64;

/// Map from a cgroup v2 id (its directory's inode number) to 1: a process
/// that execs in a selected cgroup (`watch --cgroup`, `--container`) starts
/// being watched, whatever its name.
pub const WATCHED_CGROUPS_MAP: &str = "WATCHED_CGROUPS";
pub const WATCHED_CGROUPS_MAX_ENTRIES: u32 = 1024;

/// Global holding the offset of `child_pid` in `sched/sched_process_fork`.
pub const FORK_CHILD_PID_OFFSET_GLOBAL: &str = "FORK_CHILD_PID_OFFSET";

pub const FORK_PROGRAM: &str = "watch_fork";
pub const EXEC_PROGRAM: &str = "watch_exec";
pub const EXIT_PROGRAM: &str = "watch_exit";

#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchReason {
    /// Selected by userspace (by `--pid`, or a name or parent match in /proc).
    Selected = 1,
    /// Exec'd into a watched name after stackprobe started.
    Exec = 2,
    /// Forked by a watched process.
    Forked = 3,
}

impl WatchReason {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Selected),
            2 => Some(Self::Exec),
            3 => Some(Self::Forked),
            _ => None,
        }
    }
}

/// Where a trailing version starts in a process name (`php-fpm8.2` → 7,
/// `postgres15` → 8): its last run of digits and dots, unless that run is
/// the whole name (`123` stays `123`). The name ends at its first NUL (a
/// NUL-padded comm) or at the end of `name`. None when there is nothing to
/// cut. The kernel cuts comm at exec with it, userspace names from /proc,
/// so `watch php-fpm` finds Debian's versioned binaries either way.
#[inline(always)]
pub fn version_start(name: &[u8]) -> Option<usize> {
    let mut run_start = None;
    for (i, &c) in name.iter().enumerate() {
        if c == 0 {
            break;
        }
        if c.is_ascii_digit() || c == b'.' {
            if run_start.is_none() {
                run_start = Some(i);
            }
        } else {
            run_start = None;
        }
    }
    run_start.filter(|&start| start > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_run_of_digits_and_dots_is_the_version() {
        assert_eq!(version_start(b"php-fpm8.2"), Some(7));
        assert_eq!(version_start(b"postgres15"), Some(8));
        assert_eq!(version_start(b"python3.11"), Some(6));
        assert_eq!(version_start(b"v1a2"), Some(3));
        assert_eq!(version_start(b"nginx"), None);
        assert_eq!(version_start(b"123"), None);
        assert_eq!(version_start(b"1.2"), None);
        assert_eq!(version_start(b""), None);
    }

    #[test]
    fn a_comm_ends_at_its_first_nul() {
        assert_eq!(version_start(b"php-fpm8.2\0\0\0\0\0\0"), Some(7));
        // Bytes after the NUL are not the name's.
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"nginx");
        comm[7] = b'7';
        assert_eq!(version_start(&comm), None);
        assert_eq!(version_start(b"42\0\0\0\0\0\0\0\0\0\0\0\0\0\0"), None);
        assert_eq!(version_start(b"a-very-long-d15"), Some(13));
    }
}

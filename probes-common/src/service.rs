//! Service time: how long a server holds each connection it accepted, from
//! the accept's return to its end, into the kernel's histograms under the
//! acceptor and its listener; and how many connections each server holds
//! at once (its busy workers, for servers whose workers serve one
//! connection at a time). A TCP connection ends at the server's first FIN
//! (its close or shutdown) or a reset, which the state probe sees at no
//! extra hook; a unix one at the `close()` that drops the file's last
//! reference, or the exit of the process holding it (a postgres backend
//! holds what the postmaster accepted and closed), for which the close
//! and exit probes look only at processes that hold one or whose parent
//! does ([`UNIX_HELD_MAP`]).

use crate::offsets::MemberOffset;

/// Hash of an accepted socket's `struct sock` address → [`Service`].
pub const SERVICES_MAP: &str = "SERVICES";
pub const SERVICES_MAX_ENTRIES: u32 = 16384;

/// LRU hash of a tgid and an fd it accepted at, or u32::MAX for all its
/// fds (`tgid << 32 | fd`) → the unix connections accepted there that are
/// being served: the close and exit probes' filter.
pub const UNIX_HELD_MAP: &str = "UNIX_HELD";
pub const UNIX_HELD_MAX_ENTRIES: u32 = 4096;

/// Hash of a server's key (the watched process that leads its workers:
/// the acceptor's parent if that is watched, as a php-fpm or nginx master
/// is, else the acceptor) → [`Busy`].
pub const BUSY_MAP: &str = "BUSY";
pub const BUSY_MAX_ENTRIES: u32 = 1024;
/// Hash of a server's key → the most connections it held at once since
/// userspace last set it to what it held then: a map of its own, so that
/// userspace's write of it never undoes the kernel's adds to [`Busy`].
pub const BUSY_MAX_MAP: &str = "BUSY_MAX";

pub const CLOSE_PROGRAM: &str = "service_close";
/// On `sched/sched_process_exit`, beside the lifecycle probe.
pub const EXIT_PROGRAM: &str = "service_exit";
pub const CLOSE_TRACEPOINT: &str = "sys_enter_close";
/// Global holding the offset of `fd` in `sys_enter_close`.
pub const CLOSE_FD_OFFSET_GLOBAL: &str = "CLOSE_FD_OFFSET";
/// Global holding the value of a file's reference count with one
/// reference: 1 for `f_count` (before 6.13), 0 for `f_ref` (since).
pub const FILE_ONE_REF_GLOBAL: &str = "FILE_ONE_REF";
/// Global holding the offset of the file's reference count (`f_ref` or
/// `f_count`, whichever this kernel has).
pub const FILE_REFS_GLOBAL: &str = "FILE_REFS";
/// One-entry array: 1 when unix connections are served (a hook that sees
/// their end attached: the release fentry, or the close and exit probes),
/// else 0. Set after the rung is chosen, at attach.
pub const SERVICE_CONFIG_MAP: &str = "SERVICE_CONFIG";
/// fentry on `unix_release(struct socket *)`, the release of a unix
/// socket's last file reference, whoever drops it (a close, an exit).
pub const RELEASE_PROGRAM: &str = "service_release";
pub const RELEASE_FUNCTION: &str = "unix_release";
/// The fds an exiting process's table is looked through for connections
/// it still holds.
pub const EXIT_SCAN_FDS: u32 = 32;

/// A connection being served.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Service {
    pub start_ns: u64,
    /// The acceptor, whose histogram the sample goes to.
    pub tgid: u32,
    /// The listening socket's fd plus one in the acceptor.
    pub listener: u32,
    /// The server's key in [`BUSY_MAP`].
    pub server: u32,
    /// A unix connection's fd in the acceptor plus one (counted in
    /// [`UNIX_HELD_MAP`]); 0 for TCP.
    pub unix_fd: u32,
}

crate::assert_layout!(Service, 24, { start_ns: 0, tgid: 8, listener: 12, server: 16, unix_fd: 20 });

/// One server's connections held, kept so that the time-weighted mean over
/// any interval follows from two reads: busy time up to `t` is
/// `ended_ns + open * t - open_start_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Busy {
    /// Connections held now.
    pub open: u64,
    /// The sum of their start times.
    pub open_start_ns: u64,
    /// The sum of the service times of those that ended.
    pub ended_ns: u64,
}

crate::assert_layout!(Busy, 24, { open: 0, open_start_ns: 8, ended_ns: 16 });

impl Busy {
    /// Connection-ns held up to `now_ns` (the probes' clock): over an
    /// interval, its change divided by the interval's length is the mean
    /// number held.
    pub fn held_ns(&self, now_ns: u64) -> u64 {
        self.ended_ns
            .wrapping_add(self.open.wrapping_mul(now_ns))
            .wrapping_sub(self.open_start_ns)
    }
}

/// The members the service probes read besides the fd walk's, each at the
/// offset in its global.
#[macro_export]
macro_rules! service_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            FDTABLE_MAX_FDS: fdtable.max_fds,
            TASK_REAL_PARENT: task_struct.real_parent,
            TASK_TGID: task_struct.tgid,
        }
    };
}
pub const SERVICE_MEMBERS: &[MemberOffset] = &service_members!(crate::member_table);

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::Busy {}
}

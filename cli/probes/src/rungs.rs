//! The rungs of stackprobe's hook ladders: for a metric with a choice of
//! kernel hooks, the best the kernel offers is picked at load (`--fork-hook`
//! and `--queue-hook` force one; `doctor` tries each).

/// Whether this architecture has the fork(2) and vfork(2) syscalls. arm64
/// (like every architecture on the kernel's generic syscall table) has only
/// clone and clone3: its libc's fork() and vfork() are clone calls, and its
/// kernel has no `sys_{enter,exit}_{fork,vfork}` tracepoints. Every rung
/// still sees every fork there: kernel_clone and the clone tracepoints
/// serve them all.
pub const HAS_FORK_SYSCALLS: bool = cfg!(not(any(
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "loongarch64"
)));

/// Where fork latency is measured, best first: each gives the same sample
/// (the parent's clone, start to return, with its flags), the kernel_clone
/// rungs without the syscall entry and exit around it and at a lower cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForkRung {
    /// fentry/fexit on kernel_clone (BPF trampolines: the cheapest).
    Fentry,
    /// kprobe/kretprobe on kernel_clone.
    Kprobe,
    /// The syscall tracepoints sys_{enter,exit}_{clone,clone3,fork,vfork}.
    Tracepoint,
}

impl ForkRung {
    pub const LADDER: [ForkRung; 3] = [Self::Fentry, Self::Kprobe, Self::Tracepoint];

    /// As `--fork-hook` names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fentry => "fentry",
            Self::Kprobe => "kprobe",
            Self::Tracepoint => "tracepoint",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Fentry => "fentry/fexit on kernel_clone",
            Self::Kprobe => "kprobe/kretprobe on kernel_clone",
            Self::Tracepoint if !HAS_FORK_SYSCALLS => {
                "tracepoints syscalls/sys_{enter,exit}_{clone,clone3}"
            }
            Self::Tracepoint => "tracepoints syscalls/sys_{enter,exit}_{clone,clone3,fork,vfork}",
        }
    }
}

/// How the accept probe finds the socket an accept returned, to look up
/// when its handshake completed (the accept-queue wait), best first. Accept
/// latency itself always comes from the syscall tracepoints, which see unix
/// sockets too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueRung {
    /// fexit on inet_csk_accept: the socket is its return value.
    Fexit,
    /// kretprobe on inet_csk_accept.
    Kretprobe,
    /// From the accepted fd: task → files → fdtable → file → socket → sock,
    /// six kernel reads at BTF offsets in the tracepoint exit.
    FdWalk,
}

impl QueueRung {
    pub const LADDER: [QueueRung; 3] = [Self::Fexit, Self::Kretprobe, Self::FdWalk];

    /// As `--queue-hook` names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fexit => "fexit",
            Self::Kretprobe => "kretprobe",
            Self::FdWalk => "fd-walk",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Fexit => "fexit on inet_csk_accept, joined with sock/inet_sock_set_state",
            Self::Kretprobe => "kretprobe on inet_csk_accept, joined with sock/inet_sock_set_state",
            Self::FdWalk => {
                "tracepoint exit + fd → socket walk, joined with sock/inet_sock_set_state"
            }
        }
    }
}

/// Where TCP state changes are counted, best first: the same counts from
/// either, the BTF tracepoint at a lower cost per change and with a
/// recursion guard of its own (the classic tracepoints share one per CPU,
/// so a change in softirq that interrupts another probe is skipped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateRung {
    /// tp_btf on inet_sock_set_state.
    BtfTracepoint,
    /// The classic tracepoint sock/inet_sock_set_state.
    Tracepoint,
}

impl StateRung {
    pub fn name(self) -> &'static str {
        match self {
            Self::BtfTracepoint => "tp_btf",
            Self::Tracepoint => "tracepoint",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::BtfTracepoint => "tp_btf on inet_sock_set_state",
            Self::Tracepoint => "tracepoint sock/inet_sock_set_state",
        }
    }
}

/// Where a unix connection's wait in its listener's queue starts (its end
/// is always the accept that takes it), best first. fentry is exact and
/// runs once per unix connect; without it, the syscall rung, whose hooks
/// are the connect and accept probes' own: data-ready's runs for every TCP
/// segment and unix message on the host cost more than its exactness gains
/// (BENCHMARKS.md), so it is there for the asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnixQueueRung {
    /// fentry on security_unix_stream_connect, inside the connect just
    /// before the connection is queued: the exact wait.
    Fentry,
    /// The tracepoint sock:sk_data_ready (6.3 and later), inside the
    /// connect right after the connection is queued: the exact wait.
    DataReady,
    /// The connect syscall's enter, paired with the accept through the
    /// connection's server-side socket: adds the connect's own time, and a
    /// blocking client's sleep for room in a full queue.
    Syscalls,
}

impl UnixQueueRung {
    pub const LADDER: [UnixQueueRung; 3] = [Self::Fentry, Self::Syscalls, Self::DataReady];

    /// As `--unix-queue-hook` names it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fentry => "fentry",
            Self::DataReady => "data-ready",
            Self::Syscalls => "syscalls",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Fentry => {
                "fentry on security_unix_stream_connect (the enqueue) to the accept's exit: exact"
            }
            Self::DataReady => {
                "tracepoint sock/sk_data_ready (the enqueue) to the accept's exit: exact"
            }
            Self::Syscalls => {
                "connect's enter to the accept's exit, paired by the server-side socket: adds the connect call, and a blocking client's sleep for room"
            }
        }
    }
}

/// Where a served unix connection's end is seen (TCP ones end in the state
/// probe), best first. fentry runs once per unix socket released on the
/// host, cheap enough to be on by default where the kernel takes it; the
/// close and exit probes run on every close(2) on the host, so only
/// `--unix-service-time` attaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UnixServiceRung {
    /// fentry on unix_release: the release of the socket's last file
    /// reference, by a close or the holder's exit.
    Fentry,
    /// The tracepoints syscalls/sys_enter_close (the close of the last
    /// reference) and sched/sched_process_exit (the holder's exit).
    Close,
}

impl UnixServiceRung {
    pub const LADDER: [UnixServiceRung; 2] = [Self::Fentry, Self::Close];

    /// As `--unix-service-hook` and reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fentry => "fentry",
            Self::Close => "close",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Fentry => {
                "TCP: the state probe (the server's first FIN or a reset); unix: fentry on unix_release (the release of the socket's last reference, by a close or the holder's exit)"
            }
            Self::Close => {
                "TCP: the state probe (the server's first FIN or a reset); unix: tracepoint syscalls/sys_enter_close (the last reference's close) and the holder's exit"
            }
        }
    }
}

//! Which kernel programs a run loads, what they cost, and that none is left.

use stackprobe_probes::{
    Options,
    rungs::{ForkRung, QueueRung, StateRung, UnixQueueRung, UnixServiceRung},
};

use super::*;

/// Probes loaded with one rung of a ladder forced, or None where this
/// kernel lacks it; then the rung must not be one `expected` to work, and
/// the error must say the kernel lacks it.
pub fn forced_session(options: Options, rung: &str, expected: bool) -> Option<Session> {
    match Session::try_start(options) {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(!expected, "{rung} must work on this kernel: {e:#}");
            let message = format!("{e:#}");
            assert!(
                message.contains("does not work on this kernel"),
                "{message}"
            );
            None
        }
    }
}

/// Whether this kernel must take fentry programs: `cargo xtask vm-test`
/// names fentry among the fork hooks of the kernels that do (this
/// project's own machines refuse it).
pub fn takes_fentry() -> bool {
    std::env::var("STACKPROBE_EXPECT_FORK_HOOKS")
        .is_ok_and(|hooks| hooks.split(',').any(|h| h.trim() == "fentry"))
}

/// What the programs whose names start with one of `prefixes` cost per
/// run so far (loaded with `probe_cost`), for the rung comparisons.
pub fn rung_costs(s: &Session, prefixes: &[&str]) -> String {
    s.collector
        .probes()
        .costs()
        .unwrap()
        .iter()
        .filter(|c| c.runs > 0 && prefixes.iter().any(|p| c.program.starts_with(p)))
        .map(|c| format!("{} {:.0} ns×{}", c.program, c.ns_per_run(), c.runs))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs and run time summed over this process's BPF program fds whose
/// kernel ids are in `ids`, as /proc/self/fdinfo tells them: the kernel's
/// own text, to check what stackprobe reads through bpf() against.
pub fn fdinfo_run_totals(ids: &[u32]) -> (u64, u64) {
    let mut totals = (0, 0);
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap() {
        let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        let field = |name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
        };
        if field("prog_id:").is_some_and(|id| ids.contains(&(id as u32))) {
            totals.0 += field("run_cnt:").unwrap_or(0);
            totals.1 += field("run_time_ns:").unwrap_or(0);
        }
    }
    totals
}

/// Names of stackprobe's kernel programs but the fork rungs' (as the kernel
/// truncates them, to 15 bytes).
/// (One state program is loaded: `tcp_state`, or `tcp_state_btf` and its
/// nested copy where the BTF tracepoint serves.)
pub const PROGRAM_NAMES: [&str; 9] = [
    "tcp_state",
    "tcp_sockets",
    "accept_enter",
    "accept_exit",
    "connect_enter",
    "connect_exit",
    "watch_fork",
    "watch_exec",
    "watch_exit",
];

/// The program of each accept-queue rung but the fd walk's (which is the
/// accept exit's own), truncated alike.
pub fn queue_program_names(hook: QueueRung) -> &'static [&'static str] {
    match hook {
        // inet_csk_accept_fexit and inet_csk_accept_kretprobe.
        QueueRung::Fexit | QueueRung::Kretprobe => &["inet_csk_accept"],
        QueueRung::FdWalk => &[],
    }
}

/// The programs of each fork rung.
pub fn fork_program_names(hook: ForkRung) -> &'static [&'static str] {
    match hook {
        // No fork or vfork syscalls to attach fork_enter to (arm64).
        ForkRung::Tracepoint if !stackprobe_probes::fork::HAS_FORK_SYSCALLS => {
            &["clone_enter", "clone3_enter", "clone_exit"]
        }
        ForkRung::Tracepoint => &["clone_enter", "clone3_enter", "fork_enter", "clone_exit"],
        // kernel_clone_fentry and kernel_clone_fexit, truncated alike.
        ForkRung::Fentry => &["kernel_clone_fe", "kernel_clone_fe"],
        ForkRung::Kprobe => &["kernel_clone_kp", "kernel_clone_kr"],
    }
}

/// Programs the state rung loads beyond the one in [`PROGRAM_NAMES`]: the
/// tp_btf rung's nested copy.
pub fn state_extra_programs(rung: StateRung) -> usize {
    match rung {
        StateRung::BtfTracepoint => 1,
        StateRung::Tracepoint => 0,
    }
}

/// [`state_extra_programs`] of whichever state rung a running stackprobe
/// loaded, from the names of the loaded programs.
pub fn state_extra_loaded() -> usize {
    let btf = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .any(|p| p.name_as_str() == Some("tcp_state_btf"));
    state_extra_programs(if btf {
        StateRung::BtfTracepoint
    } else {
        StateRung::Tracepoint
    })
}

/// The program of each unix queue rung: the syscall rung's are the connect
/// and accept probes'.
pub fn unix_queue_program_names(rung: UnixQueueRung) -> &'static [&'static str] {
    match rung {
        UnixQueueRung::Fentry => &["unix_enqueue"],
        UnixQueueRung::DataReady => &["unix_data_ready"],
        UnixQueueRung::Syscalls => &[],
    }
}

/// [`unix_queue_program_names`] of whichever rung a running stackprobe
/// loaded, counted from the loaded programs.
pub fn unix_queue_extra_loaded() -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str()
                .is_some_and(|n| n == "unix_data_ready" || n == "unix_enqueue")
        })
        .count()
}

/// The programs each unix service rung adds.
pub fn unix_service_program_names(rung: Option<UnixServiceRung>) -> &'static [&'static str] {
    match rung {
        Some(UnixServiceRung::Fentry) => &["service_release"],
        Some(UnixServiceRung::Close) => &["service_close", "service_exit"],
        None => &[],
    }
}

/// Every unix service rung's programs.
pub const UNIX_SERVICE_PROGRAM_NAMES: [&str; 3] =
    ["service_release", "service_close", "service_exit"];

/// [`unix_service_program_names`] of whichever rung a running stackprobe
/// loaded, counted from the loaded programs.
pub fn unix_service_extra_loaded() -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str()
                .is_some_and(|n| UNIX_SERVICE_PROGRAM_NAMES.contains(&n))
        })
        .count()
}

/// The programs `--run-queue` (`Options::run_queue`) adds.
pub const RUN_QUEUE_PROGRAM_NAMES: [&str; 3] = ["runq_wakeup", "runq_wakeup_new", "runq_switch"];

/// The do-nothing programs `doctor` loads to try a hook.
pub const HOOK_PROGRAM_NAMES: [&str; 3] = ["hook_tp_btf", "hook_fentry", "hook_kprobe"];

/// Ids of loaded programs carrying one of stackprobe's program names.
pub fn loaded_stackprobe_programs() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str().is_some_and(|n| {
                PROGRAM_NAMES.contains(&n)
                    || UNIX_SERVICE_PROGRAM_NAMES.contains(&n)
                    || RUN_QUEUE_PROGRAM_NAMES.contains(&n)
                    || n == "tcp_state_btf"
                    // tcp_state_btf_nested, truncated.
                    || n == "tcp_state_btf_n"
                    || HOOK_PROGRAM_NAMES.contains(&n)
                    || ForkRung::LADDER
                        .iter()
                        .any(|&h| fork_program_names(h).contains(&n))
                    || QueueRung::LADDER
                        .iter()
                        .any(|&h| queue_program_names(h).contains(&n))
                    || UnixQueueRung::LADDER
                        .iter()
                        .any(|&h| unix_queue_program_names(h).contains(&n))
            })
        })
        .map(|p| p.id())
        .collect()
}

/// stackprobe's programs still loaded once the kernel had up to 5 s to free
/// them: it frees a program asynchronously after its last fd closes (tp_btf
/// programs after an RCU grace period), so right after an exit they may
/// still be listed.
pub fn programs_left_loaded() -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let loaded = loaded_stackprobe_programs();
        if loaded.is_empty() || std::time::Instant::now() > deadline {
            return loaded;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

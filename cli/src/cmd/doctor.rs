//! `stackprobe doctor`: whether this machine can run `watch`, one line per
//! check with the fix, and which hook each metric uses here. The checks are
//! the ones `watch` makes before loading (same functions, same words); the
//! hooks are tried for real by loading and attaching the probes.

use std::fs;

use anyhow::{Result, bail};

use stackprobe_probes::{
    Options, Probes, fork, preflight,
    rungs::{ForkRung, QueueRung, StateRung, UnixQueueRung, UnixServiceRung},
};

enum Verdict {
    Ok,
    /// Worth knowing, not in the way.
    Note,
    /// `watch` cannot run until this is fixed.
    Fail,
}

struct Line {
    verdict: Verdict,
    text: String,
}

fn line(verdict: Verdict, text: impl Into<String>) -> Line {
    Line {
        verdict,
        text: text.into(),
    }
}

fn from(result: Result<()>, ok: &str) -> Line {
    match result {
        Ok(()) => line(Verdict::Ok, ok),
        Err(e) => line(Verdict::Fail, format!("{e:#}")),
    }
}

/// Metric → the hook `watch` uses for it on this kernel (for a ladder, the
/// rung it picked).
fn ladder(
    fork: ForkRung,
    queue: QueueRung,
    unix_queue: UnixQueueRung,
    state: StateRung,
) -> [(&'static str, &'static str); 7] {
    [
        (
            "accept latency",
            "tracepoints syscalls/sys_{enter,exit}_accept{,4}",
        ),
        ("accept-queue wait", queue.describe()),
        ("unix queue wait", unix_queue.describe()),
        ("fork latency", fork.describe()),
        (
            "process lifecycle",
            "tracepoints sched/sched_process_{fork,exec,exit}",
        ),
        ("TCP sockets", "iter/tcp (less often when sockets are many)"),
        ("TCP state changes", state.describe()),
    ]
}

pub fn run() -> Result<()> {
    let mut lines = vec![
        from(
            preflight::check_privileges(),
            "privileges: CAP_BPF and CAP_PERFMON (or root)",
        ),
        unprivileged_bpf(),
        from(preflight::check_lockdown(), &lockdown_ok()),
        from(
            preflight::load_btf().map(|_| ()),
            &format!("BTF: {}", preflight::btf_path().display()),
        ),
        bpffs(),
    ];
    let mut usable = lines.iter().all(|l| !matches!(l.verdict, Verdict::Fail));
    let mut hooks_used = None;
    if usable {
        match Probes::load(Options::default()) {
            Ok(mut probes) => {
                hooks_used = Some((
                    probes.fork_rung(),
                    probes.queue_rung(),
                    probes.unix_queue_rung(),
                    probes.state_rung(),
                ));
                lines.push(line(
                    Verdict::Ok,
                    "tracefs and tracepoints: every probe loaded and attached; BTF offsets checked on a test connection of stackprobe's own",
                ));
                if let Some(why) = probes.state_btf_refused() {
                    // The classic tracepoint's runs are skipped while any
                    // other tracing program runs on the CPU, or a map
                    // syscall holds it, and kernels before 6.7 count none.
                    lines.push(line(
                        Verdict::Note,
                        format!(
                            "TCP state changes: on the classic tracepoint, not tp_btf ({why}): a change that comes while another BPF program runs on its CPU is lost, and kernels before 6.7 do not count such losses"
                        ),
                    ));
                }
                lines.push(match probes.tcp_sockets() {
                    Ok(sockets) => line(
                        Verdict::Ok,
                        format!("iter/tcp: walks every TCP socket ({} now)", sockets.len()),
                    ),
                    Err(e) => line(Verdict::Fail, format!("iter/tcp: {e:#}")),
                });
                drop(probes);
                for rung in ForkRung::LADDER {
                    let forced = Options {
                        fork_rung: Some(rung),
                        ..Options::default()
                    };
                    lines.push(try_forced("fork hook", rung.describe(), forced));
                }
                if !fork::HAS_FORK_SYSCALLS {
                    lines.push(line(Verdict::Note, fork::NO_FORK_SYSCALLS_NOTE));
                }
                for rung in QueueRung::LADDER {
                    let forced = Options {
                        queue_rung: Some(rung),
                        ..Options::default()
                    };
                    lines.push(try_forced("accept-queue hook", rung.describe(), forced));
                }
                for rung in UnixQueueRung::LADDER {
                    let forced = Options {
                        unix_queue_rung: Some(rung),
                        ..Options::default()
                    };
                    lines.push(try_forced("unix queue hook", rung.name(), forced));
                }
                for rung in UnixServiceRung::LADDER {
                    let forced = Options {
                        unix_service_rung: Some(rung),
                        ..Options::default()
                    };
                    lines.push(try_forced("unix service hook", rung.name(), forced));
                }
                let forced = Options {
                    run_queue: true,
                    ..Options::default()
                };
                lines.push(try_forced(
                    "run-queue latency (--run-queue)",
                    "BTF tracepoints sched_wakeup, sched_wakeup_new and sched_switch",
                    forced,
                ));
                let mut probes = Probes::load(Options::default())?;
                for check in probes.check_attach_types()? {
                    lines.push(match check.result {
                        Ok(()) => line(
                            Verdict::Ok,
                            format!("{}: attaches ({})", check.hook, check.target),
                        ),
                        Err(e) => line(
                            Verdict::Note,
                            format!(
                                "{}: not available here ({}: {e:#}); watch does not need it",
                                check.hook, check.target
                            ),
                        ),
                    });
                }
            }
            Err(e) => {
                usable = false;
                lines.push(line(Verdict::Fail, format!("{e:#}")));
            }
        }
    }
    for l in &lines {
        let tag = match l.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Note => "note",
            Verdict::Fail => "FAIL",
        };
        println!("{tag}  {}", l.text);
    }
    if !usable {
        bail!("stackprobe watch cannot run here: fix the FAIL lines above");
    }
    let Some((fork_hook, queue_hook, unix_queue_hook, state_rung)) = hooks_used else {
        bail!("stackprobe watch cannot run here: the probes did not load");
    };
    println!("hooks watch uses on this kernel:");
    for (metric, hook) in ladder(fork_hook, queue_hook, unix_queue_hook, state_rung) {
        println!("  {metric:<18} {hook}");
    }
    Ok(())
}

/// Loads the probes with one rung of a ladder forced: does it work here?
fn try_forced(ladder: &str, rung: &str, forced: Options) -> Line {
    match Probes::load(forced) {
        Ok(_) => line(Verdict::Ok, format!("{ladder} {rung}: attaches")),
        Err(e) => line(
            Verdict::Note,
            format!("{ladder} {rung}: not available here ({e:#})"),
        ),
    }
}

fn unprivileged_bpf() -> Line {
    let path = "/proc/sys/kernel/unprivileged_bpf_disabled";
    match fs::read_to_string(path).map(|s| s.trim().to_string()) {
        Ok(v) if v == "0" => line(
            Verdict::Note,
            "kernel.unprivileged_bpf_disabled = 0: any user may load BPF programs (stackprobe needs root either way)",
        ),
        Ok(v) => line(
            Verdict::Ok,
            format!(
                "kernel.unprivileged_bpf_disabled = {v}: only privileged users load BPF (run stackprobe with sudo)"
            ),
        ),
        Err(e) => line(Verdict::Note, format!("{path}: {e}")),
    }
}

fn lockdown_ok() -> String {
    match fs::read_to_string(preflight::LOCKDOWN) {
        Ok(mode) => format!("lockdown: {}", mode.trim()),
        Err(_) => "lockdown: not enforced (no securityfs lockdown file)".into(),
    }
}

fn bpffs() -> Line {
    let mounted = fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(2) == Some("bpf"))
    });
    if mounted {
        line(
            Verdict::Ok,
            "bpffs: mounted (stackprobe pins nothing, so it is not needed)",
        )
    } else {
        line(
            Verdict::Note,
            "bpffs: not mounted (stackprobe pins nothing, so it is not needed)",
        )
    }
}

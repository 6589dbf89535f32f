//! The floor of section 2: empty programs on exactly the hooks stackprobe
//! attaches on this kernel, run by bpftrace. No tracer on these hooks can
//! cost less: the kernel still runs a program per event, and an enabled
//! syscall tracepoint sends every syscall of every task through the slow
//! path.

use std::{collections::BTreeSet, fs};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::Value;

use super::tracer::{Tracer, perf_link_hook as link_hook, summary};

/// What `stackprobe watch` attaches whichever rungs its ladders take
/// (cli/probes/src/{watch,accept,connect}.rs), in bpftrace's probe syntax.
const ALWAYS: [&str; 9] = [
    "tracepoint:sched:sched_process_fork",
    "tracepoint:sched:sched_process_exec",
    "tracepoint:sched:sched_process_exit",
    "tracepoint:syscalls:sys_enter_accept",
    "tracepoint:syscalls:sys_enter_accept4",
    "tracepoint:syscalls:sys_exit_accept",
    "tracepoint:syscalls:sys_exit_accept4",
    "tracepoint:syscalls:sys_enter_connect",
    "tracepoint:syscalls:sys_exit_connect",
];

/// What the floor attaches in place of the state probe's tp_btf rung; not a
/// perf link of stackprobe's, so the fdinfo check leaves it out.
const TP_BTF_STAND_IN: &str = "tracepoint:sock:inet_sock_set_state";

/// The hooks behind one rung of a ladder, named as stackprobe's JSON
/// `hooks[]` names it (cli/src/probes/rungs.rs).
fn rung_hooks(metric: &str, hook: &str) -> Option<&'static [&'static str]> {
    Some(match (metric, hook) {
        ("fork", "fentry") => &["kfunc:kernel_clone", "kretfunc:kernel_clone"],
        ("fork", "kprobe") => &["kprobe:kernel_clone", "kretprobe:kernel_clone"],
        ("fork", "tracepoint") => &[
            "tracepoint:syscalls:sys_enter_clone",
            "tracepoint:syscalls:sys_enter_clone3",
            "tracepoint:syscalls:sys_enter_fork",
            "tracepoint:syscalls:sys_enter_vfork",
            "tracepoint:syscalls:sys_exit_clone",
            "tracepoint:syscalls:sys_exit_clone3",
            "tracepoint:syscalls:sys_exit_fork",
            "tracepoint:syscalls:sys_exit_vfork",
        ],
        ("accept_queue", "fexit") => &["kretfunc:inet_csk_accept"],
        ("accept_queue", "kretprobe") => &["kretprobe:inet_csk_accept"],
        // The accept exit tracepoint, already among ALWAYS, finds the socket.
        ("accept_queue", "fd-walk") => &[],
        ("tcp_state", "tracepoint") => &["tracepoint:sock:inet_sock_set_state"],
        // bpftrace 0.17 has neither tp_btf nor working raw tracepoint
        // probes: the classic tracepoint stands in, a few ns dearer per run
        // (raw_tp ≈ +3 ns, tracepoint ≈ +10 ns on an empty program), so the
        // floor is slightly above the true one for this hook.
        ("tcp_state", "tp_btf") => &[TP_BTF_STAND_IN],
        ("unix_queue", "data-ready") => &["tracepoint:sock:sk_data_ready"],
        // The connect and accept tracepoints, already among ALWAYS.
        ("unix_queue", "syscalls") => &[],
        // TCP's end is the state probe's; unix's needs the close (and
        // sched_process_exit, already among ALWAYS).
        ("service", "tcp-only") => &[],
        ("service", "close") => &["tracepoint:syscalls:sys_enter_close"],
        ("run_queue", "off") => &[],
        // Classic stand-ins for the tp_btf programs, as for the state probe.
        ("run_queue", "tp_btf") => &[
            "tracepoint:sched:sched_wakeup",
            "tracepoint:sched:sched_wakeup_new",
            "tracepoint:sched:sched_switch",
        ],
        _ => return None,
    })
}

/// The floor's hooks for a stackprobe `--json` summary: the fixed ones and
/// those of the rung each ladder took.
pub fn hooks(summary: &Value) -> Result<Vec<&'static str>> {
    let rungs = summary["hooks"]
        .as_array()
        .context("stackprobe's summary has no hooks[]")?;
    let mut hooks = ALWAYS.to_vec();
    for metric in [
        "fork",
        "accept_queue",
        "unix_queue",
        "service",
        "run_queue",
        "tcp_state",
    ] {
        let hook = rungs
            .iter()
            .find(|r| r["metric"] == metric)
            .and_then(|r| r["hook"].as_str())
            .with_context(|| format!("stackprobe's summary names no hook for {metric}"))?;
        let Some(rung) = rung_hooks(metric, hook) else {
            bail!("stackprobe took the {hook} rung for {metric}, which the floor does not know");
        };
        hooks.extend_from_slice(rung);
    }
    Ok(hooks)
}

/// A bpftrace script with an empty program on each hook.
pub fn script(hooks: &[&str]) -> String {
    hooks.iter().map(|h| format!("{h} {{}}\n")).collect()
}

/// Hooks as the kernel describes a perf-event link: tracepoints without
/// their category, kprobes by function. BPF trampolines (kfunc, kretfunc)
/// are tracing links, which name no function, and are left out.
fn link_view<'a>(hooks: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    hooks
        .into_iter()
        .filter_map(|h| {
            let (kind, rest) = h.split_once(':')?;
            match kind {
                "tracepoint" => Some(format!("tracepoint:{}", rest.rsplit(':').next()?)),
                "kprobe" | "kretprobe" => Some(h.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// The hooks of the perf-event links `pid` holds.
fn attachments_of(pid: u32) -> Result<BTreeSet<String>> {
    let mut hooks = BTreeSet::new();
    for fd in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let fd = fd?;
        if fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf_link") {
            let info = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))?;
            hooks.extend(link_hook(&info));
        }
    }
    Ok(hooks)
}

/// Starts and stops `stackprobe ARGS`, and returns the floor's hooks from
/// its report, checked against the links the kernel lists for it.
pub fn discover(stackprobe_args: &[&str]) -> Result<Vec<&'static str>> {
    let tracer = Tracer::stackprobe(stackprobe_args)?;
    let attached = attachments_of(tracer.pid);
    let lines = tracer.stop()?;
    let attached = attached?;
    let summary = summary(&lines)?;
    let hooks = hooks(&summary)?;
    let stood_in = summary["hooks"].as_array().is_some_and(|r| {
        r.iter()
            .any(|r| r["metric"] == "tcp_state" && r["hook"] == "tp_btf")
    });
    let expected = link_view(
        hooks
            .iter()
            .copied()
            .filter(|&h| !(stood_in && h == TP_BTF_STAND_IN)),
    );
    ensure!(
        attached == expected,
        "the floor's hooks are not those stackprobe attached: stackprobe {attached:?}, floor {expected:?}"
    );
    Ok(hooks)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report(fork: &str, queue: &str) -> Value {
        report_with_state(fork, queue, "tracepoint")
    }

    fn report_with_state(fork: &str, queue: &str, state: &str) -> Value {
        json!({"type": "summary", "hooks": [
            {"metric": "fork", "hook": fork, "description": ""},
            {"metric": "accept_queue", "hook": queue, "description": ""},
            {"metric": "unix_queue", "hook": "data-ready", "description": ""},
            {"metric": "service", "hook": "close", "description": ""},
            {"metric": "run_queue", "hook": "off", "description": ""},
            {"metric": "tcp_state", "hook": state, "description": ""},
        ]})
    }

    #[test]
    fn the_state_probes_tp_btf_rung_has_the_classic_tracepoint_stand_in() {
        let hooks = hooks(&report_with_state("tracepoint", "fd-walk", "tp_btf")).unwrap();
        assert_eq!(hooks.len(), 20);
        assert!(hooks.contains(&TP_BTF_STAND_IN));
    }

    #[test]
    fn the_tracepoint_rungs_give_the_syscall_lifecycle_and_sock_tracepoints() {
        let hooks = hooks(&report("tracepoint", "fd-walk")).unwrap();
        assert_eq!(hooks.len(), 20);
        assert!(hooks.iter().all(|h| h.starts_with("tracepoint:")));
        for h in [
            "tracepoint:syscalls:sys_enter_accept4",
            "tracepoint:syscalls:sys_exit_clone3",
            "tracepoint:syscalls:sys_enter_vfork",
            "tracepoint:sched:sched_process_exec",
            "tracepoint:sock:inet_sock_set_state",
            "tracepoint:sock:sk_data_ready",
            "tracepoint:syscalls:sys_enter_close",
        ] {
            assert!(hooks.contains(&h), "{h} missing");
        }
        assert_eq!(hooks.iter().collect::<BTreeSet<_>>().len(), hooks.len());
    }

    #[test]
    fn the_trampoline_rungs_replace_the_clone_tracepoints() {
        let hooks = hooks(&report("fentry", "fexit")).unwrap();
        assert_eq!(hooks.len(), 15);
        assert!(hooks.contains(&"kretfunc:kernel_clone"));
        assert!(hooks.contains(&"kretfunc:inet_csk_accept"));
        assert!(!hooks.iter().any(|h| h.contains("clone3")));
    }

    #[test]
    fn an_unknown_rung_or_a_missing_metric_is_an_error() {
        assert!(hooks(&report("uprobe", "fd-walk")).is_err());
        assert!(hooks(&json!({"hooks": [{"metric": "fork", "hook": "kprobe"}]})).is_err());
        assert!(hooks(&json!({"type": "summary"})).is_err());
    }

    #[test]
    fn the_script_has_one_empty_program_per_hook() {
        assert_eq!(
            script(&["tracepoint:sched:sched_process_exit", "kprobe:kernel_clone"]),
            "tracepoint:sched:sched_process_exit {}\nkprobe:kernel_clone {}\n"
        );
    }

    #[test]
    fn perf_links_are_read_as_hooks_and_others_left_out() {
        let tracepoint = "pos:\t0\nflags:\t02000000\nlink_type:\tperf\nlink_id:\t3487\n\
                          prog_id:\t2699\ntp_name:\tsched_process_fork\nevent_type:\ttracepoint\ncookie:\t0\n";
        assert_eq!(
            link_hook(tracepoint).as_deref(),
            Some("tracepoint:sched_process_fork")
        );
        let kretprobe =
            "link_type:\tperf\nname:\tkernel_clone\noffset:\t0x0\nevent_type:\tkretprobe\n";
        assert_eq!(
            link_hook(kretprobe).as_deref(),
            Some("kretprobe:kernel_clone")
        );
        let tracing = "link_type:\ttracing\nattach_type:\t25\ntarget_btf_id:\t123\n";
        assert_eq!(link_hook(tracing), None);
        let uprobe = "link_type:\tperf\nname:\t/bin/x\nevent_type:\tuprobe\n";
        assert_eq!(link_hook(uprobe), None);
    }

    #[test]
    fn the_link_view_drops_categories_and_trampolines() {
        let hooks = [
            "tracepoint:syscalls:sys_enter_accept4",
            "kretprobe:kernel_clone",
            "kfunc:kernel_clone",
        ];
        let view: Vec<String> = link_view(hooks).into_iter().collect();
        assert_eq!(
            view,
            ["kretprobe:kernel_clone", "tracepoint:sys_enter_accept4"]
        );
    }
}

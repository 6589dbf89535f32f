//! Userspace side of the clone probes (kernel side: probes-ebpf/src/fork.rs):
//! setup before load, the choice of hook and attachment (their events are
//! decoded in `decode`).

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    programs::{FEntry, FExit, KProbe, TracePoint},
};
use probes_common::fork::{
    CLONE_FLAGS_OFFSET_GLOBAL, CLONE3_UARGS_OFFSET_GLOBAL, ENTER_CLONE_PROGRAM,
    ENTER_CLONE3_PROGRAM, ENTER_FORK_PROGRAM, ENTER_FORK_TRACEPOINTS, EXIT_PROGRAM,
    EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINTS, FENTRY_PROGRAM, FEXIT_PROGRAM, FORK_START_MAP,
    KERNEL_CLONE, KERNEL_CLONE_MEMBERS, KPROBE_PROGRAM, KRETPROBE_PROGRAM,
};

use super::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    rungs::ForkRung,
    tracefs::Tracefs,
};

pub use crate::rungs::HAS_FORK_SYSCALLS;

/// What `doctor` says about fork and vfork on an architecture without them.
pub const NO_FORK_SYSCALLS_NOTE: &str = "fork and vfork: this architecture has no fork or vfork \
     syscalls (nor their tracepoints sys_{enter,exit}_{fork,vfork}): its fork() and vfork() are \
     clone calls, which every fork hook counts";

/// The tracepoints only fork(2) and vfork(2) have.
const FORK_ONLY_TRACEPOINTS: [&str; 4] = [
    "sys_enter_fork",
    "sys_enter_vfork",
    "sys_exit_fork",
    "sys_exit_vfork",
];

/// `events` without the fork and vfork tracepoints where the architecture
/// has no such syscalls (a kernel of an architecture that has them and
/// lacks one still fails to attach, as it should).
fn on_this_arch(events: &[&'static str]) -> Vec<&'static str> {
    events
        .iter()
        .copied()
        .filter(|e| HAS_FORK_SYSCALLS || !FORK_ONLY_TRACEPOINTS.contains(e))
        .collect()
}

pub fn setup(tracefs: &Tracefs, btf: &KernelBtf, slots: u32) -> Result<Setup> {
    let flags = tracefs.offset("syscalls", "sys_enter_clone", "clone_flags", 8)?;
    let uargs = tracefs.offset("syscalls", "sys_enter_clone3", "uargs", 8)?;
    let ret = tracefs.same_offset("syscalls", &on_this_arch(&EXIT_TRACEPOINTS), "ret", 8)?;
    let mut globals = vec![
        (CLONE_FLAGS_OFFSET_GLOBAL, flags),
        (CLONE3_UARGS_OFFSET_GLOBAL, uargs),
        (EXIT_RET_OFFSET_GLOBAL, ret),
    ];
    // A kernel without struct kernel_clone_args (before 5.10) has no
    // kernel_clone either: its rungs then fail to load and the tracepoints serve.
    if let Ok(offsets) = btf.offsets(KERNEL_CLONE_MEMBERS) {
        globals.extend(offsets);
    }
    Ok(Setup {
        globals,
        map_sizes: vec![(FORK_START_MAP, slots)],
    })
}

/// Attaches the best rung this kernel offers (or only `wanted`), and says
/// which; a rung that fails is unloaded before the next is tried.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    wanted: Option<ForkRung>,
) -> Result<ForkRung> {
    if let Some(hook) = wanted {
        return attach_rung(ebpf, tracefs, btf, hook)
            .map(|()| hook)
            .map_err(|e| {
                anyhow!(
                    "the fork hook {} does not work on this kernel: {e:#}",
                    hook.describe()
                )
            });
    }
    let mut failures = Vec::new();
    for rung in ForkRung::LADDER {
        match attach_rung(ebpf, tracefs, btf, rung) {
            Ok(()) => return Ok(rung),
            Err(e) => failures.push(format!("{}: {e:#}", rung.describe())),
        }
    }
    bail!("no fork hook works on this kernel: {}", failures.join("; "))
}

/// Attaches one rung; if it fails, unloads what it got loaded.
fn attach_rung(ebpf: &mut Ebpf, tracefs: &Tracefs, btf: &Btf, rung: ForkRung) -> Result<()> {
    let attached = match rung {
        ForkRung::Fentry => attach_fentry(ebpf, btf),
        ForkRung::Kprobe => attach_kprobe(ebpf),
        ForkRung::Tracepoint => attach_syscall_tracepoints(ebpf, tracefs),
    };
    if attached.is_err() {
        unload(ebpf, rung);
    }
    attached
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let entry: &mut FEntry = program(ebpf, FENTRY_PROGRAM)?;
    entry.load(KERNEL_CLONE, btf).context("loading fentry")?;
    entry.attach().context("attaching fentry")?;
    let exit: &mut FExit = program(ebpf, FEXIT_PROGRAM)?;
    exit.load(KERNEL_CLONE, btf).context("loading fexit")?;
    exit.attach().context("attaching fexit")?;
    Ok(())
}

fn attach_kprobe(ebpf: &mut Ebpf) -> Result<()> {
    for name in [KPROBE_PROGRAM, KRETPROBE_PROGRAM] {
        let p: &mut KProbe = program(ebpf, name)?;
        p.load().with_context(|| format!("loading {name}"))?;
        p.attach(KERNEL_CLONE, 0)
            .with_context(|| format!("attaching {name}"))?;
    }
    Ok(())
}

fn attach_syscall_tracepoints(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_CLONE_PROGRAM,
        "syscalls",
        &["sys_enter_clone"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_CLONE3_PROGRAM,
        "syscalls",
        &["sys_enter_clone3"],
    )?;
    let fork = on_this_arch(&ENTER_FORK_TRACEPOINTS);
    if !fork.is_empty() {
        attach_tracepoints(ebpf, tracefs, ENTER_FORK_PROGRAM, "syscalls", &fork)?;
    }
    attach_tracepoints(
        ebpf,
        tracefs,
        EXIT_PROGRAM,
        "syscalls",
        &on_this_arch(&EXIT_TRACEPOINTS),
    )
}

/// Unloads (and so detaches) whatever a failed rung got loaded; a program
/// that never loaded has nothing to undo.
fn unload(ebpf: &mut Ebpf, rung: ForkRung) {
    match rung {
        ForkRung::Fentry => {
            if let Ok(p) = program::<FEntry>(ebpf, FENTRY_PROGRAM) {
                let _ = p.unload();
            }
            if let Ok(p) = program::<FExit>(ebpf, FEXIT_PROGRAM) {
                let _ = p.unload();
            }
        }
        ForkRung::Kprobe => {
            for name in [KPROBE_PROGRAM, KRETPROBE_PROGRAM] {
                if let Ok(p) = program::<KProbe>(ebpf, name) {
                    let _ = p.unload();
                }
            }
        }
        ForkRung::Tracepoint => {
            for name in [
                ENTER_CLONE_PROGRAM,
                ENTER_CLONE3_PROGRAM,
                ENTER_FORK_PROGRAM,
                EXIT_PROGRAM,
            ] {
                if let Ok(p) = program::<TracePoint>(ebpf, name) {
                    let _ = p.unload();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_architecture_without_fork_syscalls_leaves_their_tracepoints_out() {
        assert_eq!(HAS_FORK_SYSCALLS, !cfg!(target_arch = "aarch64"));
        let expected: &[&str] = if HAS_FORK_SYSCALLS {
            &EXIT_TRACEPOINTS
        } else {
            &["sys_exit_clone", "sys_exit_clone3"]
        };
        assert_eq!(on_this_arch(&EXIT_TRACEPOINTS), expected);
        assert_eq!(
            on_this_arch(&ENTER_FORK_TRACEPOINTS).is_empty(),
            !HAS_FORK_SYSCALLS
        );
    }
}

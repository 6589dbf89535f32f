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
    btf::KernelBtf,
    loader::{Setup, attach_tracepoints, program},
    tracefs::Tracefs,
};

/// Where fork latency is measured, best first: each gives the same sample
/// (the parent's clone, start to return, with its flags), the kernel_clone
/// rungs without the syscall entry and exit around it and at a lower cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ForkHook {
    /// fentry/fexit on kernel_clone (BPF trampolines: the cheapest).
    Fentry,
    /// kprobe/kretprobe on kernel_clone.
    Kprobe,
    /// The syscall tracepoints sys_{enter,exit}_{clone,clone3,fork,vfork}.
    Tracepoint,
}

impl ForkHook {
    pub const LADDER: [ForkHook; 3] = [Self::Fentry, Self::Kprobe, Self::Tracepoint];

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
            Self::Tracepoint => "tracepoints syscalls/sys_{enter,exit}_{clone,clone3,fork,vfork}",
        }
    }
}

pub fn setup(tracefs: &Tracefs, btf: &KernelBtf, slots: u32) -> Result<Setup> {
    let flags = tracefs.offset("syscalls", "sys_enter_clone", "clone_flags", 8)?;
    let uargs = tracefs.offset("syscalls", "sys_enter_clone3", "uargs", 8)?;
    let ret = tracefs.same_offset("syscalls", &EXIT_TRACEPOINTS, "ret", 8)?;
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
    wanted: Option<ForkHook>,
) -> Result<ForkHook> {
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
    for rung in ForkHook::LADDER {
        match attach_rung(ebpf, tracefs, btf, rung) {
            Ok(()) => return Ok(rung),
            Err(e) => failures.push(format!("{}: {e:#}", rung.describe())),
        }
    }
    bail!("no fork hook works on this kernel: {}", failures.join("; "))
}

/// Attaches one rung; if it fails, unloads what it got loaded.
fn attach_rung(ebpf: &mut Ebpf, tracefs: &Tracefs, btf: &Btf, rung: ForkHook) -> Result<()> {
    let attached = match rung {
        ForkHook::Fentry => attach_fentry(ebpf, btf),
        ForkHook::Kprobe => attach_kprobe(ebpf),
        ForkHook::Tracepoint => attach_syscall_tracepoints(ebpf, tracefs),
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
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_FORK_PROGRAM,
        "syscalls",
        &ENTER_FORK_TRACEPOINTS,
    )?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &EXIT_TRACEPOINTS)
}

/// Unloads (and so detaches) whatever a failed rung got loaded; a program
/// that never loaded has nothing to undo.
fn unload(ebpf: &mut Ebpf, rung: ForkHook) {
    match rung {
        ForkHook::Fentry => {
            if let Ok(p) = program::<FEntry>(ebpf, FENTRY_PROGRAM) {
                let _ = p.unload();
            }
            if let Ok(p) = program::<FExit>(ebpf, FEXIT_PROGRAM) {
                let _ = p.unload();
            }
        }
        ForkHook::Kprobe => {
            for name in [KPROBE_PROGRAM, KRETPROBE_PROGRAM] {
                if let Ok(p) = program::<KProbe>(ebpf, name) {
                    let _ = p.unload();
                }
            }
        }
        ForkHook::Tracepoint => {
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

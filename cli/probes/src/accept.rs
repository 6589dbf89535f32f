//! Userspace side of the accept probe (kernel side: probes-ebpf/src/accept.rs):
//! setup before load, the choice of hook for the accept-queue wait,
//! and attachment (its events are decoded in `decode`).

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{FExit, KProbe},
};
use probes_common::accept::{
    ACCEPT_CONFIG_MAP, ACCEPT_START_MAP, ENTER_FD_OFFSET_GLOBAL, ENTER_PROGRAM, ENTER_TRACEPOINTS,
    EXIT_PROGRAM, EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINTS, FD_WALK_MEMBERS, FEXIT_PROGRAMS,
    INET_CSK_ACCEPT, KRETPROBE_PROGRAM, SOCK_FROM_HOOK, TASK_BTF_GLOBAL, TASK_BTF_HELPER,
};

use super::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    rungs::QueueRung,
    tracefs::Tracefs,
};

/// The `fd` and `ret` offsets from this kernel's tracepoint layouts (one
/// program serves accept and accept4, so their layouts must agree), the
/// fd walk's offsets and where it starts, and the in-flight slots.
pub fn setup(tracefs: &Tracefs, btf: &KernelBtf, slots: u32) -> Result<Setup> {
    let fd = tracefs.same_offset("syscalls", &ENTER_TRACEPOINTS, "fd", 8)?;
    let ret = tracefs.same_offset("syscalls", &EXIT_TRACEPOINTS, "ret", 8)?;
    let task_btf = u32::from(btf.has_enum_value(TASK_BTF_HELPER));
    let mut globals = vec![
        (ENTER_FD_OFFSET_GLOBAL, fd),
        (EXIT_RET_OFFSET_GLOBAL, ret),
        (TASK_BTF_GLOBAL, task_btf),
    ];
    globals.extend(btf.offsets(FD_WALK_MEMBERS)?);
    Ok(Setup {
        globals,
        map_sizes: vec![(ACCEPT_START_MAP, slots)],
    })
}

/// Attaches the accept tracepoints, then the best queue hook this kernel
/// offers (or only `wanted`), and says which.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    fexit_program: &Result<&'static str>,
    wanted: Option<QueueRung>,
) -> Result<QueueRung> {
    attach_tracepoints(ebpf, tracefs, ENTER_PROGRAM, "syscalls", &ENTER_TRACEPOINTS)?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &EXIT_TRACEPOINTS)?;
    let rungs = match wanted {
        Some(hook) => vec![hook],
        None => QueueRung::LADDER.to_vec(),
    };
    let mut failures = Vec::new();
    for rung in rungs {
        let attached = match rung {
            QueueRung::Fexit => attach_fexit(ebpf, btf, fexit_program),
            QueueRung::Kretprobe => attach_kretprobe(ebpf),
            QueueRung::FdWalk => return Ok(rung),
        };
        match attached.and_then(|()| use_hook(ebpf)) {
            Ok(()) => return Ok(rung),
            Err(e) => {
                unload(ebpf, rung);
                failures.push(format!("{e:#}"));
            }
        }
    }
    Err(anyhow!(
        "the accept-queue hook {} does not work on this kernel: {}",
        wanted.map_or("(any)", QueueRung::describe),
        failures.join("; ")
    ))
}

/// The fexit program for this kernel's signature of inet_csk_accept.
pub fn fexit_program(kernel_btf: &KernelBtf) -> Result<&'static str> {
    let args = kernel_btf.func_param_count(INET_CSK_ACCEPT)?;
    FEXIT_PROGRAMS
        .iter()
        .find(|(n, _)| *n == args)
        .map(|(_, name)| *name)
        .ok_or_else(|| anyhow!("{INET_CSK_ACCEPT} takes {args} arguments here, a signature stackprobe does not know"))
}

fn attach_fexit(ebpf: &mut Ebpf, btf: &Btf, fexit_program: &Result<&'static str>) -> Result<()> {
    let name = fexit_program.as_ref().map_err(|e| anyhow!("{e:#}"))?;
    let p: &mut FExit = program(ebpf, name)?;
    p.load(INET_CSK_ACCEPT, btf).context("loading fexit")?;
    p.attach().context("attaching fexit")?;
    Ok(())
}

fn attach_kretprobe(ebpf: &mut Ebpf) -> Result<()> {
    let p: &mut KProbe = program(ebpf, KRETPROBE_PROGRAM)?;
    p.load().context("loading the kretprobe")?;
    p.attach(INET_CSK_ACCEPT, 0)
        .context("attaching the kretprobe")?;
    Ok(())
}

/// Tells the exit program to take the socket from the hook.
fn use_hook(ebpf: &mut Ebpf) -> Result<()> {
    let map = ebpf
        .map_mut(ACCEPT_CONFIG_MAP)
        .ok_or_else(|| anyhow!("the probes lack {ACCEPT_CONFIG_MAP}"))?;
    let mut config: Array<_, u32> = Array::try_from(map)?;
    Ok(config.set(0, SOCK_FROM_HOOK, 0)?)
}

fn unload(ebpf: &mut Ebpf, rung: QueueRung) {
    match rung {
        QueueRung::Fexit => {
            for (_, name) in FEXIT_PROGRAMS {
                if let Ok(p) = program::<FExit>(ebpf, name) {
                    let _ = p.unload();
                }
            }
        }
        QueueRung::Kretprobe => {
            if let Ok(p) = program::<KProbe>(ebpf, KRETPROBE_PROGRAM) {
                let _ = p.unload();
            }
        }
        QueueRung::FdWalk => {}
    }
}

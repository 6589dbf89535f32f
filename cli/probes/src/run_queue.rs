//! Userspace side of run-queue latency (kernel side:
//! probes-ebpf/src/run_queue.rs): setup before load, and attachment, only
//! when asked for: its switch program runs at every context switch on the
//! host.

use anyhow::{Context as _, Result};
use aya::{Btf, Ebpf, programs::BtfTracePoint};
use probes_common::run_queue::{PROGRAMS, RUN_QUEUE_MEMBERS, RUN_SLOTS_MAP, TASK_STATE_GLOBAL};
use stackprobe_model::probe_stats::{RUN_QUEUE_METRIC, RUN_QUEUE_OFF, RUN_QUEUE_TP_BTF, RungInUse};

use super::{attach::Setup, attach::program, btf::KernelBtf};

/// The task members read, the state's name on this kernel (`__state` from
/// 5.14, `state` before), and one slot per thread id.
pub fn setup(btf: &KernelBtf, slots: u32) -> Result<Setup> {
    let state = btf
        .path_offset("task_struct", &["__state"])
        .or_else(|_| btf.path_offset("task_struct", &["state"]))
        .context("the kernel's BTF has no task_struct.__state or .state")?;
    let mut globals = vec![(TASK_STATE_GLOBAL, state)];
    globals.extend(btf.offsets(RUN_QUEUE_MEMBERS)?);
    Ok(Setup {
        globals,
        map_sizes: vec![(RUN_SLOTS_MAP, slots)],
    })
}

/// Loads and attaches the wakeup and switch programs (BTF tracepoints).
/// The wakeups go first, so no watched thread is switched in unstamped
/// once the switch program runs.
pub fn attach(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    for (name, event) in PROGRAMS {
        let p: &mut BtfTracePoint = program(ebpf, name)?;
        p.load(event, btf).with_context(|| {
            format!(
                "loading the run-queue probe on the BTF tracepoint {event} \
                 (this kernel does not offer it to BPF programs)"
            )
        })?;
        p.attach()
            .with_context(|| format!("attaching the run-queue probe to {event}"))?;
    }
    Ok(())
}

/// The hook run-queue latency comes from, or that it was not asked for.
pub fn in_use(on: bool) -> RungInUse {
    if on {
        RungInUse {
            metric: RUN_QUEUE_METRIC,
            hook: RUN_QUEUE_TP_BTF,
            description: "BTF tracepoints sched_wakeup, sched_wakeup_new and sched_switch: \
                          run-queue wait, on-CPU slices and preemptions of watched threads",
        }
    } else {
        RungInUse {
            metric: RUN_QUEUE_METRIC,
            hook: RUN_QUEUE_OFF,
            description: "not measured: run-queue wait, on-CPU time and preemptions need \
                          --run-queue (a program on every context switch)",
        }
    }
}

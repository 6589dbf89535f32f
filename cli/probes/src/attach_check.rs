//! Which optional attach types this kernel offers, tried for real: `doctor` loads
//! and attaches the do-nothing programs of probes-ebpf/src/attach_check.rs, then
//! detaches them. (`watch` itself needs only tracepoints and iter/tcp, which
//! loading the probes proves.)

use anyhow::{Context as _, Result};
use aya::{
    Btf, Ebpf,
    programs::{BtfTracePoint, FEntry, KProbe},
};

use super::attach::program;

/// A hook, what it was tried on, and whether it worked (the error if not).
pub struct AttachCheck {
    pub hook: &'static str,
    pub target: &'static str,
    pub result: Result<()>,
}

pub fn check(ebpf: &mut Ebpf, btf: &Btf) -> Vec<AttachCheck> {
    vec![
        AttachCheck {
            hook: "tp_btf",
            target: "sched_process_fork",
            result: tp_btf(ebpf, btf),
        },
        AttachCheck {
            hook: "fentry",
            target: "tcp_v4_connect",
            result: fentry(ebpf, btf),
        },
        AttachCheck {
            hook: "kprobe",
            target: "tcp_v4_connect",
            result: kprobe(ebpf),
        },
    ]
}

fn tp_btf(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let p: &mut BtfTracePoint = program(ebpf, "hook_tp_btf")?;
    p.load("sched_process_fork", btf).context("load")?;
    let link = p.attach().context("attach")?;
    Ok(p.detach(link)?)
}

fn fentry(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let p: &mut FEntry = program(ebpf, "hook_fentry")?;
    p.load("tcp_v4_connect", btf).context("load")?;
    let link = p.attach().context("attach")?;
    Ok(p.detach(link)?)
}

fn kprobe(ebpf: &mut Ebpf) -> Result<()> {
    let p: &mut KProbe = program(ebpf, "hook_kprobe")?;
    p.load().context("load")?;
    let link = p.attach("tcp_v4_connect", 0).context("attach")?;
    Ok(p.detach(link)?)
}

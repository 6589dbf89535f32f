//! Userspace side of the TCP probes (kernel side: probes-ebpf's sock.rs,
//! tcp_state.rs, tcp_links.rs and their helpers), one file per concern:
//! here, struct offsets from BTF, the choice of hook for state changes and
//! loading; `owners`, who owns each watched listening port; `walk`, walks
//! of every TCP socket through the `iter/tcp` iterator (decoded in
//! `decode`); `links`, the kernel's per-link counts.

mod links;
mod owners;
mod walk;

pub use links::{forget_links, forget_owner, links};
pub use owners::{forget_listen_owner, set_listen_owner};
pub use walk::{Walked, snapshot, walk};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    programs::{BtfTracePoint, Iter},
};
use probes_common::sock::{
    CLOSE_MEMBERS, ITER_MEMBERS, ITER_PROGRAM, NET_MEMBERS, PROTOCOL_MEMBER, RECORD_WINDOW,
    SOCK_COMMON_MEMBERS, SOCK_COMMON_SIZES, SOCK_WINDOW, STATE_BTF_EVENT, STATE_BTF_NESTED_PROGRAM,
    STATE_BTF_PROGRAM, STATE_FIELD_SIZES, STATE_FIELDS, STATE_PROGRAM,
};

use crate::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    rungs::StateRung,
    tracefs::Tracefs,
};

pub fn setup(btf: &KernelBtf, tracefs: &Tracefs) -> Result<Setup> {
    let mut globals = btf.offsets(ITER_MEMBERS)?;
    for ((name, offset), size) in globals
        .iter()
        .take(SOCK_COMMON_MEMBERS.len())
        .zip(SOCK_COMMON_SIZES)
    {
        if (offset + size) as usize > SOCK_WINDOW {
            bail!(
                "{name} lies at byte {offset} of struct sock here, past the {SOCK_WINDOW} bytes \
                 stackprobe copies"
            );
        }
    }
    let net = btf.offsets(NET_MEMBERS)?;
    if let Some((name, offset)) = net.first()
        && *offset as usize + size_of::<u64>() > SOCK_WINDOW
    {
        bail!(
            "{name} lies at byte {offset} of struct sock here, past the {SOCK_WINDOW} bytes \
             stackprobe copies"
        );
    }
    globals.extend(net);
    globals.extend(btf.offsets(CLOSE_MEMBERS)?);
    // Without it (a bitfield before 5.6) the tp_btf program is not used.
    globals.extend(btf.offsets(PROTOCOL_MEMBER).unwrap_or_default());
    for (f, size) in STATE_FIELDS.iter().zip(STATE_FIELD_SIZES) {
        let offset = tracefs
            .field("sock", "inet_sock_set_state", f.field)?
            .offset;
        if (offset + size) as usize > RECORD_WINDOW {
            bail!(
                "inet_sock_set_state's {} lies at byte {offset} of its record here, past the \
                 {RECORD_WINDOW} bytes stackprobe copies",
                f.field
            );
        }
        globals.push((f.global, offset));
    }
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

/// Why a kernel before 5.6 gets the classic tracepoint: the one reason
/// that is the kernel's, not ours.
pub const SK_PROTOCOL_BITFIELD: &str = "sock.sk_protocol is a bitfield here";

/// Whether the tp_btf state program can read what it needs here (it reads
/// `sk_protocol` directly, which was a bitfield before 5.6).
pub fn tp_btf_readable(btf: &KernelBtf) -> bool {
    btf.offsets(PROTOCOL_MEMBER).is_ok()
}

/// Attaches the state probe to the best hook this kernel offers; with
/// the classic tracepoint, why tp_btf was not taken.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    tp_btf_readable: bool,
) -> Result<(StateRung, Option<String>)> {
    let btf_tracepoint = if tp_btf_readable {
        attach_btf_tracepoint(ebpf, btf)
    } else {
        Err(anyhow!(SK_PROTOCOL_BITFIELD))
    };
    match btf_tracepoint {
        Ok(()) => Ok((StateRung::BtfTracepoint, None)),
        Err(e) => {
            for name in [STATE_BTF_PROGRAM, STATE_BTF_NESTED_PROGRAM] {
                if let Ok(p) = program::<BtfTracePoint>(ebpf, name) {
                    let _ = p.unload();
                }
            }
            attach_tracepoints(
                ebpf,
                tracefs,
                STATE_PROGRAM,
                "sock",
                &["inet_sock_set_state"],
            )?;
            Ok((StateRung::Tracepoint, Some(format!("{e:#}"))))
        }
    }
}

/// The probe, then its nested copy, which must run after it on each change.
fn attach_btf_tracepoint(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    for name in [STATE_BTF_PROGRAM, STATE_BTF_NESTED_PROGRAM] {
        let p: &mut BtfTracePoint = program(ebpf, name)?;
        p.load(STATE_BTF_EVENT, btf)
            .with_context(|| format!("loading tp_btf {name}"))?;
        p.attach()
            .with_context(|| format!("attaching tp_btf {name}"))?;
    }
    Ok(())
}

pub fn load(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let iter: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .context("the eBPF object has no TCP iterator")?
        .try_into()?;
    iter.load("tcp", btf)
        .context("loading the iter/tcp program (the kernel's verifier refused it)")
}

//! Userspace side of service time and busy servers (kernel side:
//! probes-ebpf/src/services.rs and close.rs, with the accept and lifecycle
//! probes): setup before load, attachment, and the servers' busy counts.

use anyhow::{Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, MapError},
};
use probes_common::service::{
    BUSY_MAP, BUSY_MAX_MAP, Busy, CLOSE_FD_OFFSET_GLOBAL, CLOSE_PROGRAM, CLOSE_TRACEPOINT,
    EXIT_PROGRAM, FILE_ONE_REF_GLOBAL, FILE_REFS_GLOBAL, SERVICE_MEMBERS, UNIX_SERVICES_GLOBAL,
};
use stackprobe_model::probe_stats::{RungInUse, SERVICE_RUNG, SERVICE_TCP_ONLY};

use super::{
    attach::{Setup, attach_tracepoints},
    btf::KernelBtf,
    tracefs::Tracefs,
};

/// The close tracepoint's `fd`, the members read, where a file keeps its
/// reference count (`f_ref` (6.13 and later), which reads 0 with one
/// reference, or `f_count` before, which reads 1), and whether unix
/// connections are served (`unix`: the close and exit probes attach).
pub fn setup(tracefs: &Tracefs, btf: &KernelBtf, unix: bool) -> Result<Setup> {
    let fd = tracefs.same_offset("syscalls", &[CLOSE_TRACEPOINT], "fd", 8)?;
    let (refs, one) = match btf.path_offset("file", &["f_ref"]) {
        Ok(off) => (off, 0),
        Err(_) => (btf.path_offset("file", &["f_count"])?, 1),
    };
    let mut globals = vec![
        (CLOSE_FD_OFFSET_GLOBAL, fd),
        (FILE_REFS_GLOBAL, refs),
        (FILE_ONE_REF_GLOBAL, one),
        (UNIX_SERVICES_GLOBAL, u32::from(unix)),
    ];
    globals.extend(btf.offsets(SERVICE_MEMBERS)?);
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

/// The exit program, before the lifecycle probe's: programs on one
/// tracepoint run in the order they were attached, and that one takes the
/// exiting process out of the watch set, which this one asks.
pub fn attach_exit(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        EXIT_PROGRAM,
        "sched",
        &["sched_process_exit"],
    )
}

pub fn attach_close(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        CLOSE_PROGRAM,
        "syscalls",
        &[CLOSE_TRACEPOINT],
    )
}

/// Where service time comes from, for reports: TCP always (the state
/// probe), unix only with the close and exit probes.
pub fn in_use(unix: bool) -> RungInUse {
    if unix {
        RungInUse {
            metric: SERVICE_RUNG,
            hook: "close",
            description: "TCP: the state probe (the server's first FIN or a reset); unix: tracepoint syscalls/sys_enter_close (the last reference's close) and the holder's exit",
        }
    } else {
        RungInUse {
            metric: SERVICE_RUNG,
            hook: SERVICE_TCP_ONLY,
            description: "TCP: the state probe (the server's first FIN or a reset); unix: not measured (--unix-service-time: a probe on every close(2) on the host)",
        }
    }
}

/// Forgets `server`'s busy count (stackprobe's own, after its self-check).
pub fn forget_server(ebpf: &mut Ebpf, server: u32) -> Result<()> {
    let map = ebpf
        .map_mut(BUSY_MAP)
        .ok_or_else(|| anyhow!("the probes lack {BUSY_MAP}"))?;
    let mut busy: HashMap<&mut MapData, u32, Busy> = HashMap::try_from(map)?;
    forgotten(busy.remove(&server))?;
    let map = ebpf
        .map_mut(BUSY_MAX_MAP)
        .ok_or_else(|| anyhow!("the probes lack {BUSY_MAX_MAP}"))?;
    let mut max: HashMap<&mut MapData, u32, u64> = HashMap::try_from(map)?;
    forgotten(max.remove(&server))
}

/// A removal's result: a key that was not there is removed as well.
fn forgotten(r: Result<(), MapError>) -> Result<()> {
    match r {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Each server's busy count (by the pid it is kept under) and the most it
/// held at once since the last call, which then starts over from what it
/// holds now.
pub fn take_busy(ebpf: &mut Ebpf) -> Result<Vec<(u32, Busy, u64)>> {
    let busy: Vec<(u32, Busy)> = {
        let map = ebpf
            .map(BUSY_MAP)
            .ok_or_else(|| anyhow!("the probes lack {BUSY_MAP}"))?;
        let busy: HashMap<&MapData, u32, Busy> = HashMap::try_from(map)?;
        busy.iter().filter_map(Result::ok).collect()
    };
    let map = ebpf
        .map_mut(BUSY_MAX_MAP)
        .ok_or_else(|| anyhow!("the probes lack {BUSY_MAX_MAP}"))?;
    let mut maxes: HashMap<&mut MapData, u32, u64> = HashMap::try_from(map)?;
    let mut out = Vec::with_capacity(busy.len());
    for (server, b) in busy {
        let max = maxes.get(&server, 0).unwrap_or(b.open).max(b.open);
        // A connection that starts between the read and this write raises
        // it again itself.
        maxes.insert(server, b.open, 0)?;
        out.push((server, b, max));
    }
    Ok(out)
}

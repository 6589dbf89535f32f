//! Userspace side of service time and busy servers (kernel side:
//! probes-ebpf/src/services.rs and service_end.rs, with the accept and lifecycle
//! probes): setup before load, attachment, and the servers' busy counts.

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap, MapData, MapError},
    programs::{FEntry, TracePoint},
};
use probes_common::service::{
    BUSY_MAP, BUSY_MAX_MAP, Busy, CLOSE_FD_OFFSET_GLOBAL, CLOSE_PROGRAM, CLOSE_TRACEPOINT,
    EXIT_PROGRAM, FILE_ONE_REF_GLOBAL, FILE_REFS_GLOBAL, RELEASE_FUNCTION, RELEASE_PROGRAM,
    SERVICE_CONFIG_MAP, SERVICE_MEMBERS,
};
use stackprobe_model::probe_stats::{RungInUse, SERVICE_RUNG, SERVICE_TCP_ONLY};

use super::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    rungs::UnixServiceRung,
    tracefs::Tracefs,
};

/// The close tracepoint's `fd`, the members read, and where a file keeps
/// its reference count (`f_ref` (6.13 and later), which reads 0 with one
/// reference, or `f_count` before, which reads 1).
pub fn setup(tracefs: &Tracefs, btf: &KernelBtf) -> Result<Setup> {
    let fd = tracefs.same_offset("syscalls", &[CLOSE_TRACEPOINT], "fd", 8)?;
    let (refs, one) = match btf.path_offset("file", &["f_ref"]) {
        Ok(off) => (off, 0),
        Err(_) => (btf.path_offset("file", &["f_count"])?, 1),
    };
    let mut globals = vec![
        (CLOSE_FD_OFFSET_GLOBAL, fd),
        (FILE_REFS_GLOBAL, refs),
        (FILE_ONE_REF_GLOBAL, one),
    ];
    globals.extend(btf.offsets(SERVICE_MEMBERS)?);
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

/// Attaches what sees a unix connection's end: `wanted` or fail; else the
/// best rung this kernel offers, the close probes only if `close_allowed`
/// (`--unix-service-time`: they run on every close(2)); None: unix
/// connections are not served (TCP ones always are). Before the lifecycle
/// probe attaches: programs on one tracepoint run in the order they were
/// attached, and that one takes the exiting process out of the watch set,
/// which the exit program asks.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    wanted: Option<UnixServiceRung>,
    close_allowed: bool,
) -> Result<Option<UnixServiceRung>> {
    let rungs: Vec<UnixServiceRung> = match wanted {
        Some(rung) => vec![rung],
        None => UnixServiceRung::LADDER
            .into_iter()
            .filter(|&r| r != UnixServiceRung::Close || close_allowed)
            .collect(),
    };
    let mut failures = Vec::new();
    for rung in rungs {
        let attached = match rung {
            UnixServiceRung::Fentry => attach_release(ebpf, btf),
            UnixServiceRung::Close => attach_close(ebpf, tracefs),
        };
        match attached {
            Ok(()) => {
                config(ebpf)?.set(0, 1, 0)?;
                return Ok(Some(rung));
            }
            Err(e) => {
                unload(ebpf, rung);
                failures.push(format!("{}: {e:#}", rung.name()));
            }
        }
    }
    if wanted.is_some() || close_allowed {
        bail!(
            "the unix service hook {} does not work on this kernel: {}",
            wanted.map_or("(any)", UnixServiceRung::describe),
            failures.join("; ")
        );
    }
    Ok(None)
}

fn attach_release(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let release: &mut FEntry = program(ebpf, RELEASE_PROGRAM)?;
    release
        .load(RELEASE_FUNCTION, btf)
        .context("loading fentry")?;
    release.attach().context("attaching fentry")?;
    Ok(())
}

fn attach_close(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        EXIT_PROGRAM,
        "sched",
        &["sched_process_exit"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        CLOSE_PROGRAM,
        "syscalls",
        &[CLOSE_TRACEPOINT],
    )
}

/// Unloads (and so detaches) whatever a failed rung got loaded: the close
/// rung's exit program must not run without its close program.
fn unload(ebpf: &mut Ebpf, rung: UnixServiceRung) {
    match rung {
        UnixServiceRung::Fentry => {
            if let Ok(p) = program::<FEntry>(ebpf, RELEASE_PROGRAM) {
                let _ = p.unload();
            }
        }
        UnixServiceRung::Close => {
            for name in [EXIT_PROGRAM, CLOSE_PROGRAM] {
                if let Ok(p) = program::<TracePoint>(ebpf, name) {
                    let _ = p.unload();
                }
            }
        }
    }
}

fn config(ebpf: &mut Ebpf) -> Result<Array<&mut MapData, u32>> {
    let map = ebpf
        .map_mut(SERVICE_CONFIG_MAP)
        .ok_or_else(|| anyhow!("the probes lack {SERVICE_CONFIG_MAP}"))?;
    Ok(Array::try_from(map)?)
}

/// Where service time comes from, for reports: TCP always (the state
/// probe), unix on `rung` if any.
pub fn in_use(rung: Option<UnixServiceRung>) -> RungInUse {
    match rung {
        Some(rung) => RungInUse {
            metric: SERVICE_RUNG,
            hook: rung.name(),
            description: rung.describe(),
        },
        None => RungInUse {
            metric: SERVICE_RUNG,
            hook: SERVICE_TCP_ONLY,
            description: "TCP: the state probe (the server's first FIN or a reset); unix: not measured (no fentry here; --unix-service-time: a probe on every close(2) on the host)",
        },
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

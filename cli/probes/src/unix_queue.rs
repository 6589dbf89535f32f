//! Userspace side of the unix queue wait (kernel side:
//! probes-ebpf/src/unix_queue.rs, unix_enqueue.rs and data_ready.rs, with the accept and
//! connect probes): setup before load, the choice of rung, the watched
//! listeners the kernel stamps, and the connects a full queue refused.

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap, MapData, MapError},
    programs::FEntry,
};
use probes_common::unix::{
    DATA_READY_CATEGORY, DATA_READY_FAMILY_OFFSET_GLOBAL, DATA_READY_PROGRAM,
    DATA_READY_SK_OFFSET_GLOBAL, DATA_READY_TRACEPOINT, ENQUEUE_FUNCTION, ENQUEUE_PROGRAM,
    RUNG_DATA_READY, RUNG_FENTRY, RUNG_SYSCALLS, UNIX_CONFIG_MAP, UNIX_LISTENERS_MAP,
    UNIX_LOST_MAP, UNIX_QUEUE_MEMBERS,
};

use super::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    rungs::UnixQueueRung,
    tracefs::Tracefs,
};

/// The struct offsets the probes read, and the data-ready record's
/// offsets where this kernel has the tracepoint.
pub fn setup(tracefs: &Tracefs, btf: &KernelBtf) -> Result<Setup> {
    let mut globals = btf.offsets(UNIX_QUEUE_MEMBERS)?;
    if tracefs.has_event(DATA_READY_CATEGORY, DATA_READY_TRACEPOINT) {
        let event = [DATA_READY_TRACEPOINT];
        globals.push((
            DATA_READY_SK_OFFSET_GLOBAL,
            tracefs.same_offset(DATA_READY_CATEGORY, &event, "skaddr", 8)?,
        ));
        globals.push((
            DATA_READY_FAMILY_OFFSET_GLOBAL,
            tracefs.same_offset(DATA_READY_CATEGORY, &event, "family", 2)?,
        ));
    }
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

/// Attaches the best rung this kernel offers (or only `wanted`) and tells
/// the probes which.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    wanted: Option<UnixQueueRung>,
) -> Result<UnixQueueRung> {
    let rungs = match wanted {
        Some(rung) => vec![rung],
        None => UnixQueueRung::LADDER.to_vec(),
    };
    let mut failures = Vec::new();
    for rung in rungs {
        let attached = match rung {
            UnixQueueRung::Fentry => attach_fentry(ebpf, btf),
            UnixQueueRung::DataReady => attach_tracepoints(
                ebpf,
                tracefs,
                DATA_READY_PROGRAM,
                DATA_READY_CATEGORY,
                &[DATA_READY_TRACEPOINT],
            ),
            // The connect and accept probes are attached anyway.
            UnixQueueRung::Syscalls => Ok(()),
        };
        match attached {
            Ok(()) => {
                let value = match rung {
                    UnixQueueRung::Fentry => RUNG_FENTRY,
                    UnixQueueRung::DataReady => RUNG_DATA_READY,
                    UnixQueueRung::Syscalls => RUNG_SYSCALLS,
                };
                config(ebpf)?.set(0, value, 0)?;
                return Ok(rung);
            }
            Err(e) => failures.push(format!("{}: {e:#}", rung.name())),
        }
    }
    bail!(
        "the unix queue hook {} does not work on this kernel: {}",
        wanted.map_or("(any)", UnixQueueRung::describe),
        failures.join("; ")
    )
}

/// Where a kernel loads the program and refuses its attach (arm64's 6.1
/// does), it is unloaded again: no program of a rung not taken stays.
fn attach_fentry(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let enqueue: &mut FEntry = program(ebpf, ENQUEUE_PROGRAM)?;
    enqueue
        .load(ENQUEUE_FUNCTION, btf)
        .context("loading fentry")?;
    if let Err(e) = enqueue.attach() {
        let _ = enqueue.unload();
        return Err(e).context("attaching fentry");
    }
    Ok(())
}

fn config(ebpf: &mut Ebpf) -> Result<Array<&mut MapData, u32>> {
    let map = ebpf
        .map_mut(UNIX_CONFIG_MAP)
        .ok_or_else(|| anyhow!("the probes lack {UNIX_CONFIG_MAP}"))?;
    Ok(Array::try_from(map)?)
}

/// Tells the kernel that the unix listener with socket inode `inode` is
/// `owner`'s: connections queued there are stamped.
pub fn watch_listener(ebpf: &mut Ebpf, inode: u64, owner: u32) -> Result<()> {
    let map = ebpf
        .map_mut(UNIX_LISTENERS_MAP)
        .ok_or_else(|| anyhow!("the probes lack {UNIX_LISTENERS_MAP}"))?;
    let mut listeners: HashMap<&mut MapData, u64, u32> = HashMap::try_from(map)?;
    match listeners.get(&inode, 0) {
        Ok(_) => Ok(()),
        Err(MapError::KeyNotFound) => listeners
            .insert(inode, owner, 0)
            .with_context(|| format!("watching the unix listener with inode {inode}")),
        Err(e) => Err(e.into()),
    }
}

/// Forgets listeners no watched process holds any more.
pub fn forget_listeners(ebpf: &mut Ebpf, keep: impl Fn(u64) -> bool) -> Result<()> {
    let map = ebpf
        .map_mut(UNIX_LISTENERS_MAP)
        .ok_or_else(|| anyhow!("the probes lack {UNIX_LISTENERS_MAP}"))?;
    let mut listeners: HashMap<&mut MapData, u64, u32> = HashMap::try_from(map)?;
    let gone: Vec<u64> = listeners
        .keys()
        .filter_map(Result::ok)
        .filter(|&i| !keep(i))
        .collect();
    for inode in gone {
        match listeners.remove(&inode) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Every unix destination a full queue refused connects to since load
/// (destination id, count), from every process on the host.
pub fn lost(ebpf: &Ebpf) -> Result<Vec<(u64, u64)>> {
    let map = ebpf
        .map(UNIX_LOST_MAP)
        .ok_or_else(|| anyhow!("the probes lack {UNIX_LOST_MAP}"))?;
    let lost: HashMap<&MapData, u64, u64> = HashMap::try_from(map)?;
    Ok(lost.iter().filter_map(Result::ok).collect())
}

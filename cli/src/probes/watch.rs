//! Userspace side of the watch set (kernel side: probes-ebpf/src/watch.rs):
//! attaching the fork/exec/exit programs and reading and seeding the maps.

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{HashMap, MapError},
};
use probes_common::{
    TASK_COMM_LEN,
    watch::{
        EXEC_PROGRAM, EXIT_PROGRAM, FORK_CHILD_PID_OFFSET_GLOBAL, FORK_PROGRAM, WATCHED_MAP,
        WATCHED_NAMES_MAP, WatchReason,
    },
};

use super::{loader::attach_tracepoints, tracefs::Tracefs};

pub fn globals(tracefs: &Tracefs) -> Result<Vec<(&'static str, u32)>> {
    let child_pid = tracefs.offset("sched", "sched_process_fork", "child_pid", 4)?;
    Ok(vec![(FORK_CHILD_PID_OFFSET_GLOBAL, child_pid)])
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        FORK_PROGRAM,
        "sched",
        &["sched_process_fork"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        EXEC_PROGRAM,
        "sched",
        &["sched_process_exec"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        EXIT_PROGRAM,
        "sched",
        &["sched_process_exit"],
    )
}

fn watched_map(ebpf: &mut Ebpf) -> Result<HashMap<&mut aya::maps::MapData, u32, u32>> {
    let map = ebpf
        .map_mut(WATCHED_MAP)
        .context("the probes lack the WATCHED map")?;
    Ok(HashMap::try_from(map)?)
}

pub fn add_names(ebpf: &mut Ebpf, keys: &[[u8; TASK_COMM_LEN]]) -> Result<()> {
    let map = ebpf
        .map_mut(WATCHED_NAMES_MAP)
        .context("the probes lack the WATCHED_NAMES map")?;
    let mut names: HashMap<_, [u8; TASK_COMM_LEN], u32> = HashMap::try_from(map)?;
    for key in keys {
        names
            .insert(key, 1, 0)
            .context("adding a name to the watch set")?;
    }
    Ok(())
}

/// Adds `tgid` unless it is already there (keeping how it got there).
pub fn add_pid(ebpf: &mut Ebpf, tgid: u32) -> Result<()> {
    let mut map = watched_map(ebpf)?;
    match map.get(&tgid, 0) {
        Ok(_) => Ok(()),
        Err(MapError::KeyNotFound) => map
            .insert(tgid, WatchReason::Selected as u32, 0)
            .with_context(|| format!("adding pid {tgid} to the watch set")),
        Err(e) => Err(e.into()),
    }
}

/// Every key of the watch set: tgids, and tids of threads started by watched
/// processes while they live.
pub fn pids(ebpf: &mut Ebpf) -> Result<Vec<(u32, Option<WatchReason>)>> {
    let map = watched_map(ebpf)?;
    let mut out = Vec::new();
    for entry in map.iter() {
        match entry {
            Ok((pid, reason)) => out.push((pid, WatchReason::from_u32(reason))),
            // A key deleted by an exit between two iteration steps.
            Err(MapError::KeyNotFound) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

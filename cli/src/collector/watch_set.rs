//! Following the watch set from userspace: the kernel adds processes that
//! exec a selected name and children of watched processes as they appear;
//! this catches what was running before the probes attached.

use std::collections::{HashMap, HashSet};

use anyhow::Result;

use crate::{
    model::{
        process::{LiveProcess, ProcessTable},
        selector::Selector,
    },
    probes::Probes,
    procfs,
};

/// Adds to the kernel's watch set every running process selected by name and
/// every child of a watched process (those forked before the fork probe was
/// attached); returns the watched processes now alive. Titles are read only
/// for processes `table` has none for: they are set once, after fork or exec.
pub fn refresh(
    selector: &Selector,
    probes: &mut Probes,
    table: &ProcessTable,
) -> Result<Vec<LiveProcess>> {
    let procs = procfs::processes();
    let mut watched: HashSet<u32> = probes.watched().into_iter().map(|(pid, _)| pid).collect();
    for p in &procs {
        if selector.matches_name(&p.comm, p.exe_basename.as_deref()) && watched.insert(p.pid) {
            probes.watch_pid(p.pid)?;
        }
    }
    loop {
        let orphans: Vec<u32> = procs
            .iter()
            .filter(|p| !watched.contains(&p.pid) && watched.contains(&p.ppid))
            .map(|p| p.pid)
            .collect();
        if orphans.is_empty() {
            break;
        }
        for pid in orphans {
            probes.watch_pid(pid)?;
            watched.insert(pid);
        }
    }
    let names: HashMap<u32, &str> = procs.iter().map(|p| (p.pid, p.comm.as_str())).collect();
    Ok(procs
        .iter()
        .filter(|p| watched.contains(&p.pid))
        .map(|p| LiveProcess {
            pid: p.pid,
            name: p.comm.clone(),
            title: match table.get(p.pid) {
                Some(known) if known.title.is_some() => None,
                _ => procfs::cmdline(p.pid),
            },
            parent: names.get(&p.ppid).map(|name| (p.ppid, name.to_string())),
        })
        .collect())
}

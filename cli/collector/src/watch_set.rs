//! Following the watch set from userspace. The kernel adds processes that
//! exec a selected name and children of watched processes as they appear;
//! /proc is scanned once, at start, for what was running before the probes
//! attached. After that only pids new to the watch set are read from /proc,
//! and of those forked since, only whether they live and their title (their
//! spawn event names them and their parent): the cost follows what changed,
//! not how many processes the machine runs.

use std::collections::{HashMap, HashSet, hash_map::Entry};

use anyhow::Result;

use super::{cgroups, containers::Containers};
use stackprobe_model::{
    containers::Container,
    process::{LiveProcess, ProcessTable},
    roles,
    selector::Selector,
};
use stackprobe_probes::Probes;
use stackprobe_probes::procfs;

#[derive(Default)]
pub struct WatchSet {
    /// Watched pids already read from /proc, with what was read.
    known: HashMap<u32, Known>,
    /// Watched pids that are threads (the kernel watches every task a
    /// watched process starts): read once, then passed over while watched.
    /// Read again each interval, 200 threads cost an idle stackprobe
    /// 8.7 ms of CPU a second.
    threads: HashSet<u32>,
    scanned: bool,
    containers: Containers,
}

struct Known {
    name: String,
    parent: Option<(u32, String)>,
    container: Option<Container>,
    ns_pid: Option<u32>,
}

impl WatchSet {
    /// The watched processes now alive, for the table's sync. The first call
    /// also adds to the kernel's watch set every running process selected
    /// by name and every child of a watched one (forked before the fork
    /// probe was attached). Titles are read only for processes `table` has
    /// none for, or whose role still waits on theirs (a php-fpm worker
    /// shows its master's title until it names its pool): they are set
    /// once, after fork or exec.
    pub fn refresh(
        &mut self,
        selector: &Selector,
        probes: &mut Probes,
        table: &ProcessTable,
    ) -> Result<Vec<LiveProcess>> {
        if !self.scanned {
            self.scanned = true;
            self.scan(selector, probes)?;
        } else if !selector.cgroups().is_empty() {
            self.follow_cgroups(selector, probes)?;
        }
        let watched: Vec<u32> = probes.watched().into_iter().map(|(pid, _)| pid).collect();
        let current: HashSet<u32> = watched.iter().copied().collect();
        self.known.retain(|pid, _| current.contains(pid));
        self.threads.retain(|pid| current.contains(pid));
        let mut live = Vec::with_capacity(watched.len());
        for pid in watched {
            let known = match self.known.entry(pid) {
                // In the kernel's set, so alive: its exit probe clears its
                // byte, and `Probes::watch_pid` clears one set too late.
                Entry::Occupied(known) => known.into_mut(),
                // New to the watch set, and forked while the probes watched:
                // its spawn event told its name and parent already.
                Entry::Vacant(slot)
                    if let Some(p) = table.get(pid).filter(|p| p.parent.is_some()) =>
                {
                    if !procfs::alive(pid) {
                        continue;
                    }
                    // A child starts in its parent's cgroup and pid
                    // namespace: only a container's child has a pid of its
                    // own there to read.
                    let parent = p.parent.as_ref().and_then(|(ppid, _)| table.get(*ppid));
                    slot.insert(Known {
                        name: p.name.clone(),
                        parent: p.parent.clone(),
                        container: parent.and_then(|pp| pp.container.clone()),
                        ns_pid: parent
                            .filter(|pp| pp.ns_pid.is_some())
                            .and_then(|_| procfs::ns_pid(pid)),
                    })
                }
                Entry::Vacant(_) if self.threads.contains(&pid) => continue,
                // Else the one time its /proc entry is read.
                Entry::Vacant(slot) => {
                    let Some(p) = procfs::read(pid) else {
                        continue;
                    };
                    if !p.is_process() {
                        self.threads.insert(pid);
                        continue;
                    }
                    if p.zombie {
                        continue;
                    }
                    slot.insert(Known {
                        parent: procfs::comm(p.ppid).map(|name| (p.ppid, name)),
                        name: p.comm,
                        container: self.containers.of(pid),
                        ns_pid: p.ns_pid,
                    })
                }
            };
            // The table's name is the newer one once an exec event renamed
            // the process.
            let name = table
                .get(pid)
                .map_or_else(|| known.name.clone(), |p| p.name.clone());
            let title = match table.get(pid) {
                Some(p) if !p.needs_title() => None,
                // Not in the table yet: its name says whether a title
                // could matter.
                None if !roles::reads_title(&name) => None,
                _ => procfs::cmdline(pid),
            };
            live.push(LiveProcess {
                pid,
                name,
                title,
                parent: known.parent.clone(),
                container: known.container.clone(),
                ns_pid: known.ns_pid,
            });
        }
        Ok(live)
    }

    /// Selected cgroups since the last look: sub-cgroups made meanwhile
    /// (their execs are watched from now on), and processes moved into them
    /// without an exec.
    fn follow_cgroups(&mut self, selector: &Selector, probes: &mut Probes) -> Result<()> {
        let mount = cgroups::mount()?;
        probes.watch_cgroups(&cgroups::ids(&mount, selector.cgroups()))?;
        let watched: HashSet<u32> = probes.watched().into_iter().map(|(pid, _)| pid).collect();
        for pid in cgroups::processes(&mount, selector.cgroups()) {
            if !watched.contains(&pid) {
                probes.watch_pid(pid)?;
            }
        }
        Ok(())
    }

    /// What was running before the probes attached: processes selected by
    /// name or cgroup, and the descendants of watched processes.
    fn scan(&mut self, selector: &Selector, probes: &mut Probes) -> Result<()> {
        let procs = procfs::processes();
        let mut watched: HashSet<u32> = probes.watched().into_iter().map(|(pid, _)| pid).collect();
        let by_cgroup = !selector.cgroups().is_empty();
        for p in &procs {
            let selected = selector.matches_name(&p.comm, p.exe_basename.as_deref())
                || (by_cgroup
                    && procfs::cgroup(p.pid).is_some_and(|c| selector.matches_cgroup(&c)));
            if selected && watched.insert(p.pid) {
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
        for p in procs.iter().filter(|p| watched.contains(&p.pid)) {
            self.known.insert(
                p.pid,
                Known {
                    name: p.comm.clone(),
                    parent: names.get(&p.ppid).map(|name| (p.ppid, name.to_string())),
                    container: self.containers.of(p.pid),
                    ns_pid: p.ns_pid,
                },
            );
        }
        Ok(())
    }
}

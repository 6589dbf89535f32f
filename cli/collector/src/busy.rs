//! Each report's busy numbers: the kernel's per-server counts read into
//! the model's tracker, each server's numbers put on the row of the role
//! whose processes accepted its connections, with its configured limit.

use std::collections::HashMap;

use anyhow::Result;

use stackprobe_model::{
    busy::{BusyRow, BusyTracker, LimitRow, Reading},
    measure::{Count, Latency},
    process::ProcessTable,
    report::{Report, ReportKind},
};
use stackprobe_probes::{Probes, limits, procfs};

pub struct Busy {
    tracker: BusyTracker,
    /// Each server's limit, read once.
    limits: HashMap<u32, Option<LimitRow>>,
}

/// CLOCK_MONOTONIC in ns: the clock the probes stamp with.
pub fn probes_clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Busy {
    /// Counting from `start_ns`, when the probes loaded.
    pub fn new(start_ns: u64) -> Self {
        Self {
            tracker: BusyTracker::new(start_ns),
            limits: HashMap::new(),
        }
    }

    /// Reads the kernel's counts as of `at` (the probes' clock at the
    /// report's end) and puts each server's on its role's row.
    pub fn fill(
        &mut self,
        probes: &mut Probes,
        table: &ProcessTable,
        at: u64,
        report: &mut Report,
    ) -> Result<()> {
        let reads: Vec<Reading> = probes
            .take_busy()?
            .into_iter()
            .map(|(server, b, max)| Reading {
                server,
                open: b.open,
                held_ns: b.held_ns(at),
                max,
            })
            .collect();
        // A server that exited holding nothing is read for the last time:
        // its numbers stay in the tracker, its key leaves the kernel's table.
        for r in &reads {
            if r.open == 0 && procfs::read(r.server).is_none() {
                probes.forget_server(r.server)?;
            }
        }
        self.tracker.observe(at, reads);
        let mut servers: Vec<u32> = self.tracker.servers().collect();
        servers.sort_unstable();
        for server in servers {
            let held = match report.kind {
                ReportKind::Interval => self.tracker.interval(server),
                ReportKind::Summary => self.tracker.since_start(server),
            };
            let (Some(held), Some((role, processes))) = (held, acceptors(table, server)) else {
                continue;
            };
            let Some(row) = report.roles.iter_mut().find(|r| r.role == role) else {
                continue;
            };
            let limit = self
                .limits
                .entry(server)
                .or_insert_with(|| {
                    limits::limit_of(server).map(|l| LimitRow {
                        setting: l.setting,
                        value: l.value,
                        source: l.source.display().to_string(),
                    })
                })
                .clone();
            match &mut row.busy {
                Some(busy) => busy.add(held, processes),
                None => {
                    row.busy = Some(BusyRow {
                        mean: held.mean,
                        max: held.max,
                        now: held.now,
                        processes,
                        limit,
                    })
                }
            }
        }
        Ok(())
    }
}

/// The role whose processes accept for `server`, and how many processes
/// serve: its live children's (a master's workers) if it has any, else its
/// own (a server that accepts itself, with threads or forked children).
fn acceptors(table: &ProcessTable, server: u32) -> Option<(String, usize)> {
    let children: Vec<_> = table
        .iter()
        .filter(|p| p.watched && p.parent.as_ref().is_some_and(|(ppid, _)| *ppid == server))
        .collect();
    // A server the table does not hold (not watched: the parent of a
    // watched process is no master of it) has nobody to speak for.
    let me = table.get(server)?;
    // A master whose children accept: the children's role (the workers').
    // Accepts of threads blocked in accept() at attach are untimed.
    if let Some(worker) = children.iter().find(|p| {
        !p.activity.latency[Latency::Accept].total.is_empty()
            || p.activity.counts[Count::AcceptUntimed].total > 0
    }) {
        return Some((worker.role(), children.len()));
    }
    Some((me.role(), children.len().max(1)))
}

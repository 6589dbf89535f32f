//! The process table: what was measured for each watched process, for the
//! current interval and since the start.

use std::collections::BTreeMap;

use super::histogram::LatencyHistogram;

/// One latency metric of one process.
#[derive(Clone, Debug, Default)]
pub struct Metric {
    pub interval: LatencyHistogram,
    pub total: LatencyHistogram,
}

impl Metric {
    pub fn record(&mut self, ns: u64) {
        self.interval.record(ns);
        self.total.record(ns);
    }
}

#[derive(Clone, Debug)]
pub struct Process {
    pub pid: u32,
    pub name: String,
    /// In the kernel's watch set as of the last sync; exited processes keep
    /// their totals.
    pub watched: bool,
    pub accept: Metric,
}

impl Process {
    fn new(pid: u32, name: String) -> Self {
        Self {
            pid,
            name,
            watched: true,
            accept: Metric::default(),
        }
    }
}

/// A successful accept, as the accept probe reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptSample {
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub conn_fd: i32,
    pub latency_ns: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessTable {
    procs: BTreeMap<u32, Process>,
}

impl ProcessTable {
    pub fn record_accept(&mut self, sample: &AcceptSample) {
        let proc = self
            .procs
            .entry(sample.tgid)
            .or_insert_with(|| Process::new(sample.tgid, sample.comm.clone()));
        proc.watched = true;
        proc.accept.record(sample.latency_ns);
    }

    /// Mirrors the kernel's watch set: `live` lists every watched process now.
    pub fn sync_watched(&mut self, live: &[(u32, String)]) {
        for proc in self.procs.values_mut() {
            proc.watched = false;
        }
        for (pid, name) in live {
            let proc = self
                .procs
                .entry(*pid)
                .or_insert_with(|| Process::new(*pid, name.clone()));
            proc.watched = true;
            proc.name.clone_from(name);
        }
    }

    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.procs.get(&pid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.procs.values()
    }

    pub fn watched_count(&self) -> usize {
        self.procs.values().filter(|p| p.watched).count()
    }

    /// Starts a new interval: the interval histograms empty, the totals stay.
    pub fn reset_interval(&mut self) {
        for proc in self.procs.values_mut() {
            proc.accept.interval.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(tgid: u32, ns: u64) -> AcceptSample {
        AcceptSample {
            tgid,
            tid: tgid,
            comm: format!("srv{tgid}"),
            conn_fd: 4,
            latency_ns: ns,
        }
    }

    #[test]
    fn accepts_land_in_their_process() {
        let mut t = ProcessTable::default();
        t.record_accept(&accept(10, 100));
        t.record_accept(&accept(10, 300));
        t.record_accept(&accept(11, 50));
        assert_eq!(t.get(10).unwrap().accept.total.count(), 2);
        assert_eq!(t.get(11).unwrap().accept.total.count(), 1);
        assert_eq!(t.get(10).unwrap().name, "srv10");
    }

    #[test]
    fn interval_resets_but_totals_stay() {
        let mut t = ProcessTable::default();
        t.record_accept(&accept(10, 100));
        t.reset_interval();
        t.record_accept(&accept(10, 200));
        let p = t.get(10).unwrap();
        assert_eq!(p.accept.interval.count(), 1);
        assert_eq!(p.accept.total.count(), 2);
    }

    #[test]
    fn sync_marks_exited_processes_unwatched() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[(1, "a".into()), (2, "b".into())]);
        assert_eq!(t.watched_count(), 2);
        t.record_accept(&accept(2, 10));
        t.sync_watched(&[(1, "a".into())]);
        assert_eq!(t.watched_count(), 1);
        assert!(!t.get(2).unwrap().watched);
        assert_eq!(t.get(2).unwrap().accept.total.count(), 1);
    }
}

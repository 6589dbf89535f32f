//! Test fixtures: model states built from what the probes would hand over —
//! ring buffer events, and reads of the kernel's latency histograms.

use probes_common::hist::{HistKey, HistValue};

use super::{
    event::{Event, ExitSample, HistMetric, SpawnSample, TaskKind},
    process::{LiveProcess, ProcessTable},
};
use crate::kernel_hist::HistReads;

/// A live process with no parent known.
pub fn live(pid: u32, name: &str) -> LiveProcess {
    LiveProcess {
        pid,
        name: name.into(),
        title: None,
        parent: None,
        container: None,
        ns_pid: None,
    }
}

/// What the first read of process `tgid`'s (named `comm`) histogram of
/// `metric` hands over once the kernel has recorded `samples` in it: the
/// kernel's bucketing and userspace's reading, as in a run.
pub fn kernel_hist(tgid: u32, comm: &str, metric: HistMetric, samples: &[u64]) -> Event {
    kernel_hist_from(tgid, comm, metric, None, samples)
}

/// [`kernel_hist`], of accepts from the listener named `listener`.
pub fn kernel_hist_from(
    tgid: u32,
    comm: &str,
    metric: HistMetric,
    listener: Option<&str>,
    samples: &[u64],
) -> Event {
    let mut cpu = HistValue::ZERO;
    for &ns in samples {
        cpu.record(ns);
    }
    let key = HistKey {
        tgid,
        metric: metric as u32,
        path: 0,
    };
    let mut delta = HistReads::default()
        .read(key, [&cpu], false, || Some(comm.into()))
        .expect("a histogram with samples gained them");
    delta.path = listener.map(str::to_string);
    Event::Hist(delta)
}

/// `parent` (named `comm`) accepts `latencies.len()` connections and forks a
/// child (pids from 100) for each, each fork taking `fork_ns`; the first
/// `exits` children exit `lifetime_ns` after their birth at time 0. The
/// accepts and forks arrive as the kernel's histograms are read: once, after
/// the children's births.
pub fn fork_per_connection(
    t: &mut ProcessTable,
    parent: u32,
    comm: &str,
    latencies: &[u64],
    fork_ns: u64,
    exits: usize,
    lifetime_ns: u64,
) {
    for i in 0..latencies.len() {
        t.apply(&Event::Spawn(SpawnSample {
            parent_tgid: parent,
            child: 100 + i as u32,
            kind: TaskKind::Process,
            ts_ns: 0,
            comm: comm.into(),
        }));
    }
    if !latencies.is_empty() {
        let forks = vec![fork_ns; latencies.len()];
        t.apply(&kernel_hist(parent, comm, HistMetric::Accept, latencies));
        t.apply(&kernel_hist(parent, comm, HistMetric::Fork, &forks));
    }
    for i in 0..exits.min(latencies.len()) {
        t.apply(&Event::Exit(ExitSample {
            tgid: 100 + i as u32,
            ts_ns: lifetime_ns,
        }));
    }
}

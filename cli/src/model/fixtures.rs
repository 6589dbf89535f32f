//! Test fixtures: model states built from the events the probes would send.

use super::{
    event::{AcceptSample, Event, ExitSample, ForkSample, SpawnSample, TaskKind},
    process::{LiveProcess, ProcessTable},
};

/// A live process with no parent known.
pub fn live(pid: u32, name: &str) -> LiveProcess {
    LiveProcess {
        pid,
        name: name.into(),
        title: None,
        parent: None,
    }
}

/// `parent` (named `comm`) accepts `latencies.len()` connections and forks a
/// child (pids from 100) for each, each fork taking `fork_ns`; the first
/// `exits` children exit `lifetime_ns` after their birth at time 0.
pub fn fork_per_connection(
    t: &mut ProcessTable,
    parent: u32,
    comm: &str,
    latencies: &[u64],
    fork_ns: u64,
    exits: usize,
    lifetime_ns: u64,
) {
    for (i, &ns) in latencies.iter().enumerate() {
        let child = 100 + i as u32;
        t.apply(&Event::Accept(AcceptSample {
            tgid: parent,
            tid: parent,
            comm: comm.into(),
            conn_fd: 5,
            latency_ns: ns,
            queue_wait_ns: None,
        }));
        t.apply(&Event::Spawn(SpawnSample {
            parent_tgid: parent,
            child,
            kind: TaskKind::Process,
            ts_ns: 0,
            comm: comm.into(),
        }));
        t.apply(&Event::Fork(ForkSample {
            tgid: parent,
            tid: parent,
            comm: comm.into(),
            ret: child as i32,
            kind: TaskKind::Process,
            latency_ns: fork_ns,
        }));
    }
    for i in 0..exits.min(latencies.len()) {
        t.apply(&Event::Exit(ExitSample {
            tgid: 100 + i as u32,
            ts_ns: lifetime_ns,
        }));
    }
}

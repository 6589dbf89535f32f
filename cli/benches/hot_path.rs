//! What userspace does each interval, since accept and fork samples stay in
//! the kernel's histograms: merge what every histogram gained (and the few
//! lifecycle events the ring carries) into the process table, then build the
//! interval's report and render it; and read the watch set. Run:
//! `cargo bench -p stackprobe --bench hot_path`.
//!
//! The map and /proc reads around the merge need root and a loaded probe;
//! what is measured is everything userspace computes on their results.

use stackprobe_model::measure::Latency;
use std::{
    collections::HashMap,
    hint::black_box,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use probes_common::{
    TASK_COMM_LEN,
    event::EventKind,
    fork::FORK_FLAGS,
    hist::{HistKey, HistMetric, HistValue},
    lifecycle::{ExitEvent, SpawnEvent},
};
use stackprobe_model::{
    event::Event,
    insights,
    kernel_hist::HistReads,
    probe_stats::Drops,
    process::{LiveProcess, ProcessTable},
    report::{Report, ReportKind},
};
use stackprobe_output::view;
use stackprobe_probes::decode;

/// The kernel keeps a value per CPU; this machine has two.
const CPUS: usize = 2;

/// A deterministic spread of latencies (xorshift), so every run measures the
/// same histogram shape.
struct Latencies(u64);

impl Latencies {
    /// Roughly log-uniform between 1 µs and 8 ms, as accept and fork
    /// latencies are on a busy machine.
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let shift = self.0 % 14;
        1_000 + ((self.0 >> 8) & ((1 << (10 + shift)) - 1))
    }
}

/// The kernel's histograms, per CPU, as a read of the map finds them.
#[derive(Clone, Default)]
struct KernelMap(HashMap<HistKey, Vec<HistValue>>);

impl KernelMap {
    /// Records `n` samples of `metric` for `tgid`, spread over the CPUs, as
    /// the probes do.
    fn record(&mut self, tgid: u32, metric: HistMetric, n: usize, lat: &mut Latencies) {
        let key = HistKey {
            tgid,
            metric: metric as u32,
            path: 0,
        };
        let cpus = self
            .0
            .entry(key)
            .or_insert_with(|| vec![HistValue::ZERO; CPUS]);
        for i in 0..n {
            cpus[i % CPUS].record(lat.next());
        }
    }

    /// What `Collector::drain` does with one read of the map, but for the
    /// processes' names (the table knows them from /proc).
    fn merge_into(&self, hists: &mut HistReads, table: &mut ProcessTable) {
        for (&key, cpus) in &self.0 {
            if let Some(delta) = hists.read(key, cpus, false, || None) {
                table.apply(&Event::Hist(delta));
            }
        }
    }
}

fn live(pid: u32, name: &str, title: Option<&str>, parent: Option<u32>) -> LiveProcess {
    LiveProcess {
        pid,
        name: name.into(),
        title: title.map(Into::into),
        parent: parent.map(|p| (p, name.into())),
        container: None,
        ns_pid: None,
    }
}

fn comm(name: &str) -> [u8; TASK_COMM_LEN] {
    let mut c = [0; TASK_COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

/// Appends a record as the kernel lays it out in the ring buffer. Only for
/// the probes' event structs, which have no implicit padding (uninitialised
/// bytes must not be read).
fn push_record<T: Copy>(ring: &mut Vec<Vec<u8>>, event: &T) {
    // SAFETY: T is one of probes_common's padding-free #[repr(C)] events.
    let bytes =
        unsafe { std::slice::from_raw_parts((event as *const T).cast::<u8>(), size_of::<T>()) };
    ring.push(bytes.to_vec());
}

/// docs/lab.md's scenario, one second of it: a postmaster that accepts and
/// forks a backend per connection, next to pooled php-fpm workers that only
/// accept (over a unix socket: no accept-queue wait).
mod lab {
    use super::*;

    pub const POSTMASTER: u32 = 100;
    const PHP_MASTER: u32 = 200;
    const FIRST_WORKER: u32 = 10_000;
    const WORKERS: u32 = 300;
    /// Backends take pids from here; each lives within the interval.
    const FIRST_BACKEND: u32 = 1_000;
    /// Per interval: the lab's static page runs at ~14k requests/s.
    const CONNECTIONS: usize = 200;
    const WORKER_ACCEPTS: usize = 40;

    /// What the first /proc scan finds: the postmaster and php-fpm's master
    /// and pool.
    pub fn table() -> ProcessTable {
        let mut procs = vec![
            live(POSTMASTER, "postgres", None, None),
            live(PHP_MASTER, "php-fpm8.2", None, None),
        ];
        procs.extend((FIRST_WORKER..FIRST_WORKER + WORKERS).map(|pid| {
            live(
                pid,
                "php-fpm8.2",
                Some("php-fpm: pool www"),
                Some(PHP_MASTER),
            )
        }));
        let mut table = ProcessTable::default();
        table.sync_watched(&procs);
        table
    }

    /// One interval more of samples in the kernel's histograms.
    pub fn interval(map: &mut KernelMap, lat: &mut Latencies) {
        for tgid in FIRST_WORKER..FIRST_WORKER + WORKERS {
            map.record(tgid, HistMetric::Accept, WORKER_ACCEPTS, lat);
        }
        for metric in [
            HistMetric::Accept,
            HistMetric::AcceptQueue,
            HistMetric::Fork,
        ] {
            map.record(POSTMASTER, metric, CONNECTIONS, lat);
        }
    }

    /// The interval's ring records: each backend's spawn and exit.
    pub fn ring() -> Vec<Vec<u8>> {
        let mut ring = Vec::new();
        for i in 0..CONNECTIONS as u32 {
            let ts_ns = 1_000_000_000 + u64::from(i) * 5_000_000;
            let child = FIRST_BACKEND + i;
            let spawn = SpawnEvent {
                kind: EventKind::Spawn as u32,
                parent_tgid: POSTMASTER,
                parent_tid: POSTMASTER,
                child,
                flags: FORK_FLAGS,
                flags_known: 1,
                _pad: 0,
                ts_ns,
                comm: comm("postgres"),
            };
            push_record(&mut ring, &spawn);
            let exit = ExitEvent {
                kind: EventKind::Exit as u32,
                tgid: child,
                ts_ns: ts_ns + 3_000_000,
            };
            push_record(&mut ring, &exit);
        }
        ring
    }

    pub fn histograms() -> usize {
        WORKERS as usize + 3
    }
}

/// One interval's drain, from the state the interval before left: the
/// ring's records, then what the kernel's histograms gained.
fn drain(c: &mut Criterion) {
    let mut lat = Latencies(0x9e37_79b9_7f4a_7c15);
    let mut map = KernelMap::default();
    lab::interval(&mut map, &mut lat);
    let mut table = lab::table();
    let mut hists = HistReads::default();
    // The interval before: every histogram already read once, and the
    // table's histograms allocated, as in the steady state of a run.
    map.merge_into(&mut hists, &mut table);
    table.reset_interval();
    lab::interval(&mut map, &mut lat);
    let ring = lab::ring();

    let mut group = c.benchmark_group("drain/lab");
    group.throughput(Throughput::Elements(lab::histograms() as u64));
    group.bench_function("ring_and_histograms", |b| {
        b.iter_batched_ref(
            || (hists.clone(), table.clone()),
            |(hists, table)| {
                for bytes in &ring {
                    if let Some(event) = decode::decode(black_box(bytes)) {
                        table.apply(&event);
                    }
                }
                map.merge_into(hists, table);
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();

    let (mut hists, mut table) = (hists, table);
    map.merge_into(&mut hists, &mut table);
    let postmaster = table.get(lab::POSTMASTER).expect("the postmaster");
    assert_eq!(
        postmaster.activity.latency[Latency::Fork].interval.count(),
        200
    );
    assert_eq!(
        postmaster.activity.latency[Latency::Fork].total.count(),
        400
    );
}

/// Families of forking servers: a master and its workers make two roles.
const FAMILIES: [&str; 5] = ["nginx", "php-fpm8.2", "postgres", "gunicorn", "node"];
const PER_FAMILY: u32 = 200;
const SAMPLES: usize = 200;

/// `FAMILIES.len() * 2` roles and `FAMILIES.len() * PER_FAMILY` live
/// processes: every worker has accepted `SAMPLES` connections this interval
/// (TCP ones with their accept-queue wait), and every master but php-fpm's
/// (a static pool, as in the lab) has forked `SAMPLES` short-lived children.
fn busy_table() -> ProcessTable {
    let mut table = ProcessTable::default();
    let mut hists = HistReads::default();
    let mut map = KernelMap::default();
    let mut lat = Latencies(0x2545_f491_4f6c_dd1d);
    let mut live_procs = Vec::new();
    for (f, name) in FAMILIES.iter().enumerate() {
        let master = 1 + f as u32 * PER_FAMILY;
        live_procs.push(live(master, name, None, None));
        let title = (*name == "php-fpm8.2").then_some("php-fpm: pool www");
        live_procs.extend(
            (master + 1..master + PER_FAMILY).map(|pid| live(pid, name, title, Some(master))),
        );
    }
    table.sync_watched(&live_procs);
    let mut child = 100_000;
    for round in 0..2 {
        for (f, name) in FAMILIES.iter().enumerate() {
            let master = 1 + f as u32 * PER_FAMILY;
            let unix = *name == "php-fpm8.2";
            for pid in master + 1..master + PER_FAMILY {
                map.record(pid, HistMetric::Accept, SAMPLES, &mut lat);
                if !unix {
                    map.record(pid, HistMetric::AcceptQueue, SAMPLES, &mut lat);
                }
            }
            // Untitled php-fpm children would fold into a role of their own.
            if unix {
                continue;
            }
            map.record(master, HistMetric::Fork, SAMPLES, &mut lat);
            for i in 0..SAMPLES {
                child += 1;
                let ts_ns = i as u64 * 1_000_000;
                let spawn = SpawnEvent {
                    kind: EventKind::Spawn as u32,
                    parent_tgid: master,
                    parent_tid: master,
                    child,
                    flags: FORK_FLAGS,
                    flags_known: 1,
                    _pad: 0,
                    ts_ns,
                    comm: comm(name),
                };
                let exit = ExitEvent {
                    kind: EventKind::Exit as u32,
                    tgid: child,
                    ts_ns: ts_ns + lat.next(),
                };
                let mut ring = Vec::new();
                push_record(&mut ring, &spawn);
                push_record(&mut ring, &exit);
                for bytes in &ring {
                    table.apply(&decode::decode(bytes).expect("a valid record"));
                }
            }
        }
        map.merge_into(&mut hists, &mut table);
        // The first round is an earlier interval: totals differ from the
        // interval's numbers, as they do after the first second of a run.
        if round == 0 {
            table.reset_interval();
        }
    }
    table
}

/// What the collector makes of the table each interval: the report (with
/// its insights), rendered.
fn report(c: &mut Criterion) {
    let table = busy_table();
    let build = || {
        let mut report = Report::build(
            ReportKind::Interval,
            &table,
            Duration::from_secs(1),
            Duration::from_secs(60),
            Drops::default(),
        );
        insights::annotate(&mut report);
        report
    };
    let report = build();
    assert_eq!(report.roles.len(), 2 * FAMILIES.len());
    assert_eq!(table.len(), FAMILIES.len() * PER_FAMILY as usize);
    let mut group = c.benchmark_group(format!(
        "interval/{}_roles_{}_processes",
        report.roles.len(),
        table.len()
    ));
    // A build takes tens of milliseconds: criterion's fewest samples, of one
    // size each, keep the run within a short measurement time.
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    group.bench_function("build", |b| b.iter(|| black_box(build())));
    group.bench_function("json", |b| {
        b.iter(|| black_box(view::json::render(black_box(&report))));
    });
    group.bench_function("text", |b| {
        b.iter(|| black_box(view::text::render(black_box(&report))));
    });
    group.finish();
}

/// The watch set is read each interval, and is as long as pid_max: 4M
/// bytes where systemd sets it, with a few watched pids scattered through.
fn watch_set(c: &mut Criterion) {
    const PID_MAX: usize = 1 << 22;
    let words: Vec<AtomicU64> = (0..PID_MAX / 8).map(|_| AtomicU64::new(0)).collect();
    let watched: Vec<u32> = (0..20).map(|i| 300 + i * 209_711).collect();
    for &pid in &watched {
        words[pid as usize / 8].fetch_or(1 << (8 * (pid % 8)), Ordering::Relaxed);
    }
    let found = stackprobe_probes::watch::set_bytes(&words);
    assert_eq!(
        found.iter().map(|&(pid, _)| pid).collect::<Vec<_>>(),
        watched
    );
    let mut group = c.benchmark_group("watch_set");
    group.throughput(Throughput::Bytes(PID_MAX as u64));
    group.bench_function("pid_max_4194304", |b| {
        b.iter(|| black_box(stackprobe_probes::watch::set_bytes(black_box(&words))));
    });
    group.finish();
}

criterion_group!(benches, drain, report, watch_set);
criterion_main!(benches);

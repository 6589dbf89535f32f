//! The userspace hot path: what each ring-buffer record costs (decode, then
//! the process table), and what each interval costs (building the report and
//! rendering it). Run: `cargo bench -p stackprobe --bench hot_path`.
//!
//! The scenario is docs/lab.md's: a postmaster that accepts and forks a
//! backend per connection, next to pooled workers that only accept.

use std::{hint::black_box, time::Duration};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use probes_common::{
    TASK_COMM_LEN,
    accept::{AcceptEvent, QUEUE_WAIT_UNKNOWN},
    event::EventKind,
    fork::{FORK_FLAGS, ForkEvent},
    lifecycle::{ExitEvent, SpawnEvent},
};
use stackprobe::{
    model::{
        event::{AcceptSample, Event, ExitSample, ForkSample, SpawnSample, TaskKind},
        probe_stats::Drops,
        process::{LiveProcess, ProcessTable},
        report::{Report, ReportKind},
    },
    probes::decode,
    view,
};

const POSTMASTER: u32 = 100;
/// Backends take pids from here; up to `BACKENDS_ALIVE` live at once.
const FIRST_BACKEND: u32 = 1_000;
const BACKENDS_ALIVE: u32 = 8;
const FIRST_WORKER: u32 = 10_000;
const WORKERS: u32 = 300;
/// Records per measured batch: one drain's worth (every 50 ms) at 20k events/s.
const BATCH: usize = 1_024;

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

fn comm(name: &str) -> [u8; TASK_COMM_LEN] {
    let mut c = [0; TASK_COMM_LEN];
    c[..name.len()].copy_from_slice(name.as_bytes());
    c
}

/// Appends a record as the kernel lays it out in the ring buffer. Only for the
/// probes' event structs, which have no implicit padding (uninitialised bytes
/// must not be read).
fn push_record<T: Copy>(ring: &mut Vec<u8>, offsets: &mut Vec<(usize, usize)>, event: &T) {
    // SAFETY: T is one of probes_common's padding-free #[repr(C)] events.
    let bytes =
        unsafe { std::slice::from_raw_parts((event as *const T).cast::<u8>(), size_of::<T>()) };
    offsets.push((ring.len(), bytes.len()));
    ring.extend_from_slice(bytes);
    // The ring buffer keeps records 8-byte aligned.
    ring.resize(ring.len().next_multiple_of(8), 0);
}

/// `BATCH` records: per connection to the postmaster, its accept, the spawn
/// and fork of its backend and, `BACKENDS_ALIVE` connections later, the
/// backend's exit; between them, accepts spread over the pooled workers. The
/// batch ends with every backend it spawned gone, so replaying it keeps the
/// table the same size.
struct Records {
    ring: Vec<u8>,
    offsets: Vec<(usize, usize)>,
}

impl Records {
    fn new() -> Self {
        let mut ring = Vec::new();
        let mut offsets = Vec::new();
        let mut lat = Latencies(0x9e37_79b9_7f4a_7c15);
        let (postgres, php) = (comm("postgres"), comm("php-fpm8.2"));
        let mut worker = 0;
        let mut ts = 1_000_000_000;
        let accept = |tgid, comm, queue_wait_ns, latency_ns| AcceptEvent {
            kind: EventKind::Accept as u32,
            tgid,
            tid: tgid,
            conn_fd: 9,
            start_ns: 0,
            latency_ns,
            queue_wait_ns,
            comm,
        };
        let exit = |tgid, ts_ns| ExitEvent {
            kind: EventKind::Exit as u32,
            tgid,
            ts_ns,
        };
        let mut connection = 0u32;
        // Leave room for the trailing exits.
        while offsets.len() + BACKENDS_ALIVE as usize + 7 <= BATCH {
            for _ in 0..3 {
                let tgid = FIRST_WORKER + worker % WORKERS;
                worker += 1;
                // Pooled over a unix socket: no accept-queue wait.
                let e = accept(tgid, php, QUEUE_WAIT_UNKNOWN, lat.next());
                push_record(&mut ring, &mut offsets, &e);
            }
            ts += 250_000;
            let e = accept(POSTMASTER, postgres, lat.next(), lat.next());
            push_record(&mut ring, &mut offsets, &e);
            let child = FIRST_BACKEND + connection % (2 * BACKENDS_ALIVE);
            let spawn = SpawnEvent {
                kind: EventKind::Spawn as u32,
                parent_tgid: POSTMASTER,
                parent_tid: POSTMASTER,
                child,
                flags: FORK_FLAGS,
                flags_known: 1,
                _pad: 0,
                ts_ns: ts,
                comm: postgres,
            };
            push_record(&mut ring, &mut offsets, &spawn);
            let fork = ForkEvent {
                kind: EventKind::Fork as u32,
                tgid: POSTMASTER,
                tid: POSTMASTER,
                ret: child as i32,
                flags: FORK_FLAGS,
                flags_known: 1,
                _pad: 0,
                latency_ns: lat.next(),
                comm: postgres,
            };
            push_record(&mut ring, &mut offsets, &fork);
            if connection >= BACKENDS_ALIVE {
                let old = FIRST_BACKEND + (connection - BACKENDS_ALIVE) % (2 * BACKENDS_ALIVE);
                push_record(&mut ring, &mut offsets, &exit(old, ts));
            }
            connection += 1;
        }
        for c in connection.saturating_sub(BACKENDS_ALIVE)..connection {
            ts += 1_000_000;
            let old = FIRST_BACKEND + c % (2 * BACKENDS_ALIVE);
            push_record(&mut ring, &mut offsets, &exit(old, ts));
        }
        Self { ring, offsets }
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.offsets
            .iter()
            .map(|&(start, len)| &self.ring[start..start + len])
    }

    fn len(&self) -> usize {
        self.offsets.len()
    }
}

fn live(pid: u32, name: &str, title: Option<&str>, parent: Option<u32>) -> LiveProcess {
    LiveProcess {
        pid,
        name: name.into(),
        title: title.map(Into::into),
        parent: parent.map(|p| (p, name.into())),
    }
}

/// What the first /proc scan finds for the lab: the postmaster and php-fpm's
/// master and pool.
fn lab_table() -> ProcessTable {
    const PHP_MASTER: u32 = 200;
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

fn per_event(c: &mut Criterion) {
    let records = Records::new();
    let mut group = c.benchmark_group("per_event");
    group.throughput(Throughput::Elements(records.len() as u64));
    group.bench_function("decode", |b| {
        b.iter(|| {
            for bytes in records.iter() {
                black_box(decode::decode(black_box(bytes)));
            }
        });
    });
    let mut table = lab_table();
    // A first pass allocates every histogram the batch touches (once per
    // process in a real run), so the measurement sees the steady state.
    for bytes in records.iter() {
        table.apply(&decode::decode(bytes).expect("valid record"));
    }
    group.bench_function("decode_and_record", |b| {
        b.iter(|| {
            for bytes in records.iter() {
                if let Some(event) = decode::decode(black_box(bytes)) {
                    table.apply(&event);
                }
            }
        });
    });
    group.finish();
    assert_eq!(table.len(), 2 + WORKERS as usize, "the batch is steady");
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
                for _ in 0..SAMPLES {
                    table.apply(&Event::Accept(AcceptSample {
                        tgid: pid,
                        tid: pid,
                        comm: (*name).into(),
                        conn_fd: 9,
                        latency_ns: lat.next(),
                        queue_wait_ns: (!unix).then(|| lat.next()),
                    }));
                }
            }
            // Untitled php-fpm children would fold into a role of their own.
            let forks = if unix { 0 } else { SAMPLES };
            for i in 0..forks {
                child += 1;
                let ts_ns = i as u64 * 1_000_000;
                table.apply(&Event::Spawn(SpawnSample {
                    parent_tgid: master,
                    child,
                    kind: TaskKind::Process,
                    ts_ns,
                    comm: (*name).into(),
                }));
                table.apply(&Event::Fork(ForkSample {
                    tgid: master,
                    tid: master,
                    comm: (*name).into(),
                    ret: child as i32,
                    kind: TaskKind::Process,
                    latency_ns: lat.next(),
                }));
                table.apply(&Event::Exit(ExitSample {
                    tgid: child,
                    ts_ns: ts_ns + lat.next(),
                }));
            }
        }
        // The first round is an earlier interval: totals differ from the
        // interval's numbers, as they do after the first second of a run.
        if round == 0 {
            table.reset_interval();
        }
    }
    table
}

fn per_interval(c: &mut Criterion) {
    let table = busy_table();
    let build = || {
        Report::build(
            ReportKind::Interval,
            &table,
            Duration::from_secs(1),
            Duration::from_secs(60),
            Drops::default(),
        )
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

criterion_group!(benches, per_event, per_interval);
criterion_main!(benches);

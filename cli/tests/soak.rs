//! Soak: a loopback server churning processes, threads, execs and
//! connections for a bounded time (STACKPROBE_SOAK_SECONDS, default 60)
//! under `stackprobe watch --json`, with `kernel.pid_max` lowered so pids
//! are reused many times over. stackprobe's memory and kernel map entries
//! must stay bounded, no exited pid may be reported as live, and its totals
//! must equal the load. The same churn runs under `stackprobe agent`, read
//! from its metrics as Prometheus would.

mod support;

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData, PerCpuHashMap, loaded_maps};
use serde_json::Value;
use support::*;

/// Lowers `kernel.pid_max` for the soak and restores it when dropped (also
/// when the test panics).
struct PidMax(String);

const PID_MAX: &str = "/proc/sys/kernel/pid_max";

impl PidMax {
    fn lower_to(max: u32) -> Self {
        let old = std::fs::read_to_string(PID_MAX).unwrap();
        std::fs::write(PID_MAX, max.to_string()).unwrap();
        Self(old)
    }
}

impl Drop for PidMax {
    fn drop(&mut self) {
        std::fs::write(PID_MAX, self.0.trim()).unwrap();
    }
}

/// Slots of the tracked-socket array a socket holds (its address in
/// them), read through a mapping of the array: one lookup syscall per
/// slot would take a tenth of a second per look, time the churn loses.
fn held_slots(data: &MapData) -> usize {
    use probes_common::sock::{TRACKED_SLOT_COUNT, TrackedSlot};
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let len = TRACKED_SLOT_COUNT as usize * size_of::<TrackedSlot>();
    // SAFETY: a read-only shared mapping of a BPF_F_MMAPABLE array's fd
    // at offset 0, no longer than the array (a whole number of pages).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            data.fd().as_fd().as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "mapping TRACKED_SLOTS");
    // SAFETY: the mapping holds TRACKED_SLOT_COUNT slots, page-aligned; the
    // kernel may write them meanwhile, and a torn read only miscounts one.
    let slots = unsafe {
        std::slice::from_raw_parts(ptr.cast::<TrackedSlot>(), TRACKED_SLOT_COUNT as usize)
    };
    let held = slots
        .iter()
        // SAFETY: an aligned u64 of the mapping, read whole.
        .filter(|s| unsafe { std::ptr::read_volatile(&s.sk) } != 0)
        .count();
    // SAFETY: unmapping exactly what was mapped above.
    unsafe { libc::munmap(ptr, len) };
    held
}

/// Entries now in each of stackprobe's hash maps (whose size does not
/// follow pid_max), by name.
fn map_entries() -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for info in loaded_maps().filter_map(Result::ok) {
        let name = info.name_as_str().unwrap_or("").to_string();
        let Ok(data) = MapData::from_id(info.id()) else {
            continue;
        };
        let n = match name.as_str() {
            "TRACKED_SLOTS" => Ok(held_slots(&data)),
            "TRACKED" => {
                HashMap::<_, u64, probes_common::sock::TrackedSocket>::try_from(Map::HashMap(data))
                    .map(|m| m.keys().count())
            }
            "LISTEN_OWNERS" => {
                HashMap::<_, u64, probes_common::sock::ListenOwner>::try_from(Map::HashMap(data))
                    .map(|m| m.keys().count())
            }
            "HISTS" | "HISTS_SPARE" => PerCpuHashMap::<
                _,
                probes_common::hist::HistKey,
                probes_common::hist::HistValue,
            >::try_from(Map::PerCpuHashMap(data))
            .map(|m| m.keys().count()),
            _ => continue,
        };
        out.push((name, n.unwrap()));
    }
    out.sort();
    out
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn sum(summary: &Value, metric: &str, field: &str) -> u64 {
    summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[metric][field].as_u64().unwrap_or(0))
        .sum()
}

/// What a soak's churn did, and what it saw of stackprobe meanwhile.
struct Churned {
    seconds: u64,
    rounds: u64,
    connections: u64,
    threads: u64,
    execs: u64,
    rss_half: u64,
    rss_peak: u64,
    rss_end: u64,
    entries_peak: Vec<(String, usize)>,
    entries_end: Vec<(String, usize)>,
}

impl Churned {
    fn forks(&self) -> u64 {
        self.connections + self.execs
    }

    /// What every soak asserts of itself and of stackprobe's memory and
    /// maps.
    fn check_bounded(&self, pid_max: u32) {
        // More tasks than pids: every pid was handed out again and again.
        assert!(
            self.forks() + self.threads > 2 * u64::from(pid_max),
            "{} processes and {} threads did not wrap pid_max {pid_max} twice",
            self.forks(),
            self.threads
        );
        // Sockets leave the maps when they close: after the churn, only
        // what is still open (the listener, the last TIME_WAIT closes)
        // remains.
        assert_eq!(self.entries_end.len(), 5, "{:?}", self.entries_end);
        for (name, n) in &self.entries_end {
            assert!(*n <= 64, "{name} still holds {n} entries after the churn");
        }
        // The process table holds live processes only: tens of thousands of
        // exits later, memory is where it was halfway, but for a step: 2 of
        // 4 CI runs on 2026-12-06 grew ~2.8 MB in one piece (28040 -> 30868
        // and 28392 -> 31260 KiB, peak = end; flat locally), not located
        // yet; likely a role's histograms allocated late, as an earlier step
        // was (docs/testing.md#soak), larger since the run-queue and
        // request-path latencies joined every role. A leak of 60 bytes a
        // process still shows over the ~70000 processes of the second half.
        assert!(
            self.rss_end <= self.rss_half + 4 * 1024,
            "RSS grew from {} KiB halfway to {} KiB",
            self.rss_half,
            self.rss_end
        );
    }
}

/// `STACKPROBE_SOAK_SECONDS`, default 60.
fn soak_seconds() -> u64 {
    std::env::var("STACKPROBE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// A server for `seconds` of churn (and a minute's margin).
fn churning_server(seconds: u64) -> Server {
    let max_seconds = (seconds + 60).to_string();
    Server::start_args(
        std::path::Path::new(LOOPBACK),
        &["--tcp", "127.0.0.1:0", "--max-seconds", &max_seconds],
        None,
    )
}

/// Churns `server` for `seconds`, sampling stackprobe (`tracer`)'s RSS and
/// the kernel maps each round.
fn churn(server: &mut Server, seconds: u64, tracer: u32) -> Churned {
    let (mut connections, mut threads, mut execs, mut rounds) = (0u64, 0u64, 0u64, 0u64);
    let started = Instant::now();
    // RSS halfway through: by then the histograms are allocated and the
    // TIME_WAIT sockets (which the link table mirrors) have reached their
    // steady number, so the second half must not grow.
    let mut rss_half = None;
    let mut rss_peak = 0;
    let mut entries_peak: Vec<(String, usize)> = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        // A child per connection (connection churn and pid churn), threads,
        // and children that exec.
        server.send("serve-fork 200 tcp 0");
        let client = Command::new(LOOPBACK)
            .args(["connect", "tcp", &server.tcp, "200"])
            .output()
            .unwrap();
        assert!(client.status.success(), "{client:?}");
        assert_eq!(server.line(), "served 200");
        server.run("threads 500", "threads 500");
        server.run("spawn-exec 50", "execs 50");
        connections += 200;
        threads += 500;
        execs += 50;
        rounds += 1;
        let rss = rss_kib(tracer);
        if rss_half.is_none() && started.elapsed() >= Duration::from_secs(seconds) / 2 {
            rss_half = Some(rss);
        }
        rss_peak = rss_peak.max(rss);
        let entries = map_entries();
        if entries_peak.is_empty() {
            entries_peak = entries;
        } else {
            for ((_, peak), (_, now)) in entries_peak.iter_mut().zip(entries) {
                *peak = (*peak).max(now);
            }
        }
    }
    let rss_end = rss_kib(tracer);
    thread::sleep(Duration::from_millis(1500));
    Churned {
        seconds,
        rounds,
        connections,
        threads,
        execs,
        rss_half: rss_half.unwrap_or(rss_end),
        rss_peak,
        rss_end,
        entries_peak,
        entries_end: map_entries(),
    }
}

/// Set before stackprobe starts: it sizes the watch set from pid_max.
const LOWERED_PID_MAX: u32 = 16_384;

#[test]
fn a_long_churning_run_stays_bounded_and_counts_exactly() {
    let _lock = probe_lock();
    require_root();
    let seconds = soak_seconds();
    let _pid_max = PidMax::lower_to(LOWERED_PID_MAX);
    let mut server = churning_server(seconds);
    let mut sp = Command::new(STACKPROBE)
        .args([
            "watch",
            "--pid",
            &server.pid.to_string(),
            "--json",
            "--no-tui",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(sp.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("probes attached") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "stackprobe ended");
    }
    let stdout = sp.stdout.take().unwrap();
    let reader = thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let c = churn(&mut server, seconds, sp.id());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(sp.id() as i32, libc::SIGINT) };
    assert!(sp.wait().unwrap().success());
    let lines = reader.join().unwrap();
    let summary: Value = serde_json::from_str(
        lines
            .iter()
            .rev()
            .find(|l| l.contains("\"type\":\"summary\""))
            .unwrap(),
    )
    .unwrap();
    eprintln!(
        "soak: {} s, {} rounds: {} connections, {} processes, {} threads, {} execs; {} events, \
         drops {}; stackprobe RSS halfway {} KiB, peak {} KiB, end {} KiB; counted accepts {}, \
         forks {}, threads {}, child exits {}, children's execs {}; map entries between rounds \
         at most {:?}, at the end {:?}",
        c.seconds,
        c.rounds,
        c.connections,
        c.forks(),
        c.threads,
        c.execs,
        summary["events"]["total"],
        summary["drops"],
        c.rss_half,
        c.rss_peak,
        c.rss_end,
        sum(&summary, "accept", "total"),
        sum(&summary, "fork", "total"),
        sum(&summary, "thread", "total"),
        sum(&summary, "child_lifetime", "total"),
        sum(&summary, "children_exec", "total"),
        c.entries_peak,
        c.entries_end,
    );
    assert_eq!(summary["drops"], 0, "{}", summary["drops_by_cause"]);
    c.check_bounded(LOWERED_PID_MAX);
    assert_eq!(sum(&summary, "accept", "total"), c.connections);
    assert_eq!(sum(&summary, "fork", "total"), c.forks());
    assert_eq!(sum(&summary, "thread", "total"), c.threads);
    assert_eq!(
        sum(&summary, "child_lifetime", "total"),
        c.forks(),
        "every child's exit"
    );
    assert_eq!(sum(&summary, "children_exec", "total"), c.execs);
    // Only the server itself is alive; every pid the summary shows must be.
    let live: Vec<u64> = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["pids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        live,
        vec![u64::from(server.pid)],
        "stale pids reported live"
    );
    assert_eq!(summary["watched"], 1);
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

/// The sum of the samples of `name` (any labels) in OpenMetrics text whose
/// labels contain `with`.
fn metric_sum(body: &str, name: &str, with: &str) -> f64 {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']) && rest.contains(with))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The same churn under the agent, as a service runs it: its memory as
/// flat, its maps as bounded, and what it serves Prometheus as exact.
#[test]
fn the_agent_under_the_same_churn_stays_bounded_and_serves_exact_counts() {
    let _lock = probe_lock();
    require_root();
    let seconds = soak_seconds();
    let _pid_max = PidMax::lower_to(LOWERED_PID_MAX);
    let mut server = churning_server(seconds);
    let mut agent = Running::start(&[
        "agent",
        "--pid",
        &server.pid.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "1s",
    ]);
    agent.wait_stderr("probes attached");
    let addr = agent.metrics_addr();
    let c = churn(&mut server, seconds, agent.child.id());
    // Its next snapshot holds everything churned.
    let count = |body: &str, metric: &str| {
        metric_sum(
            body,
            "stackprobe_latency_seconds_count",
            &format!("metric=\"{metric}\""),
        ) as u64
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = http_get(&addr, "/metrics").1;
        if count(&body, "child_lifetime") == c.forks() || Instant::now() > deadline {
            break body;
        }
        thread::sleep(Duration::from_millis(200));
    };
    eprintln!(
        "agent soak: {} s, {} rounds: {} connections, {} processes, {} threads; agent RSS halfway \
         {} KiB, peak {} KiB, end {} KiB; map entries at most {:?}, at the end {:?}",
        c.seconds,
        c.rounds,
        c.connections,
        c.forks(),
        c.threads,
        c.rss_half,
        c.rss_peak,
        c.rss_end,
        c.entries_peak,
        c.entries_end
    );
    c.check_bounded(LOWERED_PID_MAX);
    assert_eq!(count(&body, "accept"), c.connections, "{body}");
    assert_eq!(count(&body, "fork"), c.forks());
    assert_eq!(count(&body, "thread"), c.threads);
    assert_eq!(count(&body, "child_lifetime"), c.forks());
    assert_eq!(
        metric_sum(&body, "stackprobe_dropped_events_total", ""),
        0.0
    );
    // Only the server lives.
    assert_eq!(metric_sum(&body, "stackprobe_processes", ""), 1.0, "{body}");
    agent.signal(libc::SIGTERM);
    let (status, _, stderr) = agent.finish();
    assert!(status.success(), "{stderr}");
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

//! Soak: a loopback server churning processes, threads, execs and
//! connections for a bounded time (STACKPROBE_SOAK_SECONDS, default 60)
//! under `stackprobe watch --json`, with `kernel.pid_max` lowered so pids
//! are reused many times over. stackprobe's memory and kernel map entries
//! must stay bounded, no exited pid may be reported as live, and its totals
//! must equal the load.

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
            "TRACKED" => {
                HashMap::<_, u64, probes_common::sock::TrackedSocket>::try_from(Map::HashMap(data))
                    .map(|m| m.keys().count())
            }
            "LISTEN_OWNERS" => {
                HashMap::<_, u64, probes_common::sock::ListenOwner>::try_from(Map::HashMap(data))
                    .map(|m| m.keys().count())
            }
            "HISTS" | "HISTS_SPARE" => {
                PerCpuHashMap::<_, u64, probes_common::hist::HistValue>::try_from(
                    Map::PerCpuHashMap(data),
                )
                .map(|m| m.keys().count())
            }
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

#[test]
fn a_long_churning_run_stays_bounded_and_counts_exactly() {
    let _lock = probe_lock();
    require_root();
    let seconds: u64 = std::env::var("STACKPROBE_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let max_seconds = (seconds + 60).to_string();
    // Set before stackprobe starts: it sizes the watch set from pid_max.
    let pid_max = 16_384;
    let _pid_max = PidMax::lower_to(pid_max);
    let mut server = Server::start_args(
        std::path::Path::new(LOOPBACK),
        &["--tcp", "127.0.0.1:0", "--max-seconds", &max_seconds],
        None,
    );
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
        let rss = rss_kib(sp.id());
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
    let rss_end = rss_kib(sp.id());
    let rss_half = rss_half.unwrap_or(rss_end);
    thread::sleep(Duration::from_millis(1500));
    let entries_end = map_entries();
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
    let forks = connections + execs;
    eprintln!(
        "soak: {seconds} s, {rounds} rounds: {connections} connections, {forks} processes, \
         {threads} threads, {execs} execs; {} events, drops {}; stackprobe RSS halfway {rss_half} KiB, \
         peak {rss_peak} KiB, end {rss_end} KiB; counted accepts {}, forks {}, threads {}, \
         child exits {}, children's execs {}; map entries between rounds at most {entries_peak:?}, at the end \
         {entries_end:?}",
        summary["events"]["total"],
        summary["drops"],
        sum(&summary, "accept", "total"),
        sum(&summary, "fork", "total"),
        sum(&summary, "thread", "total"),
        sum(&summary, "child_lifetime", "total"),
        sum(&summary, "children_exec", "total"),
    );
    assert_eq!(summary["drops"], 0, "{}", summary["drops_by_cause"]);
    // More tasks than pids: every pid was handed out again and again.
    assert!(
        forks + threads > 2 * u64::from(pid_max),
        "{forks} processes and {threads} threads did not wrap pid_max {pid_max} twice"
    );
    // Sockets leave the maps when they close: after the churn, only what
    // is still open (the listener, the last TIME_WAIT closes) remains.
    assert_eq!(entries_end.len(), 4, "{entries_end:?}");
    for (name, n) in &entries_end {
        assert!(*n <= 64, "{name} still holds {n} entries after the churn");
    }
    assert_eq!(sum(&summary, "accept", "total"), connections);
    assert_eq!(sum(&summary, "fork", "total"), forks);
    assert_eq!(sum(&summary, "thread", "total"), threads);
    assert_eq!(
        sum(&summary, "child_lifetime", "total"),
        forks,
        "every child's exit"
    );
    assert_eq!(sum(&summary, "children_exec", "total"), execs);
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
    // The process table holds live processes only: tens of thousands of exits
    // later, memory is where it was halfway.
    assert!(
        rss_end <= rss_half + 2 * 1024,
        "RSS grew from {rss_half} KiB halfway to {rss_end} KiB"
    );
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

//! Root only: `stackprobe demo` end to end. The probes must see exactly the
//! connections the demo's load generator completed, one fork per connection
//! on the forking server and none on the pooled one, and nothing of the demo
//! may outlive it.

mod support;

use std::{
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;

const DEMO_NAMES: [&str; 2] = ["demo-forking", "demo-pooled"];

/// `demo: N connections to demo-forking, M to demo-pooled` → (N, M).
fn totals(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("demo: ")?.strip_suffix(" to demo-pooled"))
        .unwrap_or_else(|| panic!("no totals line in:\n{stderr}"));
    let (forking, pooled) = line
        .split_once(" connections to demo-forking, ")
        .unwrap_or_else(|| panic!("unexpected totals line: {line}"));
    (forking.parse().unwrap(), pooled.parse().unwrap())
}

fn role<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == name)
}

/// Processes named like a demo server in the process group of one of `pids`
/// (each server leads its own; its children stay in it).
fn demo_processes(pids: &[u64]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        // After the comm: state, ppid, pgrp.
        let pgrp: u64 = stat[close + 1..]
            .split_whitespace()
            .nth(2)
            .and_then(|g| g.parse().ok())
            .unwrap_or(0);
        if DEMO_NAMES.contains(&comm) && pids.contains(&pgrp) {
            found.push(stat.trim_end().to_string());
        }
    }
    found
}

/// Killed processes take a moment to be reaped by whoever inherits them.
fn assert_none_left(pids: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = demo_processes(pids);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "demo processes left running:\n{}",
            left.join("\n")
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_probes_count_exactly_the_connections_of_the_demos_load() {
    let _lock = probe_lock();
    require_root();
    let out = Command::new(STACKPROBE)
        .args([
            "demo",
            "--duration",
            "4s",
            "--no-tui",
            "--json",
            "--rate",
            "100",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {}; stderr:\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("warning"), "{stderr}");
    let (to_forking, to_pooled) = totals(&stderr);
    // 100/s for the 3s before the last interval: 300 planned each.
    assert!(
        to_forking >= 150 && to_pooled >= 150,
        "the load fell far behind:\n{stderr}"
    );

    let reports: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let (summary, intervals) = reports.split_last().expect("at least the summary");
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["drops"], 0);

    let master = role(summary, "demo-forking master")
        .unwrap_or_else(|| panic!("no demo-forking master in {summary}"));
    assert_eq!(master["accept"]["total"], to_forking, "{master}");
    assert_eq!(master["fork"]["total"], to_forking, "{master}");
    assert_eq!(master["forks_per_accept"], 1.0);
    assert_eq!(master["thread"]["total"], 0);
    // Every child served its connection and exited before the summary.
    assert_eq!(master["child_lifetime"]["total"], to_forking);
    assert_eq!(master["children_alive"], 0);
    let accepted_by_forking: u64 = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["role"].as_str().unwrap().starts_with("demo-forking"))
        .map(|r| r["accept"]["total"].as_u64().unwrap())
        .sum();
    assert_eq!(accepted_by_forking, to_forking, "only the master accepts");
    let workers = role(summary, "demo-forking worker")
        .unwrap_or_else(|| panic!("no demo-forking worker in {summary}"));
    assert_eq!(workers["processes"], 0, "every worker exited");

    let pooled =
        role(summary, "demo-pooled").unwrap_or_else(|| panic!("no demo-pooled in {summary}"));
    assert_eq!(pooled["accept"]["total"], to_pooled, "{pooled}");
    assert_eq!(pooled["fork"]["total"], 0);
    assert_eq!(
        pooled["thread"]["total"], 0,
        "its threads predate the probes"
    );
    assert_eq!(pooled["forks_per_accept"], 0.0);

    // The insight says what the forking server costs, and nothing about the
    // pooled one.
    let said: Vec<&str> = summary["insights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert!(
        said.iter()
            .any(|i| i
                .starts_with("demo-forking master forks 1.00 processes per accepted connection")),
        "{said:?}"
    );
    assert!(!said.iter().any(|i| i.contains("demo-pooled")), "{said:?}");
    let firing = intervals
        .iter()
        .filter(|r| {
            r["insights"]
                .to_string()
                .contains("demo-forking master forks")
        })
        .count();
    assert!(firing >= 2, "{intervals:?}");

    let pids: Vec<u64> = [master, pooled]
        .iter()
        .map(|r| r["pids"][0].as_u64().unwrap())
        .collect();
    assert_none_left(&pids);
    assert!(
        programs_left_loaded().is_empty(),
        "programs left loaded after exit"
    );
}

/// The newcomer's view: on a terminal, the dashboard shows both servers and
/// says what the forking one costs, then the demo ends by itself.
#[test]
fn on_a_terminal_the_dashboard_shows_both_servers_and_the_fork_insight() {
    let _lock = probe_lock();
    require_root();
    let session = format!("stackprobe-demo-test-{}", std::process::id());
    let command = format!("{STACKPROBE} demo --duration 5s; echo EXIT=$?; sleep 30");
    let _kill = TmuxSession::start(&session, 120, 32, &command);
    let screen = wait_screen(&session, "both servers and the insight", |s| {
        s.contains("demo-pooled")
            && s.contains("demo-forking master")
            && s.contains("demo-forking master forks ")
            && s.contains("processes per accepted")
    });
    assert!(screen.contains("q quit"), "not the dashboard:\n{screen}");
    let after = wait_screen(&session, "the demo's end", |s| s.contains("EXIT="));
    assert!(after.contains("EXIT=0"), "{after}");
    assert!(
        after.contains(" connections to demo-forking, "),
        "no totals after the dashboard:\n{after}"
    );
    assert!(programs_left_loaded().is_empty());
}

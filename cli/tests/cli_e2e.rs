//! Root only: runs the `stackprobe` binary itself against loopback servers
//! and checks what it prints, how it exits, and that it leaves nothing loaded.

mod support;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Output},
    thread,
    time::Duration,
};

use std::os::unix::process::ExitStatusExt as _;

use stackprobe_probes::rungs::ForkRung;
use support::*;

#[test]
fn json_mode_counts_a_servers_accepts_and_ctrl_c_leaves_nothing_loaded() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("e2e-json");
    let mut server = Server::start(Some(&dir.0.join("s.sock")));
    let pid = server.pid.to_string();
    let mut sp = Running::start(&["watch", "--pid", &pid, "--json", "--interval", "200ms"]);
    sp.wait_stderr("probes attached");
    assert!(!loaded_stackprobe_programs().is_empty());

    server.accept_queued(12, false, "accept4");
    server.accept_queued(6, true, "accept");
    // Let at least one interval report pass, then Ctrl-C.
    thread::sleep(Duration::from_millis(500));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    let reports = json_lines(&stdout);
    let (summary, intervals) = reports.split_last().expect("at least the summary");
    assert_eq!(summary["type"], "summary");
    assert!(!intervals.is_empty() && intervals.iter().all(|r| r["type"] == "interval"));
    let total: u64 = intervals
        .iter()
        .filter_map(|r| row(r, server.pid))
        .map(|p| p["count"].as_u64().unwrap())
        .sum();
    let s = row(summary, server.pid).expect("the server in the summary");
    assert_eq!(s["count"], 18);
    assert_eq!(s["total"], 18);
    assert_eq!(s["metric"], "accept_latency");
    assert_eq!(s["process"], "stackprobe-loop", "comm is cut to 15 bytes");
    // This host refuses fentry and has no kprobes: the bottom rungs serve.
    let hooks: Vec<(&str, &str)> = summary["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["metric"].as_str().unwrap(), h["hook"].as_str().unwrap()))
        .collect();
    // State changes come from the BTF tracepoint, which this host has; the
    // unix queue and service take their default, cheapest rungs, and the
    // run queue is not measured unless asked for.
    assert_eq!(
        hooks,
        [
            ("fork", "tracepoint"),
            ("accept_queue", "fd-walk"),
            ("unix_queue", "syscalls"),
            ("service", "tcp-only"),
            ("run_queue", "off"),
            ("tcp_state", "tp_btf")
        ]
    );
    assert!(total <= 18, "intervals counted {total}");
    assert_eq!(summary["drops"], 0);
    let (min, p50, p99, max) = (
        s["min_ns"].as_u64().unwrap(),
        s["p50_ns"].as_u64().unwrap(),
        s["p99_ns"].as_u64().unwrap(),
        s["max_ns"].as_u64().unwrap(),
    );
    assert!(0 < min && min <= p50 && p50 <= p99 && p99 <= max, "{s}");
    let bucket_sum: u64 = s["log2_buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(bucket_sum, 18);

    assert!(
        programs_left_loaded().is_empty(),
        "programs left loaded after exit"
    );
    server.stop();
}

#[test]
fn text_mode_prints_intervals_and_a_summary_and_stops_after_duration() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid;
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid.to_string(),
        "--duration",
        "1500ms",
        "--interval",
        "500ms",
    ]);
    sp.wait_stderr("probes attached");
    server.accept_queued(9, false, "accept4");
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("stackprobe-loop[{pid}]")),
        "{stderr}"
    );

    let summary = stdout
        .split("=== summary")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary in:\n{stdout}"));
    assert!(
        summary.contains(&format!("stackprobe-loop[{pid}]  accepts 9 (")),
        "{summary}"
    );
    assert!(summary.contains("total 9"), "{summary}");
    assert!(summary.contains("accept latency  min "), "{summary}");
    assert!(summary.contains(" |@"), "log2 bars expected:\n{summary}");
    assert!(stdout.matches("=== interval").count() >= 2, "{stdout}");
    assert!(stdout.contains("drops 0"), "{stdout}");
    assert!(programs_left_loaded().is_empty());
    server.stop();
}

/// A server accepting on a TCP port and on a unix socket: each listener's
/// accepts counted apart, exactly, in JSON and text.
#[test]
fn accepts_are_counted_per_listener_tcp_and_unix_apart() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("listeners");
    let path = dir.0.join("srv.sock");
    let mut server = Server::start(Some(&path));
    let sp = Running::watch_json(server.pid, "300ms");
    server.accept_queued(5, false, "accept4");
    server.accept_queued(3, true, "accept");
    server.accept_queued(2, false, "accept");
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let role = &summary["roles"][0];
    let listeners: Vec<(&str, u64)> = role["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["listener"].as_str().unwrap(),
                l["accept"]["total"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listeners,
        [(server.tcp.as_str(), 7), (path.to_str().unwrap(), 3)],
        "{role}"
    );
    assert_eq!(role["accept"]["total"], 10);
    // Each listener's queue wait is its own connections'.
    assert_eq!(role["listeners"][0]["accept_queue"]["total"], 7, "{role}");
    assert_eq!(role["listeners"][1]["accept_queue"]["total"], 3, "{role}");
    // Both backlogs as the kernel lists them (all accepted: none waiting):
    // the TCP listener's from the walk, the unix one's from sock_diag.
    for l in role["listeners"].as_array().unwrap() {
        assert_eq!(l["backlog"], 0, "{role}");
        assert!(l["max_backlog"].as_u64().unwrap() > 0, "{role}");
    }
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

#[test]
fn waits_for_a_named_process_that_starts_later_and_sigterm_ends_cleanly() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("e2e-wait");
    let name = format!("spwait{}x", std::process::id() % 10_000);
    let program = dir.loopback_as(&name);
    let mut sp = Running::start(&["watch", &name, "--json", "--interval", "200ms"]);
    sp.wait_stderr("waiting for it");

    let mut server = Server::start_as(&program, None);
    server.accept_queued(4, false, "accept4");
    sp.wait_stderr("now watching");
    sp.signal(libc::SIGTERM);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let reports = json_lines(&stdout);
    let summary = reports.last().unwrap();
    let s = row(summary, server.pid).unwrap_or_else(|| panic!("{summary}"));
    assert_eq!(s["count"], 4);
    assert_eq!(s["process"], name.as_str());
    assert!(programs_left_loaded().is_empty());
    server.stop();
}

/// Runs stackprobe as nobody, with no capabilities.
fn as_nobody(args: &[&str]) -> Output {
    run(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(STACKPROBE)
        .args(args))
}

#[test]
fn no_btf_and_missing_privileges_get_a_message_and_a_non_zero_exit() {
    let _lock = probe_lock();
    require_root();
    // The rest of the bad inputs: tests/bad_input.rs.
    assert_fails(
        &run(Command::new(STACKPROBE)
            .args(["watch", "x"])
            .env("STACKPROBE_BTF", "/nonexistent/vmlinux")),
        1,
        "this kernel exposes no BTF",
    );
    // Not root: drop to nobody with no capabilities.
    let out = as_nobody(&["watch", "x"]);
    assert_fails(&out, 1, "needs root (missing CAP_BPF and CAP_PERFMON)");
    assert!(programs_left_loaded().is_empty());
}

#[test]
fn after_sigkill_the_kernel_frees_every_probe_and_a_closed_stdout_ends_cleanly() {
    let _lock = probe_lock();
    require_root();
    let mut sp = Running::start(&["watch", "--pid", "1", "--no-tui", "--json"]);
    sp.wait_stderr("probes attached");
    // This host has neither fentry nor kprobes: the fork tracepoints serve.
    assert_eq!(
        loaded_stackprobe_programs().len(),
        PROGRAM_NAMES.len()
            + fork_program_names(ForkRung::Tracepoint).len()
            + state_extra_loaded()
            + unix_queue_extra_loaded()
            + unix_service_extra_loaded()
    );
    sp.signal(libc::SIGKILL);
    let (status, _, _) = sp.finish();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // Nothing is pinned: the kernel frees the programs with the last fd.
    assert!(
        programs_left_loaded().is_empty(),
        "programs outlived SIGKILL"
    );

    // `stackprobe watch … | head -1`: the reader goes away after one line.
    let mut sp = Running::start(&["watch", "--pid", "1", "--no-tui", "--interval", "100ms"]);
    sp.wait_stderr("probes attached");
    let mut first = String::new();
    BufReader::new(sp.child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("=== interval"), "{first}");
    // The pipe is closed now (its only reader dropped); the next report ends the run.
    let status = sp.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(programs_left_loaded().is_empty());
}

#[test]
fn doctor_tries_every_hook_and_names_what_fails_in_watchs_words() {
    let _lock = probe_lock();
    require_root();
    let out = run(Command::new(STACKPROBE).arg("doctor"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for check in ["privileges", "BTF", "tracefs and tracepoints", "iter/tcp"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok ") && l.contains(check)),
            "{check} not ok:\n{stdout}"
        );
    }
    // The optional hooks are tried, whatever this kernel says of them.
    for hook in ["tp_btf:", "fentry:", "kprobe:"] {
        assert!(
            stdout
                .lines()
                .any(|l| (l.starts_with("ok ") || l.starts_with("note")) && l.contains(hook)),
            "{hook} not tried:\n{stdout}"
        );
    }
    // Each fork rung is tried; this host has only the tracepoints, and says so.
    for rung in ForkRung::LADDER {
        let tried = format!("fork hook {}:", rung.describe());
        assert!(stdout.contains(&tried), "{tried} not tried:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!(
            "  fork latency       {}",
            ForkRung::Tracepoint.describe()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("hooks watch uses on this kernel:"));
    assert!(programs_left_loaded().is_empty());

    let out = as_nobody(&["doctor"]);
    assert_fails(&out, 1, "fix the FAIL lines above");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "FAIL  stackprobe loads kernel probes and needs root (missing CAP_BPF and CAP_PERFMON)"
        ),
        "{stdout}"
    );
}

#[test]
fn a_fork_per_connection_server_shows_as_master_with_one_fork_per_accept() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid;
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid.to_string(),
        "--json",
        "--interval",
        "300ms",
    ]);
    sp.wait_stderr("probes attached");
    server.send("serve-fork 10 tcp 20");
    for _ in 0..10 {
        tcp_connect_and_read(&server.tcp);
    }
    assert_eq!(server.line(), "served 10");
    thread::sleep(Duration::from_millis(400));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    let summary = json_lines(&stdout).pop().unwrap();
    let roles = summary["roles"].as_array().unwrap();
    let master = roles
        .iter()
        .find(|r| r["role"] == "stackprobe-loop master")
        .unwrap_or_else(|| panic!("no master role in {summary}"));
    assert_eq!(master["pids"], serde_json::json!([pid]));
    assert_eq!(master["accept"]["count"], 10);
    assert_eq!(master["fork"]["count"], 10);
    assert_eq!(master["forks_per_accept"], 1.0);
    assert_eq!(master["thread"]["count"], 0);
    assert_eq!(master["children_alive"], 0);
    assert_eq!(master["child_lifetime"]["count"], 10);
    assert!(master["child_lifetime"]["min_ns"].as_u64().unwrap() >= 20_000_000);
    let workers = roles
        .iter()
        .find(|r| r["role"] == "stackprobe-loop worker")
        .unwrap_or_else(|| panic!("no worker role in {summary}"));
    assert_eq!(workers["processes"], 0, "every worker exited");
    let row = row(&summary, pid).unwrap();
    assert_eq!(row["forks"], 10);
    assert_eq!(row["role"], "stackprobe-loop master");
    assert_eq!(summary["drops"], 0);
    server.stop();
}

#[test]
fn json_mode_reports_the_servers_time_wait_sockets_and_listener() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid;
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid.to_string(),
        "--json",
        "--interval",
        "300ms",
    ]);
    sp.wait_stderr("probes attached");
    // Let one snapshot find the listener before the traffic.
    thread::sleep(Duration::from_millis(400));
    server.accept_queued(12, false, "accept4");
    thread::sleep(Duration::from_millis(700));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    let summary = json_lines(&stdout).pop().unwrap();
    let tcp = &summary["tcp"];
    let link = format!("{} ← 127.0.0.1", server.tcp);
    let row = tcp["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["link"] == link.as_str() && l["owner"] == "stackprobe-loop")
        .unwrap_or_else(|| panic!("no link {link} in {tcp}"));
    assert_eq!(row["time_wait"], 12, "{row}");
    assert_eq!(row["side"], "passive");
    assert_eq!(row["opens"]["total"], 12);
    assert_eq!(row["closes"]["total"], 12);
    let listener = tcp["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"] == server.tcp.as_str())
        .unwrap_or_else(|| panic!("no listener in {tcp}"));
    assert_eq!(listener["pid"], pid);
    assert!(tcp["sockets"].as_u64().unwrap() >= 13);
    let master = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pids"] == serde_json::json!([pid]))
        .unwrap();
    assert_eq!(master["accept_queue"]["count"], 12);
    server.stop();
}

#[test]
fn the_dashboard_runs_in_a_real_terminal_reacts_to_keys_and_quits_cleanly() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let session = format!("stackprobe-test-{}", std::process::id());
    let command = format!(
        "{STACKPROBE} watch --pid {} --interval 3s; echo EXIT=$?; sleep 30",
        server.pid
    );
    let kill = TmuxSession::start(&session, 100, 30, &command);
    wait_screen(&session, "its header", |s| {
        s.contains("ROLE") && s.contains("q quit")
    });

    server.accept_queued(24, false, "accept4");
    let screen = wait_screen(&session, "the server's accepts", |s| {
        s.lines().any(|l| {
            l.starts_with("stackprobe-loop ")
                && l.split_whitespace().nth(2).is_some_and(|rate| rate != "0")
        })
    });
    assert!(screen.contains("drops 0"), "{screen}");
    // Enter: the detail of the selected (busiest) role shows the 24 accepts.
    tmux(&["send-keys", "-t", &session, "Enter"]);
    let detail = wait_screen(&session, "the detail view", |s| s.contains("forks/accept"));
    assert!(
        detail
            .lines()
            .any(|l| l.starts_with("accept ") && l.split_whitespace().nth(1) == Some("24")),
        "{detail}"
    );
    tmux(&["send-keys", "-t", &session, "Escape"]);
    tmux(&["send-keys", "-t", &session, "?"]);
    wait_screen(&session, "the help", |s| {
        s.contains("reset histograms and counters")
    });
    tmux(&["send-keys", "-t", &session, "Escape"]);
    // A 20×5 terminal: the dashboard keeps drawing what fits, and comes back
    // whole when the terminal grows again.
    tmux(&["resize-window", "-t", &session, "-x", "20", "-y", "5"]);
    thread::sleep(Duration::from_millis(1500));
    let tiny = tmux(&["capture-pane", "-p", "-t", &session]);
    assert!(
        !tiny.contains("EXIT=") && !tiny.contains("panicked"),
        "{tiny}"
    );
    assert!(tiny.lines().all(|l| l.chars().count() <= 20), "{tiny}");
    tmux(&["resize-window", "-t", &session, "-x", "100", "-y", "30"]);
    wait_screen(&session, "the header after growing again", |s| {
        s.contains("ROLE") && s.contains("q quit")
    });
    tmux(&["send-keys", "-t", &session, "q"]);
    // Quitting restores the normal screen (the alternate one is gone) and exits 0.
    let after = wait_screen(&session, "the exit", |s| s.contains("EXIT="));
    assert!(after.contains("EXIT=0"), "{after}");
    assert!(
        !after.contains("q quit"),
        "the dashboard was left on screen:\n{after}"
    );
    assert!(programs_left_loaded().is_empty());
    drop(kill);
    server.stop();
}

/// GET /metrics over loopback.
fn scrape(addr: &str) -> String {
    let (head, body) = http_get(addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    body
}

/// The value of the sample line `name{labels}` in OpenMetrics text.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_metrics_endpoint_serves_the_runs_histograms_as_openmetrics() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid.to_string();
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid,
        "--json",
        "--interval",
        "300ms",
        "--listen",
        "127.0.0.1:0",
    ]);
    sp.wait_stderr("probes attached");
    let addr = sp.metrics_addr();
    server.accept_queued(14, false, "accept4");
    thread::sleep(Duration::from_millis(700));
    let body = scrape(&addr);
    // OpenMetrics: typed families, one histogram per role and metric, # EOF.
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    assert!(
        body.contains("# TYPE stackprobe_latency_seconds histogram"),
        "{body}"
    );
    let labels = format!(
        r#"role="stackprobe-loop",container="",metric="accept",listener="{}"}}"#,
        server.tcp
    );
    let labels = labels.as_str();
    let count = format!("stackprobe_latency_seconds_count{{{labels}");
    assert_eq!(sample(&body, &count), Some(14.0), "{body}");
    let inf = format!("stackprobe_latency_seconds_bucket{{le=\"+Inf\",{labels}");
    assert_eq!(sample(&body, &inf), Some(14.0), "{body}");
    let buckets: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with("stackprobe_latency_seconds_bucket{le=") && l.contains(labels))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "buckets must be cumulative: {buckets:?}"
    );
    let sum = sample(&body, &format!("stackprobe_latency_seconds_sum{{{labels}")).unwrap();
    assert!(sum > 0.0 && sum < 14.0, "{sum}");
    assert_eq!(
        sample(
            &body,
            "stackprobe_processes{role=\"stackprobe-loop\",container=\"\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "stackprobe_dropped_events_total"),
        Some(0.0),
        "{body}"
    );
    // The server's link: the 14 connections it accepted, labelled by its
    // listening address (never the client's).
    let link = format!(
        r#"{{role="stackprobe-loop",container="",side="passive",link="{}"}}"#,
        server.tcp
    );
    assert_eq!(
        sample(&body, &format!("stackprobe_connections_opened_total{link}")),
        Some(14.0),
        "{body}"
    );
    // Its own cost.
    let cpu = sample(&body, "stackprobe_cpu_seconds_total").unwrap();
    assert!(cpu > 0.0 && cpu < 60.0, "{cpu}");
    let rss = sample(&body, "stackprobe_resident_memory_bytes").unwrap();
    assert!(rss > 1e6 && rss < 1e9, "{rss}");
    sp.signal(libc::SIGINT);
    let (status, _, stderr) = sp.finish();
    assert!(status.success(), "{stderr}");
    server.stop();
}

//! The real stack (`cargo xtask lab`) watched by `stackprobe watch nginx
//! php-fpm postgres`: the classic findings, each checked against wrk, and
//! against bpftrace and `ss` measuring the same run independently.
//!
//! Needs root (CI runs as root) and the stackprobe binary of the same build,
//! which `cargo test` on the workspace builds beside xtask's.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");
/// wrk's connections: requests in flight when it stops are served but not
/// counted by wrk, so server-side counts may exceed wrk's by this much.
const CONNECTIONS: u64 = 8;

fn stackprobe() -> PathBuf {
    let path = PathBuf::from(XTASK).with_file_name("stackprobe");
    assert!(
        path.exists(),
        "{} is missing: run the workspace's tests (cargo xtask test), which build it",
        path.display()
    );
    path
}

/// The lab for one test; taken down on drop, even when an assertion fails.
struct Lab;

impl Lab {
    fn up() -> Self {
        let out = Command::new(XTASK).args(["lab", "up"]).output().unwrap();
        assert!(
            out.status.success(),
            "lab up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Lab
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let out = Command::new(XTASK).args(["lab", "down"]).output().unwrap();
        assert!(
            out.status.success(),
            "lab down: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// wrk's totals for one bounded load.
struct Load {
    requests: u64,
    per_s: f64,
}

fn load(page: &str, keepalive: bool, seconds: u32) -> Load {
    let mut cmd = Command::new(XTASK);
    cmd.args([
        "lab",
        "load",
        "--page",
        page,
        "--seconds",
        &seconds.to_string(),
    ]);
    cmd.args(["--connections", &CONNECTIONS.to_string()]);
    if keepalive {
        cmd.arg("--keepalive");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lab load {page}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("lab load:"))
        .expect("summary line");
    eprintln!("{line}");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {line}"))
            .to_string()
    };
    Load {
        requests: field("requests").parse().unwrap(),
        per_s: field("per_s").parse().unwrap(),
    }
}

/// A background process whose stdout lines arrive on a channel.
struct Traced {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Traced {
    /// Starts `cmd` and waits for a line containing `ready` on stdout or
    /// stderr: the moment its probes are attached.
    fn start(mut cmd: Command, ready: &'static str) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let ready_out = ready_tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(ready) {
                    let _ = ready_out.send(());
                }
                let _ = tx.send(line);
            }
        });
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  | {line}");
                if line.contains(ready) {
                    let _ = ready_tx.send(());
                }
            }
        });
        if ready_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("{cmd:?} never said {ready:?}");
        }
        Traced { child, lines }
    }

    /// SIGINT, then every stdout line it printed until it exited: within
    /// 30 s, or 120 s once stackprobe's summary is out. After the summary
    /// it only detaches, and each tracepoint's detach waits out RCU grace
    /// periods, which a contended machine stretches (~75 ms each here).
    fn stop(mut self) -> Vec<String> {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let sent = Instant::now();
        let mut out = Vec::new();
        let (mut summarized, mut told) = (false, false);
        while self.child.try_wait().unwrap().is_none() {
            for line in self.lines.try_iter() {
                summarized |= is_summary(&line);
                out.push(line);
            }
            let limit = Duration::from_secs(if summarized { 120 } else { 30 });
            if sent.elapsed() > limit {
                // Where it is stuck says more than that it is.
                let stuck = where_stuck(self.child.id());
                let _ = self.child.kill();
                panic!("did not exit within {limit:?} of SIGINT; its threads:\n{stuck}");
            }
            if summarized && !told && sent.elapsed() > Duration::from_secs(30) {
                told = true;
                let stuck = where_stuck(self.child.id());
                eprintln!(
                    "  | summarized, still not exited 30 s after SIGINT; its threads:\n{stuck}"
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!("  | exited {:?} after SIGINT", sent.elapsed());
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            out.push(line);
        }
        out
    }
}

/// Each thread of `pid`: its name, state, syscall and kernel stack, as
/// /proc shows them.
fn where_stuck(pid: u32) -> String {
    let mut out = String::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let state = read("status")
            .lines()
            .filter(|l| l.starts_with("Name:") || l.starts_with("State:"))
            .collect::<Vec<_>>()
            .join(" ");
        out += &format!(
            "{:?}: {state}; syscall {}; stack:\n{}",
            task.file_name(),
            read("syscall").trim(),
            read("stack")
        );
    }
    out
}

fn watch() -> Traced {
    let mut cmd = Command::new(stackprobe());
    cmd.args([
        "watch", "nginx", "php-fpm", "postgres", "--no-tui", "--json",
    ]);
    Traced::start(cmd, "probes attached")
}

/// Whether `line` is stackprobe's JSON summary, its last report.
fn is_summary(line: &str) -> bool {
    line.contains("\"type\":\"summary\"")
}

fn summary(lines: &[String]) -> Value {
    let json = lines
        .iter()
        .rev()
        .find(|l| is_summary(l))
        .expect("stackprobe printed a summary");
    serde_json::from_str(json).unwrap()
}

/// The same postgres accepts and forks counted by bpftrace's one-liners.
fn bpftrace() -> Traced {
    // bpftrace needs tracefs, which stackprobe only mounts while it loads:
    // in a mount namespace of its own it gets one without touching the
    // host's mounts (the same pid, execed, gets SIGINT).
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "[ -d /sys/kernel/tracing/events ] || mount -t tracefs tracefs /sys/kernel/tracing; exec \"$@\"",
        "sh",
        "bpftrace",
        "-B",
        "line",
        "-e",
        r#"BEGIN { printf("ready\n"); }
tracepoint:syscalls:sys_exit_accept, tracepoint:syscalls:sys_exit_accept4
/comm == "postgres" && args->ret >= 0/ { @accepts = count(); }
tracepoint:sched:sched_process_fork /comm == "postgres"/ { @forks = count(); }
tracepoint:sock:inet_sock_set_state
/args->newstate == 11 && (args->sport == 18081 || args->dport == 18081)/ { @closing_18081 = count(); }
tracepoint:sock:inet_sock_set_state
/args->newstate == 11 && (args->sport == 15432 || args->dport == 15432)/ { @closing_15432 = count(); }"#,
    ]);
    Traced::start(cmd, "ready")
}

fn bpftrace_count(lines: &[String], map: &str) -> u64 {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("@{map}: ")))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Connections postgres accepted and processes it forked, over the run.
fn postgres_accepts_forks(s: &Value) -> (u64, u64) {
    (
        role_total(s, "postgres", "accept"),
        role_total(s, "postgres", "fork"),
    )
}

/// Postgres's accepts over its TCP listener and over its unix socket.
fn postgres_accepts_by_path(s: &Value) -> (u64, u64) {
    let (mut tcp, mut unix) = (0, 0);
    for r in roles(s, "postgres") {
        for l in r["listeners"].as_array().unwrap() {
            let n = l["accept"]["total"].as_u64().unwrap();
            match l["listener"].as_str().unwrap() {
                "127.0.0.1:15432" => tcp += n,
                path if path.ends_with("/.s.PGSQL.15432") => unix += n,
                other => panic!("postgres accepted from {other}: {r}"),
            }
        }
    }
    (tcp, unix)
}

/// php-fpm's connects to postgres over TCP and over its unix socket
/// (successful, and refused or failed).
fn php_connects_by_path(s: &Value) -> ((u64, u64), (u64, u64)) {
    let (mut tcp, mut unix) = ((0, 0), (0, 0));
    for r in roles(s, "php-fpm") {
        for c in r["connects"].as_array().unwrap() {
            let ok = c["connect"]["total"].as_u64().unwrap();
            let failed =
                c["refused"]["total"].as_u64().unwrap() + c["failed"]["total"].as_u64().unwrap();
            let sum = match c["destination"].as_str().unwrap() {
                "127.0.0.1:15432" => &mut tcp,
                path if path.ends_with("/.s.PGSQL.15432") => &mut unix,
                _ => continue,
            };
            sum.0 += ok;
            sum.1 += failed;
        }
    }
    (tcp, unix)
}

/// Sum of a metric's `total` over roles whose name starts with `prefix`.
fn role_total(s: &Value, prefix: &str, metric: &str) -> u64 {
    roles(s, prefix)
        .map(|r| r[metric]["total"].as_u64().unwrap())
        .sum()
}

fn roles<'a>(s: &'a Value, prefix: &'a str) -> impl Iterator<Item = &'a Value> {
    s["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |r| r["role"].as_str().unwrap().starts_with(prefix))
}

/// (TIME_WAIT now, new TIME_WAIT over the run) summed over the links whose
/// address names `port`.
fn time_wait(s: &Value, port: u16) -> (u64, u64) {
    let port = format!(":{port}");
    s["tcp"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["link"].as_str().unwrap().contains(&port))
        .fold((0, 0), |(now, new), l| {
            (
                now + l["time_wait"].as_u64().unwrap(),
                new + l["new_time_wait"]["total"].as_u64().unwrap(),
            )
        })
}

/// Passive connections belong to the role that accepted them: every
/// passive link with opens is owned by a role that accepted, never by an
/// nginx master (which holds the listening sockets and accepts nothing),
/// and the backend's accepted connections are its workers'.
fn assert_no_master_opens(s: &Value) {
    let links = s["tcp"]["links"].as_array().unwrap();
    let passive = |l: &&Value| l["side"] == "passive" && l["opens"]["total"].as_u64().unwrap() > 0;
    let accepted = |role: &str| {
        roles(s, role)
            .filter(|r| r["role"] == role)
            .map(|r| {
                r["accept"]["total"].as_u64().unwrap()
                    + r["accept_untimed"]["total"].as_u64().unwrap()
            })
            .sum::<u64>()
    };
    let wrong: Vec<&Value> = links
        .iter()
        .filter(passive)
        .filter(|l| {
            let owner = l["owner"].as_str().unwrap_or("");
            owner == "nginx master" || accepted(owner) == 0
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "passive opens owned by a role that accepted nothing: {wrong:?}"
    );
    assert!(
        links.iter().filter(passive).any(|l| {
            l["owner"] == "nginx worker" && l["link"].as_str().unwrap().contains(":18081")
        }),
        "nginx workers own the backend's accepted connections: {links:?}"
    );
}

/// TIME_WAIT sockets the kernel ended early for a new connection on the same
/// 4-tuple, machine-wide (TcpExt TWRecycled).
fn tw_recycled() -> u64 {
    let netstat = std::fs::read_to_string("/proc/net/netstat").unwrap();
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "TWRecycled")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

/// TIME_WAIT sockets with `port` at either end, as `ss` counts them.
fn ss_time_wait(port: u16) -> u64 {
    let out = Command::new("ss")
        .args(["-Htan", "state", "time-wait"])
        .arg(format!("( sport = :{port} or dport = :{port} )"))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).lines().count() as u64
}

fn within_1_percent(what: &str, ours: u64, theirs: u64) {
    within_1_percent_of_bracket(what, ours, [theirs, theirs]);
}

/// `ours` within 1 % of the range two independent counts, one taken before
/// and one after ours, span.
fn within_1_percent_of_bracket(what: &str, ours: u64, [before, after]: [u64; 2]) {
    let (lo, hi) = (before.min(after), before.max(after));
    let slack = hi.div_ceil(100);
    let theirs = if before == after {
        before.to_string()
    } else {
        format!("{before} before and {after} after")
    };
    assert!(
        (lo.saturating_sub(slack)..=hi + slack).contains(&ours),
        "{what}: stackprobe {ours}, independent {theirs}"
    );
}

/// Each process of the stack in one role of its kind, one row per role, and
/// no row without a live process or anything counted; links owned by those
/// roles only.
fn one_row_per_role(s: &Value) {
    let rows: Vec<&str> = s["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    let mut unique = rows.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), rows.len(), "a role twice: {rows:?}");
    for r in s["roles"].as_array().unwrap() {
        let metrics = ["accept", "accept_queue", "fork", "thread", "child_lifetime"];
        let counts = ["exited", "execs", "fork_unknown", "fork_failed"];
        let counted: u64 = metrics
            .iter()
            .chain(&counts)
            .map(|m| r[*m]["total"].as_u64().unwrap())
            .sum();
        assert!(
            r["processes"].as_u64().unwrap() > 0 || counted > 0,
            "an empty row: {r}"
        );
    }
    let expected = [
        "nginx master",
        "nginx worker",
        "postgres postmaster",
        "postgres backend",
        "php-fpm master",
        "php-fpm pool lab",
    ];
    for role in &rows {
        // php-fpm8.2 → php-fpm
        let kind: String = role
            .split(' ')
            .enumerate()
            .map(|(i, w)| {
                if i == 0 {
                    w.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.')
                } else {
                    w
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            expected.contains(&kind.as_str()),
            "role {role:?} in {rows:?}"
        );
    }
    for link in s["tcp"]["links"].as_array().unwrap() {
        if let Some(owner) = link["owner"].as_str() {
            assert!(
                rows.contains(&owner),
                "link {link} owned by a role without a row: {rows:?}"
            );
        }
    }
}

fn insights(s: &Value) -> Vec<String> {
    s["insights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_lab_shows_fork_per_connection_time_wait_and_their_fixes() {
    let before = stack_processes();
    let lab = Lab::up();
    let served = |l: &Load| (l.requests, l.requests + CONNECTIONS);

    // 0. The lab's three loads, 20 s each, under one watch: nothing the
    //    kernel skipped or the ring buffer lost, and the connections nginx
    //    workers accept are theirs, not their master's.
    let probe = watch();
    for (page, keepalive) in [("static", false), ("new", false), ("persistent", true)] {
        let run = load(page, keepalive, 20);
        eprintln!("{page}: {} requests ({}/s)", run.requests, run.per_s);
    }
    let s = summary(&probe.stop());
    let by_cause = &s["drops_by_cause"];
    // Nothing skipped, lost or out of room. The state probe's first copy is
    // skipped for a change that interrupts it on its CPU; its nested copy
    // handles those (tcp_state.rs), so none is left skipped either.
    let opens: u64 = s["tcp"]["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["opens"]["total"].as_u64().unwrap())
        .sum();
    eprintln!(
        "state changes skipped: {} for {opens} opens",
        by_cause["skipped"]["tcp_state"]
    );
    assert_eq!(s["drops"], 0, "drops at the lab's loads: {by_cause}");
    for cause in ["lost", "skipped"] {
        for (kind, n) in by_cause[cause].as_object().unwrap() {
            assert_eq!(n, 0, "{cause} {kind}: {by_cause}");
        }
    }
    assert_no_master_opens(&s);
    one_row_per_role(&s);

    // 1. A new TCP connection to postgres per request, through the frontend
    //    that opens a new upstream connection per request.
    let bpf = bpftrace();
    let probe = watch();
    let recycled_before = tw_recycled();
    let run = load("new", false, 3);
    // A connect() may take over a TIME_WAIT socket's 4-tuple on loopback
    // (tcp_tw_reuse): the kernel ends that TIME_WAIT early, and counts it.
    let recycled = tw_recycled() - recycled_before;
    // The static round's TIME_WAIT sockets expire about now, thousands a
    // second: the summary's walk is bracketed by an `ss` count before and
    // one after (the load has ended, so the count only falls between them).
    let ss_before = [ss_time_wait(18081), ss_time_wait(15432)];
    let s = summary(&probe.stop());
    let ss_backend = [ss_before[0], ss_time_wait(18081)];
    let ss_postgres = [ss_before[1], ss_time_wait(15432)];
    one_row_per_role(&s);
    let bpf = bpf.stop();
    let (accepts, forks) = postgres_accepts_forks(&s);
    eprintln!(
        "new connection per request: {} requests ({}/s); postgres accepts {accepts}, forks {forks}; \
         bpftrace: accepts {}, forks {}",
        run.requests,
        run.per_s,
        bpftrace_count(&bpf, "accepts"),
        bpftrace_count(&bpf, "forks")
    );
    let (lo, hi) = served(&run);
    assert!(
        run.requests > 100,
        "too little load to judge: {}",
        run.requests
    );
    assert!(
        (lo..=hi).contains(&accepts),
        "postgres accepts {accepts}, wrk requests {}",
        run.requests
    );
    within_1_percent("postgres forks vs accepts", forks, accepts);
    assert_eq!(
        postgres_accepts_by_path(&s),
        (accepts, 0),
        "every accept from the TCP listener"
    );
    let (tcp, unix) = php_connects_by_path(&s);
    eprintln!("  php-fpm → postgres connects: tcp {tcp:?}, unix {unix:?} (done, failed)");
    assert!(
        (lo..=hi).contains(&tcp.0) && tcp.1 == 0 && unix == (0, 0),
        "php-fpm connects over TCP {tcp:?}, over unix {unix:?}; wrk requests {}",
        run.requests
    );
    within_1_percent(
        "postgres accepts vs bpftrace",
        accepts,
        bpftrace_count(&bpf, "accepts"),
    );
    within_1_percent(
        "postgres forks vs bpftrace",
        forks,
        bpftrace_count(&bpf, "forks"),
    );
    let postmaster = roles(&s, "postgres postmaster")
        .next()
        .expect("a postmaster role");
    let lifetime_p50 = postmaster["child_lifetime"]["p50_ns"].as_u64().unwrap();
    assert!(
        postmaster["child_lifetime"]["total"].as_u64().unwrap() >= accepts - CONNECTIONS,
        "backends that exited: {postmaster}"
    );
    assert!(
        lifetime_p50 < 200_000_000,
        "backends live {lifetime_p50} ns (p50): short-lived"
    );
    let found = insights(&s);
    assert!(
        found
            .iter()
            .any(|i| i.starts_with("postgres postmaster forks")
                && i.contains("persistent connections")),
        "{found:?}"
    );
    assert_no_master_opens(&s);
    // A postmaster whose connections wait in its accept queue is told of its
    // forks, never of workers it does not have.
    let queue = &postmaster["accept_queue"];
    eprintln!(
        "  postmaster accept queue: {} connections, p99 {} ns",
        queue["count"], queue["p99_ns"]
    );
    let said = found
        .iter()
        .find(|i| i.starts_with("postgres postmaster: connections wait"));
    if queue["count"].as_u64().unwrap() >= 20 && queue["p99_ns"].as_u64().unwrap() >= 10_000_000 {
        let said = said.unwrap_or_else(|| panic!("no accept-queue insight: {found:?}"));
        assert!(
            said.contains("accepts and forks one connection at a time") && said.contains("pooler"),
            "{said}"
        );
    } else {
        assert!(said.is_none(), "{found:?}");
    }
    assert!(
        !found.iter().any(|i| i.contains("workers are saturated")),
        "{found:?}"
    );
    // Without upstream keepalive every request leaves a TIME_WAIT between the
    // nginx frontend and backend, and one between php-fpm and postgres; a
    // connection both ends close at once (each socket through CLOSING, as
    // bpftrace counts) leaves one at each end.
    for (port, what, ss) in [
        (18081, "nginx → backend", ss_backend),
        (15432, "php-fpm → postgres", ss_postgres),
    ] {
        let (now, new) = time_wait(&s, port);
        let closing = bpftrace_count(&bpf, &format!("closing_{port}"));
        eprintln!(
            "  {what} TIME_WAIT: new {new}, now {now}, ss {ss:?} (before, after); \
             recycled by the kernel {recycled}, closed by both ends {closing}"
        );
        assert!(
            (lo.saturating_sub(recycled)..=hi + closing).contains(&new),
            "new TIME_WAIT on :{port} {new}, requests {}, recycled by the kernel {recycled}, \
             sockets through CLOSING {closing}",
            run.requests
        );
        within_1_percent_of_bracket(&format!("TIME_WAIT on :{port} vs ss"), now, ss);
    }

    // 2. Persistent connections (one per php-fpm worker, opened by a warm-up
    //    before watching), through the frontend that keeps upstream
    //    connections alive: no forks, no new TIME_WAIT.
    load("persistent", true, 1);
    let bpf = bpftrace();
    let probe = watch();
    let run = load("persistent", true, 3);
    let s = summary(&probe.stop());
    one_row_per_role(&s);
    let bpf = bpf.stop();
    let (accepts, forks) = postgres_accepts_forks(&s);
    eprintln!(
        "persistent connections + keepalive: {} requests ({}/s); postgres accepts {accepts}, forks {forks}",
        run.requests, run.per_s
    );
    assert!(
        run.requests > 1000,
        "too little load to judge: {}",
        run.requests
    );
    assert_eq!(
        (accepts, forks),
        (0, 0),
        "postgres accepted or forked with persistent connections"
    );
    assert_eq!(
        bpftrace_count(&bpf, "accepts") + bpftrace_count(&bpf, "forks"),
        0
    );
    let found = insights(&s);
    assert!(!found.iter().any(|i| i.contains("forks")), "{found:?}");
    let (_, new_backend) = time_wait(&s, 18081);
    let (_, new_postgres) = time_wait(&s, 15432);
    eprintln!("  new TIME_WAIT: nginx → backend {new_backend}, php-fpm → postgres {new_postgres}");
    // wrk stops with requests in flight; nginx closes those upstream
    // connections (a few per stop), so near 0 is under 1% of requests.
    assert!(
        new_backend * 100 <= run.requests,
        "keepalive left {new_backend} TIME_WAIT for {} requests",
        run.requests
    );
    assert_eq!(new_postgres, 0);

    // 3. A new connection per request over postgres's unix socket: the forks
    //    stay, the TCP handshakes and TIME_WAIT go.
    let probe = watch();
    let run = load("unix", true, 2);
    let s = summary(&probe.stop());
    one_row_per_role(&s);
    let (accepts, forks) = postgres_accepts_forks(&s);
    eprintln!(
        "unix socket: {} requests ({}/s); postgres accepts {accepts}, forks {forks}",
        run.requests, run.per_s
    );
    let (lo, hi) = served(&run);
    assert!(
        (lo..=hi).contains(&accepts),
        "postgres accepts {accepts}, wrk requests {}",
        run.requests
    );
    within_1_percent("postgres forks vs accepts", forks, accepts);
    assert_eq!(
        postgres_accepts_by_path(&s),
        (0, accepts),
        "every accept from the unix socket"
    );
    let (tcp, unix) = php_connects_by_path(&s);
    eprintln!("  php-fpm → postgres connects: tcp {tcp:?}, unix {unix:?} (done, failed)");
    assert!(
        (lo..=hi).contains(&unix.0) && unix.1 == 0 && tcp == (0, 0),
        "php-fpm connects over unix {unix:?}, over TCP {tcp:?}; wrk requests {}",
        run.requests
    );
    assert_eq!(
        time_wait(&s, 15432).1,
        0,
        "no TCP to postgres, no TIME_WAIT"
    );

    drop(lab);
    assert!(!std::path::Path::new("/tmp/stackprobe-lab").exists());
    let left: Vec<_> = stack_processes()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(left.is_empty(), "left running after lab down: {left:?}");
}

/// (pid, comm) of every running nginx, php-fpm and postgres process. Zombies
/// are not running: this machine's init reaps orphans late, if at all.
fn stack_processes() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1;
            let zombie = rest.split_whitespace().next() == Some("Z");
            (!zombie && (comm == "nginx" || comm == "postgres" || comm.starts_with("php-fpm")))
                .then(|| (pid, comm.to_string()))
        })
        .collect()
}

//! Probe cost: ns per run of each program under a known loopback workload,
//! measured against bpftrace's equivalent one-liner in the same run (these
//! machines are noisy: compare the ratio, not absolute numbers across runs).
//!
//! Each round runs a known loopback workload three times: with no probes,
//! under `stackprobe watch --probe-cost`, and under bpftrace with the kernel's
//! BPF run-time statistics on (restored afterwards). It reports ns per program
//! run and operations/s, and fails if stackprobe miscounted or dropped.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use serde_json::Value;

use super::{
    BpfStats,
    loopback::{self, Loopback},
    tracer::bpftrace_command,
};
use crate::process;

/// A loopback workload, the programs it exercises and bpftrace's equivalent.
pub struct Workload {
    name: &'static str,
    /// The server command for `n` operations, and its reply.
    command: fn(u64) -> (String, String),
    /// stackprobe's programs to report; the first two are comparable with
    /// bpftrace's enter and exit programs.
    programs: &'static [&'static str],
    bpftrace: &'static str,
    /// Prefixes of bpftrace's program names (the kernel cuts them to 15
    /// bytes), compared with `programs` in order.
    bpftrace_programs: &'static [&'static str],
    /// Checks that stackprobe's summary counted all `n` operations of `pid`.
    check: fn(&Value, u32, u64) -> Result<()>,
}

pub const ACCEPT: Workload = Workload {
    name: "accept",
    command: |n| (format!("accept {n} tcp accept4"), format!("accepted {n}")),
    // With the opt-in hooks on (see `stackprobe`): the server's close of
    // each TCP connection it accepted passes the unix service's close probe
    // (whose service ended at the FIN), and every segment on the host
    // sk_data_ready (the unix queue's exact rung, which keeps only unix
    // listeners).
    programs: &["accept_enter", "accept_exit", "service_close", "unix_data_ready"],
    bpftrace: "tracepoint:syscalls:sys_enter_accept4 /pid == PID/ { @start[tid] = nsecs; }
tracepoint:syscalls:sys_exit_accept4 /@start[tid]/ { if (args->ret >= 0) { @ns = hist(nsecs - @start[tid]); } delete(@start[tid]); }",
    bpftrace_programs: &["sys_enter_accep", "sys_exit_accept"],
    check: accepted_all,
};

/// Connection churn: every connection goes through its TCP states, which the
/// state program sees (both ends: it runs for every socket on the machine and
/// keeps only watched processes' ones).
pub const CHURN: Workload = Workload {
    name: "connection churn",
    command: ACCEPT.command,
    programs: &["tcp_state", "accept_exit"],
    bpftrace: "tracepoint:sock:inet_sock_set_state /args->protocol == 6/ { @states[args->oldstate, args->newstate] = count(); }",
    bpftrace_programs: &["inet_sock_set_s"],
    check: accepted_all,
};

fn accepted_all(summary: &Value, pid: u32, n: u64) -> Result<()> {
    let row = summary["processes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["pid"] == pid))
        .context("the server is missing from stackprobe's summary")?;
    ensure!(
        row["count"] == n,
        "stackprobe counted {} accepts, expected {n}",
        row["count"]
    );
    Ok(())
}

/// A fork-per-connection server whose children exit at once.
pub const FORK: Workload = Workload {
    name: "fork",
    command: |n| (format!("serve-fork {n} tcp 0"), format!("served {n}")),
    programs: &[
        "clone_enter",
        "clone_exit",
        "watch_fork",
        "watch_exit",
        "accept_exit",
        "service_exit",
    ],
    bpftrace: "tracepoint:syscalls:sys_enter_clone /pid == PID/ { @start[tid] = nsecs; }
tracepoint:syscalls:sys_exit_clone /@start[tid]/ { if (args->ret > 0) { @ns = hist(nsecs - @start[tid]); } delete(@start[tid]); }",
    bpftrace_programs: &["sys_enter_clone", "sys_exit_clone"],
    check: |summary, pid, n| {
        let role = summary["roles"]
            .as_array()
            .and_then(|roles| roles.iter().find(|r| r["pids"].as_array().is_some_and(|p| p.contains(&pid.into()))))
            .context("the server's role is missing from stackprobe's summary")?;
        ensure!(role["fork"]["count"] == n, "stackprobe counted {} forks, expected {n}", role["fork"]["count"]);
        ensure!(
            role["child_lifetime"]["count"] == n,
            "stackprobe saw {} children exit, expected {n}",
            role["child_lifetime"]["count"]
        );
        Ok(())
    },
};

#[derive(Debug, Default, Clone)]
struct Cost {
    /// ns per run of each program, in the workload's order.
    ns_per_run: Vec<f64>,
    ops_per_s: f64,
}

/// Medians over the rounds.
pub struct ProbeCost {
    pub workload: &'static str,
    pub ops: u64,
    pub rounds: u32,
    pub ops_per_s_none: f64,
    pub ops_per_s_stackprobe: f64,
    pub ops_per_s_bpftrace: f64,
    /// (program, ns per run), stackprobe's then bpftrace's.
    pub stackprobe: Vec<(&'static str, f64)>,
    pub bpftrace: Vec<(&'static str, f64)>,
}

pub fn run(w: &Workload, n: u64, rounds: u32) -> Result<ProbeCost> {
    let (mut none, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        none.push(baseline(w, n)?);
        ours.push(stackprobe(w, n)?);
        theirs.push(bpftrace(w, n)?);
        let show = |c: &Cost| {
            let ns: Vec<String> = c.ns_per_run.iter().map(|ns| format!("{ns:.0}")).collect();
            format!("ns/run [{}], {:.0} ops/s", ns.join(", "), c.ops_per_s)
        };
        eprintln!(
            "{} round {round}: stackprobe {} | bpftrace {}",
            w.name,
            show(ours.last().unwrap()),
            show(theirs.last().unwrap())
        );
    }
    let med = |v: &[Cost], f: &dyn Fn(&Cost) -> f64| median(v.iter().map(f).collect());
    Ok(ProbeCost {
        workload: w.name,
        ops: n,
        rounds,
        ops_per_s_none: med(&none, &|c| c.ops_per_s),
        ops_per_s_stackprobe: med(&ours, &|c| c.ops_per_s),
        ops_per_s_bpftrace: med(&theirs, &|c| c.ops_per_s),
        stackprobe: w
            .programs
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, med(&ours, &|c| c.ns_per_run[i])))
            .collect(),
        bpftrace: w
            .bpftrace_programs
            .iter()
            .enumerate()
            .map(|(i, p)| (*p, med(&theirs, &|c| c.ns_per_run[i])))
            .collect(),
    })
}

impl ProbeCost {
    /// A markdown table: one row per program, bpftrace's beside the
    /// stackprobe program it compares with.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "**{}** ({} operations × {} rounds, medians; operations/s: no probes {:.0}, stackprobe {:.0}, bpftrace {:.0})\n\n\
             | stackprobe program | ns/run | bpftrace program | ns/run | ratio |\n|---|---:|---|---:|---:|\n",
            self.workload,
            self.ops,
            self.rounds,
            self.ops_per_s_none,
            self.ops_per_s_stackprobe,
            self.ops_per_s_bpftrace
        );
        for (i, (program, ns)) in self.stackprobe.iter().enumerate() {
            match self.bpftrace.get(i) {
                Some((theirs, their_ns)) => out.push_str(&format!(
                    "| {program} | {ns:.0} | {theirs}… | {their_ns:.0} | {:.2} |\n",
                    ns / their_ns
                )),
                None => out.push_str(&format!("| {program} | {ns:.0} | | | |\n")),
            }
        }
        out
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `n` of the workload's operations on `server` and returns how many
/// per second.
fn load(server: &mut Loopback, w: &Workload, n: u64) -> Result<f64> {
    let (command, reply) = (w.command)(n);
    server.send(&command)?;
    let start = Instant::now();
    process::run_cmd(
        Command::new(loopback::bin())
            .args(["connect", "tcp", &server.addr, &n.to_string()])
            .stdout(Stdio::null()),
    )?;
    let line = server.line()?;
    ensure!(line == reply, "server said {line:?}");
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn interrupt(child: &Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

/// Waits until the child's stdout or stderr prints a line containing `needle`.
fn wait_line(reader: &mut impl BufRead, needle: &str) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        ensure!(
            reader.read_line(&mut line)? > 0,
            "ended before printing {needle:?}"
        );
        if line.contains(needle) {
            return Ok(());
        }
    }
}

fn baseline(w: &Workload, n: u64) -> Result<Cost> {
    let mut server = Loopback::start(&["--max-seconds", "600"])?;
    Ok(Cost {
        ops_per_s: load(&mut server, w, n)?,
        ..Cost::default()
    })
}

fn stackprobe(w: &Workload, n: u64) -> Result<Cost> {
    let mut server = Loopback::start(&["--max-seconds", "600"])?;
    let mut sp = Command::new(process::workspace_root().join("target/release/stackprobe"))
        .args([
            "watch",
            "--pid",
            &server.pid.to_string(),
            "--probe-cost",
            // The opt-in hooks too, so that the table has every program.
            "--unix-service-time",
            "--unix-queue-hook",
            "data-ready",
            "--json",
            "--interval",
            "10m",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    wait_line(
        &mut BufReader::new(sp.stderr.take().unwrap()),
        "probes attached",
    )?;
    let ops_per_s = load(&mut server, w, n)?;
    interrupt(&sp);
    let out = sp.wait_with_output()?;
    ensure!(out.status.success(), "stackprobe failed: {}", out.status);
    let stdout = String::from_utf8(out.stdout)?;
    let summary: Value = serde_json::from_str(stdout.lines().last().context("no summary")?)?;
    (w.check)(&summary, server.pid, n)?;
    ensure!(
        summary["drops"] == 0,
        "stackprobe dropped events: {}",
        summary["drops_by_cause"]
    );
    let ns_per_run = w
        .programs
        .iter()
        .map(|name| {
            let c = summary["probe_cost"]
                .as_array()
                // A program with a BTF-tracepoint twin (`tcp_state_btf`)
                // runs as whichever rung the kernel offers.
                .and_then(|v| {
                    v.iter().find(|c| {
                        c["program"] == *name || c["program"] == format!("{name}_btf").as_str()
                    })
                })
                .ok_or_else(|| anyhow!("no cost for {name}"))?;
            let per_run = |c: &serde_json::Value| {
                c["run_time_ns"].as_f64().unwrap_or(0.0)
                    / c["runs"].as_f64().unwrap_or(1.0).max(1.0)
            };
            // The tp_btf rung runs a nested copy on every change too
            // (see probes_common::sock::STATE_BTF_NESTED_PROGRAM).
            let nested = summary["probe_cost"].as_array().and_then(|v| {
                v.iter()
                    .find(|n| n["program"] == format!("{name}_btf_nested").as_str())
            });
            Ok(per_run(c) + nested.map_or(0.0, per_run))
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok(Cost {
        ns_per_run,
        ops_per_s,
    })
}

fn bpftrace(w: &Workload, n: u64) -> Result<Cost> {
    let mut server = Loopback::start(&["--max-seconds", "600"])?;
    let _stats = BpfStats::enable()?;
    let mut bt = bpftrace_command()
        .args(["-e", &w.bpftrace.replace("PID", &server.pid.to_string())])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    wait_line(&mut BufReader::new(bt.stdout.take().unwrap()), "Attaching")?;
    // bpftrace prints "Attaching" just before it attaches.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let ops_per_s = load(&mut server, w, n)?;
    let progs: Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["prog", "show", "--json"])
            .output()?
            .stdout,
    )?;
    interrupt(&bt);
    let _ = bt.wait();
    let cost = |prefix: &str| -> Result<f64> {
        let p = progs
            .as_array()
            .and_then(|v| {
                v.iter()
                    .find(|p| p["name"].as_str().is_some_and(|s| s.starts_with(prefix)))
            })
            .ok_or_else(|| anyhow!("bpftool shows no program {prefix}*"))?;
        let runs = p["run_cnt"].as_f64().unwrap_or(0.0);
        if runs < n as f64 {
            bail!("bpftrace's {prefix} ran {runs} times for {n} operations");
        }
        Ok(p["run_time_ns"].as_f64().unwrap_or(0.0) / runs)
    };
    Ok(Cost {
        ns_per_run: w
            .bpftrace_programs
            .iter()
            .map(|p| cost(p))
            .collect::<Result<_>>()?,
        ops_per_s,
    })
}

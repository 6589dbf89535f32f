//! `cargo xtask bench accept`: what the accept probes cost, measured against
//! bpftrace's equivalent one-liner in the same run (these machines are noisy:
//! compare the ratio, not absolute numbers across runs).
//!
//! Each round makes N loopback accepts three times: with no probes, under
//! `stackprobe watch --probe-cost`, and under bpftrace with the kernel's BPF
//! run-time statistics on (restored afterwards). It reports ns per program
//! run, accepts/s and stackprobe's drops.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use serde_json::Value;

use crate::{setup, tasks};

const BPFTRACE_ACCEPT: &str = "tracepoint:syscalls:sys_enter_accept4 /pid == PID/ { @start[tid] = nsecs; }
tracepoint:syscalls:sys_exit_accept4 /@start[tid]/ { if (args->ret >= 0) { @ns = hist(nsecs - @start[tid]); } delete(@start[tid]); }";

#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    enter_ns: f64,
    exit_ns: f64,
    accepts_per_s: f64,
}

pub fn accept(accepts: u64, rounds: u32) -> Result<()> {
    ensure!(
        tasks::is_root(),
        "the benchmark loads kernel probes: run it as root"
    );
    setup::apt_packages(&["bpftrace", "bpftool"])?;
    tasks::build()?;
    let bin = tasks::workspace_root().join("target/release");
    let (mut none, mut ours, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        none.push(baseline(&bin, accepts)?);
        ours.push(stackprobe(&bin, accepts)?);
        theirs.push(bpftrace(&bin, accepts)?);
        eprintln!(
            "round {round}: stackprobe enter {:.0} ns, exit {:.0} ns | bpftrace enter {:.0} ns, exit {:.0} ns",
            ours.last().unwrap().enter_ns,
            ours.last().unwrap().exit_ns,
            theirs.last().unwrap().enter_ns,
            theirs.last().unwrap().exit_ns,
        );
    }
    let med = |v: &[Cost], f: fn(&Cost) -> f64| median(v.iter().map(f).collect());
    println!("accept probe cost, {accepts} loopback accepts x {rounds} rounds (medians)");
    println!(
        "{:<12} {:>14} {:>14} {:>12}",
        "", "enter ns/run", "exit ns/run", "accepts/s"
    );
    println!(
        "{:<12} {:>14} {:>14} {:>12.0}",
        "no probes",
        "-",
        "-",
        med(&none, |c| c.accepts_per_s)
    );
    for (name, v) in [("stackprobe", &ours), ("bpftrace", &theirs)] {
        println!(
            "{name:<12} {:>14.0} {:>14.0} {:>12.0}",
            med(v, |c| c.enter_ns),
            med(v, |c| c.exit_ns),
            med(v, |c| c.accepts_per_s)
        );
    }
    println!(
        "stackprobe / bpftrace: enter {:.2}, exit {:.2} (stackprobe's exit also streams each sample to userspace)",
        med(&ours, |c| c.enter_ns) / med(&theirs, |c| c.enter_ns),
        med(&ours, |c| c.exit_ns) / med(&theirs, |c| c.exit_ns),
    );
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: u32,
    addr: String,
}

impl Server {
    fn start(bin: &Path) -> Result<Self> {
        let mut child = Command::new(bin.join("stackprobe-loopback"))
            .args(["serve", "--tcp", "127.0.0.1:0", "--max-seconds", "600"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addr = String::new();
        loop {
            let mut line = String::new();
            ensure!(
                stdout.read_line(&mut line)? > 0,
                "the loopback server ended early"
            );
            if let Some(a) = line.trim().strip_prefix("tcp ") {
                addr = a.to_string();
            }
            if line.trim() == "ready" {
                break;
            }
        }
        let pid = child.id();
        Ok(Self {
            child,
            stdin,
            stdout,
            pid,
            addr,
        })
    }

    /// Makes `n` accepts and returns how many per second.
    fn load(&mut self, bin: &Path, n: u64) -> Result<f64> {
        writeln!(self.stdin, "accept {n} tcp accept4")?;
        let start = Instant::now();
        tasks::run_cmd(
            Command::new(bin.join("stackprobe-loopback"))
                .args(["connect", "tcp", &self.addr, &n.to_string()])
                .stdout(Stdio::null()),
        )?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        ensure!(
            line.trim() == format!("accepted {n}"),
            "server said {line:?}"
        );
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.wait();
    }
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

fn baseline(bin: &Path, n: u64) -> Result<Cost> {
    let mut server = Server::start(bin)?;
    Ok(Cost {
        accepts_per_s: server.load(bin, n)?,
        ..Cost::default()
    })
}

fn stackprobe(bin: &Path, n: u64) -> Result<Cost> {
    let mut server = Server::start(bin)?;
    let mut sp = Command::new(bin.join("stackprobe"))
        .args([
            "watch",
            "--pid",
            &server.pid.to_string(),
            "--probe-cost",
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
    let accepts_per_s = server.load(bin, n)?;
    interrupt(&sp);
    let out = sp.wait_with_output()?;
    ensure!(out.status.success(), "stackprobe failed: {}", out.status);
    let stdout = String::from_utf8(out.stdout)?;
    let summary: Value = serde_json::from_str(stdout.lines().last().context("no summary")?)?;
    let row = summary["processes"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["pid"] == server.pid))
        .context("the server is missing from stackprobe's summary")?;
    ensure!(
        row["count"] == n,
        "stackprobe counted {} accepts, expected {n}",
        row["count"]
    );
    ensure!(
        summary["drops"] == 0,
        "stackprobe dropped events: {}",
        summary["drops_by_cause"]
    );
    let cost = |name: &str| -> Result<f64> {
        let c = summary["probe_cost"]
            .as_array()
            .and_then(|v| v.iter().find(|c| c["program"] == name))
            .ok_or_else(|| anyhow!("no cost for {name}"))?;
        Ok(c["run_time_ns"].as_f64().unwrap_or(0.0) / c["runs"].as_f64().unwrap_or(1.0).max(1.0))
    };
    Ok(Cost {
        enter_ns: cost("accept_enter")?,
        exit_ns: cost("accept_exit")?,
        accepts_per_s,
    })
}

/// Turns the kernel's BPF run-time statistics on and restores the old value on drop.
struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Result<Self> {
        let old = std::fs::read_to_string(BPF_STATS)?.trim().to_string();
        std::fs::write(BPF_STATS, "1")?;
        Ok(Self(old))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, &self.0);
    }
}

fn bpftrace(bin: &Path, n: u64) -> Result<Cost> {
    let mut server = Server::start(bin)?;
    let _stats = BpfStats::enable()?;
    let mut bt = Command::new("bpftrace")
        .args([
            "-e",
            &BPFTRACE_ACCEPT.replace("PID", &server.pid.to_string()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    wait_line(&mut BufReader::new(bt.stdout.take().unwrap()), "Attaching")?;
    // bpftrace prints "Attaching" just before it attaches.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let accepts_per_s = server.load(bin, n)?;
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
            bail!("bpftrace's {prefix} ran {runs} times for {n} accepts");
        }
        Ok(p["run_time_ns"].as_f64().unwrap_or(0.0) / runs)
    };
    Ok(Cost {
        enter_ns: cost("sys_enter_accep")?,
        exit_ns: cost("sys_exit_accept")?,
        accepts_per_s,
    })
}

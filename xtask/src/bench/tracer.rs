//! A tracer under measurement (stackprobe or bpftrace): started and timed
//! until its probes are attached, its CPU and memory read from /proc while it
//! runs, stopped with SIGINT as a user would.

use std::{
    collections::HashSet,
    fs,
    io::{BufRead as _, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::Value;

pub struct Tracer {
    child: Child,
    pub pid: u32,
    /// From spawn to "attached".
    pub attach: Duration,
    stdout: mpsc::Receiver<String>,
}

/// `bpftrace`, to which the caller adds arguments. bpftrace needs tracefs,
/// which stackprobe only mounts while it loads: in a mount namespace of its
/// own bpftrace gets one without touching the host's mounts (the same pid,
/// execed, gets SIGINT).
pub fn bpftrace_command() -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("[ -d /sys/kernel/tracing/events ] || mount -t tracefs tracefs /sys/kernel/tracing; exec \"$@\"")
        .args(["sh", "bpftrace"]);
    cmd
}

impl Tracer {
    /// `stackprobe ARGS` (release build), attached when it says so on stderr.
    pub fn stackprobe(args: &[&str]) -> Result<Self> {
        let bin = crate::process::workspace_root().join("target/release/stackprobe");
        let mut cmd = Command::new(bin);
        cmd.args(args);
        Self::start(cmd, "probes attached")
    }

    /// bpftrace running `script`, attached when its BEGIN probe prints
    /// `ready` (bpftrace runs BEGIN once every probe is attached).
    pub fn bpftrace(script: &str) -> Result<Self> {
        let mut cmd = bpftrace_command();
        cmd.args(["-B", "line", "-e"])
            .arg(format!("BEGIN {{ printf(\"ready\\n\"); }}\n{script}"));
        Self::start(cmd, "ready")
    }

    /// Any other tracer, attached when it prints `ready`.
    pub fn command(cmd: Command, ready: &'static str) -> Result<Self> {
        Self::start(cmd, ready)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn start(mut cmd: Command, ready: &'static str) -> Result<Self> {
        let started = Instant::now();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let (tx, stdout) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let out = child.stdout.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let ready_out = ready_tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.contains(ready) {
                    let _ = ready_out.send(());
                }
                let _ = tx.send(line);
            }
        });
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if line.contains(ready) {
                    let _ = ready_tx.send(());
                }
            }
        });
        if ready_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} did not attach within 60 s");
        }
        let attach = started.elapsed();
        let pid = child.id();
        Ok(Self {
            child,
            pid,
            attach,
            stdout,
        })
    }

    /// User + system CPU time so far, in seconds.
    pub fn cpu_s(&self) -> Result<f64> {
        cpu_s(self.pid)
    }

    /// CPU time of its threads so far, in seconds, from the scheduler's own
    /// count in ns (/proc/PID/task/*/schedstat): at an idle tracer's rate,
    /// under a millisecond a second, /proc/PID/stat's 10 ms ticks would
    /// count none or one.
    pub fn exact_cpu_s(&self) -> Result<f64> {
        let mut ns = 0u64;
        for task in fs::read_dir(format!("/proc/{}/task", self.pid))? {
            let schedstat = fs::read_to_string(task?.path().join("schedstat"))?;
            ns += schedstat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .context("malformed schedstat")?;
        }
        Ok(ns as f64 / 1e9)
    }

    /// (RSS now, peak RSS) in KiB.
    pub fn rss_kib(&self) -> Result<(u64, u64)> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .ok_or_else(|| anyhow!("no {name} in /proc/{}/status", self.pid))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// SIGINT, then its exit status once it exits, None if it has not
    /// within `within`.
    fn interrupt(&mut self, within: Duration) -> Result<Option<ExitStatus>> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends a reference tracer whose output is not wanted: SIGINT, then
    /// SIGKILL if it has not exited within 20 s. bpftrace 0.17 now and then
    /// stays in epoll_wait after taking the SIGINT (a whole benchmark run
    /// lost to it once); what it measured was read before, so the round
    /// stands.
    pub fn end(mut self) -> Result<()> {
        if self.interrupt(Duration::from_secs(20))?.is_none() {
            eprintln!(
                "bench: tracer {} ignored SIGINT for 20 s, killed: {}",
                self.pid,
                diagnose(self.pid)
            );
            self.child.kill()?;
            self.child.wait()?;
        }
        Ok(())
    }

    /// SIGINT, then everything it printed on stdout.
    pub fn stop(mut self) -> Result<Vec<String>> {
        let Some(status) = self.interrupt(Duration::from_secs(60))? else {
            let diagnosis = diagnose(self.pid);
            let _ = self.child.kill();
            let _ = self.child.wait();
            bail!(
                "tracer {} did not exit within 60 s of SIGINT: {diagnosis}",
                self.pid
            );
        };
        if !status.success() {
            bail!("tracer {} exited with {status}", self.pid);
        }
        let mut lines = Vec::new();
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_secs(2)) {
            lines.push(line);
        }
        Ok(lines)
    }
}

/// What a process that ignores SIGINT is doing: its name, signal masks and
/// where each thread waits.
fn diagnose(pid: u32) -> String {
    let read = |p: String| fs::read_to_string(p).unwrap_or_default();
    let status = read(format!("/proc/{pid}/status"));
    let signals: Vec<&str> = status
        .lines()
        .filter(|l| l.starts_with("Name:") || l.starts_with("Sig"))
        .collect();
    let threads: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| {
                let tid = t.ok()?.file_name().into_string().ok()?;
                Some(format!(
                    "{tid}:{}",
                    read(format!("/proc/{pid}/task/{tid}/wchan"))
                ))
            })
            .collect()
        })
        .unwrap_or_default();
    format!("{} threads [{}]", signals.join(" "), threads.join(" "))
}

/// stackprobe's `--json` summary among its output lines.
pub fn summary(lines: &[String]) -> Result<Value> {
    let line = lines
        .iter()
        .rev()
        .find(|l| l.contains("\"type\":\"summary\""))
        .context("stackprobe printed no summary")?;
    Ok(serde_json::from_str(line)?)
}

pub fn cpu_s(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("malformed stat")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15; after the comm, indices 11, 12.
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// The BPF programs loaded now: id → (name, runs, run time ns).
pub fn programs() -> Result<Vec<(u64, String, u64, u64)>> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
        .context("running bpftool")?;
    let progs: Value = serde_json::from_slice(&out.stdout)?;
    Ok(progs
        .as_array()
        .map(|v| {
            v.iter()
                .map(|p| {
                    (
                        p["id"].as_u64().unwrap_or(0),
                        p["name"].as_str().unwrap_or("").to_string(),
                        p["run_cnt"].as_u64().unwrap_or(0),
                        p["run_time_ns"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Program ids loaded now, to tell a tracer's programs from the rest.
pub fn program_ids() -> Result<HashSet<u64>> {
    Ok(programs()?.into_iter().map(|p| p.0).collect())
}

/// What programs not in `before` have run so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgramRuns {
    pub runs: u64,
    pub ns: u64,
    /// Run time of the socket iterator, which runs inside the tracer's own
    /// read() and so is in the tracer's system time too.
    pub in_tracer_ns: u64,
}

pub fn new_program_runs(before: &HashSet<u64>) -> Result<ProgramRuns> {
    Ok(programs()?
        .into_iter()
        .filter(|p| !before.contains(&p.0))
        .fold(ProgramRuns::default(), |mut r, p| {
            r.runs += p.2;
            r.ns += p.3;
            if p.1 == probes_common::sock::ITER_PROGRAM {
                r.in_tracer_ns += p.3;
            }
            r
        }))
}

/// Kernel memory of every BPF map now (bytes_memlock, as bpftool reports it).
pub fn map_bytes() -> Result<u64> {
    let out = Command::new("bpftool")
        .args(["map", "show", "--json"])
        .output()
        .context("running bpftool")?;
    let maps: Value = serde_json::from_slice(&out.stdout)?;
    Ok(maps
        .as_array()
        .map(|v| v.iter().filter_map(|m| m["bytes_memlock"].as_u64()).sum())
        .unwrap_or(0))
}

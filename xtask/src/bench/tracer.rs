//! A tracer under measurement (stackprobe or bpftrace): started and timed
//! until its probes are attached, its CPU and memory read from /proc while it
//! runs, stopped with SIGINT as a user would.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    io::{BufRead as _, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail, ensure};
use serde_json::Value;

use super::server_report::ProgramRun;

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

/// What each program not in `before` has run so far: id → (name, runs,
/// run time ns).
pub fn new_programs(before: &HashSet<u64>) -> Result<BTreeMap<u64, (String, u64, u64)>> {
    Ok(programs()?
        .into_iter()
        .filter(|p| !before.contains(&p.0))
        .map(|(id, name, runs, ns)| (id, (name, runs, ns)))
        .collect())
}

/// The hook of a program attached nowhere while it was listed: stackprobe's
/// socket iterator, linked only while it walks, is an iterator of TCP
/// sockets; anything else is `unknown`.
fn unattached(name: &str) -> Vec<String> {
    vec![
        if name == probes_common::sock::ITER_PROGRAM {
            "iter:tcp"
        } else {
            "unknown"
        }
        .to_string(),
    ]
}

/// What each program ran between two readings of [`new_programs`], with
/// its hooks from `hooks` (see [`unattached`] if absent there).
pub fn program_runs(
    before: &BTreeMap<u64, (String, u64, u64)>,
    after: &BTreeMap<u64, (String, u64, u64)>,
    hooks: &HashMap<u64, BTreeSet<String>>,
) -> Vec<ProgramRun> {
    after
        .iter()
        .map(|(id, (name, runs, ns))| {
            let (runs_then, ns_then) = before.get(id).map_or((0, 0), |p| (p.1, p.2));
            ProgramRun {
                name: name.clone(),
                hooks: hooks
                    .get(id)
                    .map_or_else(|| unattached(name), |h| h.iter().cloned().collect()),
                runs: runs - runs_then,
                ns: ns - ns_then,
            }
        })
        .collect()
}

fn bpftool_json(args: &[&str]) -> Result<Value> {
    let out = Command::new("bpftool")
        .args(args)
        .arg("--json")
        .output()
        .context("running bpftool")?;
    ensure!(
        out.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The hooks of the programs attached now, by program id, as the kernel
/// describes them: `bpftool perf show` for perf events (bpftrace's classic
/// tracepoints and kprobes) and raw and BTF tracepoint links, which it
/// names by their tracepoint; the /proc fdinfo of `pid`'s BPF links for the
/// rest (perf-event links, which bpftool 7.1's `link show` lists without
/// their hook). Every tracepoint kind is `tracepoint:NAME` (see
/// [`ProgramRun::hooks`]); a program attached nowhere now (stackprobe's
/// socket iterator, linked only while it walks) is absent.
pub fn program_hooks(pid: Option<u32>) -> Result<HashMap<u64, BTreeSet<String>>> {
    let mut hooks: HashMap<u64, BTreeSet<String>> = HashMap::new();
    let perf = bpftool_json(&["perf", "show"])?;
    for attachment in perf.as_array().into_iter().flatten() {
        if let (Some(id), Some(hook)) = (attachment["prog_id"].as_u64(), perf_hook(attachment)) {
            hooks.entry(id).or_default().insert(hook);
        }
    }
    for fdinfo in pid.map(links_of).transpose()?.into_iter().flatten() {
        let id = fdinfo_field(&fdinfo, "prog_id").and_then(|v| v.parse().ok());
        if let (Some(id), Some(hook)) = (id, fdinfo_hook(&fdinfo)) {
            hooks.entry(id).or_default().insert(hook);
        }
    }
    Ok(hooks)
}

/// One entry of `bpftool perf show --json` as a hook.
fn perf_hook(a: &Value) -> Option<String> {
    let kind = a["fd_type"].as_str()?;
    Some(match kind {
        "tracepoint" | "raw_tracepoint" => format!("tracepoint:{}", a["tracepoint"].as_str()?),
        "kprobe" | "kretprobe" => format!("{kind}:{}", a["func"].as_str()?),
        "uprobe" | "uretprobe" => format!(
            "{kind}:{}:{}",
            a["filename"].as_str()?,
            a["offset"].as_u64()?
        ),
        _ => return None,
    })
}

/// The /proc fdinfo of every BPF link `pid` holds.
fn links_of(pid: u32) -> Result<Vec<String>> {
    let mut links = Vec::new();
    for fd in fs::read_dir(format!("/proc/{pid}/fd"))? {
        let fd = fd?;
        if fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf_link") {
            // A link closed since the listing is no longer this tracer's.
            if let Ok(info) = fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            )) {
                links.push(info);
            }
        }
    }
    Ok(links)
}

fn fdinfo_field<'a>(fdinfo: &'a str, name: &str) -> Option<&'a str> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// The hook of a perf-event BPF link from its /proc fdinfo, in the form of
/// the floor's `link_view`. Recent kernels name the hook there; with one that does not,
/// the floor's `discover` finds no hook and fails.
pub fn perf_link_hook(fdinfo: &str) -> Option<String> {
    let field = |name: &str| {
        fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    if field("link_type")? != "perf" {
        return None;
    }
    match field("event_type")? {
        "tracepoint" => Some(format!("tracepoint:{}", field("tp_name")?)),
        kind @ ("kprobe" | "kretprobe") => Some(format!("{kind}:{}", field("name")?)),
        _ => None,
    }
}

/// A BPF link's hook from its fdinfo: perf-event links as the floor reads
/// them, raw and BTF tracepoints by their tracepoint, iterators by their
/// target. Trampolines (fentry, fexit) name only a BTF id there, and are
/// left out.
fn fdinfo_hook(fdinfo: &str) -> Option<String> {
    match fdinfo_field(fdinfo, "link_type")? {
        "perf" => perf_link_hook(fdinfo),
        "raw_tracepoint" => Some(format!("tracepoint:{}", fdinfo_field(fdinfo, "tp_name")?)),
        "iter" => Some(format!("iter:{}", fdinfo_field(fdinfo, "target_name")?)),
        _ => None,
    }
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

//! Shared by the root-only integration tests: a loopback server whose every
//! accept is known (the `stackprobe-loopback` binary), clients, and a lock so
//! the tests in one binary load probes one at a time.

#![allow(dead_code)]

use stackprobe_model::measure::Latency;
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Lines, Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, Stdio},
    sync::{Mutex, MutexGuard},
};

use probes_common::{event::EVENTS_RING_BYTES, lifecycle::ExitEvent};
use serde_json::Value;

use stackprobe_collector::Collector;
use stackprobe_model::{process::LiveProcess, selector::Selector};
use stackprobe_probes::procfs;
use stackprobe_probes::{Options, rungs::ForkRung, rungs::QueueRung, rungs::StateRung};

/// 20% more accepts than the ring buffer could hold had each sent even the
/// smallest record the probes send (an exit event, behind the ring's 8-byte
/// header): with nobody reading, any accept that crossed the ring would
/// overflow it.
pub fn accepts_past_the_ring() -> u64 {
    let record = (size_of::<ExitEvent>() as u64 + 8).next_multiple_of(8);
    u64::from(EVENTS_RING_BYTES) / record * 6 / 5
}

/// The collector `stackprobe watch` runs, selecting nothing by itself: each
/// test tells its probes which processes to watch.
pub struct Session {
    pub collector: Collector,
    _runtime: tokio::runtime::Runtime,
}

impl Session {
    pub fn start() -> Self {
        Self::try_start(Options::default()).expect("loading the probes")
    }

    pub fn try_start(options: Options) -> anyhow::Result<Self> {
        require_root();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = runtime.enter();
        let collector = Collector::start(Selector::default(), options)?;
        Ok(Self {
            collector,
            _runtime: runtime,
        })
    }

    /// Moves every event waiting in the ring buffer into the table. The
    /// clients have read each server's byte, so every accept has returned
    /// and its event is already in the ring.
    /// What the kernel's histograms gained (every accept and clone) is
    /// merged too; the count returned is of ring buffer events only.
    pub fn collect(&mut self) -> usize {
        self.collector.drain().expect("draining the probes' events")
    }

    /// Mirrors the kernel's watch set into the table, as `stackprobe watch`
    /// does each interval (without reading titles or parents).
    pub fn sync(&mut self) {
        let live: Vec<LiveProcess> = self
            .collector
            .probes()
            .watched()
            .into_iter()
            .filter_map(|(pid, _)| procfs::read(pid))
            .filter(|p| p.is_process())
            .map(|p| LiveProcess {
                pid: p.pid,
                name: p.comm,
                title: None,
                parent: None,
                container: None,
                ns_pid: p.ns_pid,
            })
            .collect();
        self.collector.table_mut().sync_watched(&live);
    }

    pub fn accepts(&self, pid: u32) -> u64 {
        self.collector
            .table()
            .get(pid)
            .map_or(0, |p| p.activity.latency[Latency::Accept].total.count())
    }
}

/// Snapshots sockets into the session's table until `done` holds (bounded):
/// the last FINs may still be in flight.
pub fn observe_until(s: &mut Session, done: impl Fn(&Session) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        s.collect();
        s.sync();
        s.collector.observe_sockets().unwrap();
        if done(s) || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub const LOOPBACK: &str = env!("CARGO_BIN_EXE_stackprobe-loopback");
pub const STACKPROBE: &str = env!("CARGO_BIN_EXE_stackprobe");

static PROBE_LOCK: Mutex<()> = Mutex::new(());

/// Serialises tests that load probes, so "nothing stays loaded" checks see
/// only their own programs.
pub fn probe_lock() -> MutexGuard<'static, ()> {
    PROBE_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests load kernel probes and must run as root (cargo xtask test does)"
    );
}

/// A sysctl set for a test and put back as it was when dropped (also when
/// the test panics).
pub struct Sysctl {
    path: PathBuf,
    was: String,
}

impl Sysctl {
    pub fn set(name: &str, value: &str) -> Self {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let was = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, value).unwrap();
        Self { path, was }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, self.was.trim());
    }
}

/// The kernel's TCP counters (/proc/net/snmp's `Tcp:` and /proc/net/netstat's
/// `TcpExt:`), so a failing test can say what the kernel did meanwhile
/// (retransmits, resets, TIME_WAIT overflows or reuse).
pub struct TcpCounters(Vec<(String, i64)>);

impl TcpCounters {
    pub fn now() -> Self {
        let mut all = Vec::new();
        for (file, section) in [("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            all.extend(
                procfs::net_section(&text, section)
                    .into_iter()
                    .filter_map(|(n, v)| Some((format!("{section}{n}"), v.parse().ok()?))),
            );
        }
        Self(all)
    }

    /// The counter `name` (`TcpExt:TCPTimeWaitOverflow`), 0 if absent.
    fn value(&self, name: &str) -> i64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// How much the counter `name` gained since `before`.
    pub fn gained(&self, before: &Self, name: &str) -> i64 {
        self.value(name) - before.value(name)
    }

    /// The counters that changed since `before`, with by how much.
    pub fn since(&self, before: &Self) -> Vec<(String, i64)> {
        self.0
            .iter()
            .filter_map(|(name, now)| {
                let gained = now - before.value(name);
                (gained != 0).then(|| (name.clone(), gained))
            })
            .collect()
    }
}

/// How many TCP sockets towards `peer` (ip:port) ss lists in each state
/// (`TIME-WAIT`, `FIN-WAIT-2`…), from one listing.
pub fn ss_states_towards(peer: &str) -> BTreeMap<String, usize> {
    let out = Command::new("ss").args(["-Htan"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut states = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(4) == Some(&peer) {
            *states.entry(cols[0].to_string()).or_default() += 1;
        }
    }
    states
}

/// A scratch directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("stackprobe-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The loopback binary as `name` in this directory (a link, made once):
    /// the kernel names a process after the file it execs, so a process
    /// started from it has a name of its own.
    pub fn loopback_as(&self, name: &str) -> PathBuf {
        let program = self.0.join(name);
        if !program.exists() {
            std::os::unix::fs::symlink(LOOPBACK, &program).unwrap();
        }
        program
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Server {
    pub child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// The process now taking commands (the forked child after `fork`).
    pub pid: u32,
    pub tcp: String,
    pub unix: Option<PathBuf>,
}

impl Server {
    pub fn start(unix: Option<&Path>) -> Self {
        Self::start_as(Path::new(LOOPBACK), unix)
    }

    /// Starts the server from `program` (a symlink to the loopback binary gives
    /// it another comm).
    pub fn start_as(program: &Path, unix: Option<&Path>) -> Self {
        Self::start_with(program, "127.0.0.1:0", unix)
    }

    /// Starts the loopback server listening on `tcp` (e.g. `[::1]:0`).
    pub fn start_with(program: &Path, tcp: &str, unix: Option<&Path>) -> Self {
        Self::start_args(program, &["--tcp", tcp], unix)
    }

    /// Starts the loopback server with extra `serve` arguments.
    pub fn start_args(program: &Path, args: &[&str], unix: Option<&Path>) -> Self {
        let mut cmd = Command::new(program);
        cmd.arg("serve").args(args);
        Self::start_command(cmd, unix)
    }

    /// Starts `cmd`, which ends in `stackprobe-loopback serve …` (run
    /// through setpriv, say); the usual flags are appended.
    pub fn start_command(mut cmd: Command, unix: Option<&Path>) -> Self {
        // Only a guard against a server outliving its test (Drop kills it):
        // long enough for the slowest test in a TCG guest (the ring-sized
        // accept test's ~90k connections take 30 s on the host, several
        // times that in a guest, and a server ended by its alarm resets
        // the connections still in its queue).
        cmd.args(["--max-seconds", "900"]);
        if let Some(path) = unix {
            cmd.arg("--unix").arg(path);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning stackprobe-loopback");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut server = Self {
            pid: child.id(),
            child,
            stdin,
            lines,
            tcp: String::new(),
            unix: unix.map(Path::to_path_buf),
        };
        loop {
            let line = server.line();
            if let Some(addr) = line.strip_prefix("tcp ") {
                server.tcp = addr.to_string();
            }
            if line == "ready" {
                break;
            }
        }
        server
    }

    pub fn line(&mut self) -> String {
        self.lines
            .next()
            .expect("stackprobe-loopback ended early")
            .expect("reading stackprobe-loopback")
    }

    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for the reply to an `accept` command.
    pub fn wait_accepted(&mut self, n: u64) {
        assert_eq!(self.line(), format!("accepted {n}"));
    }

    /// Has the server accept `n` connections made beforehand, so each accept
    /// finds a connection already queued.
    pub fn accept_queued(&mut self, n: u64, unix: bool, syscall: &str) {
        let streams: Vec<Box<dyn Read>> = (0..n)
            .map(|_| -> Box<dyn Read> {
                if unix {
                    Box::new(UnixStream::connect(self.unix.as_ref().unwrap()).unwrap())
                } else {
                    Box::new(TcpStream::connect(&self.tcp).unwrap())
                }
            })
            .collect();
        self.send(&format!(
            "accept {n} {} {syscall}",
            if unix { "unix" } else { "tcp" }
        ));
        for mut s in streams {
            read_byte_then_eof(&mut *s);
        }
        self.wait_accepted(n);
    }

    /// Sends `command` and waits for its one-line reply.
    pub fn run(&mut self, command: &str, reply: &str) {
        self.send(command);
        assert_eq!(self.line(), reply, "reply to {command:?}");
    }

    /// Forks; the child takes over the commands. Returns the child's pid.
    pub fn fork(&mut self) -> u32 {
        self.send("fork");
        let line = self.line();
        self.pid = line
            .strip_prefix("child ")
            .expect("a child pid")
            .parse()
            .unwrap();
        self.pid
    }

    pub fn stop(mut self) {
        self.send("exit");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "stackprobe-loopback failed: {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.0 GET of `path` from `addr`: the response's head and body.
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

pub fn tcp_connect_and_read(addr: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    read_byte_then_eof(&mut s);
}

/// Reads the server's byte, then waits for its FIN before closing: the server
/// always closes first, so TIME_WAIT is always on its side.
pub fn read_byte_then_eof(s: &mut dyn Read) {
    let mut byte = [0u8; 1];
    s.read_exact(&mut byte).unwrap();
    assert_eq!(
        s.read(&mut byte).unwrap(),
        0,
        "the server sends one byte, then closes"
    );
}

/// Probes loaded with one rung of a ladder forced, or None where this
/// kernel lacks it; then the rung must not be one `expected` to work, and
/// the error must say the kernel lacks it.
pub fn forced_session(options: Options, rung: &str, expected: bool) -> Option<Session> {
    match Session::try_start(options) {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(!expected, "{rung} must work on this kernel: {e:#}");
            let message = format!("{e:#}");
            assert!(
                message.contains("does not work on this kernel"),
                "{message}"
            );
            None
        }
    }
}

/// What the programs whose names start with one of `prefixes` cost per
/// run so far (loaded with `probe_cost`), for the rung comparisons.
pub fn rung_costs(s: &Session, prefixes: &[&str]) -> String {
    s.collector
        .probes()
        .costs()
        .unwrap()
        .iter()
        .filter(|c| c.runs > 0 && prefixes.iter().any(|p| c.program.starts_with(p)))
        .map(|c| format!("{} {:.0} ns×{}", c.program, c.ns_per_run(), c.runs))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs and run time summed over this process's BPF program fds whose
/// kernel ids are in `ids`, as /proc/self/fdinfo tells them: the kernel's
/// own text, to check what stackprobe reads through bpf() against.
pub fn fdinfo_run_totals(ids: &[u32]) -> (u64, u64) {
    let mut totals = (0, 0);
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap() {
        let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        let field = |name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
        };
        if field("prog_id:").is_some_and(|id| ids.contains(&(id as u32))) {
            totals.0 += field("run_cnt:").unwrap_or(0);
            totals.1 += field("run_time_ns:").unwrap_or(0);
        }
    }
    totals
}

/// Names of stackprobe's kernel programs but the fork rungs' (as the kernel
/// truncates them, to 15 bytes).
/// (One state program is loaded: `tcp_state`, or `tcp_state_btf` and its
/// nested copy where the BTF tracepoint serves.)
pub const PROGRAM_NAMES: [&str; 9] = [
    "tcp_state",
    "tcp_sockets",
    "accept_enter",
    "accept_exit",
    "connect_enter",
    "connect_exit",
    "watch_fork",
    "watch_exec",
    "watch_exit",
];

/// The program of each accept-queue rung but the fd walk's (which is the
/// accept exit's own), truncated alike.
pub fn queue_program_names(hook: QueueRung) -> &'static [&'static str] {
    match hook {
        // inet_csk_accept_fexit and inet_csk_accept_kretprobe.
        QueueRung::Fexit | QueueRung::Kretprobe => &["inet_csk_accept"],
        QueueRung::FdWalk => &[],
    }
}

/// The programs of each fork rung.
pub fn fork_program_names(hook: ForkRung) -> &'static [&'static str] {
    match hook {
        ForkRung::Tracepoint => &["clone_enter", "clone3_enter", "fork_enter", "clone_exit"],
        // kernel_clone_fentry and kernel_clone_fexit, truncated alike.
        ForkRung::Fentry => &["kernel_clone_fe", "kernel_clone_fe"],
        ForkRung::Kprobe => &["kernel_clone_kp", "kernel_clone_kr"],
    }
}

/// Programs the state rung loads beyond the one in [`PROGRAM_NAMES`]: the
/// tp_btf rung's nested copy.
pub fn state_extra_programs(rung: StateRung) -> usize {
    match rung {
        StateRung::BtfTracepoint => 1,
        StateRung::Tracepoint => 0,
    }
}

/// [`state_extra_programs`] of whichever state rung a running stackprobe
/// loaded, from the names of the loaded programs.
pub fn state_extra_loaded() -> usize {
    let btf = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .any(|p| p.name_as_str() == Some("tcp_state_btf"));
    state_extra_programs(if btf {
        StateRung::BtfTracepoint
    } else {
        StateRung::Tracepoint
    })
}

/// The do-nothing programs `doctor` loads to try a hook.
pub const HOOK_PROGRAM_NAMES: [&str; 3] = ["hook_tp_btf", "hook_fentry", "hook_kprobe"];

/// Ids of loaded programs carrying one of stackprobe's program names.
pub fn loaded_stackprobe_programs() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str().is_some_and(|n| {
                PROGRAM_NAMES.contains(&n)
                    || n == "tcp_state_btf"
                    // tcp_state_btf_nested, truncated.
                    || n == "tcp_state_btf_n"
                    || HOOK_PROGRAM_NAMES.contains(&n)
                    || ForkRung::LADDER
                        .iter()
                        .any(|&h| fork_program_names(h).contains(&n))
                    || QueueRung::LADDER
                        .iter()
                        .any(|&h| queue_program_names(h).contains(&n))
            })
        })
        .map(|p| p.id())
        .collect()
}

/// stackprobe's programs still loaded once the kernel had up to 5 s to free
/// them: it frees a program asynchronously after its last fd closes (tp_btf
/// programs after an RCU grace period), so right after an exit they may
/// still be listed.
pub fn programs_left_loaded() -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let loaded = loaded_stackprobe_programs();
        if loaded.is_empty() || std::time::Instant::now() > deadline {
            return loaded;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs a tmux command and returns its output.
pub fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("running tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A detached tmux session running `command` in a `width`×`height` terminal;
/// killed on drop, whatever happened.
pub struct TmuxSession(pub String);

impl TmuxSession {
    pub fn start(name: &str, width: u16, height: u16, command: &str) -> Self {
        let _ = tmux(&["kill-session", "-t", name]);
        let started = Command::new("tmux")
            .args(["new-session", "-d", "-s", name, "-x", &width.to_string()])
            .args(["-y", &height.to_string(), command])
            .status()
            .expect("running tmux");
        assert!(started.success(), "tmux new-session failed");
        Self(name.to_string())
    }
}

impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.0]);
    }
}

/// Captures the session's screen until `ok` accepts it (15 s at most).
pub fn wait_screen(session: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let screen = tmux(&["capture-pane", "-p", "-J", "-t", session]);
        if ok(&screen) {
            return screen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the screen never showed {what}:\n{screen}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A `stackprobe` run whose stderr the test reads line by line.
pub struct Running {
    pub child: Child,
    pub stderr: BufReader<ChildStderr>,
    pub seen: String,
    /// Its stdout read as it comes, when asked (`drain_stdout`).
    stdout: Option<std::thread::JoinHandle<String>>,
}

impl Running {
    pub fn start(args: &[&str]) -> Self {
        let mut cmd = Command::new(STACKPROBE);
        cmd.args(args).stdout(Stdio::piped());
        Self::spawn(cmd)
    }

    /// `stackprobe watch --pid PID --json --interval INTERVAL`, attached.
    pub fn watch_json(pid: u32, interval: &str) -> Self {
        let pid = pid.to_string();
        let mut sp = Self::start(&["watch", "--pid", &pid, "--json", "--interval", interval]);
        sp.wait_stderr("probes attached");
        sp
    }

    /// Runs `cmd` (its stdout as the caller set it) reading its stderr.
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        Self {
            child,
            stderr,
            seen: String::new(),
            stdout: None,
        }
    }

    /// Reads its stdout from a thread as it comes (`finish` returns it),
    /// so that a long run's reports never fill the pipe and stall it.
    pub fn drain_stdout(&mut self) {
        let mut out = self.child.stdout.take().unwrap();
        self.stdout = Some(std::thread::spawn(move || {
            let mut all = String::new();
            let _ = out.read_to_string(&mut all);
            all
        }));
    }

    /// Reads stderr until a line contains `needle`.
    pub fn wait_stderr(&mut self, needle: &str) {
        loop {
            let mut line = String::new();
            let n = self.stderr.read_line(&mut line).unwrap();
            self.seen.push_str(&line);
            assert!(
                n > 0,
                "stackprobe ended before saying {needle:?}; it said:\n{}",
                self.seen
            );
            if line.contains(needle) {
                return;
            }
        }
    }

    /// The address its metrics endpoint said it serves on.
    pub fn metrics_addr(&self) -> String {
        self.seen
            .lines()
            .find_map(|l| {
                l.strip_prefix("stackprobe: metrics on http://")?
                    .strip_suffix("/metrics")
            })
            .unwrap_or_else(|| panic!("no metrics address in:\n{}", self.seen))
            .to_string()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    pub fn finish(mut self) -> (std::process::ExitStatus, String, String) {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut stdout).unwrap();
        } else if let Some(reader) = self.stdout.take() {
            stdout = reader.join().unwrap();
        }
        self.stderr.read_to_string(&mut self.seen).unwrap();
        let status = self.child.wait().unwrap();
        (status, stdout, std::mem::take(&mut self.seen))
    }
}

/// A test that panics must not leave stackprobe running, its probes
/// attached (SIGKILL: the kernel detaches them with its last fd).
impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

pub fn row(report: &Value, pid: u32) -> Option<&Value> {
    report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
}

/// A client: `program` (a link to the loopback binary, named as the role
/// the test watches) making `n` connections of `kind` to `addr`, one after
/// another.
pub fn connect_client(program: &Path, kind: &str, addr: &str, n: u32) -> Child {
    Command::new(program)
        .args(["connect", kind, addr, &n.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The report's row of `role`.
pub fn role_row<'a>(report: &'a Value, role: &str) -> &'a Value {
    report["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == role)
        .unwrap_or_else(|| panic!("no role {role} in {report}"))
}

/// Waits until `n` threads of `pid` are inside accept() or accept4().
pub fn wait_in_accept(pid: u32, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let in_accept = [libc::SYS_accept, libc::SYS_accept4].map(|nr| nr.to_string());
    loop {
        let blocked = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("syscall")).ok())
            .filter(|line| {
                let nr = line.split_whitespace().next().unwrap_or("");
                in_accept.iter().any(|a| a == nr)
            })
            .count();
        if blocked >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{blocked} of {n} threads in accept"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

//! The `stackprobe` binary run as a user would: in tmux, or with its
//! output read, and its JSON lines picked apart.

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, ChildStderr, Command, Output, Stdio},
};

use serde_json::Value;

use super::*;

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

/// The report's row of `role`.
pub fn role_row<'a>(report: &'a Value, role: &str) -> &'a Value {
    report["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == role)
        .unwrap_or_else(|| panic!("no role {role} in {report}"))
}

/// Runs `cmd` to its end, with nothing on its standard input.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

/// `out` is a clean failure: exit `code`, `message` on stderr, no panic.
pub fn assert_fails(out: &Output, code: i32, message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr:\n{stderr}");
    assert!(
        stderr.contains(message),
        "expected {message:?} in:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

//! The benchmarks' loopback server (`stackprobe-loopback serve`), driven by
//! one-line commands on its stdin; ends on drop.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use anyhow::{Result, ensure};

use crate::process;

pub struct Loopback {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub pid: u32,
    /// Its TCP listener's address.
    pub addr: String,
}

impl Loopback {
    /// Starts the release build's server with `serve` arguments after
    /// `--tcp 127.0.0.1:0`, and waits until it is ready.
    pub fn start(args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin())
            .args(["serve", "--tcp", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
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

    pub fn send(&mut self, command: &str) -> Result<()> {
        writeln!(self.stdin, "{command}")?;
        Ok(())
    }

    /// Its next reply line, trimmed.
    pub fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line.trim().to_string())
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.wait();
    }
}

/// The release build's `stackprobe-loopback`.
pub fn bin() -> std::path::PathBuf {
    process::workspace_root().join("target/release/stackprobe-loopback")
}

//! The loopback server whose every accept is known (`stackprobe-loopback`),
//! its clients, and the scratch directories tests give it.

use std::{
    io::{BufRead, BufReader, Lines, Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use super::*;

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

/// A port free now on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

//! Network namespaces a test makes itself.

use std::{os::fd::AsRawFd as _, process::Command};

/// A network namespace of the test's own, with its loopback up, deleted
/// on drop: its traffic and counters are the test's alone.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = format!("sp-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        for args in [
            &["netns", "add", &name][..],
            &["-n", &name, "link", "set", "lo", "up"],
        ] {
            let status = Command::new("ip").args(args).status().unwrap();
            assert!(status.success(), "ip {args:?}: {status}");
        }
        Self { name }
    }

    /// Runs `f` on this thread inside the namespace (sockets it makes stay
    /// there), then comes back. The session dropped this thread's
    /// CAP_SYS_ADMIN but for such moments.
    pub fn enter<T>(&self, f: impl FnOnce() -> T) -> T {
        let home = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        let there = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        let setns = |ns: &std::fs::File| {
            stackprobe_probes::privileges::entering_namespaces(|| {
                // SAFETY: a plain syscall on a namespace file held open.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error().into());
                }
                Ok(())
            })
            .expect("setns")
        };
        setns(&there);
        let out = f();
        setns(&home);
        out
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

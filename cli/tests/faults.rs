//! Root only: the `stackprobe` binary under hostile conditions (its reader
//! stalled while the ring would overflow, tracefs unmounted under it, the watched
//! process dying or restarting, each ending signal) and what it keeps of
//! root's privileges while it runs.

mod support;

use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use stackprobe_probes::privileges;
use support::*;

/// `(name, mask)` of every Cap* line of every thread of `pid`.
fn capabilities(pid: u32) -> Vec<(String, u64)> {
    let mut caps = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for line in status.lines().filter(|l| l.starts_with("Cap")) {
            let (name, hex) = line.split_once(':').unwrap();
            caps.push((
                name.to_string(),
                u64::from_str_radix(hex.trim(), 16).unwrap(),
            ));
        }
    }
    caps
}

#[test]
fn after_attaching_only_the_needed_capabilities_are_left_and_other_users_processes_are_still_seen()
{
    let _lock = probe_lock();
    require_root();
    // A server owned by nobody: naming its listener's owner needs
    // /proc/PID/fd of another user's process.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args([LOOPBACK, "serve"]);
    let mut server = Server::start_command(cmd, None);
    let pid = server.pid;
    let sp = Running::watch_json(pid, "200ms");
    let caps = capabilities(sp.child.id());
    let kept = privileges::kept_mask();
    for (name, mask) in &caps {
        let want = match name.as_str() {
            "CapInh" | "CapAmb" => 0,
            "CapEff" => kept,
            _ => privileges::permitted_mask(),
        };
        assert_eq!(*mask, want, "{name} of a stackprobe thread: {caps:x?}");
    }
    assert_eq!(caps.len() % 5, 0, "five sets per thread: {caps:?}");

    thread::sleep(Duration::from_millis(300));
    server.accept_queued(9, false, "accept");
    thread::sleep(Duration::from_millis(400));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    assert_eq!(row(&summary, pid).expect("the server")["total"], 9);
    let listener = summary["tcp"]["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["address"] == server.tcp.as_str())
        .unwrap_or_else(|| panic!("nobody's listener not found: {}", summary["tcp"]));
    assert_eq!(listener["pid"], pid);
    assert!(programs_left_loaded().is_empty());
    server.stop();
}

#[test]
fn a_stalled_reader_misses_no_accept() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("stall");
    let path = dir.0.join("s.sock");
    let mut server = Server::start(Some(&path));
    let pid = server.pid;
    let mut sp = Running::start(&["watch", "--pid", &pid.to_string(), "--json"]);
    sp.wait_stderr("probes attached");

    // Stopped, stackprobe reads nothing: more accepts than the ring could
    // hold as records are kept in the kernel's histograms (unix sockets, so
    // accepts are all the probes see).
    sp.signal(libc::SIGSTOP);
    let n = accepts_past_the_ring();
    server.send(&format!("accept {n} unix accept4"));
    let client = Command::new(LOOPBACK)
        .args(["connect", "unix", path.to_str().unwrap(), &n.to_string()])
        .output()
        .unwrap();
    assert!(client.status.success(), "{client:?}");
    server.wait_accepted(n);
    sp.signal(libc::SIGCONT);
    thread::sleep(Duration::from_millis(300));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    let summary = json_lines(&stdout).pop().unwrap();
    let drops = &summary["drops_by_cause"];
    assert_eq!(summary["drops"], 0, "{drops}");
    assert_eq!(drops["hist_full"], 0, "{drops}");
    assert_eq!(summary["events"]["total"], 0, "no accept crosses the ring");
    assert_eq!(row(&summary, pid).expect("the server")["total"], n);
    let accept = &role_row(&summary, "stackprobe-loop")["accept"];
    assert_eq!(accept["total"], n);
    server.stop();
}

#[test]
fn tracefs_unmounted_mid_run_changes_nothing_and_stackprobe_leaves_no_mount_of_its_own() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid.to_string();
    // In a mount namespace of its own, so the host's mounts are untouched:
    // tracefs mounted before stackprobe starts (unless the host had it
    // mounted already), unmounted once it runs.
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "{{ mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing; }} \
             && exec {STACKPROBE} \"$@\""
        ))
        .args([
            "sh",
            "watch",
            "--pid",
            &pid,
            "--json",
            "--interval",
            "200ms",
        ])
        .stdout(Stdio::piped());
    let mut sp = Running::spawn(cmd);
    sp.wait_stderr("probes attached");
    let ns = sp.child.id().to_string();
    let umount = Command::new("nsenter")
        .args(["-t", &ns, "-m", "umount", "/sys/kernel/tracing"])
        .output()
        .unwrap();
    assert!(umount.status.success(), "{umount:?}");
    let mounts = fs::read_to_string(format!("/proc/{ns}/mountinfo")).unwrap();
    assert!(!mounts.contains(" - tracefs "), "{mounts}");

    server.accept_queued(7, false, "accept4");
    thread::sleep(Duration::from_millis(400));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    assert_eq!(row(&summary, server.pid).expect("the server")["total"], 7);
    assert!(programs_left_loaded().is_empty());

    // Without tracefs, stackprobe mounts it to read the tracepoint layouts
    // and unmounts it again once attached.
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "umount /sys/kernel/tracing 2>/dev/null; exec {STACKPROBE} \"$@\""
        ))
        .args(["sh", "watch", "--pid", &pid, "--json"])
        .stdout(Stdio::piped());
    let mut sp = Running::spawn(cmd);
    sp.wait_stderr("probes attached");
    let mounts = fs::read_to_string(format!("/proc/{}/mountinfo", sp.child.id())).unwrap();
    assert!(!mounts.contains(" - tracefs "), "{mounts}");
    server.accept_queued(3, false, "accept");
    thread::sleep(Duration::from_millis(200));
    sp.signal(libc::SIGTERM);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    assert_eq!(row(&summary, server.pid).expect("the server")["total"], 3);
    server.stop();
}

#[test]
fn a_watched_server_that_restarts_is_followed_and_its_first_run_is_reported_exited() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("restart");
    let name = format!("sprest{}x", std::process::id() % 10_000);
    let program = dir.loopback_as(&name);
    let mut first = Server::start_as(&program, None);
    let mut sp = Running::start(&["watch", name.as_str(), "--json", "--interval", "200ms"]);
    sp.wait_stderr("probes attached");
    first.accept_queued(5, false, "accept4");
    let first_pid = first.pid;
    first.stop();
    thread::sleep(Duration::from_millis(300));

    // The same program again, under a new pid, as a service manager restarts it.
    let mut second = Server::start_as(&program, None);
    second.accept_queued(7, false, "accept4");
    thread::sleep(Duration::from_millis(500));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");

    let summary = json_lines(&stdout).pop().unwrap();
    assert!(
        row(&summary, first_pid).is_none(),
        "the first run is not live"
    );
    assert_eq!(
        row(&summary, second.pid).expect("the second run")["total"],
        7
    );
    let r = role_row(&summary, &name);
    assert_eq!(r["accept"]["total"], 12, "both runs' accepts: {r}");
    assert_eq!(r["pids"], serde_json::json!([second.pid]));
    assert_eq!(r["exited"]["total"], 1, "{r}");
    second.stop();
}

#[test]
fn a_watched_pid_that_dies_is_reported_exited_and_the_run_goes_on() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid;
    let mut sp = Running::watch_json(pid, "200ms");
    server.accept_queued(4, false, "accept");
    // SIGKILL: no chance to close anything politely.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    thread::sleep(Duration::from_millis(700));
    assert!(sp.child.try_wait().unwrap().is_none(), "stackprobe ended");
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    assert!(row(&summary, pid).is_none(), "a dead process shown live");
    assert_eq!(summary["watched"], 0);
    let r = role_row(&summary, "stackprobe-loop");
    assert_eq!(
        (&r["accept"]["total"], &r["exited"]["total"]),
        (&4.into(), &1.into()),
        "{r}"
    );
    assert_eq!(r["processes"], 0);
}

#[test]
fn sigint_sigterm_and_sighup_each_end_the_run_with_its_summary_and_nothing_loaded() {
    let _lock = probe_lock();
    require_root();
    let mut server = Server::start(None);
    let pid = server.pid.to_string();
    for (i, sig) in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
        .into_iter()
        .enumerate()
    {
        let mut sp = Running::start(&["watch", "--pid", &pid, "--json", "--interval", "10s"]);
        sp.wait_stderr("probes attached");
        server.accept_queued(i as u64 + 1, false, "accept");
        sp.signal(sig);
        let (status, stdout, stderr) = sp.finish();
        assert_eq!(status.code(), Some(0), "signal {sig}: {status}; {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let summary = json_lines(&stdout).pop().expect("a summary");
        assert_eq!(summary["type"], "summary");
        assert_eq!(
            row(&summary, server.pid).expect("the server")["total"],
            i + 1
        );
        assert!(programs_left_loaded().is_empty(), "signal {sig}");
    }
    server.stop();
}

#[test]
fn a_btf_whose_offsets_do_not_match_the_kernel_is_caught_by_the_load_time_self_check() {
    let _lock = probe_lock();
    require_root();
    // This kernel's BTF with one offset of the accept probe's fd → socket
    // walk moved by 8 bytes: exactly the mistake a BTF from another kernel
    // (or a parser bug) would make.
    let path = "/sys/kernel/btf/vmlinux";
    let mut data = fs::read(path).unwrap();
    let btf = stackprobe_probes::btf::KernelBtf::parse(&data).unwrap();
    let at = btf
        .member_offset_position("file", "private_data")
        .expect("struct file has private_data");
    let bits = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
    data[at..at + 4].copy_from_slice(&(bits + 64).to_le_bytes());
    let dir = TempDir::new("btf");
    let patched = dir.0.join("vmlinux");
    fs::write(&patched, &data).unwrap();

    let out = Command::new(STACKPROBE)
        .args(["watch", "--pid", "1", "--json", "--duration", "1s"])
        .env("STACKPROBE_BTF", &patched)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "self-check failed: the accept probe did not find stackprobe's own test connection"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(programs_left_loaded().is_empty());
}

//! Root only: `watch --log-probes` prints what the kernel probes log, and
//! without it their logging code is not even in the kernel.

mod support;

use std::process::{Command, Stdio};

use stackprobe_probes::{Options, privileges};
use support::*;

/// `(set, mask)` of every Cap* line of every thread of `pid`.
fn capabilities(pid: u32) -> Vec<(String, u64)> {
    let mut caps = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for line in status.lines().filter(|l| l.starts_with("Cap")) {
            let (set, hex) = line.split_once(':').unwrap();
            caps.push((
                set.to_string(),
                u64::from_str_radix(hex.trim(), 16).unwrap(),
            ));
        }
    }
    caps
}

/// Starts the loopback server as `name` while `sp` watches that name: the
/// kernel watches it from its exec, and so sees it listen.
fn start_named_server(sp: &mut Running, dir: &TempDir, name: &str) -> Server {
    sp.wait_stderr("probes attached");
    Server::start_as(&dir.loopback_as(name), None)
}

#[test]
fn log_probes_prints_the_listeners_the_kernel_attributes_connections_to() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("probe-log");
    // The kernel sets comm from the exec'd path's basename.
    let name = format!("splog{}", std::process::id() % 100_000);
    let watch = |extra: &[&str]| {
        let mut cmd = Command::new(STACKPROBE);
        cmd.args(["watch", &name, "--no-tui", "--duration", "20s"])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null());
        Running::spawn(cmd)
    };

    let mut sp = watch(&["--log-probes"]);
    let server = start_named_server(&mut sp, &dir, &name);
    let port = server.tcp.rsplit(':').next().unwrap().to_string();
    // Only the kernel knows this: the server listened after the probes
    // attached, and userspace never looked for its sockets.
    sp.wait_stderr(&format!(
        "port {port} listened on by {}: connections arriving there are its",
        server.pid
    ));
    let line = sp.seen.lines().last().unwrap().to_string();
    assert!(line.starts_with("[DEBUG probes::tcp_state]"), "{line}");
    // The thread printing them, started while loading, kept no more of
    // root's capabilities than the rest of the run.
    for (set, mask) in capabilities(sp.child.id()) {
        let kept = match set.as_str() {
            "CapInh" | "CapAmb" => 0,
            "CapEff" => privileges::kept_mask(),
            _ => privileges::permitted_mask(),
        };
        assert_eq!(mask, kept, "{set} of a stackprobe thread");
    }
    sp.signal(libc::SIGINT);
    let (status, _, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    server.stop();

    let mut sp = watch(&[]);
    let server = start_named_server(&mut sp, &dir, &name);
    server.stop();
    sp.signal(libc::SIGINT);
    let (status, _, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(!stderr.contains("listened on by"), "{stderr}");
}

/// The kernel's translated size of the loaded program `name` (or of its
/// tp_btf twin, `name_btf`, when that is the rung in use), in bytes.
fn translated_size(s: &Session, name: &str) -> u32 {
    let ids = s.collector.probes().program_ids().unwrap();
    let btf_twin = format!("{name}_btf");
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| {
            ids.contains(&p.id())
                && (p.name_as_str() == Some(name) || p.name_as_str() == Some(btf_twin.as_str()))
        })
        .and_then(|p| p.size_translated())
        .unwrap_or_else(|| panic!("{name} is not loaded"))
}

/// Two programs that log and one that does not.
const PROGRAMS: [&str; 3] = ["tcp_state", "accept_exit", "watch_exit"];

#[test]
fn without_log_probes_the_verifier_removes_the_logging_code() {
    let _lock = probe_lock();
    let sizes = |log_probes| {
        let s = Session::try_start(Options {
            log_probes,
            ..Options::default()
        })
        .expect("loading the probes");
        PROGRAMS.map(|p| translated_size(&s, p))
    };
    let (off, on) = (sizes(false), sizes(true));
    for (i, name) in PROGRAMS.iter().enumerate() {
        eprintln!(
            "{name}: {} bytes without --log-probes, {} with",
            off[i], on[i]
        );
    }
    // tcp_state and accept_exit log; watch_exit does not.
    assert!(off[0] < on[0] && off[1] < on[1], "{off:?} vs {on:?}");
    assert_eq!(off[2], on[2]);
}

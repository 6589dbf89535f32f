//! The agent's systemd unit (dist/systemd): systemd's own checker accepts
//! it in a root laid out as `cargo xtask install` lays it out, and its
//! command line, expanded from its EnvironmentFile as systemd expands it,
//! starts an agent that serves metrics and ends cleanly on SIGTERM.
//! Root only (the agent loads probes). systemd is not PID 1 on these
//! machines, so the unit is checked, not started by systemd.

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use support::*;

fn dist(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dist/systemd")
        .join(file)
}

/// `Key=value` in the unit's `[Service]` section (the first such line).
fn directive(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .to_string()
}

/// The command systemd runs: `$NAME` replaced by the words of NAME's
/// value in the environment file (systemd's unbraced expansion splits at
/// whitespace).
fn exec_start(unit: &str, env_file: &str) -> Vec<String> {
    let mut words = Vec::new();
    for word in directive(unit, "ExecStart").split_whitespace() {
        match word.strip_prefix('$') {
            Some(name) => {
                let value = env_file
                    .lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("{name} is not set in the environment file"));
                words.extend(value.trim_matches('"').split_whitespace().map(String::from));
            }
            None => words.push(word.to_string()),
        }
    }
    words
}

#[test]
fn systemd_accepts_the_unit_as_installed() {
    let root = TempDir::new("unit-root");
    let r = |p: &str| root.0.join(p);
    for dir in [
        "usr/local/bin",
        "etc/systemd/system",
        "etc/default",
        "usr/lib/systemd",
    ] {
        std::fs::create_dir_all(r(dir)).unwrap();
    }
    std::fs::copy(STACKPROBE, r("usr/local/bin/stackprobe")).unwrap();
    std::fs::copy(
        dist("stackprobe-agent.service"),
        r("etc/systemd/system/stackprobe-agent.service"),
    )
    .unwrap();
    std::fs::copy(
        dist("stackprobe-agent.default"),
        r("etc/default/stackprobe-agent"),
    )
    .unwrap();
    // The targets the unit is ordered after and wanted by.
    let copied = Command::new("cp")
        .arg("-r")
        .arg("/usr/lib/systemd/system")
        .arg(r("usr/lib/systemd/"))
        .status()
        .unwrap();
    assert!(copied.success());
    let out = Command::new("systemd-analyze")
        .arg(format!("--root={}", root.0.display()))
        .args(["verify", "/etc/systemd/system/stackprobe-agent.service"])
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // Unknown keys and bad values are warnings only: none allowed.
    assert!(said.trim().is_empty(), "{said}");
}

#[test]
fn the_units_command_line_runs_an_agent_that_serves_and_stops_on_sigterm() {
    let _lock = probe_lock();
    require_root();
    let unit = std::fs::read_to_string(dist("stackprobe-agent.service")).unwrap();
    let defaults = std::fs::read_to_string(dist("stackprobe-agent.default")).unwrap();
    assert_eq!(
        directive(&unit, "EnvironmentFile"),
        "/etc/default/stackprobe-agent",
        "the file `cargo xtask install` writes the defaults to"
    );
    let mut argv = exec_start(&unit, &defaults);
    assert_eq!(argv[..2], ["/usr/local/bin/stackprobe", "agent"]);
    // The built binary for the installed one, and a free port for the
    // shipped one (so the test does not need 9464 free): nothing else
    // changes.
    argv[0] = STACKPROBE.into();
    let listen = argv.iter().position(|a| a == "--listen").unwrap();
    assert_eq!(argv[listen + 1], "127.0.0.1:9464");
    argv[listen + 1] = "127.0.0.1:0".into();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdout(std::process::Stdio::piped());
    let mut agent = Running::spawn(cmd);
    agent.wait_stderr("probes attached");
    let addr = agent.metrics_addr();
    let (head, body) = http_get(&addr, "/metrics");
    assert!(head.contains(" 200 "), "{head}");
    assert!(body.contains("stackprobe_cpu_seconds_total"), "{body}");
    // systemd's stop: SIGTERM (KillSignal's default), then SIGKILL after
    // TimeoutStopSec.
    assert!(!unit.contains("KillSignal="));
    let timeout: u64 = directive(&unit, "TimeoutStopSec")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    let stopping = std::time::Instant::now();
    agent.signal(libc::SIGTERM);
    let (status, stdout, stderr) = agent.finish();
    assert!(status.success(), "{stderr}");
    assert!(stopping.elapsed().as_secs() < timeout, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(programs_left_loaded().is_empty());
}

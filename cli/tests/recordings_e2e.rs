//! Root only: recordings as a user makes and reads them: `watch --record`,
//! then `report` and `diff` on the file, checked against what the run
//! itself printed; and a recording that fills its disk.

mod support;

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use support::*;

/// A tmpfs of `kib` KiB mounted on a fresh directory, unmounted on drop.
struct SmallDisk(TempDir);

impl SmallDisk {
    fn mount(kib: u32) -> Self {
        let dir = TempDir::new("small-disk");
        let out = run(Command::new("mount").args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={kib}k"),
            "tmpfs",
            dir.0.to_str().unwrap(),
        ]));
        assert!(out.status.success(), "mount: {out:?}");
        SmallDisk(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = run(Command::new("umount").arg(&self.0.0));
    }
}

#[test]
fn a_full_disk_is_reported_once_and_the_recording_stays_readable() {
    let _lock = probe_lock();
    require_root();
    let disk = SmallDisk::mount(8);
    let file = disk.0.0.join("run.hlog");
    let mut server = Server::start(None);
    let pid = server.pid.to_string();
    // stdout to /dev/null: nobody reads the reports, and a full pipe would
    // stall the run.
    let mut cmd = Command::new(STACKPROBE);
    cmd.args([
        "watch",
        "--pid",
        &pid,
        "--no-tui",
        "--interval",
        "100ms",
        "--record",
    ])
    .arg(&file)
    .stdout(Stdio::null());
    let mut sp = Running::spawn(cmd);
    sp.wait_stderr("probes attached");
    // Accepts in every interval (~190 bytes of recording each) until the
    // 8 KiB are nearly full, bounded in rounds.
    let mut full = false;
    for _ in 0..300 {
        server.accept_queued(5, false, "accept4");
        thread::sleep(Duration::from_millis(30));
        if std::fs::metadata(&file).map_or(0, |m| m.len()) > 6 * 1024 {
            full = true;
            break;
        }
    }
    assert!(full, "the recording never approached the disk's size");
    for _ in 0..30 {
        server.accept_queued(5, false, "accept4");
        thread::sleep(Duration::from_millis(100));
    }
    sp.signal(libc::SIGINT);
    let (status, _, stderr) = sp.finish();
    // Warned once when it happened; the run goes on, prints its summary, and
    // exits 1 because its recording is incomplete.
    assert_eq!(status.code(), Some(1), "{stderr}");
    let warnings = stderr.matches("warning: writing the recording").count();
    assert_eq!(warnings, 1, "the full disk is reported once:\n{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(
        stderr.contains("the recording keeps what was written before"),
        "{stderr}"
    );
    // What was written before the disk filled reads back whole.
    let report = run(Command::new(STACKPROBE).args(["report", file.to_str().unwrap()]));
    assert!(report.status.success(), "{report:?}");
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("· accept"),
        "{report:?}"
    );
    server.stop();
}

/// Counts other than latencies (here accepts whose thread was blocked in
/// accept() at attach) are in the recording too: `report` and `diff` give
/// the exact numbers `watch` gave.
#[test]
fn report_and_diff_give_the_runs_counts_untimed_accepts_included() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("e2e-record-counts");
    let file = dir.0.join("run.hlog");
    let unix_path = dir.0.join("s.sock");
    let mut server = Server::start(Some(&unix_path));
    server.run("accept-threads 9 4", "accepting");
    wait_in_accept(server.pid, 2);
    let pid = server.pid.to_string();
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid,
        "--json",
        "--interval",
        "200ms",
        "--record",
        file.to_str().unwrap(),
    ]);
    sp.wait_stderr("probes attached");
    for _ in 0..9 {
        tcp_connect_and_read(&server.tcp);
    }
    for _ in 0..4 {
        let mut conn = std::os::unix::net::UnixStream::connect(&unix_path).unwrap();
        read_byte_then_eof(&mut conn);
    }
    assert_eq!(server.line(), "accepted 9+4");
    thread::sleep(Duration::from_millis(300));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let role = &summary["roles"][0];
    let (timed, untimed) = (
        role["accept"]["total"].as_u64(),
        role["accept_untimed"]["total"].as_u64(),
    );
    assert_eq!((timed, untimed), (Some(11), Some(2)), "{role}");

    let report =
        run(Command::new(STACKPROBE).args(["report", file.to_str().unwrap(), "--format", "json"]));
    assert!(report.status.success(), "{report:?}");
    let rows = json_lines(&String::from_utf8_lossy(&report.stdout));
    let count = |metric: &str| {
        rows.iter()
            .find(|r| r["metric"] == metric)
            .map(|r| r["count"].as_u64().unwrap())
    };
    assert_eq!(
        (count("accept"), count("accept_untimed")),
        (Some(11), Some(2)),
        "{rows:?}"
    );
    // Only this run's, filtered by --metric like a latency.
    let only = run(Command::new(STACKPROBE).args([
        "report",
        file.to_str().unwrap(),
        "--metric",
        "accept_untimed",
    ]));
    assert!(
        String::from_utf8_lossy(&only.stdout)
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("stackprobe-loop · accept_untimed  count 2 over ")),
        "{only:?}"
    );
    let diff = run(Command::new(STACKPROBE).args([
        "diff",
        file.to_str().unwrap(),
        file.to_str().unwrap(),
        "--json",
    ]));
    let changes = json_lines(&String::from_utf8_lossy(&diff.stdout));
    let untimed = changes
        .iter()
        .find(|c| c["metric"] == "accept_untimed")
        .expect("diff has the untimed accepts");
    assert_eq!(
        (
            untimed["before_count"].as_u64(),
            untimed["after_count"].as_u64()
        ),
        (Some(2), Some(2))
    );
    server.stop();
}

#[test]
fn a_recording_reads_back_with_the_runs_exact_counts() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("e2e-record");
    let file = dir.0.join("run.hlog");
    let mut server = Server::start(None);
    let pid = server.pid.to_string();
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &pid,
        "--json",
        "--interval",
        "300ms",
        "--record",
        file.to_str().unwrap(),
    ]);
    sp.wait_stderr("probes attached");
    server.accept_queued(15, false, "accept4");
    thread::sleep(Duration::from_millis(400));
    server.accept_queued(5, false, "accept");
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(stderr.contains("recorded"), "{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let live = row(&summary, server.pid).unwrap();
    assert_eq!(live["count"], 20);

    let out = run(Command::new(STACKPROBE).args([
        "report",
        file.to_str().unwrap(),
        "--metric",
        "accept",
        "--format",
        "json",
    ]));
    assert!(out.status.success(), "{out:?}");
    let rows = json_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["schema"], "stackprobe.report/3");
    assert_eq!(rows[0]["role"], "stackprobe-loop");
    assert_eq!(rows[0]["count"], 20, "the recording holds every accept");
    // Percentiles from the recording are the run's, within HdrHistogram's
    // 1/128: the run clamps them to its exact extremes, which a recording
    // keeps only as the histogram rounds them.
    for p in ["p50_ns", "p99_ns"] {
        let (a, b) = (rows[0][p].as_f64().unwrap(), live[p].as_f64().unwrap());
        assert!(
            (a - b).abs() <= b / 128.0 + 1.0,
            "{p}: recording {a} vs run {b}"
        );
    }
    let text = run(Command::new(STACKPROBE).args(["report", file.to_str().unwrap()]));
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("stackprobe-loop · accept  count 20"),
        "{text:?}"
    );

    for name in ["run.svg", "run.png"] {
        let path = dir.0.join(name);
        let plotted = run(Command::new(STACKPROBE).args([
            "report",
            file.to_str().unwrap(),
            "--plot",
            path.to_str().unwrap(),
        ]));
        assert!(plotted.status.success(), "{plotted:?}");
    }
    let svg = std::fs::read_to_string(dir.0.join("run.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("stackprobe-loop · accept"),
        "{}",
        &svg[..200.min(svg.len())]
    );
    let png = std::fs::read(dir.0.join("run.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    // A recording cut short (other bad files: tests/bad_input.rs).
    let data = std::fs::read(&file).unwrap();
    let broken = dir.0.join("broken.hlog");
    std::fs::write(&broken, &data[..data.len() - 10]).unwrap();
    assert_fails(
        &run(Command::new(STACKPROBE).args(["report", broken.to_str().unwrap()])),
        1,
        "broken.hlog: line ",
    );
    server.stop();
}

//! Every bad input in the table of docs/faults.md: the message it gets and its exit
//! status (2: the command line is wrong, 1: it is right but cannot be done),
//! and never a panic. The rows that load probes need root.

mod support;

use std::process::{Command, Stdio};

use support::*;

/// (arguments, exit status, part of the message). `{dir}` is a scratch
/// directory holding `garbage.hlog` (not a recording), `empty.hlog` and
/// `link.hlog` (a symlink to garbage.hlog).
const ROWS: &[(&[&str], i32, &str)] = &[
    (&["watch"], 1, "name at least one process to watch"),
    (&["watch", "--pid", "0"], 1, "0 is not a process id"),
    (
        &["watch", "--pid", "abc"],
        2,
        "invalid value 'abc' for '--pid <PID>'",
    ),
    (
        &["watch", "--pid", "4194305"],
        1,
        "no process with pid 4194305",
    ),
    (
        &["watch", "x", "--duration", "-5s"],
        2,
        "unexpected argument '-5'",
    ),
    (
        &["watch", "x", "--duration", "11y"],
        2,
        "must be at most 10 years",
    ),
    (
        &["watch", "x", "--duration", "99999999999999999999s"],
        2,
        "number is too large",
    ),
    (
        &["watch", "x", "--interval", "0s"],
        2,
        "must be at least 10ms",
    ),
    (
        &["watch", "x", "--interval", "soon"],
        2,
        "invalid value 'soon' for '--interval",
    ),
    (
        &["watch", "x", "--listen", "127.0.0.1:99999"],
        2,
        "invalid socket address syntax",
    ),
    (
        &["watch", "x", "--fork-hook", "ebpf"],
        2,
        "invalid value 'ebpf' for '--fork-hook <HOOK>'",
    ),
    (
        &["watch", "x", "--frobnicate"],
        2,
        "unexpected argument '--frobnicate'",
    ),
    (
        &["--json", "watch", "x"],
        2,
        "unexpected argument '--json' found",
    ),
    (
        &["report"],
        2,
        "the following required arguments were not provided",
    ),
    (
        &["report", "/nonexistent/run.hlog"],
        1,
        "reading /nonexistent/run.hlog: No such file",
    ),
    (&["report", "{dir}"], 1, "Is a directory"),
    (
        &["report", "{dir}/garbage.hlog"],
        1,
        "garbage.hlog: line 1: not an interval log line",
    ),
    (
        &["report", "{dir}/empty.hlog"],
        1,
        "empty.hlog: no histograms in this recording",
    ),
    (
        &["report", "{dir}/empty.hlog", "--metric", "bogus"],
        2,
        "invalid value 'bogus' for '--metric",
    ),
    (
        &["report", "{dir}/empty.hlog", "--from", "10s", "--to", "5s"],
        1,
        "--from 10s is not before --to 5s",
    ),
    (
        &["diff", "{dir}/garbage.hlog", "{dir}/empty.hlog"],
        1,
        "garbage.hlog: line 1",
    ),
    (
        &["diff", "{dir}/empty.hlog"],
        2,
        "the following required arguments were not provided",
    ),
    (&["demo", "--rate", "0"], 2, "0 is not in 1..=1000"),
    (&["demo", "--duration", "0s"], 2, "must be at least 1s"),
    // These load the probes before they fail.
    (
        &[
            "watch",
            "x",
            "--record",
            "{dir}/empty.hlog",
            "--duration",
            "1s",
        ],
        1,
        "empty.hlog exists; pass --force to overwrite it",
    ),
    (
        &[
            "watch",
            "x",
            "--record",
            "{dir}/link.hlog",
            "--force",
            "--duration",
            "1s",
        ],
        1,
        "link.hlog is a symbolic link; stackprobe does not write through links",
    ),
    (
        &[
            "watch",
            "x",
            "--record",
            "/nonexistent/dir/x.hlog",
            "--duration",
            "1s",
        ],
        1,
        "creating the recording /nonexistent/dir/x.hlog",
    ),
    (
        &[
            "watch",
            "x",
            "--listen",
            "192.0.2.1:9464",
            "--duration",
            "1s",
        ],
        1,
        "listening on 192.0.2.1:9464 for metrics",
    ),
];

#[test]
fn every_bad_input_gets_its_message_and_exit_status() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("bad-input");
    std::fs::write(dir.0.join("garbage.hlog"), "x").unwrap();
    std::fs::write(dir.0.join("empty.hlog"), "").unwrap();
    std::os::unix::fs::symlink(dir.0.join("garbage.hlog"), dir.0.join("link.hlog")).unwrap();
    let scratch = dir.0.to_str().unwrap();
    for (args, code, message) in ROWS {
        let args: Vec<String> = args.iter().map(|a| a.replace("{dir}", scratch)).collect();
        let out = Command::new(STACKPROBE)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(*code),
            "stackprobe {args:?}: {stderr}"
        );
        assert!(
            stderr.contains(message),
            "stackprobe {args:?}: expected {message:?} in {stderr}"
        );
        assert!(
            !stderr.contains("panicked"),
            "stackprobe {args:?}: {stderr}"
        );
    }
    assert!(
        programs_left_loaded().is_empty(),
        "a failed run left probes loaded"
    );
}

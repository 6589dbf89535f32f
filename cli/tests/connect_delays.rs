//! Connect latency against known delays, with the real probes: a held
//! TCP connect waits for its SYN's retransmission, a held unix connect for
//! an accept. Root only; not run in the qemu guests, whose emulated clocks
//! make the delays' bounds meaningless there (connect_probes counts in them).

mod support;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use support::*;

/// Waits until `pid` sits in connect(2) (its syscall, as /proc shows it).
fn wait_in_connect(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let connect = libc::SYS_connect.to_string();
    loop {
        let now = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if now.split_whitespace().next() == Some(connect.as_str()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} never blocked in connect: {now}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Known delays: a listener whose queue is full (backlog 0, one connection
/// waiting) holds the next connect. Over TCP the kernel drops its SYN, which
/// the client sends again after the initial retransmission timeout (1 s,
/// TCP_TIMEOUT_INIT); a unix connect blocks until an accept makes room,
/// which the test makes 300 ms after the client is seen blocked. Each held
/// connect's latency is at least its delay and at most its delay plus the
/// slack of timers and scheduling: 30 ms, and for the retransmission the
/// timer wheel's own lateness, up to an eighth of the timeout (a 1 s timer
/// at HZ=250 is on the wheel's level of 8-jiffy, 32 ms, steps; 1.031 s was
/// seen).
#[test]
fn connect_latency_is_the_known_delay_of_a_full_listener() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("connect-delay");
    let path = dir.0.join("srv.sock");
    let name = format!("spdelay{}", std::process::id() % 10_000);
    let program = dir.loopback_as(&name);
    let mut server = Server::start_args(
        Path::new(LOOPBACK),
        &["--tcp", "127.0.0.1:0", "--backlog", "0"],
        Some(&path),
    );
    let unix = path.to_str().unwrap().to_string();
    let mut sp = Running::start(&["watch", &name, "--json", "--interval", "300ms"]);
    sp.wait_stderr("waiting for it");

    const UNIX_DELAY: Duration = Duration::from_millis(300);
    const RTO: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_millis(30);
    const WHEEL_SLACK: Duration = Duration::from_millis(125);

    // The first of each takes the queue's one place; the second is held.
    let mut first = connect_client(&program, "tcp", &server.tcp, 1);
    std::thread::sleep(Duration::from_millis(100));
    let mut held = connect_client(&program, "tcp", &server.tcp, 1);
    wait_in_connect(held.id());
    std::thread::sleep(Duration::from_millis(200));
    server.send("accept 2 tcp accept");
    server.wait_accepted(2);
    assert!(first.wait().unwrap().success() && held.wait().unwrap().success());

    let mut first = connect_client(&program, "unix", &unix, 1);
    std::thread::sleep(Duration::from_millis(100));
    let mut held = connect_client(&program, "unix", &unix, 1);
    wait_in_connect(held.id());
    std::thread::sleep(UNIX_DELAY);
    server.send("accept 2 unix accept");
    server.wait_accepted(2);
    assert!(first.wait().unwrap().success() && held.wait().unwrap().success());

    std::thread::sleep(Duration::from_millis(700));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let role = role_row(&summary, &name);
    for (destination, delay, slack) in [
        (server.tcp.as_str(), RTO, WHEEL_SLACK + SLACK),
        (unix.as_str(), UNIX_DELAY, SLACK),
    ] {
        let c = role["connects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["destination"] == destination)
            .unwrap_or_else(|| panic!("no connects to {destination}: {role}"));
        assert_eq!(c["connect"]["total"], 2, "{c}");
        // The held connect is the slower: the histogram's max, exact.
        let max = Duration::from_nanos(c["connect"]["max_ns"].as_u64().unwrap());
        assert!(
            max >= delay && max <= delay + slack,
            "{destination}: held {max:?}, delay {delay:?}: {c}"
        );
        // The one that found room took no delay.
        let min = Duration::from_nanos(c["connect"]["min_ns"].as_u64().unwrap());
        assert!(min < Duration::from_millis(10), "{c}");
    }
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

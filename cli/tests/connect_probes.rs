//! Connect latency on the client side, per destination, with the real
//! probes: TCP (SYN to ESTABLISHED, from the state probe) and unix sockets
//! (the connect syscall), refused and failed connects counted exactly.
//! Root only.

mod support;

use std::{
    os::unix::fs::symlink,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;

/// A client (the loopback binary under the name `name`) making `n`
/// connections of `kind` to `addr`, one after another.
fn client(program: &Path, kind: &str, addr: &str, n: u32) -> Child {
    Command::new(program)
        .args(["connect", kind, addr, &n.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

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

/// The report's row of `role`.
fn role<'a>(report: &'a Value, role: &str) -> &'a Value {
    report["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == role)
        .unwrap_or_else(|| panic!("no role {role} in {report}"))
}

/// The role's connect rows by destination: (successes, refused, failed).
fn connects(report: &Value, name: &str) -> Vec<(String, u64, u64, u64)> {
    role(report, name)["connects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["destination"].as_str().unwrap().to_string(),
                c["latency"]["total"].as_u64().unwrap(),
                c["refused"]["total"].as_u64().unwrap(),
                c["failed"]["total"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// A server on TCP and a unix socket; a client connecting 5 times over TCP
/// and 3 over the unix socket, twice to an abstract unix name and once more
/// after its listener closed, then to a closed TCP port, a unix socket
/// file nobody listens on and a path that does not exist: each destination
/// counted exactly, with its path.
#[test]
fn connects_are_counted_per_destination_with_refused_and_failed() {
    let _lock = probe_lock();
    require_root();
    let dir = TempDir::new("connects");
    let path = dir.0.join("srv.sock");
    let name = format!("spconn{}", std::process::id() % 10_000);
    let program = dir.0.join(&name);
    symlink(LOOPBACK, &program).unwrap();
    let mut server = Server::start(Some(&path));
    // A port nobody listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    // A socket file left by a listener that is gone.
    let stale = dir.0.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let missing = dir.0.join("missing.sock");

    let mut sp = Running::start(&["watch", &name, "--json", "--interval", "300ms"]);
    sp.wait_stderr("waiting for it");
    server.send("accept 5 tcp accept4");
    assert!(
        client(&program, "tcp", &server.tcp, 5)
            .wait()
            .unwrap()
            .success()
    );
    server.wait_accepted(5);
    server.send("accept 3 unix accept");
    let unix = path.to_str().unwrap();
    assert!(client(&program, "unix", unix, 3).wait().unwrap().success());
    server.wait_accepted(3);
    let abstract_name = format!("{name}-abstract");
    let at = format!("@{abstract_name}");
    {
        use std::{io::Write as _, os::linux::net::SocketAddrExt as _, os::unix::net};
        let listener = net::UnixListener::bind_addr(
            &net::SocketAddr::from_abstract_name(&abstract_name).unwrap(),
        )
        .unwrap();
        let served = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = listener.accept().unwrap();
                s.write_all(b"x").unwrap();
            }
        });
        assert!(client(&program, "unix", &at, 2).wait().unwrap().success());
        served.join().unwrap();
    }
    assert!(!client(&program, "unix", &at, 1).wait().unwrap().success());
    for _ in 0..4 {
        assert!(
            !client(&program, "tcp", &closed_addr, 1)
                .wait()
                .unwrap()
                .success()
        );
    }
    for _ in 0..2 {
        let stale = stale.to_str().unwrap();
        assert!(!client(&program, "unix", stale, 1).wait().unwrap().success());
    }
    assert!(
        !client(&program, "unix", missing.to_str().unwrap(), 1)
            .wait()
            .unwrap()
            .success()
    );
    // Past one more interval, so the last read has them all.
    std::thread::sleep(Duration::from_millis(700));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let mut got = connects(&summary, &name);
    got.sort();
    let mut want = vec![
        (server.tcp.clone(), 5, 0, 0),
        (unix.to_string(), 3, 0, 0),
        (at.clone(), 2, 1, 0),
        (closed_addr, 0, 4, 0),
        (stale.to_str().unwrap().to_string(), 0, 2, 0),
        (missing.to_str().unwrap().to_string(), 0, 0, 1),
    ];
    want.sort();
    assert_eq!(got, want, "{summary}");
    let role = role(&summary, &name);
    let paths: Vec<&str> = role["connects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.iter().filter(|&&p| p == "tcp").count(), 2, "{role}");
    assert_eq!(paths.iter().filter(|&&p| p == "unix").count(), 4, "{role}");
    server.stop();
    assert!(programs_left_loaded().is_empty());
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
    let program = dir.0.join(&name);
    symlink(LOOPBACK, &program).unwrap();
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
    let mut first = client(&program, "tcp", &server.tcp, 1);
    std::thread::sleep(Duration::from_millis(100));
    let mut held = client(&program, "tcp", &server.tcp, 1);
    wait_in_connect(held.id());
    std::thread::sleep(Duration::from_millis(200));
    server.send("accept 2 tcp accept");
    server.wait_accepted(2);
    assert!(first.wait().unwrap().success() && held.wait().unwrap().success());

    let mut first = client(&program, "unix", &unix, 1);
    std::thread::sleep(Duration::from_millis(100));
    let mut held = client(&program, "unix", &unix, 1);
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
    let role = role(&summary, &name);
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
        assert_eq!(c["latency"]["total"], 2, "{c}");
        // The held connect is the slower: the histogram's max, exact.
        let max = Duration::from_nanos(c["latency"]["max_ns"].as_u64().unwrap());
        assert!(
            max >= delay && max <= delay + slack,
            "{destination}: held {max:?}, delay {delay:?}: {c}"
        );
        // The one that found room took no delay.
        let min = Duration::from_nanos(c["latency"]["min_ns"].as_u64().unwrap());
        assert!(min < Duration::from_millis(10), "{c}");
    }
    server.stop();
    assert!(programs_left_loaded().is_empty());
}

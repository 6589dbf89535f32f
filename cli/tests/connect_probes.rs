//! Connect latency on the client side, per destination, with the real
//! probes: TCP (SYN to ESTABLISHED, from the state probe) and unix sockets
//! (the connect syscall), refused and failed connects counted exactly.
//! Root only.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;

/// The role's connect rows by destination: (successes, refused, failed).
fn connects(report: &Value, name: &str) -> Vec<(String, u64, u64, u64)> {
    role_row(report, name)["connects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["destination"].as_str().unwrap().to_string(),
                c["connect"]["total"].as_u64().unwrap(),
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
    let program = dir.loopback_as(&name);
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
        connect_client(&program, "tcp", &server.tcp, 5)
            .wait()
            .unwrap()
            .success()
    );
    server.wait_accepted(5);
    server.send("accept 3 unix accept");
    let unix = path.to_str().unwrap();
    assert!(
        connect_client(&program, "unix", unix, 3)
            .wait()
            .unwrap()
            .success()
    );
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
        assert!(
            connect_client(&program, "unix", &at, 2)
                .wait()
                .unwrap()
                .success()
        );
        served.join().unwrap();
    }
    assert!(
        !connect_client(&program, "unix", &at, 1)
            .wait()
            .unwrap()
            .success()
    );
    for _ in 0..4 {
        assert!(
            !connect_client(&program, "tcp", &closed_addr, 1)
                .wait()
                .unwrap()
                .success()
        );
    }
    for _ in 0..2 {
        let stale = stale.to_str().unwrap();
        assert!(
            !connect_client(&program, "unix", stale, 1)
                .wait()
                .unwrap()
                .success()
        );
    }
    assert!(
        !connect_client(&program, "unix", missing.to_str().unwrap(), 1)
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
    let role = role_row(&summary, &name);
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

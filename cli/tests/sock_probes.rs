//! Root only: the TCP iterator against `ss`, on loopback traffic the test
//! makes itself.

mod support;

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use stackprobe::model::sockets::TcpState;
use support::*;

/// `ss -Htan state STATE` lines whose local address (the third column) is `local`.
fn ss_count(state: &str, local: &str) -> usize {
    let out = Command::new("ss")
        .args(["-Htan", "state", state])
        .output()
        .expect("running ss");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some(local))
        .count()
}

#[test]
fn the_iterator_counts_time_wait_and_listen_sockets_as_ss_does() {
    let _lock = probe_lock();
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        let mut server = Server::start_with(Path::new(LOOPBACK), addr, None);
        let mut s = Session::start();
        // The server writes its byte and closes first: TIME_WAIT is its side's.
        server.accept_queued(30, false, "accept4");
        let local: std::net::SocketAddr = server.tcp.parse().unwrap();
        // The last FINs may still be in flight (softirq): wait for all 30,
        // bounded.
        let deadline = Instant::now() + Duration::from_secs(5);
        let (sockets, time_wait) = loop {
            let sockets = s.probes.tcp_sockets().unwrap();
            let n = sockets
                .iter()
                .filter(|k| k.state == TcpState::TimeWait && k.local == local)
                .count();
            if n == 30 || Instant::now() > deadline {
                break (sockets, n);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mine: Vec<String> = sockets
            .iter()
            .filter(|k| k.local == local)
            .map(|k| format!("{:?} {}", k.state, k.remote))
            .collect();
        let ss_all = Command::new("ss").args(["-Htan"]).output().unwrap();
        let ss_mine: Vec<String> = String::from_utf8_lossy(&ss_all.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(3) == Some(server.tcp.as_str()))
            .map(str::to_string)
            .collect();
        assert_eq!(
            time_wait, 30,
            "{addr}: iterator saw {mine:?}; ss: {ss_mine:?}"
        );
        assert_eq!(
            time_wait,
            ss_count("time-wait", &server.tcp),
            "{addr}: ss disagrees"
        );
        let listen: Vec<_> = sockets
            .iter()
            .filter(|k| k.state == TcpState::Listen && k.local == local)
            .collect();
        assert_eq!(listen.len(), 1, "{addr}");
        assert!(listen[0].ino != 0, "a listening socket has an inode");
        assert!(listen[0].max_backlog > 0);
        assert_eq!(listen[0].backlog, 0, "everything was accepted");
        // Its inode is the one /proc shows for the server's fd.
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", server.pid))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        assert!(
            fds.contains(&format!("socket:[{}]", listen[0].ino)),
            "{fds:?}"
        );
        drop(s);
        server.stop();
    }
}

//! Root only: servers in network namespaces the tests make themselves (as
//! a container's are), their clients in there too, against `ss` run inside.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

/// A network namespace with its loopback up, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("sp-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    /// `program args…` run inside.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Its inode number, as the links name it.
    fn inum(&self, pid: u32) -> u32 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .ino() as u32
    }

    /// `ss -Htan state STATE` lines inside whose local address is `local`.
    fn ss_count(&self, state: &str, local: &str) -> u64 {
        let out = self
            .command("ss", &["-Htan", "state", state])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(2) == Some(local))
            .count() as u64
    }

    /// A loopback server inside, listening on `tcp`.
    fn server(&self, tcp: &str) -> Server {
        let mut cmd = self.command(LOOPBACK, &["serve", "--tcp", tcp]);
        cmd.current_dir("/");
        Server::start_command(cmd, None)
    }

    /// `n` connections from inside to `addr`, each waiting for the
    /// server's byte and its close.
    fn connect(&self, addr: &str, n: u64) {
        let out = self
            .command(LOOPBACK, &["connect", "tcp", addr, &n.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// The server's passive link in its namespace: (TIME_WAIT now, opens, closes).
fn passive_link(s: &Session, addr: &str, inum: u32) -> (u64, u64, u64) {
    let peer = format!("{addr} ← 127.0.0.1 in net:[{inum}]");
    s.collector
        .table()
        .links
        .iter()
        .filter(|(k, _)| k.peer == peer)
        .fold((0, 0, 0), |(tw, o, c), (_, st)| {
            (tw + st.time_wait, o + st.opens.total, c + st.closes.total)
        })
}

/// Walks and reads until `done` holds (bounded): the last FINs may still be
/// in flight.
fn observe_until(s: &mut Session, done: impl Fn(&Session) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        s.collect();
        s.sync();
        s.collector.observe_sockets().unwrap();
        if done(s) || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn queue_waits(s: &Session, pid: u32) -> u64 {
    s.collector
        .table()
        .get(pid)
        .map_or(0, |p| p.activity.accept_queue.total.count())
}

#[test]
fn a_server_in_its_own_network_namespace_is_seen_as_ss_sees_it_there() {
    let _lock = probe_lock();
    let ns = Netns::new("one");
    let mut server = ns.server("127.0.0.1:0");
    let inum = ns.inum(server.pid);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.sync();
    // The first walk finds the listener in there and tells the kernel who
    // owns its port.
    s.collector.observe_sockets().unwrap();

    let n = 100;
    server.send(&format!("accept {n} tcp accept4"));
    ns.connect(&server.tcp, n);
    server.wait_accepted(n);
    observe_until(&mut s, |s| passive_link(s, &server.tcp, inum) == (n, n, n));

    assert_eq!(
        passive_link(&s, &server.tcp, inum),
        (n, n, n),
        "TIME_WAIT, opens, closes on the server's link in net:[{inum}]: {:?}",
        s.collector.table().links.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        ns.ss_count("time-wait", &server.tcp),
        n,
        "ss in the namespace"
    );
    assert_eq!(s.accepts(server.pid), n);
    assert_eq!(
        queue_waits(&s, server.pid),
        n,
        "an accept-queue wait per accept"
    );
    let listeners = s.collector.table().links.listening();
    let listener = listeners
        .iter()
        .find(|l| l.owner == server.pid)
        .unwrap_or_else(|| panic!("no listener of the server: {listeners:?}"));
    assert_eq!(
        (listener.local.to_string(), listener.netns),
        (server.tcp.clone(), Some(inum))
    );
    assert_eq!(listener.max_backlog, 128, "the listener's backlog limit");
    server.stop();
}

#[test]
fn the_same_port_in_two_namespaces_is_two_listeners_with_their_own_counts() {
    let _lock = probe_lock();
    let addr = "127.0.0.1:18555";
    let (ns_a, ns_b) = (Netns::new("a"), Netns::new("b"));
    let mut a = ns_a.server(addr);
    let mut b = ns_b.server(addr);
    let (inum_a, inum_b) = (ns_a.inum(a.pid), ns_b.inum(b.pid));
    assert_ne!(inum_a, inum_b);
    let mut s = Session::start();
    for pid in [a.pid, b.pid] {
        s.collector.probes_mut().watch_pid(pid).unwrap();
    }
    s.sync();
    s.collector.observe_sockets().unwrap();

    let (n_a, n_b) = (12, 7);
    a.send(&format!("accept {n_a} tcp accept4"));
    b.send(&format!("accept {n_b} tcp accept4"));
    ns_a.connect(addr, n_a);
    ns_b.connect(addr, n_b);
    a.wait_accepted(n_a);
    b.wait_accepted(n_b);
    observe_until(&mut s, |s| {
        passive_link(s, addr, inum_a) == (n_a, n_a, n_a)
            && passive_link(s, addr, inum_b) == (n_b, n_b, n_b)
    });

    assert_eq!(
        (
            passive_link(&s, addr, inum_a),
            passive_link(&s, addr, inum_b)
        ),
        ((n_a, n_a, n_a), (n_b, n_b, n_b)),
        "links: {:?}",
        s.collector.table().links.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        (
            ns_a.ss_count("time-wait", addr),
            ns_b.ss_count("time-wait", addr)
        ),
        (n_a, n_b),
        "ss in each namespace"
    );
    assert_eq!((queue_waits(&s, a.pid), queue_waits(&s, b.pid)), (n_a, n_b));
    let mut listeners: Vec<_> = s
        .collector
        .table()
        .links
        .listening()
        .iter()
        .filter(|l| l.local.to_string() == addr)
        .map(|l| (l.owner, l.netns))
        .collect();
    listeners.sort();
    let mut want = vec![(a.pid, Some(inum_a)), (b.pid, Some(inum_b))];
    want.sort();
    assert_eq!(listeners, want);
    a.stop();
    b.stop();
}

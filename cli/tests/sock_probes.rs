//! Root only: the TCP iterator against `ss`, on loopback traffic the test
//! makes itself.

mod support;

use stackprobe_model::measure::Latency;
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use clap::ValueEnum as _;
use stackprobe_model::tcp::sockets::TcpState;
use stackprobe_probes::{
    Options,
    rungs::{QueueRung, StateRung},
    tcp,
};
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
fn the_state_probe_is_on_tp_btf_wherever_the_kernel_can_serve_it() {
    // The classic tracepoint loses changes silently on kernels before 6.7
    // (while another BPF program or a map syscall holds the CPU): a
    // verifier refusing the tp_btf copies, as 6.1's did for 32 bytes of
    // stack over its 512, must fail here rather than fall back unseen.
    let _lock = probe_lock();
    let s = Session::start();
    let probes = s.collector.probes();
    match probes.state_btf_refused() {
        None => assert_eq!(probes.state_rung(), StateRung::BtfTracepoint),
        Some(why) => assert_eq!(why, tcp::SK_PROTOCOL_BITFIELD, "tp_btf refused"),
    }
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
            let sockets = s.collector.probes_mut().tcp_sockets().unwrap();
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

fn link_time_wait(s: &Session, owner: Option<&str>, peer: &str) -> u64 {
    s.collector
        .table()
        .links
        .iter()
        .filter(|(k, _)| k.owner.as_deref() == owner && k.peer == peer)
        .map(|(_, st)| st.time_wait)
        .sum()
}

fn link<'a>(
    s: &'a Session,
    owner: &str,
    peer: &str,
) -> &'a stackprobe_model::tcp::counts::LinkStats {
    s.collector
        .table()
        .links
        .iter()
        .find(|(k, _)| k.owner.as_deref() == Some(owner) && k.peer == peer)
        .map(|(_, st)| st)
        .unwrap_or_else(|| {
            panic!(
                "no link {owner} {peer}: {:?}",
                s.collector.table().links.iter().collect::<Vec<_>>()
            )
        })
}

/// The loopback server's link from 127.0.0.1 clients to its listener at
/// `tcp`, once `n` of its connections closed (bounded wait).
fn server_link_closed<'a>(
    s: &'a mut Session,
    tcp: &str,
    n: u64,
) -> &'a stackprobe_model::tcp::counts::LinkStats {
    let server_side = format!("{tcp} ← 127.0.0.1");
    observe_until(s, |s| {
        s.collector
            .table()
            .links
            .iter()
            .any(|(k, st)| k.peer == server_side && st.closes.total == n)
    });
    link(s, "stackprobe-loop", &server_side)
}

#[test]
fn a_client_that_closes_first_owns_its_time_wait_sockets() {
    let _lock = probe_lock();
    let dir = TempDir::new("tw-client");
    let name = format!("sptw{}c", std::process::id() % 100_000);
    let client = dir.loopback_as(&name);
    // A connect may take over a TIME_WAIT socket towards the same server
    // (loopback reuse, once a second has passed since its last segment,
    // which a slow guest's 20 connects take): ss then counts fewer than
    // the connections made.
    let _no_reuse = Sysctl::set("net.ipv4.tcp_tw_reuse", "0");
    // A reset ends a TIME_WAIT socket (RFC 1337's "assassination"): in the
    // slow guests, 2 of the 20 went with as many resets sent (Tcp OutRsts),
    // for ss and stackprobe alike. Honouring RFC 1337 keeps them.
    let _keep_on_reset = Sysctl::set("net.ipv4.tcp_rfc1337", "1");
    let mut server = Server::start(None);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    let selector = stackprobe_model::selector::Selector::new(vec![name.clone()], vec![]).unwrap();
    s.collector
        .probes_mut()
        .watch_names(&selector.kernel_comm_keys())
        .unwrap();
    s.sync();
    s.collector.observe_sockets().unwrap();

    // A kernel whose TIME_WAIT table is full (a small guest, after the
    // thousands of connections of earlier tests) makes no timewait socket
    // for a close, and counts it (TCPTimeWaitOverflow, among the counters
    // taken here): those sockets are not in TIME_WAIT, for ss nor for
    // stackprobe, though the close went through FIN_WAIT2.
    let counters_before = TcpCounters::now();
    let n = 20;
    server.send(&format!("accept-wait {n} tcp"));
    let out = Command::new(&client)
        .args([
            "connect",
            "tcp",
            &server.tcp,
            &n.to_string(),
            "--close-first",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // The client has exited; its links carry its name (its role).
    let client_role = name.as_str();
    server.wait_accepted(n);
    let to_server = format!("→ {}", server.tcp);
    let server_side = format!("{} ← 127.0.0.1", server.tcp);
    // Each socket enters TIME_WAIT just before its CLOSE change is reported,
    // and the server's end closes only when the client's last ACK arrives,
    // after that: wait for all three.
    let closes = |s: &Session, owner: &str, peer: &str| -> u64 {
        s.collector
            .table()
            .links
            .iter()
            .filter(|(k, _)| k.owner.as_deref() == Some(owner) && k.peer == peer)
            .map(|(_, st)| st.closes.total)
            .sum()
    };
    let in_time_wait = |now: &TcpCounters| {
        let overflows = now.gained(&counters_before, "TcpExt:TCPTimeWaitOverflow") as u64;
        n - overflows.min(n)
    };
    observe_until(&mut s, |s| {
        link_time_wait(s, Some(client_role), &to_server) == in_time_wait(&TcpCounters::now())
            && closes(s, client_role, &to_server) == n
            && closes(s, "stackprobe-loop", &server_side) == n
    });

    // What ss counts for that port pair: every TIME_WAIT socket towards the server.
    let ss_states = ss_states_towards(&server.tcp);
    let ss_count = ss_states.get("TIME-WAIT").copied().unwrap_or(0) as u64;
    let counters_after = TcpCounters::now();
    let in_time_wait = in_time_wait(&counters_after);
    let counters = counters_after.since(&counters_before);
    eprintln!("TCP counters during the test: {counters:?}");
    let c = link(&s, client_role, &to_server);
    assert_eq!(
        (
            c.time_wait,
            c.new_time_wait.total,
            c.opens.total,
            c.closes.total,
            c.aborts.total,
            ss_count
        ),
        (in_time_wait, n, n, n, 0, in_time_wait),
        "the client's link: TIME_WAIT, new TIME_WAIT, opens, closes, aborts; ss's \
         TIME_WAIT ({} of {n} closes found the TIME_WAIT table full). Links {:?}; drops {:?}; \
         ss's sockets towards the server by state {:?}; TCP counters meanwhile {:?}",
        n - in_time_wait,
        s.collector.table().links.iter().collect::<Vec<_>>(),
        s.collector.probes().drops().unwrap(),
        ss_states,
        counters
    );
    assert_eq!(
        link_time_wait(&s, Some("stackprobe-loop"), &server_side),
        0,
        "no TIME_WAIT for the server"
    );
    let srv = link(&s, "stackprobe-loop", &server_side);
    assert_eq!(
        (srv.opens.total, srv.closes.total),
        (n, n),
        "passive opens and closes"
    );
    server.stop();
}

#[test]
fn a_server_that_closes_first_owns_the_time_wait_sockets() {
    let _lock = probe_lock();
    let mut server = Server::start(None);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.sync();
    s.collector.observe_sockets().unwrap();

    let n = 15;
    // The server writes its byte and closes; the (unwatched) test client
    // waits for that before closing.
    server.accept_queued(n, false, "accept4");
    let server_side = format!("{} ← 127.0.0.1", server.tcp);
    observe_until(&mut s, |s| {
        link_time_wait(s, Some("stackprobe-loop"), &server_side) == n
    });

    let srv = link(&s, "stackprobe-loop", &server_side);
    assert_eq!(srv.time_wait, n);
    assert_eq!(
        srv.time_wait as usize,
        ss_count("time-wait", &server.tcp),
        "ss disagrees"
    );
    assert_eq!((srv.opens.total, srv.closes.total), (n, n));
    assert_eq!(
        link_time_wait(&s, None, &server_side),
        0,
        "no unknown closers"
    );
    server.stop();
}

#[test]
fn connections_belong_to_the_process_that_accepts_them_not_the_listeners_holder() {
    let _lock = probe_lock();
    let dir = TempDir::new("acceptor");
    // Two watched processes with names of their own: the server that
    // accepts, and one the kernel is first told holds its listener (as a
    // master that accepts nothing would).
    let acceptor_bin = dir.loopback_as("sp-acceptor");
    let holder_bin = dir.loopback_as("sp-holder");
    let mut server = Server::start_as(&acceptor_bin, None);
    let holder = Server::start_as(&holder_bin, None);
    let mut s = Session::start();
    for pid in [server.pid, holder.pid] {
        s.collector.probes_mut().watch_pid(pid).unwrap();
    }
    s.sync();
    s.collector.observe_sockets().unwrap();
    let port: u16 = server.tcp.rsplit(':').next().unwrap().parse().unwrap();
    s.collector
        .probes_mut()
        .set_listen_owner(None, port, holder.pid)
        .unwrap();

    // One connection at a time: the first completes its handshake before
    // anyone accepted there, so it is the holder's; its accept hands the
    // port to the acceptor, whose are all the others.
    let n = 12;
    server.send(&format!("accept {n} tcp accept4"));
    for _ in 0..n {
        tcp_connect_and_read(&server.tcp);
    }
    server.wait_accepted(n);
    let passive = format!("{} ← 127.0.0.1", server.tcp);
    observe_until(&mut s, |s| {
        s.collector.table().links.iter().any(|(k, st)| {
            k.owner.as_deref() == Some("sp-acceptor")
                && k.peer == passive
                && st.closes.total == n - 1
        })
    });
    let acceptor = link(&s, "sp-acceptor", &passive);
    assert_eq!(
        (acceptor.opens.total, acceptor.closes.total),
        (n - 1, n - 1)
    );
    let first = link(&s, "sp-holder", &passive);
    assert_eq!((first.opens.total, first.closes.total), (1, 1));
    server.stop();
    holder.stop();
}

/// The accept-queue hooks that must work on this kernel:
/// `STACKPROBE_EXPECT_QUEUE_HOOKS` (comma-separated; `cargo xtask vm-test`
/// sets it per kernel of the matrix), else only the fd walk, which every
/// supported kernel has.
fn expected_queue_hooks() -> Vec<QueueRung> {
    std::env::var("STACKPROBE_EXPECT_QUEUE_HOOKS")
        .unwrap_or_else(|_| "fd-walk".into())
        .split(',')
        .map(|h| QueueRung::from_str(h.trim(), true).expect("an accept-queue hook name"))
        .collect()
}

#[test]
fn accept_queue_wait_is_the_time_a_connection_waited_to_be_accepted_on_every_hook() {
    let _lock = probe_lock();
    let expected = expected_queue_hooks();
    let mut worked = Vec::new();
    for hook in QueueRung::LADDER {
        let dir = TempDir::new("queue");
        let mut server = Server::start(Some(&dir.0.join("s.sock")));
        // With the kernel's run-time statistics, to compare what each rung costs.
        let forced = Options {
            queue_rung: Some(hook),
            probe_cost: true,
            ..Options::default()
        };
        let Some(mut s) = forced_session(forced, &format!("{hook:?}"), expected.contains(&hook))
        else {
            continue;
        };
        assert_eq!(s.collector.probes().queue_rung(), hook);
        s.collector.probes_mut().watch_pid(server.pid).unwrap();
        // Tells the kernel the server owns its listening sockets.
        s.collector.refresh().unwrap();
        s.collector.observe_sockets().unwrap();

        // Prompt: each connection is accepted right after it queued.
        server.accept_queued(5, false, "accept4");
        // Unix connections wait in their queue too: every rung finds their
        // socket for the unix queue's own hook.
        server.accept_queued(2, true, "accept");
        s.collect();
        let a = &s.collector.table().get(server.pid).unwrap().activity;
        assert_eq!(a.latency[Latency::Accept].total.count(), 7, "{hook:?}");
        let prompt = a.latency[Latency::AcceptQueue].total.summary();
        assert_eq!(prompt.count, 7, "{hook:?}");
        assert!(
            prompt.max_ns < 100_000_000,
            "{hook:?}: a prompt accept waited {}ns",
            prompt.max_ns
        );

        // Slow: the connection waits 300 ms in the queue.
        let mut c = std::net::TcpStream::connect(&server.tcp).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        server.send("accept 1 tcp accept4");
        read_byte_then_eof(&mut c);
        server.wait_accepted(1);
        s.collect();
        let all = &s
            .collector
            .table()
            .get(server.pid)
            .unwrap()
            .activity
            .latency[Latency::AcceptQueue]
            .total;
        assert_eq!(all.count(), 8, "{hook:?}");
        let slow = all.summary().max_ns;
        assert!(
            (300_000_000..2_000_000_000).contains(&slow),
            "{hook:?}: the queued connection waited {slow}ns"
        );
        // One line per rung: cargo xtask vm-test puts it in its table.
        eprintln!(
            "queue hook cost {hook:?}: {}",
            rung_costs(&s, &["accept_exit", "inet_csk"])
        );
        worked.push(hook);
        drop(s);
        server.stop();
    }
    for hook in &expected {
        assert!(worked.contains(hook), "{hook:?} did not work: {worked:?}");
    }
    let s = Session::start();
    assert_eq!(
        s.collector.probes().queue_rung(),
        worked[0],
        "the default is the best that works"
    );
}

/// A loopback server listening with `backlog` that accepts nothing until
/// told, and a session watching it, its listener known.
fn watched_listener(backlog: u32) -> (Server, Session) {
    let server = Server::start_args(
        Path::new(LOOPBACK),
        &["--tcp", "127.0.0.1:0", "--backlog", &backlog.to_string()],
        None,
    );
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.sync();
    s.collector.observe_sockets().unwrap();
    (server, s)
}

/// `pid`'s listening socket, as the last walk found it.
fn listener_of(s: &Session, pid: u32) -> &stackprobe_model::tcp::snapshot::Listener {
    s.collector
        .table()
        .links
        .listening()
        .iter()
        .find(|l| l.owner == pid)
        .expect("the server's listener")
}

#[test]
fn a_full_accept_queue_shows_its_depth_at_the_limit_and_counts_overflows() {
    let _lock = probe_lock();
    let (server, mut s) = watched_listener(2);

    // The server never accepts: the queue fills, then the kernel drops.
    let mut held = Vec::new();
    for _ in 0..8 {
        if let Ok(c) = std::net::TcpStream::connect_timeout(
            &server.tcp.parse().unwrap(),
            Duration::from_millis(300),
        ) {
            held.push(c);
        }
    }
    s.collector.observe_sockets().unwrap();
    let listener = listener_of(&s, server.pid);
    assert_eq!(listener.max_backlog, 2);
    assert!(
        listener.backlog >= listener.max_backlog,
        "depth {} of {}",
        listener.backlog,
        listener.max_backlog
    );
    let (start, _, now) = s.collector.table().links.counters().unwrap();
    assert!(
        now.since(&start).listen_overflows > 0,
        "no listen overflow counted"
    );
    drop(held);
    server.stop();
}

/// While nothing watched changes, a report does not walk the sockets again
/// (an idle stackprobe's largest cost) and still says its counts are
/// current; connections arriving at a watched listener make the next one
/// walk, and it shows them queued.
#[test]
fn an_idle_watch_skips_walks_until_something_watched_changes() {
    let _lock = probe_lock();
    let (server, mut s) = watched_listener(16);
    // A report once a walk's budget (2000 times its cost) has passed, so
    // that only what changed decides; well before the 30 s cap.
    let report = |s: &mut Session| {
        let took = Duration::from_micros(s.collector.table().links.last_snapshot().1);
        std::thread::sleep(
            (took * 2000 + Duration::from_millis(300)).max(Duration::from_millis(1100)),
        );
        s.collector.tick(|f| Ok(f.report.tcp.clone())).unwrap()
    };
    // The first report sees the server join the watch set.
    report(&mut s);
    let walks = s.collector.table().links.walks();
    let tcp = report(&mut s);
    assert_eq!(
        s.collector.table().links.walks(),
        walks,
        "nothing changed, yet it walked"
    );
    assert!(
        tcp.walk_age_ms < 1000,
        "counts known current, {} ms",
        tcp.walk_age_ms
    );

    // The server never accepts: three connections wait in its queue.
    let held: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(&server.tcp).expect("connecting"))
        .collect();
    report(&mut s);
    assert_eq!(s.collector.table().links.walks(), walks + 1);
    let listener = listener_of(&s, server.pid);
    assert_eq!(listener.backlog, 3);
    drop(held);
    server.stop();
}

#[test]
fn under_connection_churn_no_state_change_is_skipped_and_every_one_counts() {
    use stackprobe_probes::rungs::StateRung;
    let _lock = probe_lock();
    let mut server = Server::start(None);
    let mut s = Session::start();
    if s.collector.probes().state_rung() != StateRung::BtfTracepoint {
        eprintln!("the tp_btf rung is not in use here: nothing to check");
        return;
    }
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.sync();
    s.collector.observe_sockets().unwrap();

    // Bounded loopback churn: two unwatched clients at once, so state
    // changes in softirq land while the other CPU's probe runs.
    let n: u64 = 2000;
    server.send(&format!("accept {n} tcp accept4"));
    let clients: Vec<_> = (0..2)
        .map(|_| {
            Command::new(LOOPBACK)
                .args(["connect", "tcp", &server.tcp, &(n / 2).to_string()])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in clients {
        assert!(c.wait().unwrap().success());
    }
    server.wait_accepted(n);
    let srv = server_link_closed(&mut s, &server.tcp, n).clone();
    let drops = s.collector.probes().drops().unwrap();
    assert_eq!(
        (srv.opens.total, srv.closes.total, srv.aborts.total),
        (n, n, 0),
        "{drops:?}"
    );
    assert_eq!(drops.skipped.tcp_state, 0, "{drops:?}");
    assert_eq!(drops.total(), 0, "{drops:?}");
    server.stop();
}

/// Entries now in the kernel's hash map of sockets that found their slot
/// taken (the map of that name stackprobe loaded).
fn spilled_sockets() -> usize {
    use aya::maps::{HashMap, Map, MapData, loaded_maps};
    loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str() == Some(probes_common::sock::TRACKED_MAP))
        .map(|m| {
            let data = MapData::from_id(m.id()).unwrap();
            HashMap::<_, u64, probes_common::sock::TrackedSocket>::try_from(Map::HashMap(data))
                .unwrap()
                .keys()
                .count()
        })
        .sum()
}

#[test]
fn thousands_of_sockets_held_at_once_are_all_followed_even_when_they_share_a_slot() {
    let _lock = probe_lock();
    // A watched listener that never accepts, and n connections held open
    // at once: the kernel follows each from its arrival, in the slot its
    // address picks; with n = 3000 of 65536 slots, about 70 find theirs
    // taken and go to the hash map instead.
    let n: u64 = 3000;
    let (server, mut s) = watched_listener(4096);

    // Room for n sockets and the test's own files.
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit calls on structs of the right type.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let limit = libc::rlimit {
            rlim_cur: old.rlim_cur.max(n + 256),
            rlim_max: old.rlim_max.max(n + 256),
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    let addr: std::net::SocketAddr = server.tcp.parse().unwrap();
    let held: Vec<_> = (0..n)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let spilled = spilled_sockets();
    assert!(
        spilled > 0,
        "{n} sockets held and none in the hash map: the spill path went untested"
    );
    // The clients close, then the listener with its queue: every queued
    // connection is reset (CLOSE_WAIT → CLOSE, an abort).
    drop(held);
    server.stop();
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) };
    let srv = server_link_closed(&mut s, &addr.to_string(), n);
    assert_eq!(
        (srv.opens.total, srv.closes.total, srv.aborts.total),
        (n, n, n),
        "{spilled} of {n} in the hash map"
    );
    assert_eq!(spilled_sockets(), 0, "sockets still followed after closing");
    let drops = s.collector.probes().drops().unwrap();
    assert_eq!(drops.total(), 0, "{drops:?}");
}

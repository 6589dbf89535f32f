//! Root only: the request's path through a pool of workers that serve one
//! connection at a time (a php-fpm pool), with more clients than workers:
//! each connection's wait in the listener's queue, against the server's
//! own clock (its accept's return minus the client's stamp before its
//! connect), on every rung this kernel has, for TCP and unix listeners, with
//! the clients watched and not; each connection's service time against the
//! time the worker held it; and the most connections the pool held at once.

mod support;

use std::process::Command;

use stackprobe_model::{histogram::LatencyHistogram, measure::Latency, process::Span};
use stackprobe_probes::{
    Options,
    rungs::{UnixQueueRung, UnixServiceRung},
};
use support::*;

const WORKERS: u64 = 2;
const CLIENTS: u64 = 6;
const SERVICE_MS: u64 = 40;

/// What the server's own clock measured of one pool run, and the
/// clients' of their connects and their connections' lives.
struct Served {
    waits_sum: u64,
    waits_max: u64,
    held_sum: u64,
    held_max: u64,
    connects_ns: u64,
    longest_life_ns: u64,
}

/// Has the server's pool serve [`CLIENTS`] connections from a client
/// process (watched if `watch_client`), all at once.
fn serve_pool(s: &mut Session, server: &mut Server, kind: &str, watch_client: bool) -> Served {
    let addr = match kind {
        "unix" => server.unix.as_ref().unwrap().to_str().unwrap().to_string(),
        _ => server.tcp.clone(),
    };
    server.run(
        &format!("pool {WORKERS} {CLIENTS} {kind} {SERVICE_MS}"),
        "pooling",
    );
    wait_in_accept(server.pid, WORKERS as usize);
    let mut client = Command::new(LOOPBACK);
    client.args(["clients", kind, &addr, &CLIENTS.to_string()]);
    let client = client.stdout(std::process::Stdio::piped()).spawn().unwrap();
    if watch_client {
        s.collector.probes_mut().watch_pid(client.id()).unwrap();
    }
    let out = client.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (connects_ns, longest_life_ns) = stdout
        .trim()
        .strip_prefix(&format!("connected {CLIENTS} in "))
        .and_then(|rest| rest.strip_suffix(" ns"))
        .and_then(|rest| rest.split_once(" ns of connects, the longest life "))
        .and_then(|(c, l)| Some((c.parse().ok()?, l.parse().ok()?)))
        .unwrap_or_else(|| panic!("clients' reply {stdout:?}"));
    let line = server.line();
    let words: Vec<&str> = line.split_whitespace().collect();
    let ["pooled", n, "waits", sum, _, max, "held", hsum, hmax] = words.as_slice() else {
        panic!("pool reply {line:?}");
    };
    assert_eq!(n.parse::<u64>().unwrap(), CLIENTS);
    s.collect();
    Served {
        waits_sum: sum.parse().unwrap(),
        waits_max: max.parse().unwrap(),
        held_sum: hsum.parse().unwrap(),
        held_max: hmax.parse().unwrap(),
        connects_ns,
        longest_life_ns,
    }
}

fn latency(s: &Session, pid: u32, l: Latency) -> LatencyHistogram {
    s.collector.table().get(pid).unwrap().activity.latency[l]
        .total
        .clone()
}

/// The probes' queue waits against the server's: as many as connections,
/// each the server's less the stretch its clock adds around the kernel's:
/// the part of the connect before the enqueue, which the clients measure
/// (a watched client's connect runs probes, and a guest's vCPU may be
/// preempted inside it for ms), and the accept's return to userspace, a
/// few µs to ms on a loaded CI machine; on the syscall rung the probe's
/// start is the connect's entry, which the client's stamp just precedes.
/// Returns by how much the probes' sum falls short of the server's.
fn assert_queue_wait(queue: &LatencyHistogram, served: &Served, what: &str) -> u64 {
    let sum = queue.sum_ns() as u64;
    let summary = queue.summary();
    assert_eq!(summary.count, CLIENTS, "{what}: {summary:?}");
    assert!(
        sum <= served.waits_sum,
        "{what}: the probes' waits ({sum} ns in all) exceed the server's ({} ns)",
        served.waits_sum
    );
    let slack = served.connects_ns + CLIENTS * 3_000_000;
    assert!(
        served.waits_sum - sum <= slack,
        "{what}: the probes' waits ({sum} ns in all) fall short of the server's ({} ns) by more than {slack} ns",
        served.waits_sum
    );
    // The longest wait is the server's longest, less at most the stretches
    // the sums differ by (the kernel keeps max and sum exact): one
    // preempted connect in a guest can take a few ms of that alone.
    assert!(
        summary.max_ns <= served.waits_max
            && served.waits_max - summary.max_ns <= served.waits_sum - sum,
        "{what}: {summary:?} (sum {sum} ns) against the server's longest wait {} ns (sum {} ns)",
        served.waits_max,
        served.waits_sum
    );
    served.waits_sum - sum
}

/// Each connection held its worker at least [`SERVICE_MS`], and at most
/// as long as the server's clock says, from the accept's return to the
/// close's, plus the accept's return, where the service starts: that
/// stretch is in the server's queue wait too, so the queue waits'
/// `shortfall` (the probes' sum under the server's) bounds it. The pool
/// held at most [`WORKERS`] at once.
fn assert_service(s: &mut Session, pid: u32, served: &Served, shortfall: u64, what: &str) {
    let service = latency(s, pid, Latency::Service);
    let (sum, service) = (service.sum_ns() as u64, service.summary());
    let held = SERVICE_MS * 1_000_000;
    assert_eq!(service.count, CLIENTS, "{what}: {service:?}");
    assert!(
        service.min_ns >= held
            && service.max_ns <= served.held_max + shortfall
            && sum <= served.held_sum + shortfall,
        "{what}: each connection was held {SERVICE_MS} ms: {service:?} (sum {sum} ns) against the server's longest hold {} ns (sum {} ns) and a queue shortfall of {shortfall} ns",
        served.held_max,
        served.held_sum
    );
    let busy = s.collector.probes_mut().take_busy().unwrap();
    let (_, b, max) = busy
        .iter()
        .find(|(server, _, _)| *server == pid)
        .unwrap_or_else(|| panic!("{what}: no busy count for {pid}: {busy:?}"));
    assert_eq!((b.open, *max), (0, WORKERS), "{what}: {busy:?}");
}

/// Watches `server`, has its pool serve the clients, and checks the queue
/// waits, accepts, service times and busy count the probes saw.
fn check_pool(s: &mut Session, mut server: Server, kind: &str, watch_client: bool, name: &str) {
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.collector.refresh().unwrap();
    s.collector.observe_sockets().unwrap();
    let served = serve_pool(s, &mut server, kind, watch_client);
    let what = format!("{name}, client watched: {watch_client}");
    let shortfall = assert_queue_wait(
        &latency(s, server.pid, Latency::AcceptQueue),
        &served,
        &what,
    );
    assert_eq!(s.accepts(server.pid), CLIENTS, "{what}");
    assert_service(s, server.pid, &served, shortfall, &what);
    if kind == "tcp" && watch_client {
        assert_held(s, &server.tcp, &served, &what);
    }
    server.stop();
}

/// The watched client's connections to `destination`, each held from its
/// SYN through its queue wait and its service to the client's close after
/// the server's byte: at least [`SERVICE_MS`], at most the longest life
/// the client's clock saw (its connect's start to its close's return).
fn assert_held(s: &Session, destination: &str, served: &Served, what: &str) {
    let held: Vec<_> = s
        .collector
        .table()
        .roles(Span::Whole)
        .into_values()
        .filter_map(|(_, a)| a.connects.get(destination).cloned())
        .collect();
    let [c] = held.as_slice() else {
        panic!("{what}: one role connected to {destination}: {held:?}");
    };
    let held = c.latency[Latency::Held].total.summary();
    assert_eq!(held.count, CLIENTS, "{what}: {held:?}");
    assert!(
        held.min_ns >= SERVICE_MS * 1_000_000 && held.max_ns <= served.longest_life_ns,
        "{what}: held {held:?}, the client's longest connection {} ns",
        served.longest_life_ns
    );
}

/// With `--unix-service-time`: the best rung (fentry where the kernel
/// takes it, else the close and exit probes).
fn unix_service_session() -> Session {
    Session::try_start(Options {
        unix_service: true,
        ..Options::default()
    })
    .expect("loading the probes")
}

/// Without `--unix-service-time`, a unix pool's queue is timed, and its
/// connections are served only where the kernel takes fentry (cheap
/// there); else they start no service (no hook would see them end), while
/// a TCP pool's are served as ever.
#[test]
fn without_unix_service_time_a_unix_pool_is_served_only_where_fentry_sees_its_end() {
    let _lock = probe_lock();
    let dir = TempDir::new("unix-off");
    let mut s = Session::start();
    let rung = s.collector.probes().unix_service_rung();
    assert!(
        rung.is_none() || rung == Some(UnixServiceRung::Fentry),
        "{rung:?}"
    );
    if takes_fentry() {
        assert_eq!(rung, Some(UnixServiceRung::Fentry));
    }
    let server = Server::start(Some(&dir.0.join("off.sock")));
    if rung.is_some() {
        check_pool(&mut s, server, "unix", false, "unix, fentry by default");
    } else {
        let mut server = server;
        s.collector.probes_mut().watch_pid(server.pid).unwrap();
        s.collector.refresh().unwrap();
        let served = serve_pool(&mut s, &mut server, "unix", false);
        assert_queue_wait(
            &latency(&s, server.pid, Latency::AcceptQueue),
            &served,
            "unix, no service time",
        );
        assert_eq!(latency(&s, server.pid, Latency::Service).summary().count, 0);
        let busy = s.collector.probes_mut().take_busy().unwrap();
        assert!(
            busy.iter()
                .all(|(server_pid, _, _)| *server_pid != server.pid),
            "{busy:?}"
        );
        server.stop();
    }
    check_pool(
        &mut s,
        Server::start(None),
        "tcp",
        false,
        "tcp, no unix service time",
    );
}

/// Each unix service rung the kernel offers times the same pool's
/// connections exactly and counts its busy workers.
#[test]
fn a_unix_pools_service_time_is_the_same_on_every_rung() {
    let _lock = probe_lock();
    let dir = TempDir::new("unix-service");
    for rung in UnixServiceRung::LADDER {
        let options = Options {
            unix_service_rung: Some(rung),
            ..Options::default()
        };
        let expected = rung == UnixServiceRung::Close || takes_fentry();
        let Some(mut s) = forced_session(options, rung.name(), expected) else {
            continue;
        };
        assert_eq!(s.collector.probes().unix_service_rung(), Some(rung));
        let server = Server::start(Some(&dir.0.join("pool.sock")));
        check_pool(&mut s, server, "unix", false, rung.name());
    }
}

fn unix_rungs() -> Vec<(Option<UnixQueueRung>, &'static str)> {
    vec![
        (None, "best rung"),
        (Some(UnixQueueRung::Fentry), "fentry"),
        (Some(UnixQueueRung::DataReady), "data-ready"),
        (Some(UnixQueueRung::Syscalls), "syscalls"),
    ]
}

#[test]
fn a_unix_pools_queue_wait_matches_the_servers_clock_on_every_rung() {
    let _lock = probe_lock();
    let dir = TempDir::new("unix-pool");
    for (rung, name) in unix_rungs() {
        // data-ready needs 6.3, fentry a kernel that takes it: where the
        // kernel lacks them, the load says so.
        let expected = match rung {
            Some(UnixQueueRung::DataReady) => has_data_ready(),
            Some(UnixQueueRung::Fentry) => takes_fentry(),
            _ => true,
        };
        let options = Options {
            unix_queue_rung: rung,
            unix_service: true,
            ..Options::default()
        };
        let Some(mut s) = forced_session(options, name, expected) else {
            continue;
        };
        if rung.is_none() && takes_fentry() {
            assert_eq!(
                s.collector.probes().unix_queue_rung(),
                UnixQueueRung::Fentry
            );
        }
        for watch_client in [false, true] {
            let server = Server::start(Some(&dir.0.join("pool.sock")));
            check_pool(&mut s, server, "unix", watch_client, name);
        }
    }
}

#[test]
fn a_tcp_pools_queue_wait_matches_the_servers_clock() {
    let _lock = probe_lock();
    let mut s = Session::start();
    for watch_client in [false, true] {
        check_pool(&mut s, Server::start(None), "tcp", watch_client, "tcp");
    }
}

/// Whether this kernel has the tracepoint the data-ready rung needs.
fn has_data_ready() -> bool {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|t| std::path::Path::new(&format!("{t}/events/sock/sk_data_ready")).exists())
}

/// A postgres-like server: the acceptor forks a child per connection and
/// closes its copy; the child holds the connection until it exits. The
/// service ends at the child's exit, not at the acceptor's close.
#[test]
fn a_connection_handed_to_a_child_is_served_until_the_child_exits() {
    let _lock = probe_lock();
    let dir = TempDir::new("fork-hold");
    let mut s = unix_service_session();
    for kind in ["unix", "tcp"] {
        let mut server = Server::start(Some(&dir.0.join("fork.sock")));
        s.collector.probes_mut().watch_pid(server.pid).unwrap();
        s.collector.refresh().unwrap();
        let addr = match kind {
            "unix" => server.unix.as_ref().unwrap().to_str().unwrap().to_string(),
            _ => server.tcp.clone(),
        };
        server.send(&format!("serve-fork 3 {kind} {SERVICE_MS} hold"));
        let out = Command::new(LOOPBACK)
            .args(["connect", kind, &addr, "3", "--close-first"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(server.line(), "served 3");
        s.collect();
        let service = latency(&s, server.pid, Latency::Service).summary();
        let held = SERVICE_MS * 1_000_000;
        assert_eq!(service.count, 3, "{kind}: {service:?}");
        assert!(
            service.min_ns >= held && service.max_ns <= held + 50_000_000,
            "{kind}: each child held its connection {SERVICE_MS} ms: {service:?}"
        );
        server.stop();
    }
}

/// The pool's busy row in the collector's summary: at most its 2 workers'
/// connections at once, and on average the service time it held over the
/// time since the probes loaded.
#[test]
fn a_pools_busy_row_says_how_many_connections_it_held() {
    let _lock = probe_lock();
    let dir = TempDir::new("busy");
    let mut s = unix_service_session();
    let mut server = Server::start(Some(&dir.0.join("busy.sock")));
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.collector.refresh().unwrap();
    serve_pool(&mut s, &mut server, "unix", false);
    let report = s.collector.finish(|f| Ok(f.report.clone())).unwrap();
    let role = report
        .roles
        .iter()
        .find(|r| r.pids.contains(&server.pid))
        .unwrap_or_else(|| panic!("no role for {}: {report:?}", server.pid));
    let busy = role.busy.as_ref().expect("a busy row");
    assert_eq!(
        (busy.max, busy.now, busy.processes),
        (WORKERS, 0, 1),
        "{busy:?}"
    );
    let served = latency(&s, server.pid, Latency::Service).sum_ns() as f64;
    let held = busy.mean * report.elapsed_s * 1e9;
    assert!(
        (held - served).abs() <= served * 0.05,
        "mean {} over {} s is {held} ns held, the services add up to {served} ns",
        busy.mean,
        report.elapsed_s
    );
    server.stop();
}

//! Root only: loads the real probes, makes known loopback traffic and checks
//! what the probes saw, accept by accept.

mod support;

use stackprobe_model::measure::{Count, Latency};
use std::{
    thread,
    time::{Duration, Instant},
};

use aya::maps::PerCpuValues;
use probes_common::{
    hist::{HISTS_MAP, HISTS_SPARE_MAP, HistKey, HistMetric, HistValue},
    watch::WatchReason,
};
use stackprobe_model::{probe_stats::Drops, selector::Selector};
use stackprobe_probes::Options;
use support::*;

#[test]
fn counts_exactly_the_watched_servers_tcp_and_unix_accepts() {
    let _lock = probe_lock();
    let dir = TempDir::new("exact");
    let mut watched = Server::start(Some(&dir.0.join("watched.sock")));
    let mut other = Server::start(Some(&dir.0.join("other.sock")));
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(watched.pid).unwrap();

    watched.accept_queued(25, false, "accept4");
    watched.accept_queued(15, false, "accept");
    watched.accept_queued(10, true, "accept4");
    watched.accept_queued(7, true, "accept");
    other.accept_queued(20, false, "accept4");
    other.accept_queued(5, true, "accept");
    s.collect();

    assert_eq!(s.accepts(watched.pid), 25 + 15 + 10 + 7);
    assert_eq!(
        s.accepts(other.pid),
        0,
        "an unwatched server must not be reported"
    );
    assert!(s.collector.table().get(other.pid).is_none());
    let summary = s
        .collector
        .table()
        .get(watched.pid)
        .unwrap()
        .activity
        .latency[Latency::Accept]
        .total
        .summary();
    // Every connection was already queued: each accept is a few µs of work.
    // Bounds are loose because CI machines are noisy, but they are bounds.
    assert!(summary.min_ns > 0, "{summary:?}");
    assert!(
        summary.max_ns < 100_000_000,
        "a queued accept took {}ns",
        summary.max_ns
    );
    assert_eq!(s.collector.probes().drops().unwrap(), Drops::default());
    assert_eq!(s.collector.undecodable(), 0);
    watched.stop();
    other.stop();
}

/// Non-blocking accepts that find the queue empty (EAGAIN) are counted,
/// exactly, and are no accepts.
#[test]
fn non_blocking_accepts_that_find_no_connection_are_counted_apart() {
    let _lock = probe_lock();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let me = std::process::id();
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(me).unwrap();
    let mut would_block = 0;
    for _ in 0..23 {
        let e = listener.accept().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        would_block += 1;
    }
    // One that does find a connection is an accept, not an empty one.
    let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let _conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                would_block += 1;
                assert!(Instant::now() < deadline, "the connection never arrived");
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    };
    s.collect();
    let a = &s.collector.table().get(me).unwrap().activity;
    // Exactly as many as returned EAGAIN here (the waits for the
    // connection included): no other thread of this process accepts.
    assert_eq!(a.counts[Count::AcceptEmpty].total, would_block);
    assert_eq!(a.latency[Latency::Accept].total.count(), 1);
    assert_eq!(s.collector.probes().drops().unwrap(), Drops::default());
}

#[test]
fn accepts_already_blocked_at_attach_are_counted_with_their_latency_unknown() {
    let _lock = probe_lock();
    let dir = TempDir::new("blocked");
    let unix_path = dir.0.join("blocked.sock");
    let mut server = Server::start(Some(&unix_path));
    // A thread blocked in accept on each listener before the probes attach:
    // the first accept of each has no start the probes saw.
    server.run("accept-threads 37 21", "accepting");
    wait_in_accept(server.pid, 2);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();

    for _ in 0..37 {
        tcp_connect_and_read(&server.tcp);
    }
    for _ in 0..21 {
        let mut conn = std::os::unix::net::UnixStream::connect(&unix_path).unwrap();
        read_byte_then_eof(&mut conn);
    }
    assert_eq!(server.line(), "accepted 37+21");
    s.collect();

    let a = &s.collector.table().get(server.pid).unwrap().activity;
    assert_eq!(
        (
            a.latency[Latency::Accept].total.count(),
            a.counts[Count::AcceptUntimed].total
        ),
        (37 + 21 - 2, 2),
        "every accept counted; the two blocked at attach without a latency"
    );
    let text = s
        .collector
        .finish(|frame| {
            let role = &frame.report.roles[0];
            assert_eq!(
                role.latency[Latency::Accept].latency.count
                    + role.counts[Count::AcceptUntimed].count,
                58
            );
            assert_eq!(role.counts[Count::AcceptUntimed].count, 2);
            let json = stackprobe_output::view::json::render(&frame.report);
            assert!(
                json.contains(r#""accept_untimed":{"count":2,"total":2}"#),
                "{json}"
            );
            Ok(stackprobe_output::view::text::render(&frame.report))
        })
        .unwrap();
    assert!(
        text.contains("accepts 56") && text.contains("accepts of unknown latency 2"),
        "{text}"
    );
    assert_eq!(s.collector.probes().drops().unwrap(), Drops::default());
    server.stop();
}

#[test]
fn a_blocking_accept_includes_its_wait() {
    let _lock = probe_lock();
    let mut server = Server::start(None);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();

    server.send("accept 1 tcp accept4");
    let wait = Duration::from_millis(300);
    thread::sleep(wait);
    tcp_connect_and_read(&server.tcp);
    server.wait_accepted(1);
    s.collect();

    let summary = s
        .collector
        .table()
        .get(server.pid)
        .unwrap()
        .activity
        .latency[Latency::Accept]
        .total
        .summary();
    assert_eq!(summary.count, 1);
    // The server entered accept within moments of the command, then waited.
    assert!(
        summary.max_ns >= 250_000_000,
        "latency {}ns should include the 300ms wait",
        summary.max_ns
    );
    assert!(
        summary.max_ns < 5_000_000_000,
        "latency {}ns",
        summary.max_ns
    );
    server.stop();
}

#[test]
fn a_child_forked_by_a_watched_process_is_watched() {
    let _lock = probe_lock();
    let mut server = Server::start(None);
    let parent = server.pid;
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(parent).unwrap();

    // Forked after the probes attached: only the kernel's fork probe can know.
    let child = server.fork();
    assert_ne!(child, parent);
    server.accept_queued(7, false, "accept4");
    s.collect();

    assert_eq!(s.accepts(child), 7);
    assert_eq!(s.accepts(parent), 0);
    assert!(
        s.collector
            .probes()
            .watched()
            .contains(&(child, Some(WatchReason::Forked)))
    );
    let watched: Vec<u32> = s
        .collector
        .probes()
        .watched()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert!(
        watched.contains(&child) && watched.contains(&parent),
        "{watched:?}"
    );
    server.stop();
}

#[test]
fn a_process_that_execs_into_a_watched_name_is_watched_from_its_first_accept() {
    let _lock = probe_lock();
    let dir = TempDir::new("exec");
    // The server under a name of its own, and that name with a version
    // suffix.
    let name = format!("splb{}x", std::process::id() % 100_000);
    let plain = dir.loopback_as(&name);
    let versioned = dir.loopback_as(&format!("{name}8.2"));
    let mut s = Session::start();
    let selector = Selector::new(vec![name.clone()], vec![]).unwrap();
    s.collector
        .probes_mut()
        .watch_names(&selector.kernel_comm_keys())
        .unwrap();

    let mut a = Server::start_as(&plain, None);
    let mut b = Server::start_as(&versioned, None);
    let mut unrelated = Server::start(None);
    a.accept_queued(5, false, "accept4");
    b.accept_queued(3, false, "accept");
    unrelated.accept_queued(4, false, "accept4");
    s.collect();

    assert_eq!(s.accepts(a.pid), 5);
    assert_eq!(s.accepts(b.pid), 3);
    assert_eq!(s.accepts(unrelated.pid), 0);
    // Only the kernel's exec probe could have added them: nothing in
    // userspace scanned /proc in this test.
    let reasons = s.collector.probes().watched();
    for pid in [a.pid, b.pid] {
        assert!(
            reasons.contains(&(pid, Some(WatchReason::Exec))),
            "{pid}: {reasons:?}"
        );
    }
    assert_eq!(s.collector.table().get(a.pid).unwrap().name, name);
    a.stop();
    b.stop();
    unrelated.stop();
}

#[test]
fn exited_processes_leave_the_watch_set() {
    let _lock = probe_lock();
    let server = Server::start(None);
    let pid = server.pid;
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(pid).unwrap();
    assert!(
        s.collector
            .probes()
            .watched()
            .iter()
            .any(|&(p, _)| p == pid)
    );
    server.stop();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s
        .collector
        .probes()
        .watched()
        .iter()
        .any(|&(p, _)| p == pid)
    {
        assert!(
            Instant::now() < deadline,
            "pid {pid} stayed in the watch set after exiting"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn dropping_the_probes_detaches_and_unloads_every_program() {
    let _lock = probe_lock();
    let s = Session::try_start(Options {
        unix_service: true,
        run_queue: true,
        ..Options::default()
    })
    .unwrap();
    let ids = s.collector.probes().program_ids().unwrap();
    assert_eq!(
        ids.len(),
        PROGRAM_NAMES.len()
            + unix_service_program_names(s.collector.probes().unix_service_rung()).len()
            + probes_common::run_queue::PROGRAMS.len()
            + fork_program_names(s.collector.probes().fork_rung()).len()
            + queue_program_names(s.collector.probes().queue_rung()).len()
            + unix_queue_program_names(s.collector.probes().unix_queue_rung()).len()
            + state_extra_programs(s.collector.probes().state_rung())
    );
    let loaded = loaded_stackprobe_programs();
    assert!(
        ids.iter().all(|id| loaded.contains(id)),
        "{ids:?} not all in {loaded:?}"
    );
    drop(s);
    let after = programs_left_loaded();
    assert!(
        ids.iter().all(|id| !after.contains(id)),
        "still loaded: {after:?}"
    );
}

#[test]
fn more_accepts_than_the_ring_buffer_holds_are_all_counted_and_none_crosses_it() {
    let _lock = probe_lock();
    let dir = TempDir::new("ring");
    let path = dir.0.join("s.sock");
    let mut server = Server::start(Some(&path));
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();

    // More accepts than the ring could hold as records, with nobody
    // reading meanwhile: the kernel's histograms keep them all. Unix
    // sockets, so that accepts are the only thing the probes see.
    let n = accepts_past_the_ring();
    server.send(&format!("accept {n} unix accept4"));
    let client = std::process::Command::new(LOOPBACK)
        .args(["connect", "unix", path.to_str().unwrap(), &n.to_string()])
        .output()
        .unwrap();
    assert!(client.status.success(), "{client:?}");
    server.wait_accepted(n);

    assert_eq!(s.collect(), 0, "no accept goes through the ring buffer");
    let drops = s.collector.probes().drops().unwrap();
    assert_eq!(drops.total(), 0, "{drops:?}");
    assert_eq!(s.accepts(server.pid), n);
    let summary = s
        .collector
        .table()
        .get(server.pid)
        .unwrap()
        .activity
        .latency[Latency::Accept]
        .total
        .summary();
    assert!(
        summary.min_ns > 0 && summary.max_ns < 10_000_000_000,
        "{summary:?}"
    );
    // Reading again adds nothing: each sample is merged once.
    assert_eq!(s.collect(), 0);
    assert_eq!(s.accepts(server.pid), n);
    server.stop();
}

/// The ids of the kernel maps named `name` loaded now.
fn map_ids(name: &str) -> Vec<u32> {
    aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str() == Some(name))
        .map(|m| m.id())
        .collect()
}

type Hists = aya::maps::PerCpuHashMap<aya::maps::MapData, HistKey, HistValue>;

fn hists(id: u32) -> Hists {
    let data = aya::maps::MapData::from_id(id).unwrap();
    Hists::try_from(aya::maps::Map::PerCpuHashMap(data)).unwrap()
}

/// Samples the histograms of `tgid`'s `metric` in `map` hold, on every CPU.
fn held(map: &Hists, tgid: u32, metric: HistMetric) -> u64 {
    map.iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.tgid == tgid && k.metric == metric as u32)
        .map(|(_, v)| v.iter().map(|h| h.count).sum::<u64>())
        .sum()
}

/// A histogram the kernel had to keep in the spare map (its first map's
/// allocator was empty when the key appeared) is moved to the first map by
/// userspace, and its old entry read a last time and removed: no sample is
/// lost or counted twice on the way.
#[test]
fn histograms_in_the_spare_map_move_to_the_first_without_losing_a_sample() {
    let _lock = probe_lock();
    let mut watched = Server::start(None);
    let spare_before = map_ids(HISTS_SPARE_MAP);
    let first_before = map_ids(HISTS_MAP);
    let mut s = Session::start();
    let new_map = |name: &str, before: &[u32]| {
        let id = map_ids(name).into_iter().find(|id| !before.contains(id));
        hists(id.expect("the session's map"))
    };
    let mut spare = new_map(HISTS_SPARE_MAP, &spare_before);
    let first = new_map(HISTS_MAP, &first_before);
    // As the kernel does when the first map cannot allocate: the key, made
    // in the spare map (for every listener fd the server may have).
    let cpus = aya::util::nr_cpus().unwrap();
    for path in 0..=48 {
        let key = HistKey {
            tgid: watched.pid,
            metric: HistMetric::Accept as u32,
            path,
        };
        let zero = PerCpuValues::try_from(vec![HistValue::ZERO; cpus]).unwrap();
        spare.insert(key, zero, 0).unwrap();
    }
    s.collector.probes_mut().watch_pid(watched.pid).unwrap();

    watched.accept_queued(25, false, "accept4");
    assert_eq!(
        held(&spare, watched.pid, HistMetric::Accept),
        25,
        "the kernel must have used the spare map"
    );
    s.collect();
    assert_eq!(s.accepts(watched.pid), 25);

    // Moved over the next intervals (an insert may find the kernel's cache
    // of values empty, and waits for the next), then read a last time and
    // removed; nothing recorded meanwhile.
    let in_spare = |spare: &Hists| {
        spare
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == watched.pid)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while in_spare(&spare) > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(120));
        s.collect();
    }
    assert_eq!(in_spare(&spare), 0, "the spare entries must have gone");
    assert_eq!(s.accepts(watched.pid), 25);

    // The kernel records in the first map now.
    watched.accept_queued(15, false, "accept");
    assert_eq!(held(&first, watched.pid, HistMetric::Accept), 15);
    s.collect();
    assert_eq!(s.accepts(watched.pid), 40);

    watched.accept_queued(10, false, "accept4");
    s.collect();
    assert_eq!(s.accepts(watched.pid), 50);
    assert_eq!(s.collector.probes().drops().unwrap(), Drops::default());
    watched.stop();
}

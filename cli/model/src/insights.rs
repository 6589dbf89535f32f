//! What the numbers mean: rules over one report that name a known problem
//! and the numbers it fired on. No rule fires on too little data.

use super::{
    histogram::duration,
    measure::Latency,
    probe_stats::{SERVICE_RUNG, SERVICE_TCP_ONLY},
    report::{ListenerLatencyRow, PathComparison, Report, ReportKind, RoleRow, path_kind},
    roles::{self, Kind},
};

mod run_queue;

pub use run_queue::{MIN_RUN_QUEUE_MEAN_NS, MIN_RUN_QUEUE_SHARE, MIN_RUN_QUEUE_WAITS};

/// At least this many accepts in the period before judging forks per accept.
pub const MIN_ACCEPTS: u64 = 20;
/// New TIME_WAIT sockets per second on one link worth a word.
pub const MIN_TIME_WAIT_PER_S: f64 = 100.0;

/// Fills `report.insights`: a pass of its own after the report is built,
/// so the report knows nothing of the rules.
pub fn annotate(report: &mut Report) {
    report.insights = insights(report);
}

/// An accept-queue wait (p99) worth a word.
pub const MIN_QUEUE_WAIT_NS: u64 = 10_000_000;

/// Queue waits a full pool makes worth a word: this many, this long (p90).
pub const MIN_POOL_WAITS: u64 = 5;
pub const MIN_POOL_WAIT_NS: u64 = 1_000_000;

/// A role whose server held as many connections as it may (its configured
/// limit, or all its processes) while connections waited in its queue:
/// the setting to raise and the numbers behind it.
fn pool_full(role: &RoleRow) -> Option<String> {
    let busy = role.busy.as_ref().filter(|b| b.at_limit())?;
    let queue = &role.latency[Latency::AcceptQueue].latency;
    if queue.count < MIN_POOL_WAITS || queue.p90_ns < MIN_POOL_WAIT_NS {
        return None;
    }
    let of = match &busy.limit {
        Some(l) => format!("{} is {} ({})", l.setting, l.value, l.source),
        None => format!("it has {} processes", busy.processes),
    };
    let service = &role.latency[Latency::Service].latency;
    let serve = if service.count > 0 {
        format!(", each connection held {} (p50)", duration(service.p50_ns))
    } else {
        String::new()
    };
    let raise = match roles::kind(&role.role) {
        Kind::PhpFpm => "raise pm.max_children (as memory allows) or make requests faster",
        Kind::Postmaster => {
            "raise max_connections, or put a pooler (pgbouncer) in front and keep connections open"
        }
        Kind::Nginx => "raise worker_connections or worker_processes",
        Kind::Generic => "add workers or make each connection cheaper",
    };
    Some(format!(
        "{}: all workers busy: {} connections held at once, {of}; {:.1} busy on average{serve}; connections wait {} (p90) in its queue: {raise}",
        role.role,
        busy.max,
        busy.mean,
        duration(queue.p90_ns)
    ))
}

/// A role whose unix listener's connections wait in its queue while
/// stackprobe does not follow unix connections' service (see
/// `--unix-service-time`): whether its workers are all busy is not
/// measured, and said so.
fn unix_service_off(report: &Report, role: &RoleRow) -> Option<String> {
    let off = report
        .rungs
        .iter()
        .any(|r| r.metric == SERVICE_RUNG && r.hook == SERVICE_TCP_ONLY);
    if !off {
        return None;
    }
    let l = role.listeners.iter().find(|l| {
        let queue = &l.latency[Latency::AcceptQueue].latency;
        path_kind(&l.listener) == "unix"
            && queue.count >= MIN_POOL_WAITS
            && queue.p90_ns >= MIN_POOL_WAIT_NS
    })?;
    Some(format!(
        "{}: connections wait {} (p90) in the queue of {}; how many of its workers are busy, and how long each holds a connection, are not measured for unix sockets on this kernel (no fentry) without --unix-service-time (a probe on every close(2) on the host)",
        role.role,
        duration(l.latency[Latency::AcceptQueue].latency.p90_ns),
        l.listener
    ))
}

/// Why connections wait to be accepted, as it is for this kind of role, and
/// the knob that helps.
fn accept_queue(role: &RoleRow) -> String {
    let wait = format!(
        "{}: connections wait {} (p99) in the accept queue",
        role.role,
        duration(role.latency[Latency::AcceptQueue].latency.p99_ns)
    );
    let fork = if role.latency[Latency::Fork].latency.count > 0 {
        format!(
            " (a fork takes {} p50)",
            duration(role.latency[Latency::Fork].latency.p50_ns)
        )
    } else {
        String::new()
    };
    let forks_per_connection = role.forks_per_accept.is_some_and(|r| r >= 0.9);
    match roles::kind(&role.role) {
        Kind::Postmaster => format!(
            "{wait}: the postmaster accepts and forks one connection at a time{fork}, so each new connection waits for the forks before it: use persistent connections or a pooler (pgbouncer)"
        ),
        Kind::Generic if forks_per_connection => format!(
            "{wait}: it forks a process per connection between accepts{fork}, so each new connection waits for the forks before it: use persistent connections or hand connections to workers started in advance"
        ),
        Kind::Nginx => format!(
            "{wait}: nginx's workers take connections more slowly than they come: raise worker_processes (up to one per core) or worker_connections, or find what blocks a worker"
        ),
        Kind::PhpFpm => format!(
            "{wait}: every pool worker is busy with a request: raise pm.max_children (as memory allows) or make requests faster"
        ),
        Kind::Generic => format!(
            "{wait}: it accepts more slowly than connections come: add accepting threads or processes, or make each connection cheaper"
        ),
    }
}

/// A listener that lost `lost` connections at its full queue in the
/// period, and what to raise, as it is for a unix socket or TCP and for
/// the kind of role.
fn listener_lost(role: &RoleRow, l: &ListenerLatencyRow, lost: u64) -> String {
    let backlog = match (l.backlog, l.max_backlog) {
        (Some(n), Some(max)) => format!(" (backlog {n}/{max} now)"),
        _ => String::new(),
    };
    let what = format!(
        "{}: {} lost {lost} connection{} at its full queue{backlog}",
        role.role,
        l.listener,
        if lost == 1 { "" } else { "s" }
    );
    let unix = path_kind(&l.listener) == "unix";
    let fix = match (unix, roles::kind(&role.role)) {
        (_, Kind::PhpFpm) => {
            "raise the pool's listen.backlog (net.core.somaxconn caps it) and, if its workers are all busy, pm.max_children; or make requests faster"
        }
        (true, _) => {
            "raise the backlog the server listens with (net.core.somaxconn caps it), or serve faster: more workers, faster requests"
        }
        (false, Kind::Nginx) => {
            "raise net.core.somaxconn and the listen directive's backlog= (511 by default), or let nginx take connections faster (worker_processes, worker_connections)"
        }
        (false, _) => {
            "raise net.core.somaxconn and the server's listen backlog, or accept faster: more workers, faster requests"
        }
    };
    format!("{what}: {fix}")
}

/// One sentence per finding, with the fix.
pub fn insights(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for role in &report.roles {
        let accepts = role.latency[Latency::Accept].latency.count;
        if let Some(ratio) = role.forks_per_accept
            && accepts >= MIN_ACCEPTS
            && ratio >= 0.9
        {
            let lifetime = if role.latency[Latency::ChildLifetime].latency.count > 0 {
                format!(
                    " and its children live {}",
                    duration(role.latency[Latency::ChildLifetime].latency.p50_ns)
                )
            } else {
                String::new()
            };
            out.push(format!(
                    "{} forks {:.2} processes per accepted connection ({:.0}/s){lifetime}: use persistent connections or a pooler",
                    role.role, ratio, role.latency[Latency::Fork].rate_per_s
                ));
        }
        if let Some(full) = pool_full(role) {
            out.push(full);
        } else if let Some(unserved) = unix_service_off(report, role) {
            out.push(unserved);
        } else if role.latency[Latency::AcceptQueue].latency.count >= MIN_ACCEPTS
            && role.latency[Latency::AcceptQueue].latency.p99_ns >= MIN_QUEUE_WAIT_NS
        {
            out.push(accept_queue(role));
        }
        for l in &role.listeners {
            if let Some(lost) = l.lost.filter(|c| c.count > 0) {
                out.push(listener_lost(role, l, lost.count));
            }
        }
        out.extend(run_queue::waiting_for_cpu(report, role));
    }
    if report.kind == ReportKind::Interval {
        for link in &report.tcp.links {
            if link.new_time_wait_per_s >= MIN_TIME_WAIT_PER_S {
                out.push(format!(
                    "{} {} leaves {:.0} TIME_WAIT/s ({} now): {}",
                    link.owner.as_deref().unwrap_or("unknown"),
                    link.link,
                    link.new_time_wait_per_s,
                    link.time_wait,
                    if link.side == "active" {
                        "enable keepalive / connection reuse towards it"
                    } else {
                        "clients close last: let them keep connections open (keepalive)"
                    }
                ));
            }
        }
    }
    for l in &report.tcp.listeners {
        if l.max_backlog > 0 && l.backlog >= l.max_backlog {
            out.push(format!(
                "{} {}: accept queue full ({}/{}): connections are being dropped",
                l.process.as_deref().unwrap_or("?"),
                l.address,
                l.backlog,
                l.max_backlog
            ));
        }
    }
    out.extend(report.paths.iter().filter_map(path_comparison));
    out.extend(report.tcp.warnings.iter().cloned());
    out
}

/// Which of a client's two paths to a server connects faster, when the
/// difference is beyond noise (see `Summary::clearly_slower_than`).
fn path_comparison(p: &PathComparison) -> Option<String> {
    let (tcp, unix) = (&p.tcp, &p.unix);
    let (fast, fast_name, slow, slow_name) = if tcp.connect.clearly_slower_than(&unix.connect) {
        (unix, "the unix socket", tcp, "TCP")
    } else if unix.connect.clearly_slower_than(&tcp.connect) {
        (tcp, "TCP", unix, "the unix socket")
    } else {
        return None;
    };
    // The queue waits only where both paths have them (a unix listener's
    // starts only once its owner is seen).
    let queue = if tcp.accept_queue.count > 0 && unix.accept_queue.count > 0 {
        format!(
            " (accept-queue wait {} vs {} p50)",
            duration(fast.accept_queue.p50_ns),
            duration(slow.accept_queue.p50_ns)
        )
    } else {
        String::new()
    };
    Some(format!(
        "{} → {}: a new connection over {fast_name} {} connects in {} (p50, {} connects) against {} over {slow_name} {} ({:.1}× slower); {} accepts them in {} vs {} (p50){queue}: connect over {fast_name}",
        p.client,
        p.server,
        fast.destination,
        duration(fast.connect.p50_ns),
        fast.connect.count,
        duration(slow.connect.p50_ns),
        slow.destination,
        slow.connect.p50_ns as f64 / fast.connect.p50_ns.max(1) as f64,
        p.server,
        duration(fast.accept.p50_ns),
        duration(slow.accept.p50_ns),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        fixtures::{fork_per_connection, live},
        probe_stats::Drops,
        process::ProcessTable,
    };

    /// A postmaster that accepted `n` connections in one second and forked a
    /// backend for each, each living 9 ms.
    fn forking(n: u32) -> Report {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "postgres")]);
        let n = n as usize;
        fork_per_connection(&mut t, 1, "postgres", &vec![1_000; n], 90_000, n, 9_000_000);
        crate::fixtures::interval_report(&t)
    }

    #[test]
    fn fork_per_connection_fires_with_its_numbers() {
        let found = insights(&forking(412));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0],
            "postgres postmaster forks 1.00 processes per accepted connection (412/s) and its children live 9.00ms: use persistent connections or a pooler"
        );
    }

    use crate::{
        event::{Event, HistDelta, HistMetric},
        process::LiveProcess,
    };

    /// `n` samples of `ns` each, as a read of the kernel's histogram hands
    /// them over.
    fn hist(tgid: u32, comm: &str, metric: HistMetric, n: u64, ns: u64) -> Event {
        Event::Hist(HistDelta {
            tgid,
            comm: Some(comm.into()),
            path: None,
            of_children: false,
            metric,
            count: n,
            sum_ns: n * ns,
            min_ns: ns,
            max_ns: ns,
            buckets: vec![(ns, n)],
        })
    }

    fn proc(pid: u32, name: &str, title: &str, parent: Option<u32>) -> LiveProcess {
        LiveProcess {
            pid,
            name: name.into(),
            title: Some(title.into()),
            parent: parent.map(|p| (p, name.to_string())),
            container: None,
            ns_pid: None,
        }
    }

    /// One interval in which `acceptor` (of `procs`) accepted 40 connections,
    /// each having waited 20 ms in the accept queue, and forked `forks`
    /// processes of 700 µs each.
    fn queued(procs: &[LiveProcess], acceptor: u32, forks: u64) -> Vec<String> {
        let mut t = ProcessTable::default();
        t.sync_watched(procs);
        let name = &procs.iter().find(|p| p.pid == acceptor).unwrap().name;
        t.apply(&hist(acceptor, name, HistMetric::Accept, 40, 50_000));
        t.apply(&hist(
            acceptor,
            name,
            HistMetric::AcceptQueue,
            40,
            20_000_000,
        ));
        if forks > 0 {
            t.apply(&hist(acceptor, name, HistMetric::Fork, forks, 700_000));
        }
        let report = crate::fixtures::interval_report(&t);
        insights(&report)
            .into_iter()
            .filter(|i| i.contains("accept queue"))
            .collect()
    }

    #[test]
    fn a_postmaster_queues_behind_its_forks() {
        let found = queued(
            &[
                proc(
                    1,
                    "postgres",
                    "/usr/lib/postgresql/15/bin/postgres -D data",
                    None,
                ),
                proc(2, "postgres", "postgres: checkpointer", Some(1)),
            ],
            1,
            40,
        );
        assert_eq!(
            found,
            [
                "postgres postmaster: connections wait 20.00ms (p99) in the accept queue: the postmaster accepts and forks one connection at a time (a fork takes 700.0µs p50), so each new connection waits for the forks before it: use persistent connections or a pooler (pgbouncer)"
            ]
        );
        assert!(!found[0].contains("workers"), "a postmaster has none");
    }

    #[test]
    fn a_generic_server_that_forks_per_connection_queues_behind_its_forks() {
        let found = queued(
            &[proc(1, "myd", "myd", None), proc(2, "myd", "myd", Some(1))],
            1,
            40,
        );
        assert_eq!(
            found,
            [
                "myd master: connections wait 20.00ms (p99) in the accept queue: it forks a process per connection between accepts (a fork takes 700.0µs p50), so each new connection waits for the forks before it: use persistent connections or hand connections to workers started in advance"
            ]
        );
    }

    #[test]
    fn nginx_workers_that_fall_behind_are_told_of_their_knobs() {
        let found = queued(
            &[
                proc(1, "nginx", "nginx: master process /usr/sbin/nginx", None),
                proc(2, "nginx", "nginx: worker process", Some(1)),
            ],
            2,
            0,
        );
        assert_eq!(
            found,
            [
                "nginx worker: connections wait 20.00ms (p99) in the accept queue: nginx's workers take connections more slowly than they come: raise worker_processes (up to one per core) or worker_connections, or find what blocks a worker"
            ]
        );
    }

    #[test]
    fn a_busy_php_fpm_pool_is_told_of_max_children() {
        let found = queued(
            &[
                proc(
                    1,
                    "php-fpm8.2",
                    "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)",
                    None,
                ),
                proc(2, "php-fpm8.2", "php-fpm: pool www", Some(1)),
            ],
            2,
            0,
        );
        assert_eq!(
            found,
            [
                "php-fpm8.2 pool www: connections wait 20.00ms (p99) in the accept queue: every pool worker is busy with a request: raise pm.max_children (as memory allows) or make requests faster"
            ]
        );
    }

    #[test]
    fn any_other_server_that_falls_behind_is_told_to_accept_faster() {
        let found = queued(&[proc(1, "myd", "myd", None)], 1, 0);
        assert_eq!(
            found,
            [
                "myd: connections wait 20.00ms (p99) in the accept queue: it accepts more slowly than connections come: add accepting threads or processes, or make each connection cheaper"
            ]
        );
        // A server forking now and then, not per connection, is not told
        // that its forks are the queue.
        let found = queued(
            &[proc(1, "myd", "myd", None), proc(2, "myd", "myd", Some(1))],
            1,
            3,
        );
        assert!(found[0].contains("accepts more slowly"), "{found:?}");
    }

    #[test]
    fn a_short_wait_fires_nothing() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[proc(1, "myd", "myd", None)]);
        t.apply(&hist(
            1,
            "myd",
            HistMetric::AcceptQueue,
            40,
            MIN_QUEUE_WAIT_NS / 2,
        ));
        let r = crate::fixtures::interval_report(&t);
        assert!(insights(&r).is_empty());
    }

    /// The insights of one interval in which `role`'s (one process named
    /// `name`, of title `title`) listener `listener` lost `lost`
    /// connections of `total` since the start.
    fn lost_at(name: &str, title: &str, listener: &str, lost: u64, total: u64) -> Vec<String> {
        use crate::report::{CountRow, ListenerLatencyRow};
        let mut t = ProcessTable::default();
        t.sync_watched(&[proc(1, name, title, None)]);
        t.apply(&hist(1, name, HistMetric::Accept, 1, 50_000));
        let mut report = crate::fixtures::interval_report(&t);
        let mut row = ListenerLatencyRow::unaccepted(listener.into());
        row.backlog = Some(3);
        row.max_backlog = Some(2);
        row.lost = Some(CountRow { count: lost, total });
        report.roles[0].listeners.push(row);
        insights(&report)
    }

    #[test]
    fn a_listener_that_lost_connections_is_told_what_to_raise() {
        let fpm = "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)";
        assert_eq!(
            lost_at("php-fpm8.2", fpm, "/run/php/www.sock", 12, 40),
            [
                "php-fpm8.2: /run/php/www.sock lost 12 connections at its full queue (backlog 3/2 now): raise the pool's listen.backlog (net.core.somaxconn caps it) and, if its workers are all busy, pm.max_children; or make requests faster"
            ]
        );
        assert_eq!(
            lost_at("myd", "myd", "@myd", 1, 1),
            [
                "myd: @myd lost 1 connection at its full queue (backlog 3/2 now): raise the backlog the server listens with (net.core.somaxconn caps it), or serve faster: more workers, faster requests"
            ]
        );
        assert_eq!(
            lost_at("myd", "myd", "127.0.0.1:8080", 7, 7),
            [
                "myd: 127.0.0.1:8080 lost 7 connections at its full queue (backlog 3/2 now): raise net.core.somaxconn and the server's listen backlog, or accept faster: more workers, faster requests"
            ]
        );
        let nginx = lost_at(
            "nginx",
            "nginx: master process /usr/sbin/nginx",
            "0.0.0.0:80",
            2,
            9,
        );
        assert!(nginx[0].contains("backlog= (511 by default)"), "{nginx:?}");
        // Lost before this period, none in it: nothing to say.
        assert!(lost_at("myd", "myd", "127.0.0.1:8080", 0, 7).is_empty());
    }

    #[test]
    fn too_little_data_fires_nothing() {
        assert!(insights(&forking(MIN_ACCEPTS as u32 - 1)).is_empty());
        let quiet = Report::build(
            ReportKind::Interval,
            &ProcessTable::default(),
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        assert!(insights(&quiet).is_empty());
    }

    /// A php-fpm pool of two workers whose master allows `limit` children:
    /// 10 requests, each held 100 ms and having waited 150 ms in the queue,
    /// with `max` of them held at once.
    fn pool(limit: u32, max: u64) -> Vec<String> {
        let mut t = ProcessTable::default();
        let proc = |pid, title: &str, parent| LiveProcess {
            pid,
            name: "php-fpm8.2".into(),
            title: Some(title.into()),
            parent,
            container: None,
            ns_pid: None,
        };
        t.sync_watched(&[
            proc(
                10,
                "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)",
                None,
            ),
            proc(11, "php-fpm: pool www", Some((10, "php-fpm8.2".into()))),
            proc(12, "php-fpm: pool www", Some((10, "php-fpm8.2".into()))),
        ]);
        for w in [11, 12] {
            t.apply(&hist(w, "php-fpm8.2", HistMetric::Accept, 5, 1_000));
            t.apply(&hist(
                w,
                "php-fpm8.2",
                HistMetric::AcceptQueue,
                5,
                150_000_000,
            ));
            t.apply(&hist(w, "php-fpm8.2", HistMetric::Service, 5, 100_000_000));
        }
        let mut report = crate::fixtures::interval_report(&t);
        let workers = report
            .roles
            .iter_mut()
            .find(|r| r.latency[Latency::Accept].latency.count > 0)
            .unwrap();
        workers.busy = Some(crate::busy::BusyRow {
            mean: 1.9,
            max,
            now: 2,
            processes: 2,
            limit: Some(crate::busy::LimitRow {
                setting: "pm.max_children",
                value: limit,
                source: "/etc/php/8.2/fpm/pool.d/www.conf".into(),
            }),
        });
        insights(&report)
    }

    #[test]
    fn a_pool_at_its_limit_with_connections_queueing_names_the_setting() {
        let found = pool(2, 2);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0],
            "php-fpm8.2 pool www: all workers busy: 2 connections held at once, pm.max_children is 2 (/etc/php/8.2/fpm/pool.d/www.conf); 1.9 busy on average, each connection held 100.00ms (p50); connections wait 150.00ms (p90) in its queue: raise pm.max_children (as memory allows) or make requests faster"
        );
    }

    #[test]
    fn a_pool_below_its_limit_is_not_called_full() {
        assert!(pool(5, 2).iter().all(|i| !i.contains("all workers busy")));
    }
}

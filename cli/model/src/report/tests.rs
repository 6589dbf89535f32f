//! Reports built whole: the rows of roles and processes over an interval
//! and the whole run, and the JSON fields against docs/json.md.

use super::*;
use crate::{
    event::{Event, ExitSample, HistMetric, SpawnSample, TaskKind},
    fixtures::{kernel_hist, live},
    measure::{Count, Latency},
    probe_stats::Drops,
    process::LiveProcess,
};
use probes_common::stats::Stat;

/// `tgid`'s accepts taking `ns`, as one read of the kernel's histograms.
fn accepts(tgid: u32, comm: &str, ns: &[u64]) -> Event {
    kernel_hist(tgid, comm, HistMetric::Accept, ns)
}

fn table() -> ProcessTable {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "idle"), live(2, "busy"), live(3, "quiet")]);
    t.apply(&accepts(2, "busy", &[1000, 2000, 3000, 4000]));
    t.apply(&accepts(3, "quiet", &[7]));
    t
}

#[test]
fn a_roles_accepts_are_broken_down_per_listener_across_its_processes() {
    let mut t = ProcessTable::default();
    let worker = |pid| LiveProcess {
        pid,
        name: "srv".into(),
        title: None,
        parent: None,
        container: None,
        ns_pid: None,
    };
    t.sync_watched(&[worker(1), worker(2)]);
    let from = |pid, metric, listener, ns: &[u64]| {
        crate::fixtures::kernel_hist_from(pid, "srv", metric, listener, ns)
    };
    t.apply(&from(
        1,
        HistMetric::Accept,
        Some("127.0.0.1:80"),
        &[1000, 2000],
    ));
    t.apply(&from(2, HistMetric::Accept, Some("127.0.0.1:80"), &[3000]));
    t.apply(&from(
        2,
        HistMetric::Accept,
        Some("/run/srv.sock"),
        &[50_000],
    ));
    t.apply(&from(
        2,
        HistMetric::AcceptQueue,
        Some("127.0.0.1:80"),
        &[400],
    ));
    t.apply(&from(1, HistMetric::Accept, None, &[9]));
    let r = Report::build(
        ReportKind::Summary,
        &t,
        Duration::from_secs(1),
        Duration::from_secs(1),
        Drops::default(),
    );
    let role = &r.roles[0];
    let rows: Vec<(&str, u64, u64)> = role
        .listeners
        .iter()
        .map(|l| {
            (
                l.listener.as_str(),
                l.latency[Latency::Accept].total,
                l.latency[Latency::AcceptQueue].total,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("127.0.0.1:80", 3, 1),
            ("(unknown listener)", 1, 0),
            ("/run/srv.sock", 1, 0),
        ]
    );
    assert_eq!(
        rows.iter().map(|r| r.1).sum::<u64>(),
        role.latency[Latency::Accept].total,
        "every accept in one listener's row"
    );
    let unix = &role.listeners[2].latency[Latency::Accept].latency;
    assert!((49_000..=51_000).contains(&unix.p50_ns), "{unix:?}");
}

#[test]
fn interval_rows_rates_and_drops() {
    let mut t = table();
    t.reset_interval();
    t.apply(&accepts(2, "busy", &[500]));
    let drops = Drops::default()
        .with(Stat::LostExit, 2)
        .with(Stat::AcceptSlotShared, 1);
    let r = Report::build(
        ReportKind::Interval,
        &t,
        Duration::from_millis(500),
        Duration::from_secs(3),
        drops,
    );
    assert_eq!(r.watched, 3);
    assert_eq!(r.drops, 3);
    // The idle process never accepted: no row. The quiet one shows 0 this interval.
    let rows: Vec<(u32, u64, u64)> = r
        .processes
        .iter()
        .map(|p| (p.pid, p.latency.count, p.total))
        .collect();
    assert_eq!(rows, vec![(2, 1, 5), (3, 0, 1)]);
    assert_eq!(r.processes[0].rate_per_s, 2.0);
    assert_eq!(r.processes[0].latency.max_ns, 500);
    assert_eq!(r.processes[1].rate_per_s, 0.0);
    // Every role is there, the idle one included.
    let roles: Vec<&str> = r.roles.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(roles, ["busy", "quiet", "idle"]);
}

#[test]
fn summary_covers_everything() {
    let t = table();
    let r = Report::build(
        ReportKind::Summary,
        &t,
        Duration::from_secs(2),
        Duration::from_secs(2),
        Drops::default(),
    );
    let busy = &r.processes[0];
    assert_eq!((busy.pid, busy.latency.count, busy.total), (2, 4, 4));
    assert_eq!(busy.rate_per_s, 2.0);
    assert_eq!(
        (
            busy.latency.min_ns,
            busy.latency.max_ns,
            busy.latency.mean_ns
        ),
        (1000, 4000, 2500)
    );
}

#[test]
fn a_fork_per_connection_server_shows_one_fork_per_accept() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    for i in 0..10u32 {
        let child = 100 + i;
        t.apply(&Event::Spawn(SpawnSample {
            parent_tgid: 1,
            child,
            kind: TaskKind::Process,
            ts_ns: u64::from(i) * 1_000_000,
            comm: "srv".into(),
        }));
        if i < 7 {
            t.apply(&Event::Exit(ExitSample {
                tgid: child,
                ts_ns: u64::from(i) * 1_000_000 + 50_000_000,
            }));
        }
    }
    // The interval's read of the kernel's histograms.
    t.apply(&accepts(1, "srv", &[3_000; 10]));
    t.apply(&kernel_hist(1, "srv", HistMetric::Fork, &[80_000; 10]));
    let r = crate::fixtures::interval_report(&t);
    let master = r.roles.iter().find(|r| r.role == "srv master").unwrap();
    assert_eq!(master.latency[Latency::Accept].latency.count, 10);
    assert_eq!(master.latency[Latency::Fork].latency.count, 10);
    assert_eq!(master.forks_per_accept, Some(1.0));
    assert_eq!(master.children_alive, 3);
    assert_eq!(master.latency[Latency::ChildLifetime].latency.count, 7);
    assert_eq!(
        master.latency[Latency::ChildLifetime].latency.p50_ns,
        50_000_000
    );
    let workers = r.roles.iter().find(|r| r.role == "srv worker").unwrap();
    assert_eq!(workers.processes, 3);
    assert_eq!(
        workers.counts[Count::Exited],
        CountRow { count: 7, total: 7 }
    );
    assert_eq!(workers.forks_per_accept, None);
}

mod json_doc;

#[test]
fn json_field_names_are_the_documented_ones() {
    // The table's roles, and a chain of three (so that `chains[]` and its
    // hops are checked too).
    let mut t = table();
    t.sync_watched(&[
        live(1, "idle"),
        live(2, "busy"),
        live(3, "quiet"),
        live(11, "nginx"),
        live(12, "php-fpm"),
        live(13, "postgres"),
    ]);
    crate::fixtures::request_path(&mut t, &crate::fixtures::three_hop_path(100, 100));
    // The run-queue probe's samples, on every role (the first is checked),
    // and what the collector adds: the host.
    for (pid, name) in [(1, "idle"), (2, "busy"), (3, "quiet"), (11, "nginx")] {
        t.apply(&kernel_hist(pid, name, HistMetric::RunQueue, &[5_000]));
        t.apply(&kernel_hist(pid, name, HistMetric::OnCpu, &[80_000]));
        t.apply(&kernel_hist(pid, name, HistMetric::Preempted, &[0]));
    }
    let mut r = Report::build(
        ReportKind::Summary,
        &t,
        Duration::from_secs(1),
        Duration::from_secs(1),
        Drops::default(),
    );
    r.host = Some(crate::host::HostRow {
        cpus: 4,
        runnable: 2,
    });
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["schema"], "stackprobe.watch/5");
    assert_eq!(v["type"], "summary");
    assert_eq!(v["drops"], 0);
    assert_eq!(v["processes"][0]["metric"], "accept_latency");
    let role = &v["roles"][0];
    let drops = &v["drops_by_cause"];
    let documented = json_doc::Fields::read();
    // Every field a report has is documented, down to each metric's
    // own fields; every declared measurement is a field of each role.
    let mut undocumented = Vec::new();
    json_doc::walk(&v, "", 3, &mut |path| {
        if !documented.covers(path) {
            undocumented.push(path.to_string());
        }
    });
    assert!(
        undocumented.is_empty(),
        "fields missing from docs/json.md: {undocumented:?}"
    );
    for name in crate::measure::names() {
        assert!(!role[name].is_null(), "roles[].{name} is not in a report");
        assert!(
            documented.covers(&format!("roles[].{name}")),
            "roles[].{name} is not in docs/json.md"
        );
    }
    for (l, _) in crate::measure::LATENCIES {
        for field in [
            "count",
            "p50_ns",
            "p999_ns",
            "rate_per_s",
            "total",
            "log2_buckets",
        ] {
            assert!(
                !role[l.name()][field].is_null(),
                "missing {}.{field}",
                l.name()
            );
        }
    }
    assert!(!drops["skipped"]["accept"].is_null());
    let hop = &v["chains"][0]["hops"][1];
    assert_eq!(hop["role"], "php-fpm", "{}", v["chains"]);
    assert!(!hop["own_ns"].is_null() && !hop["connect"]["mean_ns"].is_null());
    assert!(!role["cpu"]["on_cpu_ns"].is_null(), "{role}");
    assert!(!v["chains"][0]["hops"][0]["run_queue"]["count"].is_null());
    // Gone in schema 3: accepts and forks never cross the ring buffer.
    for gone in [
        &drops["lost"]["accept"],
        &drops["lost"]["fork"],
        &drops["folded_accepts"],
        &drops["overflow_full"],
        &role["accept"]["folded"],
    ] {
        assert!(gone.is_null(), "{gone}");
    }
}

#[test]
fn a_role_with_no_process_and_nothing_in_the_period_has_no_row() {
    use crate::{
        event::{Event as E, ExitSample as Exit},
        fixtures::live,
    };
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv"), live(2, "initdb-child")]);
    t.apply(&E::Exit(Exit { tgid: 2, ts_ns: 5 }));
    let build = |t: &ProcessTable, kind| {
        let r = Report::build(
            kind,
            t,
            Duration::from_secs(1),
            Duration::from_secs(2),
            Drops::default(),
        );
        let mut roles: Vec<_> = r.roles.into_iter().map(|r| r.role).collect();
        roles.sort();
        roles
    };
    // The interval it exited in shows it, the next ones do not; the
    // summary does.
    assert_eq!(build(&t, ReportKind::Interval), ["initdb-child", "srv"]);
    t.reset_interval();
    assert_eq!(build(&t, ReportKind::Interval), ["srv"]);
    assert_eq!(build(&t, ReportKind::Summary), ["initdb-child", "srv"]);
    // Its last histogram read, after it exited, holds only accepts of
    // unknown latency: the period has something, so the row is back.
    t.apply(&E::Hist(crate::event::HistDelta {
        tgid: 2,
        comm: None,
        path: None,
        of_children: false,
        metric: crate::event::HistMetric::AcceptUntimed,
        count: 1,
        sum_ns: 0,
        min_ns: 0,
        max_ns: 0,
        buckets: vec![(0, 1)],
    }));
    assert_eq!(build(&t, ReportKind::Interval), ["initdb-child", "srv"]);
}

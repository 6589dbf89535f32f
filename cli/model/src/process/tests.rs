//! The table's lifecycle: forks, execs, exits, syncs with /proc, roles
//! and the bounds on what it keeps.

use super::*;
use crate::{
    event::HistMetric,
    fixtures::{kernel_hist, live},
};

/// One accept of `ns` by `tgid`, as a read of the kernel's histograms hands it over.
fn accept(tgid: u32, ns: u64) -> Event {
    kernel_hist(tgid, &format!("srv{tgid}"), HistMetric::Accept, &[ns])
}

fn spawn(parent: u32, child: u32, comm: &str, ts: u64) -> Event {
    Event::Spawn(SpawnSample {
        parent_tgid: parent,
        child,
        kind: TaskKind::Process,
        ts_ns: ts,
        comm: comm.into(),
    })
}

/// One clone by `tgid` that returned `ret`, filed as the kernel files it.
fn fork(tgid: u32, ret: i32, kind: TaskKind, ns: u64) -> Event {
    let metric = HistMetric::of_clone(i64::from(ret), kind);
    kernel_hist(tgid, "srv", metric, &[ns])
}

fn exit(tgid: u32, ts: u64) -> Event {
    Event::Exit(ExitSample { tgid, ts_ns: ts })
}

#[test]
fn accepts_land_in_their_process() {
    let mut t = ProcessTable::default();
    t.apply(&accept(10, 100));
    t.apply(&accept(10, 300));
    t.apply(&accept(11, 50));
    assert_eq!(
        t.get(10).unwrap().activity.latency[Latency::Accept]
            .total
            .count(),
        2
    );
    assert_eq!(
        t.get(11).unwrap().activity.latency[Latency::Accept]
            .total
            .count(),
        1
    );
    assert_eq!(t.get(10).unwrap().name, "srv10");
}

fn hist(tgid: u32, metric: HistMetric, count: u64) -> Event {
    Event::Hist(HistDelta {
        tgid,
        comm: None,
        metric,
        path: None,
        of_children: false,
        count,
        sum_ns: 2_000 * count,
        min_ns: 2_000,
        max_ns: 2_000,
        buckets: vec![(2_000, count)],
    })
}

#[test]
fn kernel_histograms_add_to_the_metric_they_name() {
    let mut t = ProcessTable::default();
    t.apply(&accept(10, 100));
    for (metric, count) in [
        (HistMetric::Accept, 5),
        (HistMetric::AcceptQueue, 4),
        (HistMetric::Fork, 3),
        (HistMetric::Thread, 2),
        (HistMetric::ForkUnknown, 6),
        (HistMetric::ForkFailed, 7),
        (HistMetric::AcceptUntimed, 8),
    ] {
        t.apply(&hist(10, metric, count));
    }
    // A process first heard of through a histogram gets a placeholder name.
    t.apply(&hist(12, HistMetric::Accept, 1));
    let a = &t.get(10).unwrap().activity;
    assert_eq!(a.latency[Latency::Accept].total.count(), 6);
    assert_eq!(a.latency[Latency::Accept].total.summary().min_ns, 100);
    assert_eq!(a.latency[Latency::Accept].total.sum_ns(), 100 + 5 * 2_000);
    assert_eq!(a.latency[Latency::AcceptQueue].total.count(), 4);
    assert_eq!(a.latency[Latency::Fork].total.count(), 3);
    assert_eq!(a.latency[Latency::Thread].total.count(), 2);
    assert_eq!(
        (
            a.counts[Count::ForkUnknown].total,
            a.counts[Count::ForkFailed].total
        ),
        (6, 7)
    );
    // Untimed accepts are counted apart: no sample joins the latencies.
    assert_eq!(a.counts[Count::AcceptUntimed].total, 8);
    assert_eq!(t.get(10).unwrap().name, "srv10");
    assert_eq!(t.get(12).unwrap().name, "[12]");
}

#[test]
fn what_a_process_did_before_its_exit_is_read_after_it_and_goes_to_its_role() {
    let mut t = ProcessTable::default();
    t.apply(&accept(10, 100));
    t.apply(&Event::Exit(ExitSample { tgid: 10, ts_ns: 5 }));
    t.apply(&hist(10, HistMetric::Accept, 3));
    assert!(
        t.get(10).is_none(),
        "no entry comes back for an exited process"
    );
    let roles = t.roles(Span::Whole);
    let (_, a) = &roles["srv10"];
    assert_eq!(a.latency[Latency::Accept].total.count(), 4);
    assert_eq!(a.counts[Count::Exited].total, 1);
    // Two intervals on, the pid is taken to be a new process's.
    t.reset_interval();
    t.reset_interval();
    t.apply(&hist(10, HistMetric::Accept, 1));
    assert_eq!(
        t.get(10).unwrap().activity.latency[Latency::Accept]
            .total
            .count(),
        1
    );
}

#[test]
fn interval_resets_but_totals_stay() {
    let mut t = ProcessTable::default();
    t.apply(&accept(10, 100));
    t.reset_interval();
    t.apply(&accept(10, 200));
    let a = &t.get(10).unwrap().activity.latency[Latency::Accept];
    assert_eq!((a.interval.count(), a.total.count()), (1, 2));
}

#[test]
fn forks_are_counted_by_kind_and_children_get_lifetimes() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    for (i, child) in [100u32, 101, 102].into_iter().enumerate() {
        let born = 1_000_000 * i as u64;
        t.apply(&spawn(1, child, "srv", born));
        t.apply(&fork(1, child as i32, TaskKind::Process, 40_000));
        t.apply(&exit(child, born + 50_000_000));
    }
    t.apply(&Event::Spawn(SpawnSample {
        parent_tgid: 1,
        child: 200,
        kind: TaskKind::Thread,
        ts_ns: 0,
        comm: "srv".into(),
    }));
    t.apply(&fork(1, 200, TaskKind::Thread, 20_000));
    t.apply(&fork(1, -11, TaskKind::Process, 1_000));
    let a = &t.get(1).unwrap().activity;
    assert_eq!(a.latency[Latency::Fork].total.count(), 3);
    assert_eq!(a.latency[Latency::Thread].total.count(), 1);
    assert_eq!(a.counts[Count::ForkFailed].total, 1);
    let life = a.latency[Latency::ChildLifetime].total.summary();
    assert_eq!(
        (life.count, life.min_ns, life.max_ns),
        (3, 50_000_000, 50_000_000)
    );
    // Exited children are gone from the table; threads never had an entry.
    assert_eq!(t.len(), 1);
    assert_eq!(t.children_alive(1), 0);
    assert_eq!(t.get(1).unwrap().role(), "srv master");
}

#[test]
fn exited_children_retire_into_their_role() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres")]);
    t.apply(&spawn(1, 50, "postgres", 0));
    t.apply(&spawn(1, 51, "postgres", 0));
    t.apply(&fork(50, 60, TaskKind::Process, 7));
    t.apply(&exit(50, 9_000_000));
    let roles = t.roles(Span::Whole);
    let (pids, backend) = &roles["postgres backend"];
    assert_eq!(pids, &[51]);
    assert_eq!(
        backend.latency[Latency::Fork].total.count(),
        1,
        "the exited backend's fork stays counted"
    );
    assert_eq!(roles["postgres postmaster"].0, [1]);
    assert_eq!(backend.counts[Count::Exited].total, 1);
    assert_eq!(t.children_alive(1), 1);
}

#[test]
fn a_recycled_pid_is_a_new_process() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    t.apply(&spawn(1, 77, "srv", 0));
    t.apply(&accept(77, 5));
    // Its exit was lost; pid 77 comes back as another child.
    t.apply(&spawn(1, 77, "srv", 1_000));
    let p = t.get(77).unwrap();
    assert_eq!(p.activity.latency[Latency::Accept].total.count(), 0);
    assert_eq!(p.born_ns, Some(1_000));
    assert_eq!(
        t.roles(Span::Whole)["srv worker"].1.latency[Latency::Accept]
            .total
            .count(),
        1,
        "the old one retired"
    );
}

#[test]
fn memory_stays_bounded_however_many_pids_come_and_go() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres")]);
    for i in 0..200_000u64 {
        let pid = 2 + (i % 30_000) as u32;
        t.apply(&spawn(1, pid, "postgres", i * 1000));
        if i % 7 != 0 {
            t.apply(&exit(pid, i * 1000 + 9_000_000));
        }
    }
    // The forks' latencies, as one read of the kernel's histogram.
    t.apply(&kernel_hist(
        1,
        "postgres",
        HistMetric::Fork,
        &vec![30_000; 200_000],
    ));
    // Only the children whose exit was not seen are still live (a recycled
    // pid replaces its predecessor), and one role holds all the retired rest.
    assert!(t.len() <= 30_001, "{}", t.len());
    assert_eq!(t.retired_roles(), 1);
    assert_eq!(
        t.get(1).unwrap().activity.latency[Latency::Fork]
            .total
            .count(),
        200_000
    );
}

#[test]
fn roles_are_capped() {
    let mut t = ProcessTable::default();
    for i in 0..(MAX_ROLES as u32 + 50) {
        t.sync_watched(&[live(i + 1, &format!("p{i}"))]);
    }
    t.sync_watched(&[]);
    t.sync_watched(&[]);
    assert!(t.retired_roles() <= MAX_ROLES);
    assert!(t.roles(Span::Whole).contains_key(OTHER_ROLE));
}

#[test]
fn sync_retires_processes_that_left_and_finds_running_masters() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[
        live(1, "nginx"),
        LiveProcess {
            pid: 2,
            name: "nginx".into(),
            title: Some("nginx: worker process".into()),
            parent: Some((1, "nginx".into())),
            container: None,
            ns_pid: None,
        },
    ]);
    assert_eq!(t.get(1).unwrap().role(), "nginx master");
    assert_eq!(t.get(2).unwrap().role(), "nginx worker");
    t.apply(&accept(2, 10));
    // Gone from /proc without an exit event: one miss is not enough…
    t.sync_watched(&[live(1, "nginx")]);
    assert!(!t.get(2).unwrap().watched);
    // …two are.
    t.sync_watched(&[live(1, "nginx")]);
    assert!(t.get(2).is_none());
    let worker = &t.roles(Span::Whole)["nginx worker"].1;
    assert_eq!(worker.latency[Latency::Accept].total.count(), 1);
    assert_eq!(worker.counts[Count::Exited].total, 1);
}

#[test]
fn a_child_seen_in_proc_before_its_spawn_event_is_one_process() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[
        live(1, "srv"),
        LiveProcess {
            pid: 5,
            name: "srv".into(),
            title: None,
            parent: Some((1, "srv".into())),
            container: None,
            ns_pid: None,
        },
    ]);
    t.apply(&spawn(1, 5, "srv", 1_000));
    t.apply(&exit(5, 51_000));
    assert_eq!(
        t.get(1).unwrap().activity.latency[Latency::ChildLifetime]
            .total
            .count(),
        1
    );
    assert_eq!(
        t.roles(Span::Whole)["srv worker"].1.counts[Count::Exited].total,
        1,
        "retired once, not twice"
    );
}

#[test]
fn a_child_spawned_after_the_proc_scan_survives_one_sync() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    t.apply(&spawn(1, 6, "srv", 1_000));
    // The scan ran before the spawn: 6 is not listed yet.
    t.sync_watched(&[live(1, "srv")]);
    t.apply(&exit(6, 2_001_000));
    assert_eq!(
        t.get(1).unwrap().activity.latency[Latency::ChildLifetime]
            .total
            .summary()
            .max_ns,
        2_000_000
    );
}

#[test]
fn children_that_exec_are_counted_for_the_parent() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    t.apply(&spawn(1, 9, "srv", 0));
    t.apply(&Event::Exec(ExecSample {
        tgid: 9,
        ts_ns: 5,
        comm: "true".into(),
    }));
    assert_eq!(
        t.get(1).unwrap().activity.counts[Count::ChildrenExec].total,
        1
    );
    assert_eq!(t.get(9).unwrap().activity.counts[Count::Execs].total, 1);
    assert_eq!(t.get(9).unwrap().role(), "true");
}

const MASTER_TITLE: &str = "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)";

/// A php-fpm process as /proc shows it.
fn fpm(pid: u32, parent: Option<u32>, title: &str) -> LiveProcess {
    LiveProcess {
        pid,
        name: "php-fpm8.2".into(),
        title: Some(title.into()),
        parent: parent.map(|p| (p, "php-fpm8.2".to_string())),
        container: None,
        ns_pid: None,
    }
}

fn role_names(t: &ProcessTable) -> Vec<String> {
    t.roles(Span::Whole).into_keys().collect()
}

#[test]
fn only_a_process_whose_role_can_take_its_title_needs_it_read() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres"), live(10, "php-fpm8.2")]);
    t.apply(&spawn(1, 2, "postgres", 1_000));
    t.apply(&spawn(10, 11, "php-fpm8.2", 1_000));
    assert!(
        !t.get(2).unwrap().needs_title(),
        "a backend's role is its name's"
    );
    assert!(
        t.get(11).unwrap().needs_title(),
        "a worker's pool is in its title"
    );
    assert!(t.get(10).unwrap().needs_title(), "not read yet");
    // An exec to a name that reads its title: read it.
    t.apply(&Event::Exec(ExecSample {
        tgid: 2,
        ts_ns: 2_000,
        comm: "php-fpm8.2".into(),
    }));
    assert!(t.get(2).unwrap().needs_title());
}

#[test]
fn a_worker_seen_before_its_title_settles_into_one_role_with_everything_it_did() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[
        fpm(1, None, MASTER_TITLE),
        fpm(2, Some(1), "php-fpm: pool www"),
        // Read between its fork and its naming its pool: its master's title.
        fpm(3, Some(1), MASTER_TITLE),
    ]);
    t.apply(&hist(3, HistMetric::Accept, 4));
    assert_eq!(t.get(3).unwrap().role(), "php-fpm8.2 worker");
    assert!(
        t.get(3).unwrap().needs_title(),
        "read again at the next sync"
    );
    assert!(!t.get(2).unwrap().needs_title());
    assert!(!t.get(1).unwrap().needs_title());
    t.reset_interval();
    t.apply(&hist(3, HistMetric::Accept, 1));
    t.sync_watched(&[
        fpm(1, None, MASTER_TITLE),
        fpm(2, Some(1), "php-fpm: pool www"),
        fpm(3, Some(1), "php-fpm: pool www"),
    ]);
    assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
    let (pids, pool) = &t.roles(Span::Whole)["php-fpm8.2 pool www"];
    assert_eq!(pids, &[2, 3]);
    assert_eq!(pool.latency[Latency::Accept].total.count(), 5);
    assert_eq!(
        t.roles(Span::Interval)["php-fpm8.2 pool www"].1.latency[Latency::Accept]
            .interval
            .count(),
        1
    );
    // It exits: its numbers stay in its pool.
    t.apply(&exit(3, 10));
    assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
    assert_eq!(
        t.roles(Span::Whole)["php-fpm8.2 pool www"].1.latency[Latency::Accept]
            .total
            .count(),
        5
    );
}

#[test]
fn a_worker_that_exits_before_naming_its_pool_joins_its_siblings_pool() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[
        fpm(1, None, MASTER_TITLE),
        fpm(2, Some(1), "php-fpm: pool www"),
        fpm(3, Some(1), MASTER_TITLE),
    ]);
    t.apply(&hist(3, HistMetric::Accept, 2));
    t.apply(&exit(3, 10));
    assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
    let pool = &t.roles(Span::Whole)["php-fpm8.2 pool www"].1;
    assert_eq!(
        (
            pool.latency[Latency::Accept].total.count(),
            pool.counts[Count::Exited].total
        ),
        (2, 1)
    );
    // With pools of two names, which one it served is not known.
    t.sync_watched(&[
        fpm(1, None, MASTER_TITLE),
        fpm(2, Some(1), "php-fpm: pool www"),
        fpm(4, Some(1), "php-fpm: pool api"),
        fpm(5, Some(1), MASTER_TITLE),
    ]);
    t.apply(&exit(5, 20));
    assert!(role_names(&t).contains(&"php-fpm8.2 worker".to_string()));
}

#[test]
fn a_daemonized_master_is_one_master_with_its_short_lived_parent() {
    let mut t = ProcessTable::default();
    // php-fpm forks its master and exits; the master forks the workers.
    t.sync_watched(&[fpm(1, None, "php-fpm8.2 --fpm-config lab.conf")]);
    t.apply(&spawn(1, 2, "php-fpm8.2", 0));
    t.apply(&exit(1, 1_000));
    t.apply(&hist(2, HistMetric::Thread, 1));
    t.apply(&spawn(2, 3, "php-fpm8.2", 2_000));
    t.apply(&spawn(2, 4, "php-fpm8.2", 3_000));
    t.sync_watched(&[
        fpm(2, Some(1), MASTER_TITLE),
        fpm(3, Some(2), "php-fpm: pool www"),
        fpm(4, Some(2), "php-fpm: pool www"),
    ]);
    assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
    let (pids, master) = &t.roles(Span::Whole)["php-fpm8.2 master"];
    assert_eq!(pids, &[2]);
    assert_eq!(
        (
            master.counts[Count::Exited].total,
            master.latency[Latency::Thread].total.count()
        ),
        (1, 1)
    );
}

/// Run-queue samples the kernel kept under `parent` for its children.
fn children_run_queue(parent: u32, count: u64) -> Event {
    Event::Hist(HistDelta {
        of_children: true,
        ..match hist(parent, HistMetric::RunQueue, count) {
            Event::Hist(d) => d,
            _ => unreachable!(),
        }
    })
}

#[test]
fn run_queue_samples_kept_under_a_parent_go_to_its_childrens_role() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres")]);
    t.apply(&spawn(1, 50, "postgres", 0));
    t.apply(&spawn(1, 51, "postgres", 0));
    // No child gone yet: the live ones' role.
    t.apply(&children_run_queue(1, 3));
    t.apply(&exit(50, 9_000_000));
    t.apply(&exit(51, 9_000_000));
    // Every child gone: the role the latest retired into.
    t.apply(&children_run_queue(1, 4));
    let roles = t.roles(Span::Whole);
    let waits = |role: &str| roles[role].1.latency[Latency::RunQueue].total.count();
    assert_eq!(waits("postgres backend"), 7);
    assert_eq!(waits("postgres postmaster"), 0, "not the parent's own");
    assert_eq!(
        t.get(1).unwrap().activity.latency[Latency::RunQueue]
            .total
            .count(),
        0
    );
}

#[test]
fn run_queue_samples_of_an_unknown_parents_children_are_named_by_its_pid() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres")]);
    t.apply(&spawn(1, 50, "postgres", 0));
    t.apply(&exit(50, 9_000_000));
    t.apply(&children_run_queue(7, 2));
    assert_eq!(
        t.roles(Span::Whole)["[7]"].1.latency[Latency::RunQueue]
            .total
            .count(),
        2,
        "an unknown parent's children are named by its pid"
    );
}

#[test]
fn a_gone_parents_last_children_samples_still_find_their_role_then_it_is_forgotten() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "postgres")]);
    t.apply(&spawn(1, 50, "postgres", 0));
    t.apply(&exit(50, 1_000));
    t.apply(&exit(1, 2_000));
    // The kernel's last read of the parent's children, after its exit.
    t.apply(&children_run_queue(1, 3));
    let waits = |t: &ProcessTable, role: &str| {
        t.roles(Span::Whole)
            .get(role)
            .map_or(0, |(_, a)| a.latency[Latency::RunQueue].total.count())
    };
    assert_eq!(waits(&t, "postgres backend"), 3);
    t.reset_interval();
    t.reset_interval();
    t.apply(&children_run_queue(1, 1));
    assert_eq!(
        (waits(&t, "postgres backend"), waits(&t, "[1]")),
        (3, 1),
        "two intervals on, the parent's children's role is forgotten"
    );
}

#[test]
fn a_reused_row_keeps_nothing_of_the_process_that_retired_from_it() {
    let busy = |t: &mut ProcessTable| {
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&spawn(1, 5, "srv", 1_000));
        t.sync_watched(&[
            live(1, "srv"),
            LiveProcess {
                pid: 5,
                name: "srv".into(),
                title: Some("srv: busy".into()),
                parent: Some((1, "srv".into())),
                container: Container::from_cgroup(
                    "/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
                ),
                ns_pid: Some(3),
            },
        ]);
        t.apply(&accept(5, 100));
        assert!(t.get(5).unwrap().container.is_some());
        t.apply(&spawn(5, 6, "srv", 2_000));
        t.apply(&exit(6, 2_500));
        t.apply(&exit(5, 3_000));
    };
    let mut reused = ProcessTable::default();
    busy(&mut reused);
    assert_eq!(reused.spare.len(), 2, "the worker's row is reused first");
    reused.apply(&accept(9, 50));
    let mut fresh = ProcessTable::default();
    fresh.apply(&accept(9, 50));
    // Debug shows every field, histograms included.
    assert_eq!(
        format!("{:?}", reused.get(9).unwrap()),
        format!("{:?}", fresh.get(9).unwrap())
    );
}

#[test]
fn role_names_are_kept_while_a_map_holds_them() {
    let mut t = ProcessTable::default();
    t.sync_watched(&[live(1, "srv")]);
    t.apply(&spawn(1, 5, "srv", 1_000));
    t.apply(&exit(5, 2_000));
    t.apply(&spawn(1, 6, "srv", 3_000));
    t.apply(&exit(6, 4_000));
    assert_eq!(t.role_names.len(), 1, "one name for both workers");
    t.apply(&exit(1, 5_000));
    assert_eq!(t.role_names.len(), 2);
    // One interval on, what the kernel read late still finds its role.
    t.reset_interval();
    t.apply(&hist(5, HistMetric::Accept, 2));
    assert!(t.get(5).is_none());
    assert_eq!(
        t.roles(Span::Whole)["srv worker"].1.latency[Latency::Accept]
            .total
            .count(),
        2
    );
    assert_eq!(t.role_names.len(), 2);
    t.reset_interval();
    assert!(t.role_names.is_empty(), "{:?}", t.role_names);
}

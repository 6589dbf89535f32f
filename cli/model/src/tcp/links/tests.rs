//! The link table: what each read adds, TIME_WAIT to the closer, roles
//! remembered and let go, links formatted once.

use std::{collections::HashMap, net::SocketAddr};

use super::*;
use crate::tcp::{key::Side, role_names::MAX_ROLE_NAMES, snapshot::Walk};

const CLIENT: u32 = 10;
const SERVER: u32 = 20;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn active(owner: u32, remote: &str) -> KernelLink {
    KernelLink {
        owner,
        peer: Peer {
            side: Side::Active,
            addr: addr(remote),
            peer_ip: None,
            netns: None,
        },
    }
}

fn passive(owner: u32, local: &str, remote_ip: &str) -> KernelLink {
    KernelLink {
        owner,
        peer: Peer {
            side: Side::Passive,
            addr: addr(local),
            peer_ip: Some(remote_ip.parse().unwrap()),
            netns: None,
        },
    }
}

fn totals(opens: u64, closes: u64, aborts: u64, new_time_wait: u64) -> LinkTotals {
    LinkTotals {
        opens,
        closes,
        aborts,
        new_time_wait,
    }
}

fn roles() -> HashMap<u32, String> {
    HashMap::from([(CLIENT, "client".into()), (SERVER, "server".into())])
}

/// A read of the kernel's totals, with a walk finding `time_wait`.
fn read(
    links: Vec<(KernelLink, LinkTotals)>,
    time_wait: Option<Vec<(KernelLink, u64)>>,
) -> SocketSnapshot {
    SocketSnapshot {
        links,
        walk: time_wait.map(|time_wait| Walk {
            time_wait,
            ..Walk::default()
        }),
        roles: roles(),
        ..SocketSnapshot::default()
    }
}

fn row<'a>(t: &'a LinkTable, owner: Option<&str>, peer: &str) -> &'a LinkStats {
    t.iter()
        .find(|(k, _)| k.owner.as_deref() == owner && k.peer == peer)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no link {owner:?} {peer}: {:?}", t.links))
}

#[test]
fn time_wait_goes_to_the_process_that_closed_first() {
    let mut t = LinkTable::default();
    // Five connections the client opened and closed first, as the
    // kernel counts them: each end's opens and closes on its own link,
    // the TIME_WAIT on the closer's.
    let client = active(CLIENT, "127.0.0.1:80");
    let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
    let links = vec![(client, totals(5, 5, 0, 5)), (server, totals(5, 5, 0, 0))];
    t.observe_snapshot(read(links.clone(), Some(vec![(client, 5)])));
    let c = row(&t, Some("client"), "→ 127.0.0.1:80");
    assert_eq!((c.time_wait, c.new_time_wait.interval), (5, 5));
    assert_eq!((c.opens.total, c.closes.total, c.aborts.total), (5, 5, 0));
    let s = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
    assert_eq!((s.time_wait, s.opens.total, s.closes.total), (0, 5, 5));
    // Still there at the next snapshot: not new any more.
    t.reset_interval();
    t.observe_snapshot(read(links, Some(vec![(client, 5)])));
    let c = row(&t, Some("client"), "→ 127.0.0.1:80");
    assert_eq!((c.time_wait, c.new_time_wait.interval), (5, 0));
    assert_eq!(c.new_time_wait.total, 5);
}

#[test]
fn a_links_endpoint_names_the_service_never_the_client() {
    let mut t = LinkTable::default();
    let client = active(CLIENT, "127.0.0.1:80");
    let server = passive(SERVER, "127.0.0.2:80", "127.0.0.3");
    let mut in_netns = active(CLIENT, "[::1]:5432");
    in_netns.peer.netns = Some(4026532301);
    let links = vec![
        (client, totals(1, 0, 0, 0)),
        (server, totals(1, 0, 0, 0)),
        (in_netns, totals(1, 0, 0, 0)),
    ];
    t.observe_snapshot(read(links, None));
    let endpoints: Vec<(&str, &str)> = t
        .iter()
        .map(|(k, _)| (k.peer.as_str(), k.endpoint.as_str()))
        .collect();
    assert_eq!(
        endpoints,
        [
            ("→ 127.0.0.1:80", "127.0.0.1:80"),
            (
                "→ [::1]:5432 in net:[4026532301]",
                "[::1]:5432 in net:[4026532301]"
            ),
            ("127.0.0.2:80 ← 127.0.0.3", "127.0.0.2:80"),
        ]
    );
}

#[test]
fn only_what_grew_since_the_last_read_counts() {
    let mut t = LinkTable::default();
    let c = active(CLIENT, "127.0.0.1:80");
    t.observe_snapshot(read(vec![(c, totals(3, 1, 0, 1))], None));
    t.reset_interval();
    t.observe_snapshot(read(vec![(c, totals(7, 4, 1, 2))], None));
    let r = row(&t, Some("client"), "→ 127.0.0.1:80");
    assert_eq!((r.opens.interval, r.opens.total), (4, 7));
    assert_eq!((r.closes.interval, r.aborts.interval), (3, 1));
    assert_eq!((r.new_time_wait.interval, r.new_time_wait.total), (1, 2));
    // Forgotten in the kernel, then counting from 0 again: all of it is new.
    t.observe_snapshot(read(vec![], None));
    t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], None));
    assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").opens.total, 9);
    // Without a walk, TIME_WAIT now stays as the last walk found it.
    t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], Some(vec![(c, 4)])));
    t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], None));
    assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 4);
}

#[test]
fn a_server_that_closes_first_owns_the_time_wait() {
    let mut t = LinkTable::default();
    let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
    let links = vec![
        (active(CLIENT, "127.0.0.1:80"), totals(3, 3, 0, 0)),
        (server, totals(3, 3, 0, 3)),
    ];
    t.observe_snapshot(read(links, Some(vec![(server, 3)])));
    let s = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
    assert_eq!((s.time_wait, s.new_time_wait.total), (3, 3));
    assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 0);
}

#[test]
fn unknown_closers_are_unknown() {
    let mut t = LinkTable::default();
    t.observe_snapshot(read(
        vec![],
        Some(vec![
            (passive(0, "127.0.0.1:80", "127.0.0.1"), 1),
            (active(0, "127.0.0.1:80"), 1),
            (active(0, "10.0.0.1:80"), 1),
        ]),
    ));
    assert_eq!(row(&t, None, "127.0.0.1:80 ← 127.0.0.1").time_wait, 1);
    assert_eq!(row(&t, None, "→ 127.0.0.1:80").time_wait, 1);
    assert_eq!(row(&t, None, "→ 10.0.0.1:80").time_wait, 1);
    assert_eq!(t.iter().count(), 3);
}

#[test]
fn an_exited_owner_keeps_its_role_and_its_quiet_links_are_forgotten() {
    let mut t = LinkTable::default();
    let child = 30;
    // The child exited before the read: its role was remembered then.
    t.remember_role(child, "server child");
    let link = active(child, "127.0.0.1:5432");
    t.observe_snapshot(read(vec![(link, totals(1, 1, 0, 1))], None));
    assert_eq!(
        row(&t, Some("server child"), "→ 127.0.0.1:5432")
            .closes
            .total,
        1
    );
    // Quiet for QUIET_READS reads and its owner gone: forgettable.
    let alive = |pid| pid == CLIENT;
    assert!(t.forgettable(alive).is_empty());
    for _ in 0..QUIET_READS {
        t.observe_snapshot(read(vec![(link, totals(1, 1, 0, 1))], None));
    }
    assert_eq!(t.forgettable(alive), vec![link]);
    // Not while it keeps counting, nor while its owner lives.
    let live = active(CLIENT, "127.0.0.1:5432");
    for _ in 0..3 {
        t.observe_snapshot(read(vec![(live, totals(1, 0, 0, 0))], None));
    }
    assert!(t.forgettable(alive).is_empty());
    // An owner never seen is named by its pid.
    t.observe_snapshot(read(
        vec![(active(99, "127.0.0.1:1"), totals(1, 0, 0, 0))],
        None,
    ));
    assert_eq!(row(&t, Some("[99]"), "→ 127.0.0.1:1").opens.total, 1);
}

#[test]
fn past_the_bound_unused_role_names_go_and_a_remembered_owner_keeps_its_own() {
    let mut t = LinkTable::default();
    // Processes of more distinct roles than the bound exit; one, pid
    // 100000, is still counting on a link when the others' roles age out.
    const FIRST: u32 = 100_000;
    for pid in FIRST..FIRST + MAX_ROLE_NAMES as u32 + 10 {
        t.remember_role(pid, &format!("role {pid}"));
    }
    let link = active(FIRST, "127.0.0.1:5432");
    for n in 1..=ROLE_MEMORY {
        t.observe_snapshot(read(vec![(link, totals(n, 0, 0, 0))], None));
    }
    // All in use at the first read, when the bound was passed: the
    // next one is twice as many, and the names aged out stay till then.
    let first_read = MAX_ROLE_NAMES + 10 + roles().len();
    assert_eq!(t.role_names.names.len(), first_read);
    for pid in 2 * FIRST..2 * FIRST + first_read as u32 + 1 {
        t.remember_role(pid, &format!("role {pid}"));
    }
    let next = ROLE_MEMORY + 1;
    t.observe_snapshot(read(vec![(link, totals(next, 0, 0, 0))], None));
    let in_use: std::collections::HashSet<u32> = t.roles.values().map(|(id, _)| *id).collect();
    assert_eq!(
        t.role_names.names.len(),
        in_use.len(),
        "unused names let go"
    );
    // pid FIRST's, the second batch's and the live processes'.
    assert_eq!(in_use.len(), 1 + first_read + 1 + roles().len());
    // The link's owner is still named by its role, and a name let go
    // is interned anew when it returns.
    t.remember_role(FIRST + 1, "role 100001");
    t.observe_snapshot(read(
        vec![
            (link, totals(next + 1, 0, 0, 0)),
            (active(FIRST + 1, "127.0.0.1:1"), totals(1, 0, 0, 0)),
        ],
        None,
    ));
    assert_eq!(
        row(&t, Some("role 100000"), "→ 127.0.0.1:5432").opens.total,
        next + 1
    );
    assert_eq!(row(&t, Some("role 100001"), "→ 127.0.0.1:1").opens.total, 1);
}

#[test]
fn each_link_is_formatted_once() {
    let mut t = LinkTable::default();
    let c = active(CLIENT, "[::1]:443");
    for n in 1..=5 {
        t.observe_snapshot(read(vec![(c, totals(n, 0, 0, 0))], None));
    }
    assert_eq!(t.peers.len(), 1);
    assert_eq!(t.peers[&c.peer].peer, "→ [::1]:443");
    assert_eq!(row(&t, Some("client"), "→ [::1]:443").opens.total, 5);
}

#[test]
fn kernel_counters_per_interval_and_since_the_start() {
    let mut t = LinkTable::default();
    let at = |n| KernelCounters {
        listen_overflows: n,
        listen_drops: n,
        time_wait_overflows: 0,
    };
    t.set_counters(at(100));
    t.set_counters(at(105));
    let (start, interval, now) = t.counters.unwrap();
    assert_eq!(now.since(&start).listen_overflows, 5);
    assert_eq!(now.since(&interval).listen_overflows, 5);
    t.reset_interval();
    t.set_counters(at(107));
    let (start, interval, now) = t.counters.unwrap();
    assert_eq!(now.since(&interval).listen_overflows, 2);
    assert_eq!(now.since(&start).listen_overflows, 7);
}

#[test]
fn resets_are_aborts_and_memory_follows_kernel_links() {
    let mut t = LinkTable::default();
    let c = active(CLIENT, "127.0.0.1:81");
    t.observe_snapshot(read(vec![(c, totals(1, 1, 1, 0))], None));
    let r = row(&t, Some("client"), "→ 127.0.0.1:81");
    assert_eq!((r.opens.total, r.closes.total, r.aborts.total), (1, 1, 1));
    // Once the kernel forgot the link and the owners' roles aged out,
    // nothing of it is kept but its text.
    for _ in 0..ROLE_MEMORY {
        t.observe_snapshot(SocketSnapshot::default());
    }
    assert_eq!(t.remembered(), 1);
}

#[test]
fn a_process_whose_role_settles_takes_its_links_along() {
    let mut t = LinkTable::default();
    let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
    let other = passive(SERVER + 1, "127.0.0.1:80", "127.0.0.1");
    let as_role = |links, role: &str| SocketSnapshot {
        links,
        roles: HashMap::from([(SERVER, role.into()), (SERVER + 1, "srv master".into())]),
        ..SocketSnapshot::default()
    };
    // A server counted before its first fork of its own name…
    t.observe_snapshot(as_role(
        vec![(server, totals(3, 2, 0, 0)), (other, totals(4, 4, 0, 0))],
        "srv",
    ));
    t.reset_interval();
    t.observe_snapshot(as_role(
        vec![(server, totals(5, 4, 1, 0)), (other, totals(4, 4, 0, 0))],
        "srv",
    ));
    // …then a master, with another master already on the same link.
    t.observe_snapshot(as_role(
        vec![(server, totals(6, 6, 1, 0)), (other, totals(4, 4, 0, 0))],
        "srv master",
    ));
    let owners: Vec<_> = t.iter().map(|(k, _)| k.owner.clone()).collect();
    assert_eq!(owners, [Some("srv master".to_string())], "one row");
    let r = row(&t, Some("srv master"), "127.0.0.1:80 ← 127.0.0.1");
    assert_eq!((r.opens.total, r.closes.total, r.aborts.total), (10, 10, 1));
    // This interval: 2 + 1 opens of the server's, none of the other's.
    assert_eq!((r.opens.interval, r.closes.interval), (3, 4));
    // Retiring under the same role moves nothing.
    t.remember_role(SERVER, "srv master");
    assert_eq!(
        row(&t, Some("srv master"), "127.0.0.1:80 ← 127.0.0.1")
            .opens
            .total,
        10
    );
}

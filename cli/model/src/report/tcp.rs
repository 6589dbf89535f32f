//! The report's TCP part: the links of the watched processes, their
//! listening sockets with their backlogs, the kernel's TcpExt counters, and
//! what deserves a warning (ports running out, namespaces not walked).

use serde::Serialize;

use super::{CountRow, Period, ReportKind};
use crate::{
    process::ProcessTable,
    tcp::{key::Side, sockets::netns_suffix},
};

/// A share of the ephemeral ports held in TIME_WAIT towards one service at or
/// above which a link is warned about.
pub const PORT_PRESSURE_WARNING: f64 = 0.5;

#[derive(Clone, Debug, Default, Serialize)]
pub struct TcpReport {
    pub links: Vec<LinkRow>,
    pub listeners: Vec<ListenerRow>,
    /// Machine-wide TcpExt counters (not per process: the kernel keeps them
    /// for the whole network namespace).
    pub kernel: KernelRow,
    /// Size of ip_local_port_range, when readable.
    pub ephemeral_ports: Option<u32>,
    /// TCP sockets on the machine at the last snapshot, and what taking it
    /// cost stackprobe (µs of wall time).
    pub sockets: usize,
    pub snapshot_us: u64,
    /// How old the walk behind `time_wait`, `listeners` and `sockets` is,
    /// in ms: walks are spaced out when they are costly (many sockets).
    pub walk_age_ms: u64,
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    /// The role of the processes owning the link's sockets (for TIME_WAIT:
    /// that closed first); null when unknown (the closer was not seen).
    pub owner: Option<String>,
    /// `active` (it connected out) or `passive` (it accepted).
    pub side: &'static str,
    /// `→ 127.0.0.1:5432` or `127.0.0.1:5432 ← 127.0.0.1`.
    pub link: String,
    /// Where its connections go, without the client: the destination of an
    /// active link, the listening address of a passive one.
    pub endpoint: String,
    /// TIME_WAIT sockets now, left by this process closing first.
    pub time_wait: u64,
    pub new_time_wait: CountRow,
    pub new_time_wait_per_s: f64,
    pub opens: CountRow,
    pub closes: CountRow,
    /// Connections that ended without the FIN handshake (reset, refused).
    pub aborts: CountRow,
    /// For active links: TIME_WAIT sockets as a share of the ephemeral ports.
    pub port_pressure: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ListenerRow {
    pub pid: u32,
    pub process: Option<String>,
    /// `127.0.0.1:5432`, or `127.0.0.1:5432 in net:[4026532301]` in another
    /// network namespace than stackprobe's.
    pub address: String,
    /// That namespace's inode number; None for stackprobe's own.
    pub netns: Option<u32>,
    /// Connections established and waiting to be accepted now, and the limit.
    pub backlog: u32,
    pub max_backlog: u32,
    /// Connections the kernel dropped at this listener since stackprobe
    /// started (`count` in the period, `total` since the start): each one
    /// its full accept queue turned away, and those a full SYN queue or
    /// want of memory dropped (the listener's `sk_drops`, `ss -ltm`'s `d`,
    /// which also counts the rarer drops of a listener busy in a syscall).
    /// As of the last walk of the sockets: a report between walks (walks
    /// are a few seconds, at most 30 s, apart) keeps the last walk's total
    /// and counts nothing new.
    pub lost: CountRow,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct KernelRow {
    pub listen_overflows: CountRow,
    pub listen_drops: CountRow,
    pub time_wait_overflows: CountRow,
}

pub(super) fn tcp_report(p: &Period, table: &ProcessTable) -> TcpReport {
    let links = &table.links;
    let name = |pid: u32| table.get(pid).map(|proc| proc.name.clone());
    let ports = links.ephemeral_ports();
    let mut rows: Vec<LinkRow> = links
        .iter()
        .map(|(key, st)| {
            let new_time_wait = p.count(&st.new_time_wait);
            LinkRow {
                owner: key.owner.clone(),
                side: match key.side {
                    Side::Active => "active",
                    Side::Passive => "passive",
                },
                link: key.peer.clone(),
                endpoint: key.endpoint.clone(),
                time_wait: st.time_wait,
                new_time_wait_per_s: p.rate(new_time_wait.count),
                new_time_wait,
                opens: p.count(&st.opens),
                closes: p.count(&st.closes),
                aborts: p.count(&st.aborts),
                port_pressure: match (key.side, ports) {
                    (Side::Active, Some(n)) if n > 0 => Some(st.time_wait as f64 / f64::from(n)),
                    _ => None,
                },
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.time_wait
            .cmp(&a.time_wait)
            .then(b.opens.total.cmp(&a.opens.total))
            .then(a.link.cmp(&b.link))
    });
    let unwalked = links.unwalked().iter().map(|u| {
        format!(
            "net:[{}] (process {}'s network namespace) could not be walked: {}; its listeners and TIME_WAIT sockets are not counted",
            u.netns, u.pid, u.reason
        )
    });
    let warnings = rows
        .iter()
        .filter(|r| r.port_pressure.is_some_and(|x| x >= PORT_PRESSURE_WARNING))
        .map(|r| {
            format!(
                "{} {} holds {} TIME_WAIT sockets, {:.0}% of the {} ephemeral ports: new connections to it will start failing; reuse connections (keepalive, a pool)",
                r.owner.as_deref().unwrap_or("unknown"),
                r.link,
                r.time_wait,
                r.port_pressure.unwrap_or(0.0) * 100.0,
                ports.unwrap_or(0)
            )
        })
        .chain(unwalked)
        .collect();
    let kernel = links
        .counters()
        .map_or(KernelRow::default(), |(start, interval, now)| {
            let (since_start, in_interval) = (now.since(&start), now.since(&interval));
            let row = |total: u64, interval: u64| CountRow {
                count: match p.kind {
                    ReportKind::Interval => interval,
                    ReportKind::Summary => total,
                },
                total,
            };
            KernelRow {
                listen_overflows: row(since_start.listen_overflows, in_interval.listen_overflows),
                listen_drops: row(since_start.listen_drops, in_interval.listen_drops),
                time_wait_overflows: row(
                    since_start.time_wait_overflows,
                    in_interval.time_wait_overflows,
                ),
            }
        });
    TcpReport {
        links: rows,
        listeners: links
            .listening()
            .iter()
            .map(|l| ListenerRow {
                pid: l.owner,
                process: name(l.owner),
                address: format!("{}{}", l.local, netns_suffix(l.netns)),
                netns: l.netns,
                backlog: l.backlog,
                max_backlog: l.max_backlog,
                lost: p.count(&l.lost),
            })
            .collect(),
        kernel,
        ephemeral_ports: ports,
        sockets: links.last_snapshot().0,
        snapshot_us: links.last_snapshot().1,
        walk_age_ms: links.walk_age().as_millis() as u64,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{
        probe_stats::Drops,
        process::ProcessTable,
        report::{Report, ReportKind},
    };

    #[test]
    fn a_link_near_port_exhaustion_is_warned_about() {
        use crate::tcp::{
            counts::LinkTotals,
            key::{KernelLink, Peer, Side},
            snapshot::{SocketSnapshot, Walk},
        };
        let mut t = ProcessTable::default();
        let server: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        // nginx (pid 7) opened 60 connections and closed each first: the
        // kernel counted them, and a walk found their 60 TIME_WAIT sockets.
        let link = KernelLink {
            owner: 7,
            peer: Peer {
                side: Side::Active,
                addr: server,
                peer_ip: None,
                netns: None,
            },
        };
        let totals = LinkTotals {
            opens: 60,
            closes: 60,
            aborts: 0,
            new_time_wait: 60,
        };
        t.links.observe_snapshot(SocketSnapshot {
            links: vec![(link, totals)],
            walk: Some(Walk {
                time_wait: vec![(link, 60)],
                ..Walk::default()
            }),
            roles: std::collections::HashMap::from([(7, "nginx".to_string())]),
            ephemeral_ports: Some(100),
            ..Default::default()
        });
        let r = Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_secs(2),
            Duration::from_secs(2),
            Drops::default(),
        );
        let link = &r.tcp.links[0];
        assert_eq!(
            (link.owner.as_deref(), link.link.as_str(), link.time_wait),
            (Some("nginx"), "→ 127.0.0.1:8080", 60)
        );
        assert_eq!(link.new_time_wait_per_s, 30.0);
        assert_eq!(link.port_pressure, Some(0.6));
        assert_eq!(r.tcp.warnings.len(), 1);
        assert!(
            r.tcp.warnings[0].starts_with(
                "nginx → 127.0.0.1:8080 holds 60 TIME_WAIT sockets, 60% of the 100 ephemeral ports"
            ),
            "{}",
            r.tcp.warnings[0]
        );
    }

    #[test]
    fn a_listeners_drops_since_the_first_walk_are_its_lost_connections() {
        use std::collections::HashMap;

        use crate::{
            fixtures::{interval_report, live},
            report::CountRow,
            tcp::{
                snapshot::{SocketSnapshot, Walk},
                sockets::{ListenDrops, TcpSock, TcpState},
            },
        };
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(7, "myd")]);
        // myd (pid 7) listens on 127.0.0.1:8080 and accepts nothing: each
        // walk finds its socket's drops so far.
        let walk = |drops: u32| SocketSnapshot {
            walk: Some(Walk {
                listeners: vec![TcpSock {
                    state: TcpState::Listen,
                    local: "127.0.0.1:8080".parse().unwrap(),
                    remote: "0.0.0.0:0".parse().unwrap(),
                    ino: 55,
                    backlog: 2,
                    max_backlog: 1,
                    netns: None,
                }],
                owners: HashMap::from([((None, 8080), 7)]),
                listen_drops: vec![ListenDrops {
                    netns: None,
                    ino: 55,
                    drops,
                }],
                namespaces: vec![None],
                ..Walk::default()
            }),
            ..Default::default()
        };
        // 40 before stackprobe's first walk, 12 in the first interval.
        t.links.observe_snapshot(walk(40));
        t.links.observe_snapshot(walk(52));
        let lost = |r: &Report| {
            let row = r.roles[0]
                .listeners
                .iter()
                .find(|l| l.listener == "127.0.0.1:8080")
                .expect("a row for the listener that lost connections");
            assert_eq!((row.backlog, row.max_backlog), (Some(2), Some(1)));
            assert_eq!(Some(r.tcp.listeners[0].lost), row.lost);
            row.lost
        };
        let r = interval_report(&t);
        assert_eq!(
            lost(&r),
            Some(CountRow {
                count: 12,
                total: 12
            })
        );
        let insights = crate::insights::insights(&r);
        assert!(
            insights
                .iter()
                .any(|i| i.starts_with("myd: 127.0.0.1:8080 lost 12 connections at its full queue")),
            "{insights:?}"
        );
        // 3 more in the next interval; the summary counts all 15.
        t.reset_interval();
        t.links.observe_snapshot(walk(55));
        assert_eq!(
            lost(&interval_report(&t)),
            Some(CountRow {
                count: 3,
                total: 15
            })
        );
        let summary = Report::build(
            ReportKind::Summary,
            &t,
            Duration::from_secs(4),
            Duration::from_secs(4),
            Drops::default(),
        );
        assert_eq!(
            lost(&summary),
            Some(CountRow {
                count: 15,
                total: 15
            })
        );
        // A look without a walk: the last walk's total, nothing new.
        t.reset_interval();
        t.links.observe_snapshot(SocketSnapshot::default());
        assert_eq!(
            lost(&interval_report(&t)),
            Some(CountRow {
                count: 0,
                total: 15
            })
        );
    }

    #[test]
    fn a_namespace_the_walk_could_not_enter_is_warned_about() {
        use crate::tcp::snapshot::{SocketSnapshot, Unwalked, Walk};
        let mut t = ProcessTable::default();
        t.links.observe_snapshot(SocketSnapshot {
            walk: Some(Walk {
                unwalked: vec![Unwalked {
                    netns: 4026532301,
                    pid: 42,
                    reason: "CAP_SYS_ADMIN is not permitted".into(),
                }],
                ..Walk::default()
            }),
            ..Default::default()
        });
        let r = crate::fixtures::interval_report(&t);
        assert_eq!(
            r.tcp.warnings,
            [
                "net:[4026532301] (process 42's network namespace) could not be walked: \
              CAP_SYS_ADMIN is not permitted; its listeners and TIME_WAIT sockets are not \
              counted"
            ]
        );
    }
}

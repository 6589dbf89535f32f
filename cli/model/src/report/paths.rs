//! A connection can take one of two paths: TCP or a unix socket. This
//! names which one a listener or destination is, and sets side by side the
//! two paths one client role takes to one server role.

use serde::Serialize;

use super::{ConnectRow, ListenerLatencyRow, RoleRow, Summary};
use crate::measure::Latency;

/// One client role reaching one server role over two paths.
#[derive(Clone, Debug, Serialize)]
pub struct PathComparison {
    pub client: String,
    pub server: String,
    pub tcp: PathNumbers,
    pub unix: PathNumbers,
}

/// What a connection over one path costs: the client's connect, and at the
/// server's listener (all its clients' connections) the accept and, for
/// TCP, the accept-queue wait (not measured for unix sockets: empty).
#[derive(Clone, Debug, Serialize)]
pub struct PathNumbers {
    /// The TCP address:port or unix path, as the client connects to it and
    /// the server listens on it.
    pub destination: String,
    pub connect: Summary,
    pub refused: u64,
    pub failed: u64,
    pub accept: Summary,
    pub accept_queue: Summary,
}

/// Each pair of a client's TCP and unix destinations that one server role
/// listens on both of (the names match: the address, or the path the
/// client gave and the server bound).
pub(super) fn compare_paths(roles: &[RoleRow]) -> Vec<PathComparison> {
    let mut out = Vec::new();
    let listener = |name: &str| {
        roles.iter().find_map(|server| {
            server
                .listeners
                .iter()
                .find(|l| l.listener == name)
                .map(|l| (server, l))
        })
    };
    let numbers = |c: &ConnectRow, l: &ListenerLatencyRow| PathNumbers {
        destination: c.destination.clone(),
        connect: c.connects().latency,
        refused: c.refused.count,
        failed: c.failed.count,
        accept: l.latency[Latency::Accept].latency,
        accept_queue: l.latency[Latency::AcceptQueue].latency,
    };
    for client in roles {
        let by_kind = |kind: &'static str| client.connects.iter().filter(move |c| c.path == kind);
        for tcp in by_kind("tcp") {
            let Some((server, tcp_listener)) = listener(&tcp.destination) else {
                continue;
            };
            for unix in by_kind("unix") {
                if let Some((also, unix_listener)) = listener(&unix.destination)
                    && also.role == server.role
                {
                    out.push(PathComparison {
                        client: client.role.clone(),
                        server: server.role.clone(),
                        tcp: numbers(tcp, tcp_listener),
                        unix: numbers(unix, unix_listener),
                    });
                }
            }
        }
    }
    out
}

/// Whether a listener's or destination's name is a TCP address or a unix
/// socket's (a path, or `@` and an abstract name); names in parentheses
/// are neither.
pub fn path_kind(name: &str) -> &'static str {
    if name.starts_with('/') || name.starts_with('@') {
        "unix"
    } else if name.starts_with('(') {
        "unknown"
    } else {
        "tcp"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{
        event::HistMetric,
        measure::Latency,
        probe_stats::Drops,
        process::ProcessTable,
        report::{Report, ReportKind},
    };

    /// A client ("php", pid 1) connecting to `tcp_ns` over TCP and
    /// `unix_ns` over a unix socket, 30 times each, twice refused over TCP;
    /// a server ("postgres", pid 2) listening on both.
    fn two_paths(tcp_ns: u64, unix_ns: u64) -> Report {
        let mut t = ProcessTable::default();
        t.sync_watched(&[
            crate::fixtures::live(1, "php"),
            crate::fixtures::live(2, "postgres"),
        ]);
        let from = |pid, comm, metric, path, ns: &[u64]| {
            crate::fixtures::kernel_hist_from(pid, comm, metric, Some(path), ns)
        };
        let (tcp, unix) = ("127.0.0.1:5432", "/run/pg/.s.PGSQL.5432");
        t.apply(&from(1, "php", HistMetric::Connect, tcp, &[tcp_ns; 30]));
        t.apply(&from(1, "php", HistMetric::ConnectRefused, tcp, &[0, 0]));
        t.apply(&from(1, "php", HistMetric::Connect, unix, &[unix_ns; 30]));
        t.apply(&from(2, "postgres", HistMetric::Accept, tcp, &[4_000; 30]));
        t.apply(&from(
            2,
            "postgres",
            HistMetric::AcceptQueue,
            tcp,
            &[900_000; 30],
        ));
        t.apply(&from(2, "postgres", HistMetric::Accept, unix, &[6_000; 30]));
        let mut r = Report::build(
            ReportKind::Summary,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        crate::insights::annotate(&mut r);
        r
    }

    #[test]
    fn a_client_reaching_a_server_over_tcp_and_unix_gets_the_paths_side_by_side() {
        let r = two_paths(15_000, 5_000);
        let php = r.roles.iter().find(|r| r.role == "php").unwrap();
        let rows: Vec<(&str, &str, u64, u64)> = php
            .connects
            .iter()
            .map(|c| {
                (
                    c.destination.as_str(),
                    c.path,
                    c.connects().total,
                    c.refused.total,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("127.0.0.1:5432", "tcp", 30, 2),
                ("/run/pg/.s.PGSQL.5432", "unix", 30, 0)
            ]
        );
        assert_eq!(php.latency[Latency::Connect].total, 60);
        let [p] = r.paths.as_slice() else {
            panic!("{:?}", r.paths)
        };
        assert_eq!((p.client.as_str(), p.server.as_str()), ("php", "postgres"));
        assert_eq!((p.tcp.connect.count, p.tcp.refused), (30, 2));
        assert!((14_800..=15_200).contains(&p.tcp.connect.p50_ns), "{p:?}");
        assert!((4_900..=5_100).contains(&p.unix.connect.p50_ns), "{p:?}");
        assert_eq!((p.tcp.accept.count, p.unix.accept.count), (30, 30));
        assert_eq!(
            (p.tcp.accept_queue.count, p.unix.accept_queue.count),
            (30, 0)
        );
        let said: Vec<&String> = r
            .insights
            .iter()
            .filter(|i| i.starts_with("php → postgres"))
            .collect();
        assert_eq!(said.len(), 1, "{:?}", r.insights);
        assert!(
            said[0].contains("over the unix socket /run/pg/.s.PGSQL.5432 connects in 5.0µs")
                && said[0].ends_with("connect over the unix socket"),
            "{}",
            said[0]
        );
    }

    #[test]
    fn paths_within_noise_of_each_other_get_no_insight() {
        // 10 % apart: beyond the bucket width, within a machine's wobble.
        let r = two_paths(11_000, 10_000);
        assert_eq!(r.paths.len(), 1);
        assert!(
            !r.insights.iter().any(|i| i.starts_with("php → postgres")),
            "{:?}",
            r.insights
        );
    }
}

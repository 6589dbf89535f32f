//! What one interval (or the whole run) measured, ready for any view to
//! render: text, JSON, later the dashboard.

use std::time::Duration;

use serde::Serialize;

use super::{
    containers::{self, Container},
    counter::Counter,
    histogram::{LatencyHistogram, Log2Bucket, Summary},
    links::Side,
    measure::{Count, Counts, Latencies, Latency, ListenerLatencies},
    probe_stats::{Drops, ProgramCost, RungInUse},
    process::{Activity, Metric, ProcessTable, Span},
    sockets::netns_suffix,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    /// The last interval.
    Interval,
    /// Everything since stackprobe started.
    Summary,
}

/// The `--json` schema: bumped when a field changes meaning or goes away
/// (new fields may appear without a bump).
pub const SCHEMA: &str = "stackprobe.watch/3";

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    #[serde(rename = "type")]
    pub kind: ReportKind,
    /// Seconds since stackprobe attached its probes.
    pub elapsed_s: f64,
    /// Seconds this report covers.
    pub period_s: f64,
    /// Processes in the watch set now.
    pub watched: usize,
    /// All drops since the start (see `drops_by_cause`).
    pub drops: u64,
    pub drops_by_cause: Drops,
    /// Events received from the kernel (set by the collector).
    pub events: CountRow,
    /// Watched processes grouped by role (postmaster, backends, workers…).
    pub roles: Vec<RoleRow>,
    /// Live processes that have accepted anything.
    pub processes: Vec<ProcessRow>,
    /// Connections, listeners and the kernel's TCP counters.
    pub tcp: TcpReport,
    /// Clients that reach one watched server over TCP and over a unix
    /// socket: the two paths side by side.
    pub paths: Vec<PathComparison>,
    /// Per-program BPF run-time statistics, with `--probe-cost` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub probe_cost: Vec<ProgramCost>,
    /// What the numbers mean, when there is enough data: filled by
    /// `insights::annotate`, a pass of its own.
    pub insights: Vec<String>,
    /// The hook each metric with a choice of hooks comes from on this
    /// kernel (set by the collector).
    #[serde(rename = "hooks")]
    pub rungs: Vec<RungInUse>,
}

/// One latency metric over the period: its distribution (`count` is the
/// period's samples), rate and all-time total.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MetricRow {
    #[serde(flatten)]
    pub latency: Summary,
    pub rate_per_s: f64,
    pub total: u64,
    pub log2_buckets: Vec<Log2Bucket>,
}

/// A count over the period, and since the start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CountRow {
    pub count: u64,
    pub total: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RoleRow {
    /// The role, with its container's label in brackets for processes in
    /// a container (roles are per container).
    pub role: String,
    /// The container's name, else its short id; null outside containers.
    pub container: Option<String>,
    /// Live processes in the role.
    pub processes: usize,
    /// Some of their pids (at most [`PIDS_SHOWN`]).
    pub pids: Vec<u32>,
    /// Each declared latency ([`crate::measure::LATENCIES`]), a field of
    /// its own in JSON.
    #[serde(flatten)]
    pub latency: Latencies<MetricRow>,
    /// Each declared count ([`crate::measure::COUNTS`]), likewise.
    #[serde(flatten)]
    pub counts: Counts<CountRow>,
    /// Processes forked per accepted connection over the period (null
    /// without accepts).
    pub forks_per_accept: Option<f64>,
    /// Children of the role's processes alive now.
    pub children_alive: usize,
    /// `accept` and `accept_queue` per listening socket the role's
    /// processes accepted from, busiest first.
    pub listeners: Vec<ListenerLatencyRow>,
    /// The role's connects per destination, busiest first.
    pub connects: Vec<ConnectRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConnectRow {
    /// `127.0.0.1:5432`, `[::1]:80`, a unix socket's path (`@name` in the
    /// abstract namespace), or `(unknown destination)`.
    pub destination: String,
    /// `tcp` or `unix`.
    pub path: &'static str,
    /// Successful connects: TCP, from the SYN to ESTABLISHED (the
    /// handshake, which a non-blocking connect does not wait for); unix,
    /// the connect() call.
    pub latency: MetricRow,
    /// Refused: a reset answering the SYN, or a unix socket nobody listens on.
    pub refused: CountRow,
    /// Failed otherwise: timed out, unreachable, no such socket file, a
    /// full unix backlog, or closed before it completed.
    pub failed: CountRow,
}

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
fn compare_paths(roles: &[RoleRow]) -> Vec<PathComparison> {
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
        connect: c.latency.latency,
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

#[derive(Clone, Debug, Serialize)]
pub struct ListenerLatencyRow {
    /// `127.0.0.1:5432`, `[::1]:80`, a unix socket's path (`@name` in the
    /// abstract namespace), or `(unknown listener)`.
    pub listener: String,
    /// The latencies declared [`Per::Listener`] (accept, accept_queue).
    #[serde(flatten)]
    pub latency: ListenerLatencies<MetricRow>,
    /// A TCP listener's connections waiting to be accepted now, and the
    /// limit, as the last walk of the sockets found them; null for a unix
    /// socket (the walk covers TCP only) or a listener it did not find.
    pub backlog: Option<u32>,
    pub max_backlog: Option<u32>,
}

pub const PIDS_SHOWN: usize = 16;

impl RoleRow {
    /// No live process and nothing in the period: a role whose processes
    /// all exited before it, or that was only ever a name. It has no row.
    fn is_empty(&self) -> bool {
        self.processes == 0
            && self.latency.iter().all(|(_, m)| m.latency.count == 0)
            && self.counts.iter().all(|(_, c)| c.count == 0)
            && self
                .connects
                .iter()
                .all(|c| c.latency.latency.count + c.refused.count + c.failed.count == 0)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    pub process: String,
    pub pid: u32,
    /// Its pid inside its container's pid namespace, where that differs.
    pub ns_pid: Option<u32>,
    /// The container it runs in (runtime, full id, name when known).
    pub container: Option<Container>,
    pub role: String,
    pub metric: &'static str,
    /// Accepts per second over the period.
    pub rate_per_s: f64,
    /// Accepts since the start (with a latency sample).
    pub total: u64,
    /// Accepts since the start whose latency is unknown (blocked in
    /// accept() when the probes attached).
    pub untimed: u64,
    /// The period's accept latency distribution; `count` is the period's accepts.
    #[serde(flatten)]
    pub latency: Summary,
    pub log2_buckets: Vec<Log2Bucket>,
    /// Processes this one forked in the period.
    pub forks: u64,
    pub children_alive: usize,
}

pub const ACCEPT_METRIC: &str = "accept_latency";

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
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct KernelRow {
    pub listen_overflows: CountRow,
    pub listen_drops: CountRow,
    pub time_wait_overflows: CountRow,
}

struct Period {
    kind: ReportKind,
    secs: f64,
}

impl Period {
    fn hist<'a>(&self, m: &'a Metric) -> &'a LatencyHistogram {
        match self.kind {
            ReportKind::Interval => &m.interval,
            ReportKind::Summary => &m.total,
        }
    }

    fn metric(&self, m: &Metric) -> MetricRow {
        let hist = self.hist(m);
        MetricRow {
            latency: hist.summary(),
            rate_per_s: self.rate(hist.count()),
            total: m.total_count(),
            log2_buckets: hist.log2_buckets(),
        }
    }

    fn count(&self, c: &Counter) -> CountRow {
        CountRow {
            count: match self.kind {
                ReportKind::Interval => c.interval,
                ReportKind::Summary => c.total,
            },
            total: c.total,
        }
    }

    fn rate(&self, count: u64) -> f64 {
        if self.secs > 0.0 {
            count as f64 / self.secs
        } else {
            0.0
        }
    }
}

impl Report {
    pub fn build(
        kind: ReportKind,
        table: &ProcessTable,
        period: Duration,
        elapsed: Duration,
        drops: Drops,
    ) -> Self {
        let p = Period {
            kind,
            secs: period.as_secs_f64(),
        };
        let span = match kind {
            ReportKind::Interval => Span::Interval,
            ReportKind::Summary => Span::Whole,
        };
        let mut roles: Vec<RoleRow> = table
            .roles(span)
            .into_iter()
            .map(|(role, (pids, activity))| role_row(&p, table, role, &pids, &activity))
            .filter(|row| !row.is_empty())
            .collect();
        roles.sort_by(|a, b| {
            (b.latency[Latency::Accept].total + b.latency[Latency::Fork].total)
                .cmp(&(a.latency[Latency::Accept].total + a.latency[Latency::Fork].total))
                .then(b.processes.cmp(&a.processes))
                .then(a.role.cmp(&b.role))
        });
        // Every live process that has accepted anything gets a row, so a
        // server that went quiet shows 0 rather than vanishing.
        let mut processes: Vec<ProcessRow> = table
            .iter()
            .filter(|proc| {
                !proc.activity.latency[Latency::Accept].total.is_empty()
                    || proc.activity.counts[Count::AcceptUntimed].total > 0
            })
            .map(|proc| {
                let accept = p.metric(&proc.activity.latency[Latency::Accept]);
                ProcessRow {
                    process: proc.name.clone(),
                    pid: proc.pid,
                    ns_pid: proc.ns_pid,
                    container: proc.container.clone(),
                    role: proc.role(),
                    metric: ACCEPT_METRIC,
                    rate_per_s: accept.rate_per_s,
                    total: accept.total,
                    untimed: proc.activity.counts[Count::AcceptUntimed].total,
                    latency: accept.latency,
                    log2_buckets: accept.log2_buckets,
                    forks: p.hist(&proc.activity.latency[Latency::Fork]).count(),
                    children_alive: table.children_alive(proc.pid),
                }
            })
            .collect();
        processes.sort_by(|a, b| b.total.cmp(&a.total).then(a.pid.cmp(&b.pid)));
        let tcp = tcp_report(&p, table);
        for role in &mut roles {
            attach_backlogs(role, &tcp.listeners, table);
        }
        let paths = compare_paths(&roles);
        Self {
            schema: SCHEMA,
            kind,
            elapsed_s: elapsed.as_secs_f64(),
            period_s: p.secs,
            watched: table.watched_count(),
            drops: drops.total(),
            drops_by_cause: drops,
            events: CountRow::default(),
            roles,
            processes,
            tcp,
            paths,
            probe_cost: Vec::new(),
            insights: Vec::new(),
            rungs: Vec::new(),
        }
    }
}

fn tcp_report(p: &Period, table: &ProcessTable) -> TcpReport {
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

fn role_row(p: &Period, table: &ProcessTable, role: String, pids: &[u32], a: &Activity) -> RoleRow {
    let latency = a.latency.map(|m| p.metric(m));
    let counts = a.counts.map(|c| p.count(c));
    let accepted = latency[Latency::Accept].latency.count + counts[Count::AcceptUntimed].count;
    let forks = latency[Latency::Fork].latency.count;
    let forks_per_accept = (accepted > 0).then(|| forks as f64 / accepted as f64);
    RoleRow {
        container: containers::split_role(&role).1.map(str::to_string),
        role,
        processes: pids.len(),
        pids: pids.iter().copied().take(PIDS_SHOWN).collect(),
        latency,
        counts,
        forks_per_accept,
        children_alive: pids.iter().map(|&pid| table.children_alive(pid)).sum(),
        listeners: listener_rows(p, a),
        connects: connect_rows(p, a),
    }
}

fn connect_rows(p: &Period, a: &Activity) -> Vec<ConnectRow> {
    let mut rows: Vec<ConnectRow> = a
        .connects
        .iter()
        .map(|(name, c)| ConnectRow {
            path: path_kind(name),
            destination: name.clone(),
            latency: p.metric(&c.latency),
            refused: p.count(&c.refused),
            failed: p.count(&c.failed),
        })
        .collect();
    let tried = |r: &ConnectRow| r.latency.total + r.refused.total + r.failed.total;
    rows.sort_by(|a, b| {
        tried(b)
            .cmp(&tried(a))
            .then(a.destination.cmp(&b.destination))
    });
    rows
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

/// Each of the role's TCP listeners' backlog, from the walk's listener of
/// that address held by one of the role's processes.
fn attach_backlogs(role: &mut RoleRow, walked: &[ListenerRow], table: &ProcessTable) {
    for l in &mut role.listeners {
        // The walk names a listener in another namespace with its suffix;
        // its process names it without.
        let found = walked.iter().find(|w| {
            w.address.strip_suffix(&netns_suffix(w.netns)) == Some(l.listener.as_str())
                && table.get(w.pid).is_some_and(|p| p.role() == role.role)
        });
        if let Some(w) = found {
            l.backlog = Some(w.backlog);
            l.max_backlog = Some(w.max_backlog);
        }
    }
}

fn listener_rows(p: &Period, a: &Activity) -> Vec<ListenerLatencyRow> {
    let mut rows: Vec<ListenerLatencyRow> = a
        .listeners
        .iter()
        .map(|(name, l)| ListenerLatencyRow {
            listener: name.clone(),
            latency: ListenerLatencies(l.latency.map(|m| p.metric(m))),
            backlog: None,
            max_backlog: None,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.latency[Latency::Accept]
            .total
            .cmp(&a.latency[Latency::Accept].total)
            .then(a.listener.cmp(&b.listener))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Event, ExitSample, HistMetric, SpawnSample, TaskKind},
        fixtures::kernel_hist,
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
        t.sync_watched(&[
            LiveProcess {
                pid: 1,
                name: "idle".into(),
                title: None,
                parent: None,
                container: None,
                ns_pid: None,
            },
            LiveProcess {
                pid: 2,
                name: "busy".into(),
                title: None,
                parent: None,
                container: None,
                ns_pid: None,
            },
            LiveProcess {
                pid: 3,
                name: "quiet".into(),
                title: None,
                parent: None,
                container: None,
                ns_pid: None,
            },
        ]);
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
                    c.latency.total,
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
        t.sync_watched(&[LiveProcess {
            pid: 1,
            name: "srv".into(),
            title: None,
            parent: None,
            container: None,
            ns_pid: None,
        }]);
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
        let r = Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
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

    #[test]
    fn a_link_near_port_exhaustion_is_warned_about() {
        use crate::links::{KernelLink, LinkTotals, Peer, Side, SocketSnapshot, Walk};
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
    fn a_namespace_the_walk_could_not_enter_is_warned_about() {
        use crate::links::{SocketSnapshot, Unwalked, Walk};
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
        let r = Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        assert_eq!(
            r.tcp.warnings,
            [
                "net:[4026532301] (process 42's network namespace) could not be walked: \
              CAP_SYS_ADMIN is not permitted; its listeners and TIME_WAIT sockets are not \
              counted"
            ]
        );
    }

    /// docs/json.md's table, read as the list of documented fields.
    mod json_doc {
        use serde_json::Value;

        /// Each row: the field paths its first cell names (`roles[].accept`,
        /// `.fork`: a sibling of the first), and the field names its text
        /// gives in backquotes (`{count, total}` gives two). A row whose
        /// text starts with the name of a shape row (`metric`, `count`)
        /// has that shape's fields too.
        pub struct Fields(Vec<(Vec<String>, Vec<String>)>);

        fn names(quoted: &str) -> impl Iterator<Item = String> + '_ {
            quoted
                .split(['{', '}', ',', ' ', '`'])
                .map(|n| n.trim_end_matches("[]"))
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        }

        impl Fields {
            pub fn read() -> Self {
                let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/json.md"));
                let quoted = |s: &str| -> Vec<String> {
                    s.split('`').skip(1).step_by(2).flat_map(names).collect()
                };
                let rows: Vec<(Vec<String>, Vec<String>, String)> = doc
                    .lines()
                    .filter_map(|l| l.strip_prefix("| `"))
                    .map(|row| {
                        let (cell, text) = row.split_once(" | ").unwrap_or((row, ""));
                        let cell_names: Vec<String> = cell
                            .split('`')
                            .step_by(2)
                            .map(|n| n.trim_end_matches("[]").to_string())
                            .filter(|n| !n.is_empty() && n != ", ")
                            .collect();
                        let first = cell_names[0].clone();
                        let parent = first.rsplit_once('.').map_or("", |(p, _)| p).to_string();
                        let paths = cell_names
                            .iter()
                            .map(|n| match n.strip_prefix('.') {
                                Some(sibling) => format!("{parent}.{sibling}"),
                                None if n.contains('.') || parent.is_empty() => n.clone(),
                                None => format!("{parent}.{n}"),
                            })
                            .collect();
                        (paths, quoted(text), text.to_string())
                    })
                    .collect();
                let shape = |name: &str| {
                    rows.iter()
                        .find(|(paths, _, _)| paths == &[name.to_string()])
                        .map(|(_, fields, _)| fields.clone())
                        .unwrap_or_default()
                };
                let (metric, count) = (shape("metric"), shape("count"));
                Self(
                    rows.iter()
                        .map(|(paths, fields, text)| {
                            let mut fields = fields.clone();
                            if text.starts_with("metric") {
                                fields.extend(metric.iter().cloned());
                            }
                            if text.starts_with("count") {
                                fields.extend(count.iter().cloned());
                            }
                            (paths.clone(), fields)
                        })
                        .collect(),
                )
            }

            /// `path` is documented: named in a row, the parent of fields
            /// named, or described in the row of one of its ancestors.
            pub fn covers(&self, path: &str) -> bool {
                let path = path.replace("[]", "");
                let named = self.0.iter().any(|(paths, _)| {
                    paths.iter().any(|d| {
                        let d = d.replace("[]", "");
                        d == path || d.starts_with(&format!("{path}."))
                    })
                });
                if named {
                    return true;
                }
                let mut ancestor = path.as_str();
                while let Some((up, _)) = ancestor.rsplit_once('.') {
                    let field = path[up.len() + 1..].split('.').next().unwrap_or("");
                    if self.0.iter().any(|(paths, fields)| {
                        paths.iter().any(|d| d.replace("[]", "") == up)
                            && fields.iter().any(|f| f == field)
                    }) {
                        return true;
                    }
                    ancestor = up;
                }
                false
            }
        }

        /// Hands `f` the path of every field of `v` down to `depth` levels
        /// (`roles[].accept.count`: arrays are walked through their first
        /// element).
        pub fn walk(v: &Value, prefix: &str, depth: usize, f: &mut impl FnMut(&str)) {
            if depth == 0 {
                return;
            }
            let Value::Object(map) = v else { return };
            for (key, value) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                f(&path);
                match value {
                    Value::Array(items) => {
                        if let Some(first) = items.first() {
                            walk(first, &format!("{path}[]"), depth - 1, f);
                        }
                    }
                    other => walk(other, &path, depth - 1, f),
                }
            }
        }
    }

    #[test]
    fn json_field_names_are_the_documented_ones() {
        let t = table();
        let r = Report::build(
            ReportKind::Summary,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["schema"], "stackprobe.watch/3");
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
            metric: crate::event::HistMetric::AcceptUntimed,
            count: 1,
            sum_ns: 0,
            min_ns: 0,
            max_ns: 0,
            buckets: vec![(0, 1)],
        }));
        assert_eq!(build(&t, ReportKind::Interval), ["initdb-child", "srv"]);
    }
}

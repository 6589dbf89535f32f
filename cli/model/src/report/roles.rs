//! The report's rows per role: each declared latency and count summed over
//! the role's processes (live ones and those that exited), with their
//! accepts per listener and their connects per destination.

use serde::Serialize;

use super::{CountRow, CpuRow, ListenerRow, MetricRow, Period, Report, cpu::cpu_row, path_kind};
use crate::{
    busy::BusyRow,
    containers,
    measure::{Count, Counts, DestinationLatencies, Kept, Latencies, Latency, ListenerLatencies},
    process::{Activity, ProcessTable, Span},
    tcp::sockets::netns_suffix,
};

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
    /// The connections the role's server held (see [`crate::busy`]); null
    /// for a role that accepted none since stackprobe started.
    pub busy: Option<BusyRow>,
    /// Its threads' CPU time and run-queue wait over the period, summed;
    /// null when neither was measured in it.
    pub cpu: Option<CpuRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConnectRow {
    /// `127.0.0.1:5432`, `[::1]:80`, a unix socket's path (`@name` in the
    /// abstract namespace), or `(unknown destination)`.
    pub destination: String,
    /// `tcp` or `unix`.
    pub path: &'static str,
    /// The latencies declared [`Per::Destination`](crate::measure::Per):
    /// `connect`, successful connects (TCP, from the SYN to ESTABLISHED,
    /// the handshake, which a non-blocking connect does not wait for;
    /// unix, the connect() call), and `held`, how long each TCP
    /// connection stayed open.
    #[serde(flatten)]
    pub latency: DestinationLatencies<MetricRow>,
    /// Refused: a reset answering the SYN, or a unix socket nobody listens on.
    pub refused: CountRow,
    /// Failed otherwise: timed out, unreachable, no such socket file, or
    /// closed before it completed.
    pub failed: CountRow,
    /// Unix connects a full listener queue refused (EAGAIN): lost at the
    /// queue.
    pub lost: CountRow,
}

impl ConnectRow {
    /// The successful connects.
    pub fn connects(&self) -> &MetricRow {
        &self.latency[Latency::Connect]
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ListenerLatencyRow {
    /// `127.0.0.1:5432`, `[::1]:80`, a unix socket's path (`@name` in the
    /// abstract namespace), or `(unknown listener)`.
    pub listener: String,
    /// The latencies declared [`Per::Listener`] (accept, accept_queue).
    #[serde(flatten)]
    pub latency: ListenerLatencies<MetricRow>,
    /// The listener's connections waiting to be accepted now, and the
    /// limit: a TCP listener's as the last walk of the sockets found them,
    /// a unix listener's as the kernel's socket diagnostics list them at
    /// the report; null for a listener neither found.
    pub backlog: Option<u32>,
    pub max_backlog: Option<u32>,
    /// Connections lost at the listener's full queue (`count` in the
    /// period, `total` since stackprobe started): a TCP listener's from
    /// the last walk of the sockets (its `sk_drops`, see
    /// [`ListenerRow::lost`]: between walks, the last walk's), a unix
    /// listener's the connects its full queue refused (EAGAIN) from any
    /// process, matched by the socket file the client named; null for a
    /// listener neither found. A listener that lost connections has a row
    /// even if its role accepted nothing from it.
    pub lost: Option<CountRow>,
}

pub const PIDS_SHOWN: usize = 16;

impl RoleRow {
    /// No live process and nothing in the period: a role whose processes
    /// all exited before it, or that was only ever a name. It has no row.
    fn is_empty(&self) -> bool {
        self.processes == 0
            && self.latency.iter().all(|(_, m)| m.latency.count == 0)
            && self.counts.iter().all(|(_, c)| c.count == 0)
            && self.connects.iter().all(|c| {
                c.connects().latency.count + c.refused.count + c.failed.count + c.lost.count == 0
            })
    }
}

/// A row per role with something to show, busiest first.
pub(super) fn role_rows(p: &Period, table: &ProcessTable, span: Span) -> Vec<RoleRow> {
    let mut roles: Vec<RoleRow> = table
        .roles(span)
        .into_iter()
        .map(|(role, (pids, activity))| role_row(p, table, role, &pids, &activity))
        .filter(|row| !row.is_empty())
        .collect();
    roles.sort_by(|a, b| {
        (b.latency[Latency::Accept].total + b.latency[Latency::Fork].total)
            .cmp(&(a.latency[Latency::Accept].total + a.latency[Latency::Fork].total))
            .then(b.processes.cmp(&a.processes))
            .then(a.role.cmp(&b.role))
    });
    roles
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
        busy: None,
        cpu: cpu_row(p, a),
    }
}

fn connect_rows(p: &Period, a: &Activity) -> Vec<ConnectRow> {
    let mut rows: Vec<ConnectRow> = a
        .connects
        .iter()
        .map(|(name, c)| ConnectRow {
            path: path_kind(name),
            destination: name.clone(),
            latency: Kept(c.latency.map(|m| p.metric(m))),
            refused: p.count(&c.refused),
            failed: p.count(&c.failed),
            lost: p.count(&c.lost),
        })
        .collect();
    let tried =
        |r: &ConnectRow| r.connects().total + r.refused.total + r.failed.total + r.lost.total;
    rows.sort_by(|a, b| {
        tried(b)
            .cmp(&tried(a))
            .then(a.destination.cmp(&b.destination))
    });
    rows
}

/// The TCP listeners' backlogs and lost connections on the roles'
/// listener rows, each from the walk's listener of that address (see
/// [`Report::attach_listener`]).
pub(super) fn attach_backlogs(roles: &mut [RoleRow], walked: &[ListenerRow], table: &ProcessTable) {
    for w in walked {
        let Some(holder) = table.get(w.pid).map(|p| p.role()) else {
            continue;
        };
        // The walk names a listener in another namespace with its suffix;
        // its process names it without.
        let name = w
            .address
            .strip_suffix(&netns_suffix(w.netns))
            .unwrap_or(&w.address);
        attach_listener(
            roles,
            &holder,
            name,
            Some((w.backlog, w.max_backlog)),
            w.lost,
        );
    }
}

impl Report {
    /// Puts a listener's backlog (connections waiting, and the limit) and
    /// the connections it lost on the rows that show it: those of its name
    /// in `holder`'s role (the role of the process holding it), else in
    /// the other roles of the same container (a master holds the socket
    /// its workers accept from). A listener that lost connections and has
    /// no row gets one in the holder's role.
    pub fn attach_listener(
        &mut self,
        holder: &str,
        listener: &str,
        backlog: Option<(u32, u32)>,
        lost: CountRow,
    ) {
        attach_listener(&mut self.roles, holder, listener, backlog, lost);
    }
}

fn attach_listener(
    roles: &mut [RoleRow],
    holder: &str,
    listener: &str,
    backlog: Option<(u32, u32)>,
    lost: CountRow,
) {
    let fill = |l: &mut ListenerLatencyRow| {
        if let Some((n, max)) = backlog {
            l.backlog = Some(n);
            l.max_backlog = Some(max);
        }
        l.lost = Some(lost);
    };
    let mut found = false;
    for l in roles
        .iter_mut()
        .filter(|r| r.role == holder)
        .flat_map(|r| r.listeners.iter_mut())
        .filter(|l| l.listener == listener)
    {
        fill(l);
        found = true;
    }
    if !found {
        let container = containers::split_role(holder).1;
        for l in roles
            .iter_mut()
            .filter(|r| containers::split_role(&r.role).1 == container)
            .flat_map(|r| r.listeners.iter_mut())
            .filter(|l| l.listener == listener)
        {
            fill(l);
            found = true;
        }
    }
    if !found
        && lost.total > 0
        && let Some(role) = roles.iter_mut().find(|r| r.role == holder)
    {
        let mut row = ListenerLatencyRow::unaccepted(listener.to_string());
        fill(&mut row);
        role.listeners.push(row);
    }
}

impl ListenerLatencyRow {
    /// The row of a listener its role accepted nothing from: no latency,
    /// nothing known of its backlog.
    pub fn unaccepted(listener: String) -> Self {
        Self {
            listener,
            latency: ListenerLatencies::default(),
            backlog: None,
            max_backlog: None,
            lost: None,
        }
    }
}

fn listener_rows(p: &Period, a: &Activity) -> Vec<ListenerLatencyRow> {
    let mut rows: Vec<ListenerLatencyRow> = a
        .listeners
        .iter()
        .map(|(name, l)| ListenerLatencyRow {
            listener: name.clone(),
            latency: Kept(l.latency.map(|m| p.metric(m))),
            backlog: None,
            max_backlog: None,
            lost: None,
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

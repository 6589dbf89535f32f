//! The plain-text view (`--no-tui`): a header per report, then one block per
//! role (accepts, forks, threads, children and their lifetimes, CPU time
//! against run-queue wait), then per accepting process its accepts, rate,
//! percentiles and bpftrace-style log2 bars. Parts with nothing to show are
//! left out.

use std::fmt::Write as _;

use stackprobe_model::measure::{Count, Latency, Per};
use stackprobe_model::{
    histogram::{Log2Bucket, Summary, duration},
    probe_stats::Drops,
    report::{
        Chain, HopLatency, PathComparison, Report, ReportKind, RoleRow, TcpReport, path_kind,
    },
};

const BAR_WIDTH: u64 = 40;

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let title = match report.kind {
        ReportKind::Interval => "interval",
        ReportKind::Summary => "summary",
    };
    let _ = write!(
        out,
        "=== {title} at +{:.1}s ({:.2}s) · watching {} process{}",
        report.elapsed_s,
        report.period_s,
        report.watched,
        if report.watched == 1 { "" } else { "es" },
    );
    if report.drops > 0 {
        let _ = write!(out, " · {}", drops_line(&report.drops_by_cause));
    } else {
        out.push_str(" · drops 0");
    }
    out.push('\n');
    if !report.probe_cost.is_empty() {
        let costs: Vec<String> = report
            .probe_cost
            .iter()
            .map(|c| format!("{} {:.0}ns×{}", c.program, c.ns_per_run(), c.runs))
            .collect();
        let _ = writeln!(out, "probe cost: {}", costs.join(", "));
    }
    for role in &report.roles {
        out.push_str(&role_block(role));
    }
    out.push_str(&chains_block(&report.chains));
    out.push_str(&paths_block(&report.paths));
    out.push_str(&tcp_block(&report.tcp));
    for insight in &report.insights {
        let _ = writeln!(out, "insight: {insight}");
    }
    if report.kind == ReportKind::Summary {
        for h in &report.rungs {
            let _ = writeln!(out, "hook: {} from {}", h.metric, h.description);
        }
    }
    if report.processes.is_empty() {
        out.push_str("no accepts yet\n");
    } else {
        out.push_str("per process:\n");
    }
    for p in &report.processes {
        // `postgres[5120 (1 inside) in db]`: the host's pid, then the
        // container's view.
        let inside = p
            .ns_pid
            .map_or_else(String::new, |n| format!(" ({n} inside)"));
        let container = p
            .container
            .as_ref()
            .map_or_else(String::new, |c| format!(" in {}", c.label()));
        let _ = writeln!(
            out,
            "{}[{}{inside}{container}]  accepts {} ({:.1}/s)  total {}",
            p.process, p.pid, p.latency.count, p.rate_per_s, p.total
        );
        if p.latency.count > 0 {
            let _ = writeln!(out, "  accept latency  {}", percentile_line(&p.latency));
            out.push_str(&log2_bars(&p.log2_buckets));
        }
    }
    out
}

fn role_block(r: &RoleRow) -> String {
    let mut out = role_header(r);
    out.push_str(&latency_lines(r));
    out.push_str(&cpu_line(r));
    out.push_str(&busy_line(r));
    out.push_str(&listener_lines(r));
    out.push_str(&connect_lines(r));
    out
}

/// The role's first line: its processes, then what it counted.
fn role_header(r: &RoleRow) -> String {
    let mut out = r.role.clone();
    let plural = if r.processes == 1 { "" } else { "es" };
    let pids: Vec<String> = r.pids.iter().map(u32::to_string).collect();
    let more = if r.processes > r.pids.len() {
        " …"
    } else {
        ""
    };
    let _ = write!(
        out,
        " ({} process{plural}{}{}{more}",
        r.processes,
        if pids.is_empty() { "" } else { ": " },
        pids.join(" ")
    );
    if r.counts[Count::Exited].total > 0 {
        let _ = write!(out, ", {} exited", r.counts[Count::Exited].count);
    }
    out.push(')');
    let accept = &r.latency[Latency::Accept];
    if accept.total > 0 {
        let _ = write!(
            out,
            "  accepts {} ({:.1}/s)",
            accept.latency.count, accept.rate_per_s
        );
    }
    if r.counts[Count::AcceptUntimed].total > 0 {
        let _ = write!(
            out,
            "  {} {} (blocked in accept() before the probes attached)",
            Count::AcceptUntimed.decl().label,
            r.counts[Count::AcceptUntimed].count
        );
    }
    let fork = &r.latency[Latency::Fork];
    if fork.total > 0 {
        let _ = write!(
            out,
            "  forks {} ({:.1}/s",
            fork.latency.count, fork.rate_per_s
        );
        if let Some(ratio) = r.forks_per_accept {
            let _ = write!(out, ", {ratio:.2} per accept");
        }
        out.push(')');
    }
    if r.latency[Latency::Thread].total > 0 {
        let _ = write!(
            out,
            "  threads {}",
            r.latency[Latency::Thread].latency.count
        );
    }
    // Every other declared count, by its label, once it has counted
    // (involuntary switches are on the CPU line).
    for (count, c) in r.counts.iter() {
        if !matches!(
            count,
            Count::Exited | Count::AcceptUntimed | Count::Preempted
        ) && c.total > 0
        {
            let _ = write!(out, "  {} {}", count.decl().label, c.count);
        }
    }
    if fork.total > 0 || r.children_alive > 0 {
        let _ = write!(out, "  children alive {}", r.children_alive);
    }
    out.push('\n');
    out
}

/// The connections the role's server held: mean and most at once, against
/// its processes and its configured limit.
fn busy_line(r: &RoleRow) -> String {
    let Some(b) = &r.busy else {
        return String::new();
    };
    let limit = b.limit.as_ref().map_or_else(String::new, |l| {
        format!("  limit {} {} ({})", l.setting, l.value, l.source)
    });
    format!(
        "  {:<15} mean {:.1}  max {}  now {}  of {} processes{limit}\n",
        "busy", b.mean, b.max, b.now, b.processes
    )
}

/// Busy on a CPU against waiting for one, when the run-queue probe
/// measured the role in the period: the time its threads ran (and what
/// share of a core that is), in how many slices and how many ended
/// preempted; the time they waited, its share of their runnable time, in
/// how many waits.
fn cpu_line(r: &RoleRow) -> String {
    let Some(c) = &r.cpu else {
        return String::new();
    };
    let share = if c.cores >= 1.0 {
        format!("{:.2} cores", c.cores)
    } else {
        format!("{:.1}% of a core", c.cores * 100.0)
    };
    format!(
        "  {:<15} busy {} on a CPU ({share}; {} slices, {} {})  waiting {} for a CPU ({:.0}% of the runnable time; {} waits)\n",
        "cpu",
        duration(c.on_cpu_ns),
        r.latency[Latency::OnCpu].latency.count,
        r.counts[Count::Preempted].count,
        Count::Preempted.decl().label,
        duration(c.run_queue_ns),
        c.waiting_share * 100.0,
        r.latency[Latency::RunQueue].latency.count,
    )
}

/// A percentile line per declared latency with samples in the period
/// (connects are per destination, below).
fn latency_lines(r: &RoleRow) -> String {
    let mut out = String::new();
    for (l, m) in r.latency.iter() {
        if l.decl().per != Per::Destination && m.latency.count > 0 {
            let label = l.decl().label;
            let _ = writeln!(out, "  {label:<15} {}", percentile_line(&m.latency));
        }
    }
    out
}

/// Per listener, when the role accepts from more than one; and each
/// listener that lost connections at its full queue.
fn listener_lines(r: &RoleRow) -> String {
    let mut out = String::new();
    let active: Vec<_> = r
        .listeners
        .iter()
        .filter(|l| l.latency[Latency::Accept].latency.count > 0)
        .collect();
    let each = active.len() >= 2;
    for l in &r.listeners {
        let accepted = l.latency[Latency::Accept].latency.count > 0;
        let lost = l.lost.filter(|c| c.total > 0);
        if !(each && accepted) && lost.is_none() {
            continue;
        }
        let backlog = match (l.backlog, l.max_backlog) {
            (Some(n), Some(max)) => format!("  backlog {n}/{max}"),
            _ => String::new(),
        };
        let lost = lost.map_or_else(String::new, |c| {
            format!("  lost at a full queue {}", c.count)
        });
        let accept = &l.latency[Latency::Accept];
        let _ = writeln!(
            out,
            "  from {}  accepts {} ({:.1}/s){backlog}{lost}",
            l.listener, accept.latency.count, accept.rate_per_s
        );
        if !each {
            continue;
        }
        for (latency, m) in l.latency.iter() {
            if m.latency.count > 0 {
                let label = latency.decl().label;
                let _ = writeln!(out, "    {label:<15} {}", percentile_line(&m.latency));
            }
        }
    }
    out
}

/// Per destination the role connected to.
fn connect_lines(r: &RoleRow) -> String {
    let mut out = String::new();
    for c in &r.connects {
        let connects = c.connects();
        let tried = connects.latency.count + c.refused.count + c.failed.count + c.lost.count;
        if tried == 0 {
            continue;
        }
        let _ = write!(
            out,
            "  connect to {} ({})  {} ({:.1}/s)",
            c.destination, c.path, connects.latency.count, connects.rate_per_s
        );
        if c.refused.total > 0 {
            let _ = write!(out, "  refused {}", c.refused.count);
        }
        if c.failed.total > 0 {
            let _ = write!(out, "  failed {}", c.failed.count);
        }
        if c.lost.total > 0 {
            let _ = write!(out, "  lost at a full queue {}", c.lost.count);
        }
        out.push('\n');
        for (l, m) in c.latency.iter().filter(|(_, m)| m.latency.count > 0) {
            let _ = writeln!(
                out,
                "    {:<15} {}",
                l.decl().label,
                percentile_line(&m.latency)
            );
        }
    }
    out
}

/// Each chain of roles a request crosses: one line per hop with the link it
/// was reached by, the means of its connect, queue wait, accept and service
/// time (and its threads' run-queue wait, when measured), its own time, forks per accept, busy connections and connections
/// lost at its queue; then the hop holding the most own time.
fn chains_block(chains: &[Chain]) -> String {
    let mut out = String::new();
    let mean = |l: &HopLatency| {
        if l.count > 0 {
            duration(l.mean_ns)
        } else {
            "-".to_string()
        }
    };
    for c in chains {
        let roles: Vec<&str> = c.hops.iter().map(|h| h.role.as_str()).collect();
        let _ = writeln!(out, "path: {} (means)", roles.join(" → "));
        for (i, h) in c.hops.iter().enumerate() {
            out.push_str("  ");
            if i > 0 {
                let via: Vec<String> = h
                    .via
                    .iter()
                    .map(|v| format!("{}:{v}", path_kind(v)))
                    .collect();
                let _ = write!(out, "{} → ", c.hops[i - 1].role);
                let _ = write!(out, "{} ({})", h.role, via.join(", "));
            } else {
                out.push_str(&h.role);
            }
            if let Some(connect) = &h.connect {
                let _ = write!(out, "  connect {}", mean(connect));
            }
            let _ = write!(
                out,
                "  queue {}  accept {}  service {}",
                mean(&h.accept_queue),
                mean(&h.accept),
                mean(&h.service)
            );
            if h.run_queue.count > 0 {
                let _ = write!(out, "  runq {}", mean(&h.run_queue));
            }
            match h.own_ns {
                Some(own) => {
                    let _ = write!(out, "  own {}", duration(own));
                }
                None => out.push_str("  own -"),
            }
            if let Some(f) = h.forks_per_accept.filter(|&f| f > 0.0) {
                let _ = write!(out, "  forks/accept {f:.2}");
            }
            if let Some(b) = &h.busy {
                let _ = write!(out, "  busy {:.1}/{}", b.mean, b.max);
                if let Some(l) = &b.limit {
                    let _ = write!(out, " ({} {})", l.setting, l.value);
                }
            }
            if let Some(lost) = h.lost.filter(|l| l.total > 0) {
                let _ = write!(out, "  lost {}", lost.count);
            }
            if let Some(note) = &h.note {
                let _ = write!(out, "  ({note})");
            }
            out.push('\n');
        }
        match c
            .holder
            .as_ref()
            .and_then(|holder| c.hops.iter().find(|h| &h.role == holder))
        {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "  holder: {} (own {})",
                    h.role,
                    duration(h.own_ns.unwrap_or(0))
                );
            }
            None => out.push_str("  holder: - (no hop has an own time)\n"),
        }
    }
    out
}

/// Each client reaching one server over TCP and over a unix socket: the two
/// paths side by side.
fn paths_block(paths: &[PathComparison]) -> String {
    let mut out = String::new();
    for p in paths {
        let _ = writeln!(out, "paths: {} → {}", p.client, p.server);
        for (kind, n) in [("tcp", &p.tcp), ("unix", &p.unix)] {
            let queue = if n.accept_queue.count > 0 {
                duration(n.accept_queue.p50_ns)
            } else {
                "-".to_string()
            };
            let _ = write!(
                out,
                "  {kind:<4} {}  connects {}  connect p50 {} p99 {}  accept p50 {}  queue p50 {queue}",
                n.destination,
                n.connect.count,
                duration(n.connect.p50_ns),
                duration(n.connect.p99_ns),
                duration(n.accept.p50_ns),
            );
            if n.refused + n.failed > 0 {
                let _ = write!(out, "  refused {}  failed {}", n.refused, n.failed);
            }
            out.push('\n');
        }
    }
    out
}

fn tcp_block(tcp: &TcpReport) -> String {
    let mut out = String::new();
    if !tcp.links.is_empty() {
        match super::time_wait_age(tcp) {
            Some(age) => {
                let _ = writeln!(out, "connections: ({age})");
            }
            None => out.push_str("connections:\n"),
        }
    }
    for l in &tcp.links {
        let who = l.owner.as_deref().unwrap_or("unknown");
        let _ = write!(out, "  {who} {}  TIME_WAIT {}", l.link, l.time_wait);
        if l.new_time_wait.total > 0 {
            let _ = write!(
                out,
                " (+{}, {:.1}/s)",
                l.new_time_wait.count, l.new_time_wait_per_s
            );
        }
        if l.opens.total + l.closes.total > 0 {
            let _ = write!(
                out,
                "  opens {}  closes {}  aborts {}",
                l.opens.count, l.closes.count, l.aborts.count
            );
        }
        if let Some(p) = l.port_pressure.filter(|&p| p > 0.0) {
            let _ = write!(out, "  ephemeral ports {:.1}%", p * 100.0);
        }
        out.push('\n');
    }
    if !tcp.listeners.is_empty() {
        out.push_str("listeners:\n");
    }
    for l in &tcp.listeners {
        let _ = writeln!(
            out,
            "  {}[{}] {}  backlog {}/{}{}{}",
            l.process.as_deref().unwrap_or("?"),
            l.pid,
            l.address,
            l.backlog,
            l.max_backlog,
            if l.backlog >= l.max_backlog && l.max_backlog > 0 {
                "  FULL"
            } else {
                ""
            },
            if l.lost.total > 0 {
                format!("  lost at a full queue {}", l.lost.count)
            } else {
                String::new()
            }
        );
    }
    let k = &tcp.kernel;
    if k.listen_overflows.total + k.listen_drops.total + k.time_wait_overflows.total > 0 {
        let _ = writeln!(
            out,
            "kernel (whole machine): listen overflows {}  listen drops {}  TIME_WAIT overflows {}",
            k.listen_overflows.count, k.listen_drops.count, k.time_wait_overflows.count
        );
    }
    for w in &tcp.warnings {
        let _ = writeln!(out, "WARNING: {w}");
    }
    out
}

fn percentile_line(s: &Summary) -> String {
    format!(
        "min {}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}",
        duration(s.min_ns),
        duration(s.p50_ns),
        duration(s.p90_ns),
        duration(s.p99_ns),
        duration(s.p999_ns),
        duration(s.max_ns),
        duration(s.mean_ns),
    )
}

/// `DROPS N (…)`: every cause with a count, and for events lost to a full
/// ring buffer or skipped by the kernel, their kinds.
fn drops_line(d: &Drops) -> String {
    let mut causes = Vec::new();
    let lost: Vec<String> = d
        .ring_lost()
        .filter(|&(_, n)| n > 0)
        .map(|(kind, n)| format!("{} {n}", kind.label))
        .collect();
    if !lost.is_empty() {
        causes.push(format!("ring buffer full: {}", lost.join(", ")));
    }
    let skipped: Vec<String> = d
        .skipped
        .by_kind()
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    if !skipped.is_empty() {
        causes.push(format!(
            "skipped by the kernel (a BPF program was already running on that CPU): {}",
            skipped.join(", ")
        ));
    }
    for (cause, n) in d.causes() {
        if n > 0 {
            causes.push(format!("{} {n}", cause.label));
        }
    }
    format!("DROPS {} ({})", d.total(), causes.join("; "))
}

/// bpftrace's `hist()` layout, in nanoseconds: `[4K, 8K)  12 |@@@@   |`.
pub fn log2_bars(buckets: &[Log2Bucket]) -> String {
    let peak = buckets.iter().map(|b| b.count).max().unwrap_or(0);
    let mut out = String::new();
    for b in buckets {
        let width = (b.count * BAR_WIDTH).checked_div(peak).unwrap_or(0);
        let range = format!("[{}, {})", si(b.lo), si(b.hi));
        let _ = writeln!(
            out,
            "  {range:<14}{:>9} |{:<width$}|",
            b.count,
            "@".repeat(width as usize),
            width = BAR_WIDTH as usize
        );
    }
    out
}

/// bpftrace's power-of-two suffixes: 1024 → 1K, 1048576 → 1M.
fn si(v: u64) -> String {
    const UNITS: [(u32, &str); 6] = [
        (60, "E"),
        (50, "P"),
        (40, "T"),
        (30, "G"),
        (20, "M"),
        (10, "K"),
    ];
    for (shift, unit) in UNITS {
        if v >= 1 << shift && v.is_multiple_of(1 << shift) {
            return format!("{}{unit}", v >> shift);
        }
    }
    v.to_string()
}

/// Processes by name and pid, for one line: `nginx[12], nginx[13]`.
pub fn process_list(procs: &[(u32, String)]) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> = procs
        .iter()
        .take(SHOWN)
        .map(|(pid, name)| format!("{name}[{pid}]"))
        .collect();
    if procs.len() > SHOWN {
        names.push(format!("and {} more", procs.len() - SHOWN));
    }
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use stackprobe_model::{
        fixtures::{self, fork_per_connection, live},
        probe_stats::{LostEvents, Stat},
        process::ProcessTable,
    };

    /// A postmaster (pid 42) that accepted 3 connections and forked a backend
    /// for each; two backends exited after 9 ms.
    fn report(drops: Drops) -> Report {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(42, "postgres")]);
        fork_per_connection(
            &mut t,
            42,
            "postgres",
            &[900, 2_500, 12_000],
            100_000,
            2,
            9_000_000,
        );
        fixtures::report(&t).at(3).drops(drops).build()
    }

    #[test]
    fn a_process_in_a_container_is_named_with_its_container_and_its_pid_inside() {
        let mut t = ProcessTable::default();
        let id = "4f2a9c1be07d5e3c8a6b2f1d0e9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a29384756";
        let mut p = live(5120, "postgres");
        p.container =
            stackprobe_model::containers::Container::from_cgroup(&format!("/docker/{id}"));
        p.ns_pid = Some(1);
        t.sync_watched(&[p]);
        fork_per_connection(&mut t, 5120, "postgres", &[2_000], 100_000, 0, 0);
        let text = render(&fixtures::interval_report(&t));
        assert!(
            text.lines()
                .any(|l| l.starts_with("postgres postmaster [4f2a9c1be07d] (1 process: 5120)")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("postgres[5120 (1 inside) in 4f2a9c1be07d]  accepts 1")),
            "{text}"
        );
        // Its backend, known only from its spawn event so far, is the
        // container's from the start.
        assert!(
            text.lines()
                .any(|l| l.starts_with("postgres backend [4f2a9c1be07d] (1 process: 100)")),
            "{text}"
        );
    }

    #[test]
    fn renders_roles_then_processes_with_percentiles_and_bars() {
        let text = render(&report(Drops::default()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "=== interval at +3.0s (1.00s) · watching 2 processes · drops 0"
        );
        assert_eq!(
            lines[1],
            "postgres postmaster (1 process: 42)  accepts 3 (3.0/s)  forks 3 (3.0/s, 1.00 per accept)  children alive 1"
        );
        assert_eq!(
            lines[2],
            "  accept latency  min 900ns  p50 2.5µs  p90 12.0µs  p99 12.0µs  p99.9 12.0µs  max 12.0µs  mean 5.1µs"
        );
        assert_eq!(
            lines[3],
            "  fork latency    min 100.0µs  p50 100.0µs  p90 100.0µs  p99 100.0µs  p99.9 100.0µs  max 100.0µs  mean 100.0µs"
        );
        assert_eq!(
            lines[4],
            "  child lifetime  min 9.00ms  p50 9.00ms  p90 9.00ms  p99 9.00ms  p99.9 9.00ms  max 9.00ms  mean 9.00ms"
        );
        assert_eq!(lines[5], "postgres backend (1 process: 102, 2 exited)");
        assert_eq!(lines[6], "per process:");
        assert_eq!(lines[7], "postgres[42]  accepts 3 (3.0/s)  total 3");
        assert!(lines[8].starts_with("  accept latency  min 900ns"));
        assert_eq!(
            lines[9],
            format!("  [512, 1K)             1 |{:<40}|", "@".repeat(40))
        );
        assert_eq!(lines[10], format!("  [1K, 2K)              0 |{:<40}|", ""));
        assert_eq!(
            lines[11],
            format!("  [2K, 4K)              1 |{}|", "@".repeat(40))
        );
        assert_eq!(lines[12], format!("  [4K, 8K)              0 |{:<40}|", ""));
        assert_eq!(
            lines[13],
            format!("  [8K, 16K)             1 |{}|", "@".repeat(40))
        );
        assert_eq!(lines.len(), 14);
    }

    #[test]
    fn a_role_with_two_listeners_shows_each() {
        use stackprobe_model::{event::HistMetric, fixtures::kernel_hist_from};
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(42, "postgres")]);
        for (listener, samples) in [
            ("127.0.0.1:5432", &[8_000u64, 9_000][..]),
            ("/run/postgresql/.s.PGSQL.5432", &[3_000][..]),
        ] {
            t.apply(&kernel_hist_from(
                42,
                "postgres",
                HistMetric::Accept,
                Some(listener),
                samples,
            ));
        }
        let text = render(&fixtures::report(&t).summary().build());
        assert!(
            text.contains(
                "  from 127.0.0.1:5432  accepts 2 (2.0/s)\n    accept latency  min 8.0µs"
            ),
            "{text}"
        );
        assert!(
            text.contains("  from /run/postgresql/.s.PGSQL.5432  accepts 1 (1.0/s)"),
            "{text}"
        );
    }

    #[test]
    fn a_listener_that_lost_connections_says_how_many() {
        use stackprobe_model::report::{CountRow, ListenerLatencyRow};
        let mut r = report(Drops::default());
        let mut lost = ListenerLatencyRow::unaccepted("/run/php/www.sock".into());
        lost.backlog = Some(3);
        lost.max_backlog = Some(2);
        lost.lost = Some(CountRow {
            count: 12,
            total: 40,
        });
        r.roles[0].listeners.push(lost);
        let mut quiet = ListenerLatencyRow::unaccepted("/run/php/other.sock".into());
        quiet.lost = Some(CountRow::default());
        r.roles[0].listeners.push(quiet);
        let text = render(&r);
        assert!(
            text.contains(
                "  from /run/php/www.sock  accepts 0 (0.0/s)  backlog 3/2  lost at a full queue 12\n"
            ),
            "{text}"
        );
        assert!(!text.contains("other.sock"), "{text}");
    }

    #[test]
    fn a_chain_of_roles_shows_each_hops_times_and_the_holder() {
        use stackprobe_model::{
            busy::{BusyRow, LimitRow},
            report::{CountRow, link_chains},
        };
        let mut t = ProcessTable::default();
        fixtures::three_hops(&mut t, 100);
        // Measured with --run-queue: php-fpm's threads waited for a CPU.
        t.apply(&fixtures::kernel_hist(
            12,
            "php-fpm",
            stackprobe_model::event::HistMetric::RunQueue,
            &[1_000_000, 3_000_000],
        ));
        let mut r = fixtures::interval_report(&t);
        let php = r.roles.iter_mut().find(|r| r.role == "php-fpm").unwrap();
        php.busy = Some(BusyRow {
            mean: 2.0,
            max: 2,
            now: 2,
            processes: 2,
            limit: Some(LimitRow {
                setting: "pm.max_children",
                value: 2,
                source: "/etc/php/8.2/fpm/pool.d/www.conf".into(),
            }),
        });
        php.listeners[0].lost = Some(CountRow { count: 3, total: 5 });
        link_chains(&mut r);
        let text = render(&r);
        let block: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("path: "))
            .take(5)
            .collect();
        assert_eq!(
            block,
            [
                "path: nginx → php-fpm → postgres (means)",
                "  nginx  queue 30.0µs  accept 4.0µs  service 100.00ms  own 7.96ms",
                "  nginx → php-fpm (unix:/run/php/php-fpm.sock)  connect 40.0µs  queue 12.00ms  accept 4.0µs  service 80.00ms  runq 2.00ms  own 28.98ms  busy 2.0/2 (pm.max_children 2)  lost 3",
                "  php-fpm → postgres (tcp:127.0.0.1:5432)  connect 15.0µs  queue 1.00ms  accept 4.0µs  service 50.00ms  own 50.00ms",
                "  holder: postgres (own 50.00ms)",
            ],
            "{text}"
        );
        // After the roles.
        let path = text.find("path: ").unwrap();
        assert!(text.find("postgres (1 process").unwrap() < path, "{text}");
    }

    #[test]
    fn a_role_the_run_queue_probe_measured_is_busy_on_a_cpu_or_waiting_for_one() {
        use stackprobe_model::{event::HistMetric, fixtures::kernel_hist};
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(7, "php-fpm")]);
        // In a second: 100 slices of 2 ms, 12 of them preempted, and 50
        // waits of 1 ms.
        t.apply(&kernel_hist(
            7,
            "php-fpm",
            HistMetric::OnCpu,
            &[2_000_000; 100],
        ));
        t.apply(&kernel_hist(
            7,
            "php-fpm",
            HistMetric::RunQueue,
            &[1_000_000; 50],
        ));
        t.apply(&kernel_hist(7, "php-fpm", HistMetric::Preempted, &[0; 12]));
        let mut r = fixtures::interval_report(&t);
        let text = render(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "php-fpm (1 process: 7)", "{text}");
        assert!(
            lines[2].starts_with("  run-queue wait  min 1.00ms"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("  on CPU          min 2.00ms"),
            "{text}"
        );
        assert_eq!(
            lines[4],
            "  cpu             busy 200.00ms on a CPU (20.0% of a core; 100 slices, 12 involuntary switches)  waiting 50.00ms for a CPU (20% of the runnable time; 50 waits)"
        );
        // Threads on several CPUs at once: cores, not a percentage of one.
        r.roles[0].cpu.as_mut().unwrap().cores = 2.5;
        assert!(
            render(&r).contains("busy 200.00ms on a CPU (2.50 cores; "),
            "{text}"
        );
        // Not measured: no line.
        assert!(!render(&report(Drops::default())).contains("  cpu "));
    }

    #[test]
    fn drops_are_shown_with_their_causes() {
        let skipped = LostEvents {
            tcp_state: 3,
            ..LostEvents::default()
        };
        let text = render(&report(
            Drops::from_stats(|_| 0, skipped)
                .with(Stat::LostSpawn, 5)
                .with(Stat::LostTcpState, 4)
                .with(Stat::AcceptSlotShared, 1)
                .with(Stat::ForkSlotShared, 2),
        ));
        assert!(
            text.contains("DROPS 15 (ring buffer full: spawn 5, tcp_state 4; skipped by the kernel (a BPF program was already running on that CPU): tcp_state 3; accept slot shared 1; fork slot shared 2)"),
            "{text}"
        );
    }

    #[test]
    fn failed_map_inserts_in_the_kernel_are_drops() {
        let text = render(&report(
            Drops::default()
                .with(Stat::ListenOwnersFull, 1)
                .with(Stat::TrackedInsertFailed, 2)
                .with(Stat::LinkMapFull, 3),
        ));
        assert!(
            text.contains(
                "DROPS 6 (listener map full 1; socket map insert failed 2; link map full 3)"
            ),
            "{text}"
        );
    }

    #[test]
    fn durations_pick_readable_units() {
        assert_eq!(duration(999), "999ns");
        assert_eq!(duration(1_500), "1.5µs");
        assert_eq!(duration(2_340_000), "2.34ms");
        assert_eq!(duration(61_000_000_000), "61.000s");
    }

    #[test]
    fn si_suffixes_like_bpftrace() {
        assert_eq!(si(0), "0");
        assert_eq!(si(512), "512");
        assert_eq!(si(1024), "1K");
        assert_eq!(si(1 << 20), "1M");
        assert_eq!(si(1 << 33), "8G");
    }
}

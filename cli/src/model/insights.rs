//! What the numbers mean: rules over one report that name a known problem
//! and the numbers it fired on. No rule fires on too little data.

use super::{
    histogram::duration,
    report::{Report, ReportKind},
};

/// At least this many accepts in the period before judging forks per accept.
pub const MIN_ACCEPTS: u64 = 20;
/// New TIME_WAIT sockets per second on one link worth a word.
pub const MIN_TIME_WAIT_PER_S: f64 = 100.0;

/// Fills `report.insights`: a pass of its own after the report is built,
/// so the report knows nothing of the rules.
pub fn annotate(report: &mut Report) {
    report.insights = insights(report);
}

/// One sentence per finding, with the fix.
pub fn insights(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for role in &report.roles {
        let accepts = role.accept.latency.count;
        if let Some(ratio) = role.forks_per_accept
            && accepts >= MIN_ACCEPTS
            && ratio >= 0.9
        {
            let lifetime = if role.child_lifetime.latency.count > 0 {
                format!(
                    " and its children live {}",
                    duration(role.child_lifetime.latency.p50_ns)
                )
            } else {
                String::new()
            };
            out.push(format!(
                    "{} forks {:.2} processes per accepted connection ({:.0}/s){lifetime}: use persistent connections or a pooler",
                    role.role, ratio, role.fork.rate_per_s
                ));
        }
        if role.accept_queue.latency.count >= MIN_ACCEPTS
            && role.accept_queue.latency.p99_ns >= 10_000_000
        {
            out.push(format!(
                "{}: connections wait {} (p99) in the accept queue: its workers are saturated",
                role.role,
                duration(role.accept_queue.latency.p99_ns)
            ));
        }
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
    out.extend(report.tcp.warnings.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{
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
        Report::build(
            ReportKind::Interval,
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
            Drops::default(),
        )
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
}

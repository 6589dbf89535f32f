//! A role that waits for a CPU long enough to matter: its threads were
//! runnable, not waiting on I/O or a lock, and no CPU was free. Measured
//! only with the run-queue probe (`watch --run-queue`); without its samples
//! nothing fires.

use crate::{
    histogram::duration,
    measure::Latency,
    report::{Report, RoleRow},
};

/// Run-queue waits in the period before judging them (as accepts are).
pub const MIN_RUN_QUEUE_WAITS: u64 = 20;

/// The mean wait worth a word. A thread woken on an idle CPU runs within
/// microseconds, and even the deepest idle states cost a few hundred at
/// most to leave; a mean of a millisecond is a scheduler slice (0.75 to
/// 3 ms): the role's threads queued behind other threads' slices.
pub const MIN_RUN_QUEUE_MEAN_NS: u64 = 1_000_000;

/// The share of the role's time the waits must add up to: a tenth of its
/// service time (where it has one: the waits inside a request lengthen
/// it), else of its time on a CPU. Below it, more CPUs would not change
/// what its clients see by much.
pub const MIN_RUN_QUEUE_SHARE: f64 = 0.10;

/// `role`'s threads waited for a CPU for at least [`MIN_RUN_QUEUE_SHARE`]
/// of its service time (or, for a role that serves no connections, of its
/// CPU time), [`MIN_RUN_QUEUE_MEAN_NS`] a wait on average: what the host
/// lacks, with its runnable threads against its CPUs when known.
pub(super) fn waiting_for_cpu(report: &Report, role: &RoleRow) -> Option<String> {
    let cpu = role.cpu?;
    let waits = &role.latency[Latency::RunQueue].latency;
    if waits.count < MIN_RUN_QUEUE_WAITS || waits.mean_ns < MIN_RUN_QUEUE_MEAN_NS {
        return None;
    }
    let service = &role.latency[Latency::Service].latency;
    // Means times counts: within a nanosecond per connection of the sum.
    let (basis_ns, basis) = if service.count > 0 {
        let ns = service.mean_ns.saturating_mul(service.count);
        (ns, format!("of its {} of service time", duration(ns)))
    } else {
        (
            cpu.on_cpu_ns,
            format!("of its {} on a CPU", duration(cpu.on_cpu_ns)),
        )
    };
    let share = cpu.run_queue_ns as f64 / basis_ns.max(1) as f64;
    if basis_ns == 0 || share < MIN_RUN_QUEUE_SHARE {
        return None;
    }
    let host = report.host.map_or_else(String::new, |h| {
        format!(
            " ({} thread{} runnable for {} CPU{} now)",
            h.runnable,
            if h.runnable == 1 { "" } else { "s" },
            h.cpus,
            if h.cpus == 1 { "" } else { "s" }
        )
    });
    Some(format!(
        "{}: its threads waited {} for a CPU ({} waits, mean {}, p99 {}), {:.0}% {basis}: the host is short of CPU{host}: add CPUs or move other work off this host; more busy workers than CPUs add waiting, not throughput",
        role.role,
        duration(cpu.run_queue_ns),
        waits.count,
        duration(waits.mean_ns),
        duration(waits.p99_ns),
        share * 100.0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::HistMetric,
        fixtures::{self, kernel_hist, live},
        host::HostRow,
        insights::insights,
        process::ProcessTable,
    };

    /// One interval of process 1 (`myd`): `waits` run-queue waits of
    /// `wait_ns` each, 100 slices of 2 ms on a CPU, and, if `service_ns`,
    /// 10 connections served in that time each.
    fn waited(waits: usize, wait_ns: u64, service_ns: Option<u64>) -> Report {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "myd")]);
        t.apply(&kernel_hist(
            1,
            "myd",
            HistMetric::RunQueue,
            &vec![wait_ns; waits],
        ));
        t.apply(&kernel_hist(1, "myd", HistMetric::OnCpu, &[2_000_000; 100]));
        if let Some(ns) = service_ns {
            t.apply(&kernel_hist(1, "myd", HistMetric::Accept, &[1_000; 10]));
            t.apply(&kernel_hist(1, "myd", HistMetric::Service, &[ns; 10]));
        }
        let mut r = fixtures::interval_report(&t);
        r.host = Some(HostRow {
            cpus: 4,
            runnable: 9,
        });
        r
    }

    fn found(r: &Report) -> Vec<String> {
        insights(r)
            .into_iter()
            .filter(|i| i.contains("for a CPU"))
            .collect()
    }

    #[test]
    fn heavy_waits_against_the_service_time_name_the_share_and_the_host() {
        // 60 waits of 3 ms: 180 ms against 10 × 100 ms of service.
        let r = waited(60, 3_000_000, Some(100_000_000));
        assert_eq!(
            found(&r),
            [
                "myd: its threads waited 180.00ms for a CPU (60 waits, mean 3.00ms, p99 3.00ms), 18% of its 1.000s of service time: the host is short of CPU (9 threads runnable for 4 CPUs now): add CPUs or move other work off this host; more busy workers than CPUs add waiting, not throughput"
            ]
        );
    }

    #[test]
    fn a_role_serving_nothing_is_measured_against_its_cpu_time() {
        // 30 waits of 2 ms: 60 ms against 100 × 2 ms on a CPU.
        let mut r = waited(30, 2_000_000, None);
        r.host = None;
        assert_eq!(
            found(&r),
            [
                "myd: its threads waited 60.00ms for a CPU (30 waits, mean 2.00ms, p99 2.00ms), 30% of its 200.00ms on a CPU: the host is short of CPU: add CPUs or move other work off this host; more busy workers than CPUs add waiting, not throughput"
            ]
        );
    }

    #[test]
    fn light_short_or_few_waits_fire_nothing() {
        // Under a tenth of the service time: 60 × 1 ms against 1 s.
        assert!(found(&waited(60, 1_000_000, Some(100_000_000))).is_empty());
        // A large share of short waits: wakeups, not a queue (2000 × 200 µs
        // is 40 % of a second of service).
        assert!(found(&waited(2_000, 200_000, Some(100_000_000))).is_empty());
        // Too few to judge.
        assert!(found(&waited(19, 50_000_000, Some(100_000_000))).is_empty());
        // Not measured: no run-queue samples, no CPU row.
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "myd")]);
        t.apply(&kernel_hist(1, "myd", HistMetric::Service, &[1_000; 30]));
        let r = fixtures::interval_report(&t);
        assert!(r.roles[0].cpu.is_none());
        assert!(found(&r).is_empty());
    }
}

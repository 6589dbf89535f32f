//! A role's CPU over the period, from the run-queue probe's two latencies:
//! the time its threads ran (the `on_cpu` slices' sum) against the time
//! they were runnable but waited for a CPU (the `run_queue` waits' sum).
//! Percentiles of either say how long one slice or one wait was; only the
//! exact sums say how the role's time splits between busy on a CPU and
//! waiting for one, so they are the row's, computed here for every view.

use serde::Serialize;

use super::Period;
use crate::{measure::Latency, process::Activity};

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CpuRow {
    /// CPU time of the slices that ended in the period (a slice is counted
    /// when its thread switches out), in ns.
    pub on_cpu_ns: u64,
    /// `on_cpu_ns` over the period: how many CPUs' worth the role kept
    /// busy (0.12 is 12 % of one core; above 1 with several threads).
    pub cores: f64,
    /// Run-queue waits that ended in the period, summed, in ns.
    pub run_queue_ns: u64,
    /// `run_queue_ns` over `run_queue_ns + on_cpu_ns`: of the time its
    /// threads were runnable, the share they spent waiting for a CPU.
    pub waiting_share: f64,
}

/// The role's CPU row; None when neither latency has a sample in the
/// period (not measured: the run-queue probe is off, or no thread of the
/// role ran).
pub(super) fn cpu_row(p: &Period, a: &Activity) -> Option<CpuRow> {
    let on_cpu = p.hist(&a.latency[Latency::OnCpu]);
    let run_queue = p.hist(&a.latency[Latency::RunQueue]);
    if on_cpu.is_empty() && run_queue.is_empty() {
        return None;
    }
    let (on_cpu_ns, run_queue_ns) = (clamp(on_cpu.sum_ns()), clamp(run_queue.sum_ns()));
    let runnable = on_cpu_ns as f64 + run_queue_ns as f64;
    Some(CpuRow {
        on_cpu_ns,
        cores: if p.secs > 0.0 {
            on_cpu_ns as f64 / (p.secs * 1e9)
        } else {
            0.0
        },
        run_queue_ns,
        waiting_share: if runnable > 0.0 {
            run_queue_ns as f64 / runnable
        } else {
            0.0
        },
    })
}

/// 584 years of CPU time fit in a u64 of ns.
fn clamp(ns: u128) -> u64 {
    u64::try_from(ns).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use crate::{
        event::HistMetric,
        fixtures::{self, kernel_hist, live},
        process::ProcessTable,
    };

    #[test]
    fn the_sums_split_the_roles_runnable_time_into_busy_and_waiting() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "myd")]);
        // 100 slices of 2 ms and 50 waits of 1 ms in a second.
        t.apply(&kernel_hist(1, "myd", HistMetric::OnCpu, &[2_000_000; 100]));
        t.apply(&kernel_hist(
            1,
            "myd",
            HistMetric::RunQueue,
            &[1_000_000; 50],
        ));
        let r = fixtures::interval_report(&t);
        let cpu = r.roles[0].cpu.expect("measured");
        assert_eq!((cpu.on_cpu_ns, cpu.run_queue_ns), (200_000_000, 50_000_000));
        assert!((cpu.cores - 0.2).abs() < 1e-9, "{cpu:?}");
        assert!((cpu.waiting_share - 0.2).abs() < 1e-9, "{cpu:?}");
        // The next interval has no slice ended in it, so no row; the
        // summary keeps the run's.
        t.reset_interval();
        assert_eq!(fixtures::interval_report(&t).roles[0].cpu, None);
        let whole = fixtures::report(&t).summary().build();
        assert_eq!(whole.roles[0].cpu.map(|c| c.on_cpu_ns), Some(200_000_000));
    }
}

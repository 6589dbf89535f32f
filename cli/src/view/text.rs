//! The plain-text view (`--no-tui`): a header per report, then per process its
//! accepts, rate, percentile line and bpftrace-style log2 bars.

use std::fmt::Write as _;

use crate::model::{
    histogram::{Log2Bucket, Summary},
    report::{Report, ReportKind},
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
        let d = report.drops_by_cause;
        let _ = write!(
            out,
            " · DROPS {} (ring buffer full {}, accept slot shared {}, pid beyond watch set {})",
            report.drops, d.ringbuf_full, d.accept_slot_shared, d.watch_out_of_range
        );
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
    if report.processes.is_empty() {
        out.push_str("no accepts yet\n");
    }
    for p in &report.processes {
        let _ = writeln!(
            out,
            "{}[{}]  accepts {} ({:.1}/s)  total {}",
            p.process, p.pid, p.latency.count, p.rate_per_s, p.total
        );
        if p.latency.count > 0 {
            let _ = writeln!(out, "  accept latency  {}", percentile_line(&p.latency));
            out.push_str(&log2_bars(&p.log2_buckets));
        }
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

/// A latency in the unit that keeps 3–4 significant digits.
pub fn duration(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.3}s", ns as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::report::{ACCEPT_METRIC, Drops, ProcessRow};

    fn report(drops: Drops) -> Report {
        Report {
            kind: ReportKind::Interval,
            elapsed_s: 3.0,
            period_s: 1.0,
            watched: 2,
            drops: drops.total(),
            drops_by_cause: drops,
            processes: vec![ProcessRow {
                process: "postgres".into(),
                pid: 42,
                metric: ACCEPT_METRIC,
                rate_per_s: 3.0,
                total: 10,
                latency: Summary {
                    count: 3,
                    min_ns: 900,
                    mean_ns: 5_000,
                    p50_ns: 2_500,
                    p90_ns: 12_000,
                    p99_ns: 12_000,
                    p999_ns: 12_000,
                    max_ns: 12_000,
                },
                log2_buckets: vec![
                    Log2Bucket {
                        lo: 512,
                        hi: 1024,
                        count: 1,
                    },
                    Log2Bucket {
                        lo: 1024,
                        hi: 2048,
                        count: 0,
                    },
                    Log2Bucket {
                        lo: 2048,
                        hi: 4096,
                        count: 2,
                    },
                ],
            }],
            probe_cost: Vec::new(),
        }
    }

    #[test]
    fn renders_process_line_percentiles_and_bars() {
        let text = render(&report(Drops::default()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "=== interval at +3.0s (1.00s) · watching 2 processes · drops 0"
        );
        assert_eq!(lines[1], "postgres[42]  accepts 3 (3.0/s)  total 10");
        assert_eq!(
            lines[2],
            "  accept latency  min 900ns  p50 2.5µs  p90 12.0µs  p99 12.0µs  p99.9 12.0µs  max 12.0µs  mean 5.0µs"
        );
        assert_eq!(
            lines[3],
            format!("  [512, 1K)             1 |{:<40}|", "@".repeat(20))
        );
        assert_eq!(lines[4], format!("  [1K, 2K)              0 |{:<40}|", ""));
        assert_eq!(
            lines[5],
            format!("  [2K, 4K)              2 |{}|", "@".repeat(40))
        );
    }

    #[test]
    fn drops_are_shown_with_their_causes() {
        let text = render(&report(Drops {
            ringbuf_full: 5,
            accept_slot_shared: 1,
            watch_out_of_range: 0,
        }));
        assert!(
            text.contains(
                "DROPS 6 (ring buffer full 5, accept slot shared 1, pid beyond watch set 0)"
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

//! `stackprobe diff BEFORE AFTER`: two recordings side by side, per role and
//! metric: rate, p50, p99 and max before and after, and the change; for a
//! gauge (busy connections, own time), its mean and max.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::Result;
use serde::Serialize;

use super::report::{Filter, Row, gauge_value, rows};
use crate::cli::DiffArgs;
use stackprobe_model::histogram::{Summary, duration};

/// `diff --json`'s shape: /2 adds the counts' rows (`before_count`,
/// `after_count`; percentiles null). /3 adds the gauges' rows
/// (`before_mean`, `after_mean`, `before_gauge_max`, `after_gauge_max`: the
/// report's `gauge_mean` and `gauge_max`; rates, counts, percentiles and
/// verdict null), and those four fields, null, to every other row.
pub const SCHEMA: &str = "stackprobe.diff/3";

#[derive(Debug, Serialize)]
pub struct Change {
    pub schema: &'static str,
    pub role: String,
    pub metric: String,
    /// Samples per second over each recording's covered time; null when the
    /// recording has none of this role and metric.
    pub before_per_s: Option<f64>,
    pub after_per_s: Option<f64>,
    /// Samples, or a count's sum, in each recording.
    pub before_count: Option<u64>,
    pub after_count: Option<u64>,
    pub before_p50_ns: Option<u64>,
    pub after_p50_ns: Option<u64>,
    pub before_p99_ns: Option<u64>,
    pub after_p99_ns: Option<u64>,
    pub before_max_ns: Option<u64>,
    pub after_max_ns: Option<u64>,
    /// A gauge's duration-weighted mean and largest interval value in each
    /// recording (see `report`'s `gauge_mean`, `gauge_max`); null for a
    /// latency or a count.
    pub before_mean: Option<f64>,
    pub after_mean: Option<f64>,
    pub before_gauge_max: Option<f64>,
    pub after_gauge_max: Option<f64>,
    /// `faster` or `slower` when the change is beyond noise (see
    /// `Summary::clearly_slower_than`), else null.
    pub verdict: Option<&'static str>,
}

pub fn run(args: DiffArgs) -> Result<()> {
    let filter = Filter {
        role: args.role,
        metric: args.metric,
        by_process: args.by_process,
        ..Filter::default()
    };
    let changes = changes(&rows(&args.before, &filter)?, &rows(&args.after, &filter)?);
    if args.json {
        for c in &changes {
            println!("{}", serde_json::to_string(c).expect("changes serialise"));
        }
    } else {
        print!("{}", render(&changes));
    }
    Ok(())
}

/// Per second; None for a gauge, which has no count.
fn rate(r: &Row) -> Option<f64> {
    if r.is_gauge() {
        None
    } else if r.seconds > 0.0 {
        Some(r.count() as f64 / r.seconds)
    } else {
        Some(0.0)
    }
}

/// Samples or a count's sum; None for a gauge.
fn count(r: &Row) -> Option<u64> {
    (!r.is_gauge()).then(|| r.count())
}

/// A row's latency summary (None for a count, or no row).
fn latency(r: Option<&Row>) -> Option<&Summary> {
    r.and_then(|r| r.latency.as_ref())
}

pub fn changes(before: &[Row], after: &[Row]) -> Vec<Change> {
    type Pair<'a> = (Option<&'a Row>, Option<&'a Row>);
    let mut keys: BTreeMap<(String, String), Pair<'_>> = BTreeMap::new();
    for r in before {
        keys.entry((r.role.clone(), r.metric.clone()))
            .or_default()
            .0 = Some(r);
    }
    for r in after {
        keys.entry((r.role.clone(), r.metric.clone()))
            .or_default()
            .1 = Some(r);
    }
    keys.into_iter()
        .map(|((role, metric), (b, a))| Change {
            schema: SCHEMA,
            role,
            metric,
            before_per_s: b.and_then(rate),
            after_per_s: a.and_then(rate),
            before_count: b.and_then(count),
            after_count: a.and_then(count),
            before_p50_ns: latency(b).map(|s| s.p50_ns),
            after_p50_ns: latency(a).map(|s| s.p50_ns),
            before_p99_ns: latency(b).map(|s| s.p99_ns),
            after_p99_ns: latency(a).map(|s| s.p99_ns),
            before_max_ns: latency(b).map(|s| s.max_ns),
            after_max_ns: latency(a).map(|s| s.max_ns),
            before_mean: b.and_then(|r| r.gauge_mean),
            after_mean: a.and_then(|r| r.gauge_mean),
            before_gauge_max: b.and_then(|r| r.gauge_max),
            after_gauge_max: a.and_then(|r| r.gauge_max),
            verdict: latency(b).zip(latency(a)).and_then(|(b, a)| {
                if a.clearly_slower_than(b) {
                    Some("slower")
                } else if b.clearly_slower_than(a) {
                    Some("faster")
                } else {
                    None
                }
            }),
        })
        .collect()
}

fn change(before: Option<f64>, after: Option<f64>) -> String {
    match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => format!(" ({:+.1}%)", (a - b) / b * 100.0),
        _ => String::new(),
    }
}

fn pair(before: Option<u64>, after: Option<u64>) -> String {
    let show = |v: Option<u64>| v.map_or("-".to_string(), duration);
    format!(
        "{} → {}{}",
        show(before),
        show(after),
        change(before.map(|v| v as f64), after.map(|v| v as f64))
    )
}

/// A gauge's values before → after, with the change.
fn gauge_pair(metric: &str, before: Option<f64>, after: Option<f64>) -> String {
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| gauge_value(metric, v));
    format!(
        "{} → {}{}",
        show(before),
        show(after),
        change(before, after)
    )
}

impl Change {
    pub fn is_gauge(&self) -> bool {
        self.before_mean.is_some() || self.after_mean.is_some()
    }
}

pub fn render(changes: &[Change]) -> String {
    let mut out = String::new();
    for c in changes {
        if c.is_gauge() {
            let _ = writeln!(
                out,
                "{} · {}  mean {}   max {}",
                c.role,
                c.metric,
                gauge_pair(&c.metric, c.before_mean, c.after_mean),
                gauge_pair(&c.metric, c.before_gauge_max, c.after_gauge_max)
            );
            continue;
        }
        if c.before_p50_ns.is_none() && c.after_p50_ns.is_none() {
            // A count: no percentiles to set side by side.
            let n = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            let _ = writeln!(
                out,
                "{} · {}  count {} → {}{}",
                c.role,
                c.metric,
                n(c.before_count),
                n(c.after_count),
                change(
                    c.before_count.map(|v| v as f64),
                    c.after_count.map(|v| v as f64)
                )
            );
            continue;
        }
        let per_s = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}/s"));
        let _ = writeln!(
            out,
            "{} · {}  {} → {}{}",
            c.role,
            c.metric,
            per_s(c.before_per_s),
            per_s(c.after_per_s),
            change(c.before_per_s, c.after_per_s)
        );
        let _ = writeln!(
            out,
            "  p50 {}   p99 {}   max {}",
            pair(c.before_p50_ns, c.after_p50_ns),
            pair(c.before_p99_ns, c.after_p99_ns),
            pair(c.before_max_ns, c.after_max_ns)
        );
    }
    for c in changes {
        if let Some(verdict) = c.verdict {
            let _ = writeln!(
                out,
                "insight: {} · {} is {verdict} beyond noise: p50 {}",
                c.role,
                c.metric,
                pair(c.before_p50_ns, c.after_p50_ns)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hdrhistogram::Histogram;

    use super::*;
    use stackprobe_model::measure::Count;
    use stackprobe_output::export::hlog::{Interval, Recorder};

    fn recording(
        dir: &std::path::Path,
        name: &str,
        forks_per_interval: u64,
        fork_ns: u64,
    ) -> std::path::PathBuf {
        let path = dir.join(name);
        let rec = Recorder::create(&path, true).unwrap();
        for i in 0..10u64 {
            let mut accept = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            accept.record_n(3_000, 400).unwrap();
            let mut fork = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            if forks_per_interval > 0 {
                fork.record_n(fork_ns, forks_per_interval).unwrap();
            }
            let mut histograms = vec![("postgres postmaster".to_string(), "accept", accept)];
            if forks_per_interval > 0 {
                histograms.push(("postgres postmaster".to_string(), "fork", fork));
            }
            // Accepts blocked before the attach: a count, not a latency.
            let counts = if forks_per_interval > 0 && i == 0 {
                vec![("postgres postmaster".to_string(), Count::AcceptUntimed, 3)]
            } else {
                vec![]
            };
            rec.record(Interval {
                start: Duration::from_secs(i),
                duration: Duration::from_secs(1),
                histograms,
                counts,
                gauges: vec![],
            });
        }
        rec.finish().unwrap()
    }

    #[test]
    fn known_recordings_give_known_changes() {
        let dir = std::env::temp_dir().join(format!("sp-diff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let before = recording(&dir, "before.hlog", 400, 80_000);
        let after = recording(&dir, "after.hlog", 0, 0);
        let f = Filter::default();
        let c = changes(&rows(&before, &f).unwrap(), &rows(&after, &f).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.len(), 3);
        let untimed = &c[1];
        assert_eq!(
            (
                untimed.metric.as_str(),
                untimed.before_count,
                untimed.after_count,
                untimed.before_p50_ns
            ),
            ("accept_untimed", Some(3), None, None)
        );
        let accept = &c[0];
        assert_eq!(
            (
                accept.metric.as_str(),
                accept.before_per_s,
                accept.after_per_s
            ),
            ("accept", Some(400.0), Some(400.0))
        );
        // Recorded values are HdrHistogram's (within 1/128).
        for p50 in [accept.before_p50_ns, accept.after_p50_ns] {
            assert!(p50.is_some_and(|v| v.abs_diff(3_000) <= 3), "{p50:?}");
        }
        let fork = &c[2];
        assert_eq!((fork.before_per_s, fork.after_per_s), (Some(400.0), None));
        assert_eq!(
            fork.before_p99_ns.map(|v| v.abs_diff(80_000) <= 80),
            Some(true)
        );
        let text = render(&c);
        assert!(
            text.contains("postgres postmaster · accept  400.0/s → 400.0/s (+0.0%)"),
            "{text}"
        );
        assert!(
            text.contains("postgres postmaster · fork  400.0/s → -"),
            "{text}"
        );
        assert!(
            text.contains("postgres postmaster · accept_untimed  count 3 → -\n"),
            "{text}"
        );
    }

    /// One role's connects: `n` per interval of `ns` each, for 10 intervals.
    fn connects(dir: &std::path::Path, name: &str, ns: u64, n: u64) -> std::path::PathBuf {
        let path = dir.join(name);
        let rec = Recorder::create(&path, true).unwrap();
        for i in 0..10u64 {
            let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            // Spread like a real run: most at `ns`, a tenth at twice that.
            h.record_n(ns, n - n / 10).unwrap();
            h.record_n(2 * ns, n / 10).unwrap();
            rec.record(Interval {
                start: Duration::from_secs(i),
                duration: Duration::from_secs(1),
                histograms: vec![("php-fpm".to_string(), "connect", h)],
                counts: vec![],
                gauges: vec![],
            });
        }
        rec.finish().unwrap()
    }

    #[test]
    fn a_change_beyond_noise_says_so_and_one_within_it_does_not() {
        let dir = std::env::temp_dir().join(format!("sp-diff-noise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tcp = connects(&dir, "tcp.hlog", 15_000, 100);
        let unix = connects(&dir, "unix.hlog", 5_000, 100);
        let wobble = connects(&dir, "wobble.hlog", 16_000, 100);
        let f = Filter::default();
        let rows = |p: &std::path::Path| rows(p, &f).unwrap();
        let faster = changes(&rows(&tcp), &rows(&unix));
        let within = changes(&rows(&tcp), &rows(&wobble));
        let slower = changes(&rows(&unix), &rows(&tcp));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(faster[0].verdict, Some("faster"));
        assert_eq!(slower[0].verdict, Some("slower"));
        assert_eq!(within[0].verdict, None);
        let text = render(&faster);
        assert!(
            text.contains("insight: php-fpm · connect is faster beyond noise: p50 15.0µs → 5.0µs"),
            "{text}"
        );
        assert!(!render(&within).contains("insight:"));
    }

    /// A pool's busy workers and own time: `busy` and `own_ms` in each of
    /// 4 one-second intervals; and 10 accepts in each.
    fn pool(dir: &std::path::Path, name: &str, busy: f64, own_ms: f64) -> std::path::PathBuf {
        let path = dir.join(name);
        let rec = Recorder::create(&path, true).unwrap();
        for i in 0..4u64 {
            let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            h.record_n(2_000, 10).unwrap();
            rec.record(Interval {
                start: Duration::from_secs(i),
                duration: Duration::from_secs(1),
                histograms: vec![("php-fpm".to_string(), "accept", h)],
                counts: vec![],
                gauges: vec![
                    ("php-fpm".to_string(), "busy_mean", busy),
                    // The last interval is the busiest.
                    (
                        "php-fpm".to_string(),
                        "busy_max",
                        if i == 3 { 2.0 * busy } else { busy },
                    ),
                    ("php-fpm".to_string(), "own", own_ms * 1e6),
                ],
            });
        }
        rec.finish().unwrap()
    }

    #[test]
    fn gauges_compare_their_means_and_maxes_without_a_verdict() {
        let dir = std::env::temp_dir().join(format!("sp-diff-gauges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let before = pool(&dir, "before.hlog", 4.0, 20.0);
        let after = pool(&dir, "after.hlog", 1.0, 5.0);
        let f = Filter::default();
        let before = rows(&before, &f).unwrap();
        let c = changes(&before, &rows(&after, &f).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            c.iter().map(|c| c.metric.as_str()).collect::<Vec<_>>(),
            ["accept", "busy_max", "busy_mean", "own"]
        );
        let busy = &c[2];
        assert_eq!(
            (
                busy.before_mean,
                busy.after_mean,
                busy.before_gauge_max,
                busy.after_gauge_max
            ),
            (Some(4.0), Some(1.0), Some(4.0), Some(1.0))
        );
        assert_eq!(
            (
                busy.before_per_s,
                busy.before_count,
                busy.before_p50_ns,
                busy.verdict
            ),
            (None, None, None, None)
        );
        assert_eq!(
            (
                c[1].before_mean,
                c[1].before_gauge_max,
                c[1].after_gauge_max
            ),
            (Some(5.0), Some(8.0), Some(2.0))
        );
        // A latency has no gauge fields.
        assert_eq!((c[0].before_mean, c[0].after_gauge_max), (None, None));
        assert_eq!(c[0].before_count, Some(40));
        let json = serde_json::to_value(busy).unwrap();
        assert_eq!(json["schema"], "stackprobe.diff/3");
        assert_eq!(
            (
                &json["before_mean"],
                &json["after_gauge_max"],
                &json["verdict"]
            ),
            (
                &serde_json::json!(4.0),
                &serde_json::json!(1.0),
                &serde_json::Value::Null
            )
        );
        let text = render(&c);
        for line in [
            "php-fpm · busy_mean  mean 4.0 → 1.0 (-75.0%)   max 4.0 → 1.0 (-75.0%)\n",
            "php-fpm · busy_max  mean 5.0 → 1.2 (-75.0%)   max 8.0 → 2.0 (-75.0%)\n",
            "php-fpm · own  mean 20.00ms → 5.00ms (-75.0%)   max 20.00ms → 5.00ms (-75.0%)\n",
            "php-fpm · accept  10.0/s → 10.0/s (+0.0%)\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }
        assert!(!text.contains("insight:"), "{text}");
        // A gauge in one recording only.
        let gone = changes(&before, &[]);
        assert_eq!((gone[2].before_mean, gone[2].after_mean), (Some(4.0), None));
        assert!(
            render(&gone).contains("php-fpm · busy_mean  mean 4.0 → -   max 4.0 → -\n"),
            "{}",
            render(&gone)
        );
    }
}

//! `stackprobe report FILE`: the percentiles and histograms of a recording,
//! for the whole run or a window of it, per role and metric.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::cli::{ReportArgs, ReportFormat};
use stackprobe_model::histogram::{LatencyHistogram, Log2Bucket, Summary};
use stackprobe_output::{
    export::{hlog, plot},
    view::text::log2_bars,
};

/// `report --format json`'s shape: bumped when a field changes meaning or
/// goes away. /2: rows of counts (a `count`, no percentiles) appear. /3:
/// rows of gauges (`busy_mean`, `busy_max`, `busy_limit`, `own`: a
/// `gauge_mean` and a `gauge_max`, no `count`, no percentiles) appear.
pub const SCHEMA: &str = "stackprobe.report/3";

/// One role's latency, count or gauge, merged over the intervals kept.
#[derive(Debug, Serialize)]
pub struct Row {
    pub schema: &'static str,
    pub role: String,
    pub metric: String,
    pub intervals: usize,
    /// Seconds the intervals cover.
    pub seconds: f64,
    /// A latency's summary (its `count` the samples); None for a count.
    #[serde(flatten)]
    pub latency: Option<Summary>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub log2_buckets: Vec<Log2Bucket>,
    /// A count's sum; None for a latency or a gauge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// A gauge's interval values, weighted by the intervals' durations;
    /// None for a latency or a count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gauge_mean: Option<f64>,
    /// A gauge's largest interval value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gauge_max: Option<f64>,
}

impl Row {
    /// Samples of a latency, or a count's sum (0 for a gauge).
    pub fn count(&self) -> u64 {
        self.latency.map_or(0, |s| s.count) + self.count.unwrap_or(0)
    }

    pub fn is_gauge(&self) -> bool {
        self.gauge_mean.is_some()
    }
}

/// A gauge's value as text: `own` is a time in ns, the busy gauges are
/// connections.
pub fn gauge_value(metric: &str, v: f64) -> String {
    if metric == "own" {
        stackprobe_model::histogram::duration(v.round() as u64)
    } else {
        format!("{v:.1}")
    }
}

pub fn run(args: ReportArgs) -> Result<()> {
    if let (Some(from), Some(to)) = (args.from, args.to)
        && from >= to
    {
        bail!(
            "--from {} is not before --to {}: the window would be empty",
            humantime::format_duration(from),
            humantime::format_duration(to)
        );
    }
    let filter = Filter {
        role: args.role,
        metric: args.metric,
        from: args.from,
        to: args.to,
        by_process: false,
    };
    let rows = rows(&args.file, &filter)?;
    print!("{}", render(&rows, args.format));
    if let Some(path) = &args.plot {
        plot::write(path, args.force, &series(&args.file, &filter)?)?;
        eprintln!("stackprobe: plotted {}", path.display());
    }
    Ok(())
}

/// Per role and metric: the merged histogram and p99 per interval, to plot.
pub fn series(file: &std::path::Path, filter: &Filter) -> Result<Vec<plot::Series>> {
    let mut by_key: BTreeMap<String, plot::Series> = BTreeMap::new();
    hlog::for_each(file, |r| {
        let hlog::Value::Histogram(h) = &r.value else {
            return Ok(());
        };
        if !filter.keeps(&r) {
            return Ok(());
        }
        let label = format!("{} · {}", r.role, r.metric);
        let s = by_key.entry(label.clone()).or_insert_with(|| plot::Series {
            label,
            total: hdrhistogram::Histogram::new_from(h),
            p99_over_time: Vec::new(),
        });
        s.p99_over_time
            .push((r.start.as_secs_f64(), h.value_at_quantile(0.99)));
        s.total
            .add(h)
            .map_err(|e| anyhow::anyhow!("merging histograms: {e:?}"))?;
        Ok(())
    })?;
    Ok(by_key.into_values().collect())
}

/// Which histograms of a recording to use.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Roles whose name contains this.
    pub role: Option<String>,
    pub metric: Option<String>,
    pub from: Option<std::time::Duration>,
    pub to: Option<std::time::Duration>,
    /// Merge every role of a process name (`postgres postmaster` and
    /// `postgres backend` into `postgres`): runs whose roles differ (a server
    /// that forked in one and not the other) then line up.
    pub by_process: bool,
}

impl Filter {
    fn keeps(&self, r: &hlog::Recorded) -> bool {
        self.role
            .as_ref()
            .is_none_or(|want| r.role.contains(want.as_str()))
            && self.metric.as_ref().is_none_or(|want| *want == r.metric)
            && self.from.is_none_or(|from| r.start >= from)
            && self.to.is_none_or(|to| r.start < to)
    }
}

/// What one (role, metric) of a recording adds up to.
#[derive(Default)]
struct Merged {
    /// None for a count or a gauge.
    hist: Option<LatencyHistogram>,
    count: u64,
    /// None for a latency or a count.
    gauge: Option<Gauge>,
    intervals: usize,
    seconds: f64,
}

/// A gauge's interval values so far.
#[derive(Default)]
struct Gauge {
    /// Each value times its interval's seconds, summed.
    weighted: f64,
    seconds: f64,
    /// The values summed, for intervals of no length.
    sum: f64,
    n: usize,
    max: f64,
}

impl Gauge {
    fn add(&mut self, value: f64, seconds: f64) {
        self.weighted += value * seconds;
        self.seconds += seconds;
        self.sum += value;
        self.n += 1;
        self.max = self.max.max(value);
    }

    fn mean(&self) -> f64 {
        if self.seconds > 0.0 {
            self.weighted / self.seconds
        } else {
            self.sum / self.n.max(1) as f64
        }
    }
}

/// The recording's histograms, counts and gauges merged per (role,
/// metric), filtered. With `by_process`, a gauge's values from the merged
/// roles are taken as so many intervals.
pub fn rows(file: &std::path::Path, filter: &Filter) -> Result<Vec<Row>> {
    let mut merged: BTreeMap<(String, String), Merged> = BTreeMap::new();
    hlog::for_each(file, |r| {
        if !filter.keeps(&r) {
            return Ok(());
        }
        let role = if filter.by_process {
            r.role.split(' ').next().unwrap_or_default().to_string()
        } else {
            r.role
        };
        let m = merged.entry((role, r.metric)).or_default();
        match r.value {
            hlog::Value::Histogram(h) => m
                .hist
                .get_or_insert_with(LatencyHistogram::new)
                .add(&LatencyHistogram::from_hdr(h)),
            hlog::Value::Count(n) => m.count += n,
            hlog::Value::Gauge(v) => m
                .gauge
                .get_or_insert_with(Gauge::default)
                .add(v, r.duration.as_secs_f64()),
        }
        m.intervals += 1;
        m.seconds += r.duration.as_secs_f64();
        Ok(())
    })?;
    if merged.is_empty() {
        bail!("nothing in {} matches the filters", file.display());
    }
    Ok(merged
        .into_iter()
        .map(|((role, metric), m)| Row {
            schema: SCHEMA,
            role,
            metric,
            intervals: m.intervals,
            seconds: m.seconds,
            latency: m.hist.as_ref().map(LatencyHistogram::summary),
            log2_buckets: m
                .hist
                .as_ref()
                .map(LatencyHistogram::log2_buckets)
                .unwrap_or_default(),
            count: (m.hist.is_none() && m.gauge.is_none()).then_some(m.count),
            gauge_mean: m.gauge.as_ref().map(Gauge::mean),
            gauge_max: m.gauge.as_ref().map(|g| g.max),
        })
        .collect())
}

pub fn render(rows: &[Row], format: ReportFormat) -> String {
    let mut out = String::new();
    match format {
        ReportFormat::Json => {
            for r in rows {
                out.push_str(&serde_json::to_string(r).expect("rows serialise"));
                out.push('\n');
            }
        }
        ReportFormat::Csv => {
            out.push_str(
                "role,metric,intervals,count,min_ns,mean_ns,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,gauge_mean,gauge_max\n",
            );
            for r in rows {
                let _ = write!(
                    out,
                    "\"{}\",{},{},",
                    r.role.replace('"', "\"\""),
                    r.metric,
                    r.intervals,
                );
                // A gauge has no count.
                if !r.is_gauge() {
                    let _ = write!(out, "{}", r.count());
                }
                // A count or a gauge has no latency columns.
                let _ = match &r.latency {
                    Some(s) => write!(
                        out,
                        ",{},{},{},{},{},{},{}",
                        s.min_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns
                    ),
                    None => write!(out, ",,,,,,,"),
                };
                // Only a gauge has the gauge columns.
                let v = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
                let _ = writeln!(out, ",{},{}", v(r.gauge_mean), v(r.gauge_max));
            }
        }
        ReportFormat::Text => {
            for r in rows {
                if let (Some(mean), Some(max)) = (r.gauge_mean, r.gauge_max) {
                    let _ = writeln!(
                        out,
                        "{} · {}  mean {}  max {} over {} intervals ({:.0}s)",
                        r.role,
                        r.metric,
                        gauge_value(&r.metric, mean),
                        gauge_value(&r.metric, max),
                        r.intervals,
                        r.seconds
                    );
                    continue;
                }
                let _ = writeln!(
                    out,
                    "{} · {}  count {} over {} intervals ({:.0}s)",
                    r.role,
                    r.metric,
                    r.count(),
                    r.intervals,
                    r.seconds
                );
                let Some(s) = &r.latency else {
                    continue;
                };
                let d = stackprobe_model::histogram::duration;
                let _ = writeln!(
                    out,
                    "  min {}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {}",
                    d(s.min_ns),
                    d(s.p50_ns),
                    d(s.p90_ns),
                    d(s.p99_ns),
                    d(s.p999_ns),
                    d(s.max_ns),
                    d(s.mean_ns)
                );
                out.push_str(&log2_bars(&r.log2_buckets));
            }
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

    #[test]
    fn filters_windows_and_process_merging() {
        let dir = std::env::temp_dir().join(format!("sp-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.hlog");
        let rec = Recorder::create(&path, true).unwrap();
        for i in 0..4u64 {
            let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
            h.record_n(1_000 * (i + 1), 10).unwrap();
            rec.record(Interval {
                start: Duration::from_secs(i),
                duration: Duration::from_secs(1),
                histograms: vec![
                    ("x master".into(), "accept", h.clone()),
                    ("x worker".into(), "accept", h),
                ],
                // Untimed accepts in the first two intervals only.
                counts: if i < 2 {
                    vec![("x master".into(), Count::AcceptUntimed, i + 1)]
                } else {
                    vec![]
                },
                gauges: vec![],
            });
        }
        rec.finish().unwrap();
        let all = rows(&path, &Filter::default()).unwrap();
        assert_eq!(
            all.iter()
                .map(|r| (r.role.as_str(), r.metric.as_str(), r.count()))
                .collect::<Vec<_>>(),
            [
                ("x master", "accept", 40),
                ("x master", "accept_untimed", 3),
                ("x worker", "accept", 40)
            ]
        );
        assert_eq!((all[1].latency, all[1].count), (None, Some(3)));
        let text = render(&all, ReportFormat::Text);
        assert!(
            text.contains("x master · accept_untimed  count 3 over 2 intervals"),
            "{text}"
        );
        let merged = rows(
            &path,
            &Filter {
                by_process: true,
                ..Filter::default()
            },
        )
        .unwrap();
        assert_eq!(
            (merged.len(), merged[0].role.as_str(), merged[0].count()),
            (2, "x", 80)
        );
        let window = rows(
            &path,
            &Filter {
                role: Some("master".into()),
                from: Some(Duration::from_secs(2)),
                ..Filter::default()
            },
        )
        .unwrap();
        assert_eq!(
            (window.len(), window[0].count(), window[0].intervals),
            (1, 20, 2)
        );
        assert!(
            window[0].latency.unwrap().min_ns.abs_diff(3_000) <= 3,
            "{:?}",
            window[0].latency
        );
        assert!(
            rows(
                &path,
                &Filter {
                    metric: Some("fork".into()),
                    ..Filter::default()
                }
            )
            .is_err()
        );
        let csv = render(&all, ReportFormat::Csv);
        assert!(csv.starts_with("role,metric,intervals,count,"), "{csv}");
        assert!(csv.contains("\"x master\",accept,4,40,"), "{csv}");
        // Latencies and counts leave the gauge columns empty.
        assert!(
            csv.contains("\n\"x master\",accept_untimed,2,3,,,,,,,,,\n"),
            "{csv}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gauges_merge_weighted_by_their_intervals_durations() {
        let dir = std::env::temp_dir().join(format!("sp-report-gauges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.hlog");
        let rec = Recorder::create(&path, true).unwrap();
        let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        h.record_n(1_000, 10).unwrap();
        // 1 s at 1.0, then 3 s at 2.0.
        for (start, secs, busy, own) in [(0, 1, 1.0, 2_000_000.0), (1, 3, 2.0, 4_000_000.0)] {
            rec.record(Interval {
                start: Duration::from_secs(start),
                duration: Duration::from_secs(secs),
                histograms: vec![("php-fpm pool www".into(), "accept", h.clone())],
                counts: vec![],
                gauges: vec![
                    ("php-fpm pool www".into(), "busy_mean", busy),
                    ("php-fpm pool www".into(), "busy_max", 2.0 * busy),
                    ("php-fpm pool www".into(), "own", own),
                ],
            });
        }
        rec.finish().unwrap();
        let all = rows(&path, &Filter::default()).unwrap();
        let only = |metric: &str| {
            rows(
                &path,
                &Filter {
                    metric: Some(metric.into()),
                    ..Filter::default()
                },
            )
            .unwrap()
        };
        let busy = only("busy_mean");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            all.iter().map(|r| r.metric.as_str()).collect::<Vec<_>>(),
            ["accept", "busy_max", "busy_mean", "own"]
        );
        assert_eq!(busy.len(), 1);
        let b = &busy[0];
        assert_eq!(
            (b.intervals, b.seconds, b.gauge_mean, b.gauge_max),
            (2, 4.0, Some(1.75), Some(2.0))
        );
        assert_eq!((b.count, b.latency, b.count()), (None, None, 0));
        assert_eq!(
            (all[1].gauge_mean, all[1].gauge_max),
            (Some(3.5), Some(4.0))
        );
        assert_eq!(
            (all[3].gauge_mean, all[3].gauge_max),
            (Some(3_500_000.0), Some(4_000_000.0))
        );
        assert_eq!((all[0].gauge_mean, all[0].gauge_max), (None, None));

        let text = render(&all, ReportFormat::Text);
        for line in [
            "php-fpm pool www · busy_mean  mean 1.8  max 2.0 over 2 intervals (4s)\n",
            "php-fpm pool www · busy_max  mean 3.5  max 4.0 over 2 intervals (4s)\n",
            "php-fpm pool www · own  mean 3.50ms  max 4.00ms over 2 intervals (4s)\n",
            "php-fpm pool www · accept  count 20 over 2 intervals (4s)\n",
        ] {
            assert!(text.contains(line), "no {line:?} in:\n{text}");
        }

        let csv = render(&all, ReportFormat::Csv);
        assert!(
            csv.starts_with(
                "role,metric,intervals,count,min_ns,mean_ns,p50_ns,p90_ns,p99_ns,p999_ns,max_ns,gauge_mean,gauge_max\n"
            ),
            "{csv}"
        );
        assert!(
            csv.contains("\n\"php-fpm pool www\",busy_mean,2,,,,,,,,,1.75,2\n"),
            "{csv}"
        );
        assert!(
            csv.contains("\n\"php-fpm pool www\",own,2,,,,,,,,,3500000,4000000\n"),
            "{csv}"
        );
        let columns = |line: &str| line.split(',').count();
        let header = columns(csv.lines().next().unwrap());
        for line in csv.lines() {
            // No role here holds a comma.
            assert_eq!(columns(line), header, "{line}");
        }

        let json: Vec<serde_json::Value> = render(&all, ReportFormat::Json)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let b = &json[2];
        assert_eq!(b["schema"], "stackprobe.report/3");
        assert_eq!(
            (&b["metric"], &b["gauge_mean"], &b["gauge_max"]),
            (
                &serde_json::json!("busy_mean"),
                &serde_json::json!(1.75),
                &serde_json::json!(2.0)
            )
        );
        assert_eq!(
            (&b["intervals"], &b["seconds"]),
            (&serde_json::json!(2), &serde_json::json!(4.0))
        );
        for absent in ["count", "p50_ns", "log2_buckets"] {
            assert!(b.get(absent).is_none(), "{absent} in {b}");
        }
        // A latency has no gauge fields.
        assert!(json[0].get("gauge_mean").is_none(), "{}", json[0]);
        assert_eq!(json[0]["count"], 20);

        // --metric takes the gauges' names.
        for metric in hlog::GAUGES {
            let cli = <crate::cli::Cli as clap::Parser>::try_parse_from([
                "stackprobe",
                "report",
                "r.hlog",
                "--metric",
                metric,
            ]);
            assert!(cli.is_ok(), "{metric}: {cli:?}");
        }
    }
}

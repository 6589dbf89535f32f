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
/// goes away. /2: rows of counts (a `count`, no percentiles) appear.
pub const SCHEMA: &str = "stackprobe.report/2";

/// One role's latency or count, merged over the intervals kept.
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
    /// A count's sum; None for a latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl Row {
    /// Samples of a latency, or a count's sum.
    pub fn count(&self) -> u64 {
        self.latency.map_or(0, |s| s.count) + self.count.unwrap_or(0)
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
    /// None for a count.
    hist: Option<LatencyHistogram>,
    count: u64,
    intervals: usize,
    seconds: f64,
}

/// The recording's histograms and counts merged per (role, metric),
/// filtered.
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
            count: m.hist.is_none().then_some(m.count),
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
                "role,metric,intervals,count,min_ns,mean_ns,p50_ns,p90_ns,p99_ns,p999_ns,max_ns\n",
            );
            for r in rows {
                let _ = write!(
                    out,
                    "\"{}\",{},{},{}",
                    r.role.replace('"', "\"\""),
                    r.metric,
                    r.intervals,
                    r.count(),
                );
                // A count has no latency columns.
                let _ = match &r.latency {
                    Some(s) => writeln!(
                        out,
                        ",{},{},{},{},{},{},{}",
                        s.min_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns
                    ),
                    None => writeln!(out, ",,,,,,,"),
                };
            }
        }
        ReportFormat::Text => {
            for r in rows {
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

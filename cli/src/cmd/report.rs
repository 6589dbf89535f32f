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

#[derive(Debug, Serialize)]
pub struct Row {
    pub role: String,
    pub metric: String,
    pub intervals: usize,
    /// Seconds the intervals cover.
    pub seconds: f64,
    #[serde(flatten)]
    pub latency: Summary,
    pub log2_buckets: Vec<Log2Bucket>,
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
        if !filter.keeps(&r) {
            return Ok(());
        }
        let label = format!("{} · {}", r.role, r.metric);
        let s = by_key.entry(label.clone()).or_insert_with(|| plot::Series {
            label,
            total: hdrhistogram::Histogram::new_from(&r.histogram),
            p99_over_time: Vec::new(),
        });
        s.p99_over_time
            .push((r.start.as_secs_f64(), r.histogram.value_at_quantile(0.99)));
        s.total
            .add(&r.histogram)
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

/// The recording's histograms merged per (role, metric), filtered.
pub fn rows(file: &std::path::Path, filter: &Filter) -> Result<Vec<Row>> {
    let mut merged: BTreeMap<(String, String), (LatencyHistogram, usize, f64)> = BTreeMap::new();
    hlog::for_each(file, |r| {
        if !filter.keeps(&r) {
            return Ok(());
        }
        let role = if filter.by_process {
            r.role.split(' ').next().unwrap_or_default().to_string()
        } else {
            r.role
        };
        let (hist, n, secs) = merged
            .entry((role, r.metric))
            .or_insert_with(|| (LatencyHistogram::new(), 0, 0.0));
        hist.add(&LatencyHistogram::from_hdr(r.histogram));
        *n += 1;
        *secs += r.duration.as_secs_f64();
        Ok(())
    })?;
    if merged.is_empty() {
        bail!("nothing in {} matches the filters", file.display());
    }
    Ok(merged
        .into_iter()
        .map(|((role, metric), (hist, intervals, seconds))| Row {
            role,
            metric,
            intervals,
            seconds,
            latency: hist.summary(),
            log2_buckets: hist.log2_buckets(),
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
                let s = &r.latency;
                let _ = writeln!(
                    out,
                    "\"{}\",{},{},{},{},{},{},{},{},{},{}",
                    r.role.replace('"', "\"\""),
                    r.metric,
                    r.intervals,
                    s.count,
                    s.min_ns,
                    s.mean_ns,
                    s.p50_ns,
                    s.p90_ns,
                    s.p99_ns,
                    s.p999_ns,
                    s.max_ns
                );
            }
        }
        ReportFormat::Text => {
            for r in rows {
                let s = &r.latency;
                let _ = writeln!(
                    out,
                    "{} · {}  count {} over {} intervals ({:.0}s)",
                    r.role, r.metric, s.count, r.intervals, r.seconds
                );
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
            });
        }
        rec.finish().unwrap();
        let all = rows(&path, &Filter::default()).unwrap();
        assert_eq!(
            all.iter()
                .map(|r| (r.role.as_str(), r.latency.count))
                .collect::<Vec<_>>(),
            [("x master", 40), ("x worker", 40)]
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
            (
                merged.len(),
                merged[0].role.as_str(),
                merged[0].latency.count
            ),
            (1, "x", 80)
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
            (window.len(), window[0].latency.count, window[0].intervals),
            (1, 20, 2)
        );
        assert!(
            window[0].latency.min_ns.abs_diff(3_000) <= 3,
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

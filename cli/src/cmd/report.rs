//! `stackprobe report FILE`: the percentiles and histograms of a recording,
//! for the whole run or a window of it, per role and metric.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::{
    cli::{ReportArgs, ReportFormat},
    export::hlog,
    model::histogram::{LatencyHistogram, Log2Bucket, Summary},
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
    let filter = Filter {
        role: args.role,
        metric: args.metric,
        from: args.from,
        to: args.to,
    };
    let rows = rows(&args.file, &filter)?;
    print!("{}", render(&rows, args.format));
    Ok(())
}

/// Which histograms of a recording to use.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Roles whose name contains this.
    pub role: Option<String>,
    pub metric: Option<String>,
    pub from: Option<std::time::Duration>,
    pub to: Option<std::time::Duration>,
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
    for r in hlog::read(file)?.into_iter().filter(|r| filter.keeps(r)) {
        let (hist, n, secs) = merged
            .entry((r.role, r.metric))
            .or_insert_with(|| (LatencyHistogram::new(), 0, 0.0));
        hist.add(&LatencyHistogram::from_hdr(r.histogram));
        *n += 1;
        *secs += r.duration.as_secs_f64();
    }
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
                let d = crate::model::histogram::duration;
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

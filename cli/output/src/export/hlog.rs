//! Recordings: every interval's histograms as an HdrHistogram interval log
//! (V2, deflate-compressed, base64), the standard format other HdrHistogram
//! tools read. Each histogram's tag names its role and metric:
//! `role=postgres%20postmaster;metric=accept` (tags may not contain spaces or
//! commas, so those are percent-encoded). Each declared count an interval
//! gained is a comment line, which other HdrHistogram readers skip:
//! `#stackprobe-count start=1.000 duration=1.000 metric=accept_untimed count=2 role=ROLE`.
//! Each gauge an interval's report held is one too, after the counts:
//! `#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=1.5 role=ROLE`
//! (see [`GAUGES`]).

use std::{
    fs::File,
    io::{Cursor, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine as _;
use hdrhistogram::{
    Histogram,
    serialization::{
        Deserializer, V2DeflateSerializer,
        interval_log::{IntervalLogIterator, IntervalLogWriterBuilder, LogEntry, Tag},
    },
};

use stackprobe_model::{
    measure::Count,
    process::{ProcessTable, Span},
    report::{Report, ReportKind},
};

/// What starts a count's line.
const COUNT_LINE: &str = "#stackprobe-count ";

/// What starts a gauge's line.
const GAUGE_LINE: &str = "#stackprobe-gauge ";

/// The gauges a recording holds, per role and interval: the connections the
/// role's server held on average (`busy_mean`) and at most at once
/// (`busy_max`), its configured limit (`busy_limit`, where known), and on a
/// chain of the path view the hop's own mean time per request in ns
/// (`own`).
pub const GAUGES: [&str; 4] = ["busy_mean", "busy_max", "busy_limit", "own"];

fn encode(s: &str) -> String {
    s.replace('%', "%25")
        .replace(' ', "%20")
        .replace(',', "%2C")
}

fn decode(s: &str) -> String {
    s.replace("%20", " ")
        .replace("%2C", ",")
        .replace("%25", "%")
}

pub fn tag(role: &str, metric: &str) -> String {
    format!("role={};metric={}", encode(role), encode(metric))
}

pub fn parse_tag(tag: &str) -> Option<(String, String)> {
    let (role, metric) = tag.strip_prefix("role=")?.split_once(";metric=")?;
    Some((decode(role), decode(metric)))
}

/// One interval's histograms, to be written.
pub struct Interval {
    /// Since the recording started.
    pub start: Duration,
    pub duration: Duration,
    /// (role, metric, histogram)
    pub histograms: Vec<(String, &'static str, Histogram<u64>)>,
    /// (role, count, what it gained in the interval), those above 0.
    pub counts: Vec<(String, Count, u64)>,
    /// (role, gauge (one of [`GAUGES`]), its value over the interval).
    pub gauges: Vec<(String, &'static str, f64)>,
}

impl Interval {
    /// This interval's histograms of every role and metric that has samples.
    pub fn of(table: &ProcessTable, start: Duration, duration: Duration) -> Self {
        let mut histograms = Vec::new();
        let mut counts = Vec::new();
        for (role, (_, activity)) in table.roles(Span::Interval) {
            for (l, m) in activity.latency.iter() {
                if let Some(h) = m.interval.hdr().filter(|h| !h.is_empty()) {
                    histograms.push((role.clone(), l.name(), h.clone()));
                }
            }
            for (c, n) in activity.counts.iter() {
                if n.interval > 0 {
                    counts.push((role.clone(), c, n.interval));
                }
            }
        }
        Self {
            start,
            duration,
            histograms,
            counts,
            gauges: Vec::new(),
        }
    }

    /// With the gauges of the interval's `report`: each busy row's mean, max
    /// and limit (when known), and each chain hop's own time (a role on two
    /// chains once, from the first). A summary's (the run's end: its
    /// numbers cover the whole run, not the last partial interval) adds
    /// none.
    pub fn with_report(mut self, report: &Report) -> Self {
        self.gauges = gauges(report);
        self
    }
}

/// (role, gauge, value) of a report; see [`Interval::with_report`].
pub fn gauges(report: &Report) -> Vec<(String, &'static str, f64)> {
    let mut out = Vec::new();
    if report.kind != ReportKind::Interval {
        return out;
    }
    for r in &report.roles {
        let Some(busy) = &r.busy else {
            continue;
        };
        out.push((r.role.clone(), GAUGES[0], busy.mean));
        out.push((r.role.clone(), GAUGES[1], busy.max as f64));
        if let Some(limit) = &busy.limit {
            out.push((r.role.clone(), GAUGES[2], f64::from(limit.value)));
        }
    }
    let mut owned: Vec<&str> = Vec::new();
    for hop in report.chains.iter().flat_map(|c| &c.hops) {
        if let Some(ns) = hop.own_ns
            && !owned.contains(&hop.role.as_str())
        {
            owned.push(&hop.role);
            out.push((hop.role.clone(), GAUGES[3], ns as f64));
        }
    }
    // Values a line cannot hold (never from a report) are left out.
    out.retain(|(_, _, v)| v.is_finite() && *v >= 0.0);
    out
}

/// Writes intervals in a thread of its own, so a slow disk never slows
/// collection. Each interval is flushed, so what was written stays a valid
/// log; the first error stops the recording and is kept for the caller.
pub struct Recorder {
    path: PathBuf,
    tx: Option<mpsc::Sender<Interval>>,
    thread: Option<std::thread::JoinHandle<()>>,
    error: Arc<Mutex<Option<String>>>,
}

impl Recorder {
    /// Creates `path` (an existing file only with `force`; see `file`).
    pub fn create(path: &Path, force: bool) -> Result<Self> {
        let file = super::file::create(path, force, "recording")?;
        let (tx, rx) = mpsc::channel::<Interval>();
        let error = Arc::new(Mutex::new(None));
        let failed = error.clone();
        let shown = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                if let Err(e) = write_all(file, rx) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("writing the recording {shown}: {e:#}"));
                }
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            tx: Some(tx),
            thread: Some(thread),
            error,
        })
    }

    pub fn record(&self, interval: Interval) {
        if let Some(tx) = &self.tx {
            // A send only fails once the writer stopped on an error, which
            // `error` reports.
            let _ = tx.send(interval);
        }
    }

    /// The error that stopped the recording, if any.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Writes what is queued and closes the file.
    pub fn finish(mut self) -> Result<PathBuf> {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        match self.error() {
            Some(e) => bail!(e),
            None => Ok(self.path.clone()),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn write_all(mut file: File, rx: mpsc::Receiver<Interval>) -> Result<()> {
    let mut serializer = V2DeflateSerializer::new();
    let mut buf = Vec::new();
    let mut written = 0;
    IntervalLogWriterBuilder::new()
        .add_comment("stackprobe recording: tags are role=ROLE;metric=METRIC (percent-encoded), values in ns")
        .with_start_time(SystemTime::now())
        .begin_log_with(&mut buf, &mut serializer)?;
    append(&mut file, &mut buf, &mut written)?;
    for interval in rx {
        let mut log = IntervalLogWriterBuilder::new().begin_log_with(&mut buf, &mut serializer)?;
        for (role, metric, hist) in &interval.histograms {
            let tag = tag(role, metric);
            let tag = Tag::new(&tag)
                .ok_or_else(|| anyhow!("tag {tag:?} has a character logs cannot hold"))?;
            log.write_histogram(hist, interval.start, interval.duration, Some(tag))
                .map_err(|e| anyhow!("{e:?}"))?;
        }
        for (role, count, n) in &interval.counts {
            log.write_comment(&format!(
                "{}start={:.3} duration={:.3} metric={} count={n} role={}",
                &COUNT_LINE[1..],
                interval.start.as_secs_f64(),
                interval.duration.as_secs_f64(),
                count.name(),
                encode(role)
            ))?;
        }
        for (role, gauge, value) in &interval.gauges {
            log.write_comment(&format!(
                "{}start={:.3} duration={:.3} metric={gauge} value={value} role={}",
                &GAUGE_LINE[1..],
                interval.start.as_secs_f64(),
                interval.duration.as_secs_f64(),
                encode(role)
            ))?;
        }
        drop(log);
        append(&mut file, &mut buf, &mut written)?;
    }
    Ok(())
}

/// Appends a whole interval or nothing: when a write fails (a full disk),
/// the file is cut back to the last complete interval, so what was written
/// stays readable.
fn append(file: &mut File, buf: &mut Vec<u8>, written: &mut u64) -> Result<()> {
    if let Err(e) = file.write_all(buf) {
        let _ = file.set_len(*written);
        return Err(e.into());
    }
    *written += buf.len() as u64;
    buf.clear();
    Ok(())
}

/// One histogram, count or gauge, read back from a recording.
#[derive(Debug)]
pub struct Recorded {
    pub start: Duration,
    pub duration: Duration,
    pub role: String,
    pub metric: String,
    pub value: Value,
}

#[derive(Debug, PartialEq)]
pub enum Value {
    Histogram(Histogram<u64>),
    Count(u64),
    /// One interval's value of a gauge (one of [`GAUGES`], or one a later
    /// version writes): finite and not negative.
    Gauge(f64),
}

/// Reads a recording; a corrupt or truncated one is an error naming the file
/// and line.
pub fn read(path: &Path) -> Result<Vec<Recorded>> {
    let mut out = Vec::new();
    for_each(path, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Hands each histogram of a recording to `f` in order, then each count and
/// gauge in the order of their lines, holding one at a time (an hour at 1 s for a few roles is tens of
/// thousands of them).
pub fn for_each(path: &Path, f: impl FnMut(Recorded) -> Result<()>) -> Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_each(&data, f).map_err(|e| anyhow!("{}: {e}", path.display()))
}

pub fn parse(data: &[u8]) -> Result<Vec<Recorded>> {
    let mut out = Vec::new();
    parse_each(data, |r| {
        out.push(r);
        Ok(())
    })?;
    Ok(out)
}

/// Line numbers by byte offset, counted incrementally (offsets only grow).
struct Lines<'a> {
    data: &'a [u8],
    offset: usize,
    line: usize,
}

impl Lines<'_> {
    fn at(&mut self, offset: usize) -> usize {
        let offset = offset.min(self.data.len());
        if offset < self.offset {
            self.offset = 0;
            self.line = 1;
        }
        self.line += self.data[self.offset..offset]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        self.offset = offset;
        self.line
    }
}

fn parse_each(data: &[u8], mut f: impl FnMut(Recorded) -> Result<()>) -> Result<()> {
    let mut deserializer = Deserializer::new();
    let mut lines = Lines {
        data,
        offset: 0,
        line: 1,
    };
    let mut offset = 0;
    let mut seen = 0usize;
    for entry in IntervalLogIterator::new(data) {
        let entry = entry.map_err(|e| {
            let hdrhistogram::serialization::interval_log::LogIteratorError::ParseError { offset } =
                e;
            anyhow!("line {}: not an interval log line", lines.at(offset))
        })?;
        let LogEntry::Interval(h) = entry else {
            continue;
        };
        let encoded = h.encoded_histogram();
        offset = find(data, encoded.as_bytes(), offset);
        let line = lines.at(offset);
        let tag = h
            .tag()
            .ok_or_else(|| anyhow!("line {line}: a histogram without a role/metric tag"))?;
        let (role, metric) = parse_tag(tag.as_str())
            .ok_or_else(|| anyhow!("line {line}: tag {:?} is not role=…;metric=…", tag.as_str()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| anyhow!("line {line}: bad base64: {e}"))?;
        let histogram: Histogram<u64> = deserializer
            .deserialize(&mut Cursor::new(bytes))
            .map_err(|e| anyhow!("line {line}: bad histogram: {e:?}"))?;
        seen += 1;
        f(Recorded {
            start: h.start_timestamp(),
            duration: h.duration(),
            role,
            metric,
            value: Value::Histogram(histogram),
        })?;
    }
    for (i, line) in data.split(|&b| b == b'\n').enumerate() {
        let recorded = if let Some(rest) = line.strip_prefix(COUNT_LINE.as_bytes()) {
            std::str::from_utf8(rest)
                .ok()
                .and_then(parse_count)
                .ok_or_else(|| anyhow!("line {}: not a stackprobe count", i + 1))?
        } else if let Some(rest) = line.strip_prefix(GAUGE_LINE.as_bytes()) {
            std::str::from_utf8(rest)
                .ok()
                .and_then(parse_gauge)
                .ok_or_else(|| anyhow!("line {}: not a stackprobe gauge", i + 1))?
        } else {
            continue;
        };
        seen += 1;
        f(recorded)?;
    }
    if seen == 0 {
        bail!("no histograms in this recording (empty or not a stackprobe recording)");
    }
    Ok(())
}

/// `start=1.000 duration=1.000 metric=accept_untimed count=2 role=ROLE`:
/// the role is last, and percent-encoded, so it may hold spaces.
fn parse_count(line: &str) -> Option<Recorded> {
    let (fields, role) = line.split_once(" role=")?;
    let mut fields = fields.split(' ');
    let mut field = |name: &str| fields.next()?.strip_prefix(name)?.strip_prefix('=');
    let secs = |s: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e12)
            .map(Duration::from_secs_f64)
    };
    let start = secs(field("start")?)?;
    let duration = secs(field("duration")?)?;
    let metric = field("metric")?.to_string();
    let count = field("count")?.parse().ok()?;
    Some(Recorded {
        start,
        duration,
        role: decode(role),
        metric,
        value: Value::Count(count),
    })
}

/// `start=1.000 duration=1.000 metric=busy_mean value=1.5 role=ROLE`, each
/// field once, in that order, the value finite and not negative; the role
/// is last, and percent-encoded.
fn parse_gauge(line: &str) -> Option<Recorded> {
    let (fields, role) = line.split_once(" role=")?;
    let fields: Vec<&str> = fields.split(' ').collect();
    let [start, duration, metric, value] = fields.as_slice() else {
        return None;
    };
    fn get<'a>(field: &'a str, name: &str) -> Option<&'a str> {
        field.strip_prefix(name)?.strip_prefix('=')
    }
    let secs = |s: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e12)
            .map(Duration::from_secs_f64)
    };
    let start = secs(get(start, "start")?)?;
    let duration = secs(get(duration, "duration")?)?;
    let metric = get(metric, "metric")?.to_string();
    let value = get(value, "value")?
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)?;
    if metric.is_empty() || role.is_empty() {
        return None;
    }
    Some(Recorded {
        start,
        duration,
        role: decode(role),
        metric,
        value: Value::Gauge(value),
    })
}

fn find(data: &[u8], needle: &[u8], from: usize) -> usize {
    data.get(from..)
        .and_then(|rest| rest.windows(needle.len().max(1)).position(|w| w == needle))
        .map_or(from, |i| from + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(values: &[u64]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for &v in values {
            h.record(v).unwrap();
        }
        h
    }

    fn write(intervals: Vec<Interval>) -> Vec<u8> {
        // A directory per call: tests run in parallel, and one removing
        // its directory must not take another's file.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sp-hlog-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.hlog");
        let rec = Recorder::create(&path, true).unwrap();
        for i in intervals {
            rec.record(i);
        }
        rec.finish().unwrap();
        let data = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        data
    }

    #[test]
    fn tags_round_trip_through_the_encoding() {
        let t = tag("postgres postmaster", "accept");
        assert_eq!(t, "role=postgres%20postmaster;metric=accept");
        assert!(Tag::new(&t).is_some());
        assert_eq!(
            parse_tag(&t),
            Some(("postgres postmaster".into(), "accept".into()))
        );
        assert_eq!(
            parse_tag(&tag("a,b%c d", "fork")),
            Some(("a,b%c d".into(), "fork".into()))
        );
        assert_eq!(parse_tag("whatever"), None);
    }

    #[test]
    fn histograms_read_back_exactly() {
        let a = hist(&[1_000, 2_000, 3_000, 1_000_000]);
        let b = hist(&(1..=5000).map(|v| v * 997).collect::<Vec<_>>());
        let data = write(vec![
            Interval {
                start: Duration::from_secs(1),
                duration: Duration::from_secs(1),
                histograms: vec![
                    ("postgres postmaster".into(), "accept", a.clone()),
                    ("nginx worker".into(), "fork", b.clone()),
                ],
                counts: vec![("postgres postmaster".into(), Count::AcceptUntimed, 2)],
                gauges: vec![],
            },
            Interval {
                start: Duration::from_secs(2),
                duration: Duration::from_secs(1),
                histograms: vec![("postgres postmaster".into(), "accept", a.clone())],
                counts: vec![("php-fpm pool a;b=c".into(), Count::ForkFailed, 7)],
                gauges: vec![],
            },
        ]);
        let back = parse(&data).unwrap();
        assert_eq!(back.len(), 5);
        let counts: Vec<(Duration, &str, &str, u64)> = back
            .iter()
            .filter_map(|r| match r.value {
                Value::Count(n) => Some((r.start, r.role.as_str(), r.metric.as_str(), n)),
                Value::Histogram(_) | Value::Gauge(_) => None,
            })
            .collect();
        assert_eq!(
            counts,
            [
                (
                    Duration::from_secs(1),
                    "postgres postmaster",
                    "accept_untimed",
                    2
                ),
                (
                    Duration::from_secs(2),
                    "php-fpm pool a;b=c",
                    "fork_failed",
                    7
                ),
            ]
        );
        // Other HdrHistogram readers see the histograms alone: the counts
        // are comments to them.
        let intervals = IntervalLogIterator::new(&data)
            .filter(|e| matches!(e, Ok(LogEntry::Interval(_))))
            .count();
        assert_eq!(intervals, 3);
        assert_eq!(
            (back[0].role.as_str(), back[0].metric.as_str()),
            ("postgres postmaster", "accept")
        );
        assert_eq!(back[1].role, "nginx worker");
        assert_eq!(back[2].start, Duration::from_secs(2));
        let hist = |r: &Recorded| match &r.value {
            Value::Histogram(h) => h.clone(),
            other => panic!("{other:?} where a histogram was written"),
        };
        for (got, want) in [(&hist(&back[0]), &a), (&hist(&back[1]), &b)] {
            assert_eq!(got.len(), want.len());
            for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
                assert_eq!(got.value_at_quantile(q), want.value_at_quantile(q), "q {q}");
            }
            assert_eq!((got.min(), got.max()), (want.min(), want.max()));
        }
    }

    #[test]
    fn the_run_queue_probes_histograms_and_count_round_trip_like_any_declared() {
        use stackprobe_model::{
            event::HistMetric,
            fixtures::{kernel_hist, live},
        };
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "php-fpm")]);
        t.apply(&kernel_hist(
            1,
            "php-fpm",
            HistMetric::RunQueue,
            &[3_000, 5_000_000],
        ));
        t.apply(&kernel_hist(1, "php-fpm", HistMetric::Preempted, &[0; 7]));
        let data = write(vec![Interval::of(
            &t,
            Duration::from_secs(1),
            Duration::from_secs(1),
        )]);
        let back: Vec<(String, String, u64, u64)> = parse(&data)
            .unwrap()
            .into_iter()
            .map(|r| {
                let (n, max) = match r.value {
                    Value::Histogram(h) => (h.len(), h.max()),
                    Value::Count(n) => (n, 0),
                    Value::Gauge(g) => panic!("a gauge {g} where none was written"),
                };
                (r.role, r.metric, n, max)
            })
            .collect();
        let [(role, metric, n, max), (crole, count, c, _)] = back.as_slice() else {
            panic!("{back:?}")
        };
        assert_eq!(
            (role.as_str(), metric.as_str(), *n),
            ("php-fpm", "run_queue", 2)
        );
        assert!(max.abs_diff(5_000_000) <= 5_000_000 / 128, "{max}");
        assert_eq!(
            (crole.as_str(), count.as_str(), *c),
            ("php-fpm", "preempted", 7)
        );
    }

    /// A recording as stackprobe wrote them before gauges were kept: one
    /// interval with a histogram and a count.
    const OLD: &str = "#stackprobe recording: tags are role=ROLE;metric=METRIC (percent-encoded), values in ns
#[StartTime: 1796528719.807 (seconds since epoch)]
Tag=role=postgres%20postmaster;metric=accept,1.000,1.000,3001.000,HISTFAAAADx4nAExAM7/HISTEwAAAAkAAAAAAAAAAwAAAAAAAAABAAAADfhHWAA/8AAAAAAAAM8PAs0PApUIAoImBoQ=
#stackprobe-count start=1.000 duration=1.000 metric=accept_untimed count=2 role=postgres%20postmaster
";

    #[test]
    fn an_old_recording_without_gauges_reads_as_before() {
        let back = parse(OLD.as_bytes()).unwrap();
        assert_eq!(back.len(), 2, "{back:?}");
        let second = Duration::from_secs(1);
        let Value::Histogram(h) = &back[0].value else {
            panic!("{:?} where a histogram was written", back[0].value);
        };
        assert_eq!(
            (
                back[0].start,
                back[0].duration,
                back[0].role.as_str(),
                back[0].metric.as_str()
            ),
            (second, second, "postgres postmaster", "accept")
        );
        assert_eq!((h.len(), h.min(), h.max()), (3, 1_000, 3_001));
        assert!(matches!(back[1].value, Value::Count(2)), "{back:?}");
        assert_eq!(
            (
                back[1].start,
                back[1].duration,
                back[1].role.as_str(),
                back[1].metric.as_str()
            ),
            (second, second, "postgres postmaster", "accept_untimed")
        );
        // The writer still writes it so, when a report has no gauges.
        let data = write(vec![Interval {
            start: second,
            duration: second,
            histograms: vec![(
                "postgres postmaster".into(),
                "accept",
                hist(&[1_000, 2_000, 3_000]),
            )],
            counts: vec![("postgres postmaster".into(), Count::AcceptUntimed, 2)],
            gauges: vec![],
        }]);
        let body = |text: &str| {
            text.lines()
                .filter(|l| !l.starts_with("#[StartTime"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(body(&String::from_utf8(data).unwrap()), body(OLD));
    }

    #[test]
    fn busy_rows_and_own_times_round_trip_as_gauges() {
        use stackprobe_model::{
            busy::{BusyRow, LimitRow},
            fixtures::{interval_report, three_hops},
        };

        let mut t = ProcessTable::default();
        three_hops(&mut t, 100);
        let mut report = interval_report(&t);
        let role = |name: &str| {
            report
                .roles
                .iter()
                .position(|r| r.role.starts_with(name))
                .unwrap()
        };
        let (fpm, pg) = (role("php-fpm"), role("postgres"));
        report.roles[fpm].busy = Some(BusyRow {
            mean: 1.75,
            max: 2,
            now: 1,
            processes: 2,
            limit: Some(LimitRow {
                setting: "pm.max_children",
                value: 5,
                source: "/etc/php/8.2/fpm/pool.d/www.conf".into(),
            }),
        });
        // No limit known: no busy_limit.
        report.roles[pg].busy = Some(BusyRow {
            mean: 0.1,
            max: 1,
            now: 0,
            processes: 3,
            limit: None,
        });
        let (fpm, pg) = (
            report.roles[fpm].role.clone(),
            report.roles[pg].role.clone(),
        );
        let nginx = report.chains[0].hops[0].role.clone();
        let second = Duration::from_secs(1);
        let interval = Interval::of(&t, Duration::from_secs(3), second).with_report(&report);
        let want: Vec<(String, &str, f64)> = vec![
            (fpm.clone(), "busy_mean", 1.75),
            (fpm.clone(), "busy_max", 2.0),
            (fpm.clone(), "busy_limit", 5.0),
            (pg.clone(), "busy_mean", 0.1),
            (pg.clone(), "busy_max", 1.0),
            (nginx, "own", 7_960_000.0),
            (fpm.clone(), "own", 28_985_000.0),
            (pg.clone(), "own", 50_000_000.0),
        ];
        fn sorted(mut v: Vec<(String, &str, f64)>) -> Vec<(String, &str, f64)> {
            v.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
            v
        }
        let want = sorted(want);
        assert_eq!(sorted(interval.gauges.clone()), want);
        // The summary's numbers are the whole run's: not the last interval's.
        let mut summary = report.clone();
        summary.kind = ReportKind::Summary;
        assert!(gauges(&summary).is_empty());
        let histograms = interval.histograms.len();
        // A role whose name needs encoding.
        let pool = Interval {
            start: Duration::from_secs(4),
            duration: Duration::from_millis(500),
            histograms: vec![],
            counts: vec![],
            gauges: vec![("php-fpm pool a,b%c".into(), "busy_mean", 0.333)],
        };
        let data = write(vec![interval, pool]);
        let text = String::from_utf8(data.clone()).unwrap();
        assert!(
            text.contains(&format!(
                "\n#stackprobe-gauge start=3.000 duration=1.000 metric=busy_mean value=1.75 role={}\n",
                encode(&fpm)
            )),
            "{text}"
        );
        let back = parse(&data).unwrap();
        let gauges: Vec<&Recorded> = back
            .iter()
            .filter(|r| matches!(r.value, Value::Gauge(_)))
            .collect();
        let got: Vec<(String, &str, f64)> = gauges
            .iter()
            .filter(|r| r.start == Duration::from_secs(3))
            .map(|r| {
                let Value::Gauge(v) = r.value else {
                    unreachable!()
                };
                assert_eq!(r.duration, second);
                let metric = GAUGES.iter().find(|&&g| g == r.metric).unwrap();
                (r.role.clone(), *metric, v)
            })
            .collect();
        assert_eq!(sorted(got), want);
        let last = gauges.last().unwrap();
        assert_eq!(
            (
                last.role.as_str(),
                last.metric.as_str(),
                last.duration,
                &last.value
            ),
            (
                "php-fpm pool a,b%c",
                "busy_mean",
                Duration::from_millis(500),
                &Value::Gauge(0.333)
            )
        );
        // Other HdrHistogram readers see the histograms alone.
        let intervals = IntervalLogIterator::new(&data)
            .filter(|e| matches!(e, Ok(LogEntry::Interval(_))))
            .count();
        assert_eq!(intervals, histograms);
        assert!(histograms > 0);
    }

    #[test]
    fn a_malformed_gauge_line_is_an_error_with_its_line() {
        let data = write(vec![Interval {
            start: Duration::ZERO,
            duration: Duration::from_secs(1),
            histograms: vec![("x".into(), "accept", hist(&[5]))],
            counts: vec![],
            gauges: vec![("x".into(), "busy_max", 3.0)],
        }]);
        let lines = String::from_utf8(data.clone()).unwrap().lines().count();
        let good = "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=2.5 role=a";
        let mut ok = data.clone();
        ok.extend_from_slice(format!("{good}\n").as_bytes());
        let back = parse(&ok).unwrap();
        assert!(matches!(back.last().unwrap().value, Value::Gauge(2.5)));
        assert!(matches!(back[back.len() - 2].value, Value::Gauge(3.0)));
        for line in [
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value= role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=x role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=-1 role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=NaN role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=inf role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=1e400 role=a",
            "#stackprobe-gauge start=-1 duration=1.000 metric=busy_mean value=1 role=a",
            "#stackprobe-gauge duration=1.000 start=1.000 metric=busy_mean value=1 role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=1 count=1 role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric= value=1 role=a",
            "#stackprobe-gauge start=1.000 duration=1.000 metric=busy_mean value=1 role=",
        ] {
            let mut bad = data.clone();
            bad.extend_from_slice(format!("{line}\n").as_bytes());
            let err = parse(&bad).unwrap_err().to_string();
            assert_eq!(
                err,
                format!("line {}: not a stackprobe gauge", lines + 1),
                "{line}"
            );
        }
        // A good line cut short (no newline: it may have lost digits).
        let mut cut = data.clone();
        cut.extend_from_slice(good.as_bytes());
        let err = parse(&cut).unwrap_err().to_string();
        assert!(err.starts_with(&format!("line {}: ", lines + 1)), "{err}");
        // A gauge in the middle is named by its own line.
        let mut middle = good.as_bytes().to_vec();
        middle.push(b'\n');
        middle.extend_from_slice(
            b"#stackprobe-gauge start=1 duration=1 metric=own value=-0.5 role=a\n",
        );
        middle.extend_from_slice(&data);
        let err = parse(&middle).unwrap_err().to_string();
        assert_eq!(err, "line 2: not a stackprobe gauge");
    }

    #[test]
    fn corrupt_truncated_and_empty_recordings_are_errors_with_a_line() {
        let data = write(vec![Interval {
            start: Duration::ZERO,
            duration: Duration::from_secs(1),
            histograms: vec![("x".into(), "accept", hist(&[5, 6, 7]))],
            counts: vec![],
            gauges: vec![],
        }]);
        assert!(
            parse(b"")
                .unwrap_err()
                .to_string()
                .contains("no histograms")
        );
        let text = String::from_utf8(data.clone()).unwrap();
        let lines = text.lines().count();
        // Cut the last (histogram) line in half.
        let cut = &data[..data.len() - 20];
        let err = parse(cut).unwrap_err().to_string();
        assert!(err.contains(&format!("line {lines}")), "{err}");
        // Garbage in the middle of the histogram's base64.
        let mut bad = data.clone();
        let at = bad.len() - 30;
        bad[at] = b'!';
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.starts_with("line "), "{err}");
        assert!(parse(b"not a log\nat all\n").is_err());
        // A count line cut short, or with a count that is no number.
        for line in [
            "#stackprobe-count start=1.000 duration=1.000 metric=exited",
            "#stackprobe-count start=1.000 duration=1.000 metric=exited count=x role=a",
            "#stackprobe-count start=-1 duration=1.000 metric=exited count=1 role=a",
        ] {
            let mut bad = data.clone();
            bad.extend_from_slice(format!("{line}\n").as_bytes());
            let err = parse(&bad).unwrap_err().to_string();
            assert_eq!(err, format!("line {}: not a stackprobe count", lines + 1));
        }
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    /// A small valid recording to mutate.
    fn valid() -> Vec<u8> {
        let mut h: Histogram<u64> = Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for v in [10u64, 2_000, 30_000, 4_000_000] {
            h.record(v).unwrap();
        }
        let mut out = Vec::new();
        let mut serializer = V2DeflateSerializer::new();
        {
            let mut log = IntervalLogWriterBuilder::new()
                .begin_log_with(&mut out, &mut serializer)
                .unwrap();
            let t = tag("postgres postmaster", "accept");
            log.write_histogram(
                &h,
                Duration::from_secs(1),
                Duration::from_secs(1),
                Tag::new(&t),
            )
            .unwrap();
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&data);
        }

        #[test]
        fn mutated_recordings_never_panic(at in 0usize..1000, byte in any::<u8>(), cut in 0usize..1000) {
            let mut data = valid();
            let i = at % data.len();
            data[i] = byte;
            data.truncate(data.len() - cut % data.len());
            if let Err(e) = parse(&data) {
                // Errors say where, or that nothing usable was found.
                let msg = e.to_string();
                prop_assert!(msg.starts_with("line ") || msg.contains("no histograms"), "{}", msg);
            }
        }
    }
}

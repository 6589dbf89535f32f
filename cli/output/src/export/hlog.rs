//! Recordings: every interval's histograms as an HdrHistogram interval log
//! (V2, deflate-compressed, base64), the standard format other HdrHistogram
//! tools read. Each histogram's tag names its role and metric:
//! `role=postgres%20postmaster;metric=accept` (tags may not contain spaces or
//! commas, so those are percent-encoded). Each declared count an interval
//! gained is a comment line, which other HdrHistogram readers skip:
//! `#stackprobe-count start=1.000 duration=1.000 metric=accept_untimed count=2 role=ROLE`.

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
};

/// What starts a count's line.
const COUNT_LINE: &str = "#stackprobe-count ";

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
        }
    }
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

/// One histogram, or one count, read back from a recording.
#[derive(Debug)]
pub struct Recorded {
    pub start: Duration,
    pub duration: Duration,
    pub role: String,
    pub metric: String,
    pub value: Value,
}

#[derive(Debug)]
pub enum Value {
    Histogram(Histogram<u64>),
    Count(u64),
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

/// Hands each histogram of a recording to `f` in order, then each count,
/// holding one at a time (an hour at 1 s for a few roles is tens of
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
        let Some(rest) = line.strip_prefix(COUNT_LINE.as_bytes()) else {
            continue;
        };
        let count = std::str::from_utf8(rest)
            .ok()
            .and_then(parse_count)
            .ok_or_else(|| anyhow!("line {}: not a stackprobe count", i + 1))?;
        seen += 1;
        f(count)?;
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
        let dir = std::env::temp_dir().join(format!(
            "sp-hlog-{}-{}",
            std::process::id(),
            intervals.len()
        ));
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
            },
            Interval {
                start: Duration::from_secs(2),
                duration: Duration::from_secs(1),
                histograms: vec![("postgres postmaster".into(), "accept", a.clone())],
                counts: vec![("php-fpm pool a;b=c".into(), Count::ForkFailed, 7)],
            },
        ]);
        let back = parse(&data).unwrap();
        assert_eq!(back.len(), 5);
        let counts: Vec<(Duration, &str, &str, u64)> = back
            .iter()
            .filter_map(|r| match r.value {
                Value::Count(n) => Some((r.start, r.role.as_str(), r.metric.as_str(), n)),
                Value::Histogram(_) => None,
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
            Value::Count(n) => panic!("a count {n} where a histogram was written"),
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
    fn corrupt_truncated_and_empty_recordings_are_errors_with_a_line() {
        let data = write(vec![Interval {
            start: Duration::ZERO,
            duration: Duration::from_secs(1),
            histograms: vec![("x".into(), "accept", hist(&[5, 6, 7]))],
            counts: vec![],
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

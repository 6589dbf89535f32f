//! Section 3: the event rates stackprobe takes without dropping, and its own
//! CPU at each. The event source is thread creation in a watched loopback
//! process (each thread: a clone latency event and a spawn event), paced to a
//! target rate, or as fast as one or two generator processes go.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use super::{
    Scale,
    loopback::Loopback,
    tracer::{Tracer, summary},
};

/// A loopback process that creates threads on command.
struct Generator(Loopback);

impl Generator {
    fn start() -> Result<Self> {
        Ok(Self(Loopback::start(&["--max-seconds", "300"])?))
    }

    fn send(&mut self, n: u64, rate: Option<f64>) -> Result<()> {
        // No rate: one far beyond what thread creation reaches.
        self.0
            .send(&format!("threads {n} {}", rate.unwrap_or(1e12)))
    }

    /// Waits for the reply to `send`: how long the threads took.
    fn done(&mut self) -> Result<Duration> {
        let line = self.0.line()?;
        let secs = line
            .strip_prefix("threads ")
            .and_then(|l| l.split_once(" in "))
            .and_then(|(_, s)| s.strip_suffix('s')?.parse::<f64>().ok())
            .with_context(|| format!("generator said {line:?}"))?;
        Ok(Duration::from_secs_f64(secs))
    }
}

struct Step {
    events_per_s: f64,
    events: u64,
    drops: u64,
    cpu_percent: f64,
    /// The generator could not keep the asked rate.
    generator_bound: bool,
}

/// `n` threads per generator at `rate` each (None: as fast as they go).
fn step(generators: usize, n: u64, rate: Option<f64>) -> Result<Step> {
    let mut gens = (0..generators)
        .map(|_| Generator::start())
        .collect::<Result<Vec<_>>>()?;
    let pids: Vec<String> = gens.iter().map(|g| g.0.pid.to_string()).collect();
    let mut args = vec!["watch", "--json", "--no-tui", "--interval", "1s"];
    for pid in &pids {
        args.extend(["--pid", pid.as_str()]);
    }
    let tracer = Tracer::stackprobe(&args)?;
    let cpu0 = tracer.cpu_s()?;
    let started = Instant::now();
    for g in &mut gens {
        g.send(n, rate)?;
    }
    let mut slowest = Duration::ZERO;
    for g in &mut gens {
        slowest = slowest.max(g.done()?);
    }
    // Everything the generators did is in the ring; one drain tick later
    // stackprobe has read it.
    std::thread::sleep(Duration::from_millis(300));
    let wall = started.elapsed().as_secs_f64();
    let cpu = tracer.cpu_s()? - cpu0;
    let s = summary(&tracer.stop()?)?;
    let threads: u64 = s["roles"]
        .as_array()
        .map(|roles| {
            roles
                .iter()
                .filter_map(|r| r["thread"]["total"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    let drops = s["drops"].as_u64().unwrap_or(0);
    let expected = n * generators as u64;
    // With drops the count may fall short (that is what drops say); without,
    // it must be exact.
    ensure!(
        drops > 0 || threads == expected,
        "stackprobe counted {threads} threads, {expected} were created, no drops"
    );
    let events = s["events"]["total"].as_u64().unwrap_or(0);
    let wanted = rate.map(|r| n as f64 / r);
    Ok(Step {
        events_per_s: events as f64 / slowest.as_secs_f64(),
        events,
        drops,
        cpu_percent: 100.0 * cpu / wall,
        generator_bound: wanted.is_some_and(|w| slowest.as_secs_f64() > w * 1.1),
    })
}

pub fn run(scale: &Scale) -> Result<String> {
    let seconds = scale.pick(1.0, 4.0);
    // Events per thread, from a calibration run.
    let calibration = step(1, 2000, None)?;
    let per_thread = calibration.events as f64 / 2000.0;
    let mut md = format!(
        "\n## 3. Lossless event rate and stackprobe's CPU\n\n\
         Events: a watched loopback process creating threads that end at once ({per_thread:.1} \
         ring-buffer events per thread), paced to a target rate for {seconds} s, or as fast as \
         one or two generator processes go. stackprobe runs `watch --pid … --json`; its CPU is \
         user + system time over the run's wall time (100% = one core). Every run must count \
         every thread exactly unless it reports drops. Targets: lossless past 500k events/s; \
         ≤ 2% of a core at 10k events/s.\n\n\
         | target events/s | reached events/s | events | drops | stackprobe CPU (% of a core) |\n\
         |---|---:|---:|---:|---:|\n"
    );
    let targets: [(Option<f64>, usize, &str); 4] = [
        (Some(10_000.0), 1, "10k"),
        (Some(100_000.0), 1, "100k"),
        (None, 1, "max, 1 generator"),
        (None, 2, "max, 2 generators"),
    ];
    for (target, generators, label) in targets {
        let (n, rate) = match target {
            Some(events) => {
                let rate = events / per_thread;
                ((rate * seconds) as u64, Some(rate))
            }
            // About `seconds` at the calibration's pace.
            None => (
                (calibration.events_per_s / per_thread * seconds) as u64,
                None,
            ),
        };
        let s = step(generators, n.max(1000), rate)?;
        eprintln!(
            "capacity {label}: {:.0} events/s, drops {}, cpu {:.1}%",
            s.events_per_s, s.drops, s.cpu_percent
        );
        let _ = writeln!(
            md,
            "| {label} | {:.0}{} | {} | {} | {:.1} |",
            s.events_per_s,
            if s.generator_bound {
                " (generator-bound)"
            } else {
                ""
            },
            s.events,
            s.drops,
            s.cpu_percent
        );
    }
    md.push_str(
        "\n\"generator-bound\": thread creation on this machine could not go faster, so the \
         rate was limited by the load, not by stackprobe.\n",
    );
    Ok(md)
}

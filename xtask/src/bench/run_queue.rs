//! Section 6: what `watch --run-queue` adds on the lab, beside bpftrace's
//! script of section 2 and libbpf-tools' `runqlat -P` measuring run-queue
//! latency for every process. Interleaved round by round like section 2;
//! the question is whether stackprobe ÷ bpftrace total CPU per request
//! rises by more than 10 % with the flag (then it stays off by default).

use std::{collections::HashSet, fmt::Write as _, process::Command, time::Instant};

use anyhow::{Context as _, Result, ensure};

use super::{
    BpfStats,
    server::{STACKPROBE_ARGS, bpftrace_script},
    spread,
    tracer::{Tracer, cpu_s, program_ids, programs, summary},
};
use crate::lab::{self, LoadArgs, Page};

/// libbpf-tools, whose `runqlat` the section runs.
pub const PACKAGES: [&str; 1] = ["libbpf-tools"];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Config {
    Bpftrace,
    Stackprobe,
    StackprobeRunQueue,
    Runqlat,
}

const CONFIGS: [Config; 4] = [
    Config::Bpftrace,
    Config::Stackprobe,
    Config::StackprobeRunQueue,
    Config::Runqlat,
];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Bpftrace => "bpftrace (section 2's script)",
            Config::Stackprobe => "stackprobe watch",
            Config::StackprobeRunQueue => "stackprobe watch --run-queue",
            Config::Runqlat => "runqlat -P (libbpf-tools)",
        }
    }

    fn start(self, php: &str) -> Result<Tracer> {
        match self {
            Config::Bpftrace => Tracer::bpftrace(&bpftrace_script(php)),
            Config::Stackprobe => Tracer::stackprobe(&STACKPROBE_ARGS),
            Config::StackprobeRunQueue => {
                Tracer::stackprobe(&[&STACKPROBE_ARGS[..], &["--run-queue"]].concat())
            }
            // One histogram per process, printed only at the end. Its
            // stdout is a pipe here, which stdio would buffer whole: line
            // buffering lets its "Tracing" line say it attached (stdbuf
            // execs it, so the pid is runqlat's).
            Config::Runqlat => Tracer::command(
                {
                    let mut cmd = Command::new("stdbuf");
                    cmd.args(["-oL", "runqlat", "-P", "3600", "1"]);
                    cmd
                },
                "Tracing run queue latency",
            ),
        }
    }
}

/// One load under one configuration: requests, the tracer's BPF time and
/// its userspace CPU, and its programs' runs and run time by name.
#[derive(Default, Clone, Debug)]
struct Run {
    requests: u64,
    bpf_ns: u64,
    user_s: f64,
    programs: Vec<(String, u64, u64)>,
    /// Samples stackprobe could not record (its summary's `drops`).
    drops: u64,
}

impl Run {
    fn total_us_per_request(&self) -> f64 {
        (self.bpf_ns as f64 / 1e3 + self.user_s * 1e6) / self.requests.max(1) as f64
    }
}

fn measure(config: Config, load: &LoadArgs, php: &str) -> Result<Run> {
    let before: HashSet<u64> = program_ids()?;
    let tracer = config.start(php)?;
    let ours = |all: Vec<(u64, String, u64, u64)>| -> Vec<(u64, String, u64, u64)> {
        all.into_iter().filter(|p| !before.contains(&p.0)).collect()
    };
    let progs_before = ours(programs()?);
    let cpu_before = cpu_s(tracer.pid())?;
    let (url, _, wrk) = lab::wrk(load)?;
    let progs_after = ours(programs()?);
    let cpu_after = cpu_s(tracer.pid())?;
    wrk.ensure_clean(&format!("{url} under {}", config.name()))?;
    let drops = if matches!(config, Config::Stackprobe | Config::StackprobeRunQueue) {
        let summary = summary(&tracer.stop()?)?;
        let drops = summary["drops"]
            .as_u64()
            .context("a summary without drops")?;
        // The flag's drops are part of what it measures (its table shows
        // them); without it, any drop is a defect the bench stops on.
        ensure!(
            drops == 0 || config == Config::StackprobeRunQueue,
            "{} dropped events: {}",
            config.name(),
            summary["drops_by_cause"]
        );
        if drops > 0 {
            eprintln!(
                "run queue: {} dropped {drops} samples: {}",
                config.name(),
                summary["drops_by_cause"]
            );
        }
        drops
    } else {
        tracer.end()?;
        0
    };
    let mut run = Run {
        requests: wrk.requests,
        user_s: cpu_after - cpu_before,
        drops,
        ..Run::default()
    };
    for (id, name, runs, ns) in progs_after {
        let (runs0, ns0) = progs_before
            .iter()
            .find(|p| p.0 == id)
            .map_or((0, 0), |p| (p.2, p.3));
        run.bpf_ns += ns - ns0;
        // The socket iterator runs inside stackprobe's read(): its time is
        // in the tracer's system time already.
        if name == probes_common::sock::ITER_PROGRAM {
            run.user_s -= (ns - ns0) as f64 / 1e9;
        }
        run.programs.push((name, runs - runs0, ns - ns0));
    }
    Ok(run)
}

/// Rounds × seconds per load; the full bench's rounds span a socket walk.
pub struct Length {
    pub rounds: u32,
    pub seconds: u64,
}

pub fn run(length: &Length) -> Result<String> {
    let _stats = BpfStats::enable()?;
    let php = lab::php_fpm_comm()?;
    let mut md = format!(
        "\n## 6. Run-queue latency (`--run-queue`)\n\n\
         The lab under wrk (2 threads, 8 connections, no upstream keepalive), {} rounds × {} s, \
         interleaved: bpftrace's script of section 2, `stackprobe watch nginx php-fpm postgres` \
         without and with `--run-queue`, and libbpf-tools' `runqlat -P` (run-queue latency \
         per process for every process on the host, in the kernel; stackprobe's only for the \
         watched ones). Total CPU per request is the BPF programs' run time plus the tracer's \
         userspace, medians over the rounds. The flag is on by default only if it raises \
         stackprobe ÷ bpftrace by at most 10 % on both pages.\n\n\
         | page | configuration | total CPU µs/request | ÷ bpftrace | samples lost/request |\n\
         |---|---|---:|---:|---:|\n",
        length.rounds, length.seconds
    );
    let mut programs_md =
        String::from("\n| page | program | runs/request | ns/run |\n|---|---|---:|---:|\n");
    let mut verdict = String::new();
    for page in [Page::Static, Page::New] {
        let load = LoadArgs {
            page,
            keepalive: false,
            seconds: length.seconds,
            connections: 8,
        };
        lab::wrk(&LoadArgs { seconds: 1, ..load })?;
        let mut rounds: Vec<Vec<Run>> = Vec::new();
        for round in 1..=length.rounds {
            let started = Instant::now();
            let runs = CONFIGS
                .iter()
                .map(|&c| measure(c, &load, &php))
                .collect::<Result<Vec<_>>>()?;
            eprintln!(
                "run queue {page:?} round {round}: {} µs/request ({}), {:.0} s",
                runs.iter()
                    .map(|r| format!("{:.1}", r.total_us_per_request()))
                    .collect::<Vec<_>>()
                    .join(" / "),
                CONFIGS.map(Config::name).join(" / "),
                started.elapsed().as_secs_f64()
            );
            rounds.push(runs);
        }
        let median =
            |f: &dyn Fn(&[Run]) -> f64| spread(&rounds.iter().map(|r| f(r)).collect::<Vec<_>>()).0;
        let ratio = |c: Config| {
            move |r: &[Run]| {
                r[c as usize].total_us_per_request()
                    / r[Config::Bpftrace as usize].total_us_per_request()
            }
        };
        for c in CONFIGS {
            let total = median(&|r: &[Run]| r[c as usize].total_us_per_request());
            // The other tracers do not say what they miss.
            let lost = if matches!(c, Config::Stackprobe | Config::StackprobeRunQueue) {
                let lost = median(&|r: &[Run]| {
                    r[c as usize].drops as f64 / r[c as usize].requests.max(1) as f64
                });
                format!("{lost:.2}")
            } else {
                "not reported".to_string()
            };
            let _ = writeln!(
                md,
                "| {page:?} | {} | {total:.1} | {:.2} | {lost} |",
                c.name(),
                median(&ratio(c))
            );
        }
        let rise = median(&|r: &[Run]| {
            ratio(Config::StackprobeRunQueue)(r) / ratio(Config::Stackprobe)(r) - 1.0
        });
        let _ = write!(
            verdict,
            "{page:?}: `--run-queue` raises stackprobe ÷ bpftrace by {:.0} % (median of the rounds' own ratios). ",
            rise * 100.0
        );
        // Per program: stackprobe's run-queue programs and runqlat's.
        for (c, keep) in [(Config::StackprobeRunQueue, "runq_"), (Config::Runqlat, "")] {
            let names: Vec<String> = rounds[0][c as usize]
                .programs
                .iter()
                .map(|p| p.0.clone())
                .filter(|n| n.starts_with(keep))
                .collect();
            for name in names {
                let of = |r: &[Run]| {
                    let run = &r[c as usize];
                    let p = run.programs.iter().find(|p| p.0 == name);
                    p.map_or((0.0, 0.0), |p| {
                        (
                            p.1 as f64 / run.requests.max(1) as f64,
                            p.2 as f64 / p.1.max(1) as f64,
                        )
                    })
                };
                let _ = writeln!(
                    programs_md,
                    "| {page:?} | {} `{name}` | {:.1} | {:.0} |",
                    if c == Config::Runqlat {
                        "runqlat"
                    } else {
                        "stackprobe"
                    },
                    median(&|r: &[Run]| of(r).0),
                    median(&|r: &[Run]| of(r).1),
                );
            }
        }
    }
    md.push_str(&programs_md);
    md.push('\n');
    md.push_str(verdict.trim_end());
    md.push('\n');
    Ok(md)
}

/// `cargo xtask bench run-queue`: the lab up, this section, the lab down.
pub fn standalone(length: &Length) -> Result<()> {
    super::prepare()?;
    crate::setup::apt_packages(&PACKAGES)?;
    let result = lab::up().and_then(|()| run(length));
    let down = lab::down();
    let md = result?;
    down?;
    print!("{md}");
    Ok(())
}

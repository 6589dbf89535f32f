//! Sections 2 and 5: the lab's requests/s with nothing attached, under
//! stackprobe, and under bpftrace measuring the same things, interleaved
//! round by round; and what each tracer spends per request (BPF programs plus
//! its own userspace CPU).

use std::fmt::Write as _;

use anyhow::{Result, ensure};

use super::{
    BpfStats, Scale, spread,
    tracer::{Tracer, new_program_runs, program_ids, summary},
};
use crate::lab::{self, LoadArgs, Page};

#[derive(Clone, Copy, PartialEq)]
enum Config {
    None,
    Stackprobe,
    Bpftrace,
}

const CONFIGS: [Config; 3] = [Config::None, Config::Stackprobe, Config::Bpftrace];

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::None => "nothing attached",
            Config::Stackprobe => "stackprobe",
            Config::Bpftrace => "bpftrace",
        }
    }
}

/// One wrk run under one configuration.
#[derive(Default, Clone, Copy)]
struct Run {
    per_s: f64,
    requests: u64,
    /// BPF program runs and their run time (ns) during the load.
    bpf_runs: u64,
    bpf_ns: u64,
    /// The tracer's own CPU during the load, in seconds.
    user_cpu_s: f64,
    /// Events stackprobe lost (ring buffer full).
    drops: u64,
}

/// bpftrace measuring what stackprobe measures on the lab: accept and clone
/// latency per process name, TCP state transitions, postgres exits.
fn bpftrace_script(php: &str) -> String {
    let names = format!("comm == \"nginx\" || comm == \"{php}\" || comm == \"postgres\"");
    format!(
        "tracepoint:syscalls:sys_enter_accept, tracepoint:syscalls:sys_enter_accept4 /{names}/ {{ @a[tid] = nsecs; }}
tracepoint:syscalls:sys_exit_accept, tracepoint:syscalls:sys_exit_accept4 /@a[tid]/ {{ if (args->ret >= 0) {{ @accept_ns[comm] = hist(nsecs - @a[tid]); }} delete(@a[tid]); }}
tracepoint:syscalls:sys_enter_clone, tracepoint:syscalls:sys_enter_clone3, tracepoint:syscalls:sys_enter_fork, tracepoint:syscalls:sys_enter_vfork /{names}/ {{ @c[tid] = nsecs; }}
tracepoint:syscalls:sys_exit_clone, tracepoint:syscalls:sys_exit_clone3, tracepoint:syscalls:sys_exit_fork, tracepoint:syscalls:sys_exit_vfork /@c[tid]/ {{ if (args->ret > 0) {{ @clone_ns[comm] = hist(nsecs - @c[tid]); }} delete(@c[tid]); }}
tracepoint:sock:inet_sock_set_state /args->protocol == 6/ {{ @states[args->oldstate, args->newstate] = count(); }}
tracepoint:sched:sched_process_exit /comm == \"postgres\"/ {{ @exits = count(); }}"
    )
}

fn measure(config: Config, load: &LoadArgs, script: &str) -> Result<Run> {
    let before = program_ids()?;
    let tracer = match config {
        Config::None => None,
        Config::Stackprobe => Some(Tracer::stackprobe(&[
            "watch", "nginx", "php-fpm", "postgres", "--no-tui", "--json",
        ])?),
        Config::Bpftrace => Some(Tracer::bpftrace(script)?),
    };
    let cpu_before = tracer
        .as_ref()
        .map(Tracer::cpu_s)
        .transpose()?
        .unwrap_or(0.0);
    let runs_before = new_program_runs(&before)?;
    let (url, _, wrk) = lab::wrk(load)?;
    let runs_after = new_program_runs(&before)?;
    let cpu_after = tracer
        .as_ref()
        .map(Tracer::cpu_s)
        .transpose()?
        .unwrap_or(0.0);
    ensure!(
        wrk.non_2xx == 0 && wrk.socket_errors == 0,
        "{url} under {}: {} error responses, {} socket errors",
        config.name(),
        wrk.non_2xx,
        wrk.socket_errors
    );
    // Drops are a result here (the server and wrk compete with the tracer
    // for two cores), reported beside the throughput.
    let mut drops = 0;
    if let Some(tracer) = tracer {
        let lines = tracer.stop()?;
        if config == Config::Stackprobe {
            drops = summary(&lines)?["drops"].as_u64().unwrap_or(0);
        }
    }
    Ok(Run {
        per_s: wrk.per_s,
        requests: wrk.requests,
        bpf_runs: runs_after.0 - runs_before.0,
        bpf_ns: runs_after.1 - runs_before.1,
        user_cpu_s: cpu_after - cpu_before,
        drops,
    })
}

pub fn run(scale: &Scale) -> Result<String> {
    let _stats = BpfStats::enable()?;
    let script = bpftrace_script(&lab::php_fpm_comm()?);
    let rounds = scale.pick(1, 3);
    let seconds = scale.pick(2, 5);
    let pages = [
        (
            Page::Static,
            "static page through the frontend without upstream keepalive (a backend connection per request)",
        ),
        (
            Page::New,
            "PHP page opening a new postgres connection per request (a postgres fork per request)",
        ),
    ];
    let mut md2 = String::from(
        "\n## 2. Cost to the watched server\n\n\
         The lab (`cargo xtask lab up`: nginx → nginx → php-fpm → postgres) under wrk \
         (2 threads, 8 connections), with nothing attached, under `stackprobe watch nginx php-fpm \
         postgres`, and under a bpftrace script measuring the same things (accept and clone \
         latency histograms per process name, TCP state transitions, postgres exits), interleaved \
         round by round. BPF run-time statistics are on in every run (≈ 20 ns per program run, for \
         both tools alike). Target: stackprobe ≤ 1% throughput loss and below bpftrace's.\n\n",
    );
    let mut md5 = String::from(
        "\n## 5. Total CPU per request and per probe run\n\n\
         During the runs of section 2: the BPF programs' run time (from the kernel's run-time \
         statistics) plus the tracer's own user + system CPU during the load (from /proc; \
         bpftrace's start-up compile is not counted), divided by the requests served and by \
         the probe runs. Medians over the rounds.\n\n\
         | load | tracer | probe runs/request | BPF ns/request | userspace ns/request | total ns/request | total ns/probe run |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for (page, what) in pages {
        let load = LoadArgs {
            page,
            keepalive: false,
            seconds,
            connections: 8,
        };
        // Warm up: php-fpm workers, postgres caches, TIME_WAIT steady state.
        lab::wrk(&LoadArgs { seconds: 1, ..load })?;
        let mut runs: Vec<[Run; 3]> = Vec::new();
        for round in 1..=rounds {
            let mut this = [Run::default(); 3];
            for (i, config) in CONFIGS.into_iter().enumerate() {
                this[i] = measure(config, &load, &script)?;
            }
            eprintln!(
                "server {page:?} round {round}: {:.0} / {:.0} / {:.0} requests/s",
                this[0].per_s, this[1].per_s, this[2].per_s
            );
            runs.push(this);
        }
        let _ = writeln!(
            md2,
            "**{what}** ({rounds} rounds × {seconds} s)\n\n\
             | configuration | requests/s median [min–max] | vs nothing attached, per round: median [min–max] | events dropped |\n|---|---:|---:|---:|"
        );
        for (i, config) in CONFIGS.into_iter().enumerate() {
            let (med, lo, hi) = spread(&runs.iter().map(|r| r[i].per_s).collect::<Vec<_>>());
            let ratio = if i == 0 {
                "1".to_string()
            } else {
                let (m, l, h) = spread(
                    &runs
                        .iter()
                        .map(|r| r[i].per_s / r[0].per_s)
                        .collect::<Vec<_>>(),
                );
                format!("{m:.3} [{l:.3}–{h:.3}]")
            };
            let drops = if config == Config::Stackprobe {
                runs.iter().map(|r| r[i].drops).sum::<u64>().to_string()
            } else {
                "-".to_string()
            };
            let _ = writeln!(
                md2,
                "| {} | {med:.0} [{lo:.0}–{hi:.0}] | {ratio} | {drops} |",
                config.name()
            );
        }
        md2.push('\n');
        for (i, config) in CONFIGS.into_iter().enumerate().skip(1) {
            let per = |f: &dyn Fn(&Run) -> f64| {
                spread(&runs.iter().map(|r| f(&r[i])).collect::<Vec<_>>()).0
            };
            let req = |r: &Run| r.requests.max(1) as f64;
            let bpf = per(&|r| r.bpf_ns as f64 / req(r));
            let user = per(&|r| r.user_cpu_s * 1e9 / req(r));
            let total = per(&|r| (r.bpf_ns as f64 + r.user_cpu_s * 1e9) / req(r));
            let per_run =
                per(&|r| (r.bpf_ns as f64 + r.user_cpu_s * 1e9) / r.bpf_runs.max(1) as f64);
            let runs_per_req = per(&|r| r.bpf_runs as f64 / req(r));
            let _ = writeln!(
                md5,
                "| {page:?} | {} | {runs_per_req:.1} | {bpf:.0} | {user:.0} | {total:.0} | {per_run:.0} |",
                config.name()
            );
        }
    }
    Ok(md2 + &md5)
}

//! Sections 2 and 5: the lab's requests/s with nothing attached, with empty
//! programs on stackprobe's hooks (the floor), under bpftrace measuring the
//! same things as stackprobe, under stackprobe's `watch` and under its
//! `agent` (the service), interleaved round by round; and what each spends
//! per request (BPF programs plus its own userspace CPU).

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};

use super::{
    BpfStats, Scale, floor,
    server_report::{self, CONFIGS, Config, Page, Round, Run},
    tracer::{Tracer, new_programs, program_hooks, program_ids, program_runs, summary},
};
use crate::lab::{self, LoadArgs, Page as LabPage};

pub(super) const STACKPROBE_ARGS: [&str; 6] = [
    "watch", "nginx", "php-fpm", "postgres", "--no-tui", "--json",
];

/// stackprobe as its service runs it (dist/systemd's defaults: metrics
/// brought up to date every 15 s), on a port of the bench's choosing.
const AGENT_ARGS: [&str; 4] = ["agent", "nginx", "php-fpm", "postgres"];

/// A loopback port no one listens on now, for the agent's metrics.
fn free_loopback_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The agent's `stackprobe_dropped_events_total`, as of its last update.
fn scraped_drops(port: u16) -> Result<u64> {
    lab::http_get(port, "/metrics")?
        .lines()
        .find_map(|l| l.strip_prefix("stackprobe_dropped_events_total "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no stackprobe_dropped_events_total at 127.0.0.1:{port}/metrics"))
}

/// bpftrace measuring what stackprobe measures on the lab: accept, clone
/// and connect latency per process name (connect: the syscall, as
/// stackprobe times a unix one), TCP handshakes of connects (SYN_SENT →
/// ESTABLISHED, as stackprobe times a TCP one), TCP state transitions,
/// postgres exits.
pub(super) fn bpftrace_script(php: &str) -> String {
    let names = format!("comm == \"nginx\" || comm == \"{php}\" || comm == \"postgres\"");
    format!(
        "tracepoint:syscalls:sys_enter_accept, tracepoint:syscalls:sys_enter_accept4 /{names}/ {{ @a[tid] = nsecs; }}
tracepoint:syscalls:sys_exit_accept, tracepoint:syscalls:sys_exit_accept4 /@a[tid]/ {{ if (args->ret >= 0) {{ @accept_ns[comm] = hist(nsecs - @a[tid]); }} delete(@a[tid]); }}
tracepoint:syscalls:sys_enter_clone, tracepoint:syscalls:sys_enter_clone3, tracepoint:syscalls:sys_enter_fork, tracepoint:syscalls:sys_enter_vfork /{names}/ {{ @c[tid] = nsecs; }}
tracepoint:syscalls:sys_exit_clone, tracepoint:syscalls:sys_exit_clone3, tracepoint:syscalls:sys_exit_fork, tracepoint:syscalls:sys_exit_vfork /@c[tid]/ {{ if (args->ret > 0) {{ @clone_ns[comm] = hist(nsecs - @c[tid]); }} delete(@c[tid]); }}
tracepoint:syscalls:sys_enter_connect /{names}/ {{ @k[tid] = nsecs; }}
tracepoint:syscalls:sys_exit_connect /@k[tid]/ {{ @connect_ns[comm] = hist(nsecs - @k[tid]); delete(@k[tid]); }}
tracepoint:sock:inet_sock_set_state /args->protocol == 6/ {{ $sk = args->skaddr; @states[args->oldstate, args->newstate] = count(); if (args->newstate == 2) {{ @syn[$sk] = nsecs; }} if (args->oldstate == 2) {{ if (args->newstate == 1) {{ @handshake_ns = hist(nsecs - @syn[$sk]); }} delete(@syn[$sk]); }} }}
tracepoint:sched:sched_process_exit /comm == \"postgres\"/ {{ @exits = count(); }}"
    )
}

/// The bpftrace scripts of the floor and of bpftrace, and the floor's hooks
/// (each stackprobe run must attach the same).
struct Scripts {
    floor_hooks: Vec<&'static str>,
    floor: String,
    bpftrace: String,
}

/// The tracer of `config` started (none for nothing attached), and the
/// agent's metrics port.
fn start(config: Config, scripts: &Scripts) -> Result<(Option<Tracer>, Option<u16>)> {
    let metrics = (config == Config::Agent)
        .then(free_loopback_port)
        .transpose()?;
    let tracer = match config {
        Config::None => None,
        Config::Floor => Some(Tracer::bpftrace(&scripts.floor)?),
        Config::Bpftrace => Some(Tracer::bpftrace(&scripts.bpftrace)?),
        Config::Stackprobe => Some(Tracer::stackprobe(&STACKPROBE_ARGS)?),
        Config::Agent => {
            let port = metrics.context("the agent's metrics port")?;
            let listen = format!("127.0.0.1:{port}");
            Some(Tracer::stackprobe(
                &[&AGENT_ARGS[..], &["--listen", &listen]].concat(),
            )?)
        }
    };
    Ok((tracer, metrics))
}

fn measure(config: Config, load: &LoadArgs, scripts: &Scripts) -> Result<Run> {
    let before = program_ids()?;
    let (tracer, metrics) = start(config, scripts)?;
    let cpu = || tracer.as_ref().map(Tracer::cpu_s).transpose();
    let cpu_before = cpu()?.unwrap_or(0.0);
    let started = Instant::now();
    let runs_before = new_programs(&before)?;
    let (url, _, wrk) = lab::wrk(load)?;
    let runs_after = new_programs(&before)?;
    let cpu_after = cpu()?.unwrap_or(0.0);
    let wall_s = started.elapsed().as_secs_f64();
    // While the tracer is still attached.
    let hooks = program_hooks(tracer.as_ref().map(Tracer::pid))?;
    let programs = program_runs(&runs_before, &runs_after, &hooks);
    // The iterator runs inside the tracer's read(): its time is in the
    // tracer's system time too.
    let in_tracer_ns: u64 = programs
        .iter()
        .filter(|p| p.name == probes_common::sock::ITER_PROGRAM)
        .map(|p| p.ns)
        .sum();
    wrk.ensure_clean(&format!("{url} under {}", config.name()))?;
    // Drops are a result here (the server and wrk compete with the tracer
    // for two cores), reported beside the throughput.
    let mut drops = 0;
    let mut rss_kib = 0;
    if let Some(tracer) = tracer {
        if matches!(config, Config::Stackprobe | Config::Agent) {
            rss_kib = tracer.rss_kib()?.0;
        }
        if let Some(port) = metrics {
            drops = scraped_drops(port)?;
            tracer.end()?;
        } else if config != Config::Stackprobe {
            tracer.end()?;
        } else {
            let lines = tracer.stop()?;
            let summary = summary(&lines)?;
            ensure!(
                floor::hooks(&summary)? == scripts.floor_hooks,
                "stackprobe took other hooks than the floor's: {}",
                summary["hooks"]
            );
            drops = summary["drops"].as_u64().unwrap_or(0);
        }
    }
    Ok(Run {
        per_s: wrk.per_s,
        requests: wrk.requests,
        wall_s,
        bpf_runs: programs.iter().map(|p| p.runs).sum(),
        bpf_ns: programs.iter().map(|p| p.ns).sum(),
        // The iterator's run time is counted once, as BPF time.
        user_cpu_s: (cpu_after - cpu_before) - in_tracer_ns as f64 / 1e9,
        drops,
        rss_kib,
        programs,
    })
}

/// What sections 2 and 5 run.
pub struct Options {
    pub rounds: u32,
    /// Seconds of load per configuration and round.
    pub seconds: u64,
    pub pages: Vec<LabPage>,
    /// wrk's connections: every page is loaded at each.
    pub connections: Vec<u32>,
    /// Whether to measure each tracer on the idle lab first.
    pub idle: bool,
}

impl Options {
    /// The whole benchmark's: both pages at 8 and at 32 connections.
    pub fn of(scale: &Scale) -> Self {
        Self {
            rounds: scale.pick(1, 3),
            // A round spans one of stackprobe's TIME_WAIT walks, which come
            // every 30 s at the lab's socket counts: shorter rounds would
            // leave their cost out.
            seconds: scale.pick(2, 31),
            pages: vec![LabPage::Static, LabPage::New],
            connections: vec![8, 32],
            idle: true,
        }
    }
}

fn page_title(page: LabPage) -> &'static str {
    match page {
        LabPage::Static => {
            "static page through the frontend without upstream keepalive (a backend connection per request)"
        }
        LabPage::New => {
            "PHP page opening a new postgres connection per request (a postgres fork per request)"
        }
        LabPage::Persistent => "PHP page on a persistent postgres connection",
        LabPage::Unix => "PHP page querying postgres over its unix socket",
    }
}

pub fn run(scale: &Scale) -> Result<String> {
    run_with(&Options::of(scale), scale)
}

pub fn run_with(options: &Options, scale: &Scale) -> Result<String> {
    let _stats = BpfStats::enable()?;
    let floor_hooks = floor::discover(&STACKPROBE_ARGS)?;
    let scripts = Scripts {
        floor: floor::script(&floor_hooks),
        bpftrace: bpftrace_script(&lab::php_fpm_comm()?),
        floor_hooks,
    };
    // Before any load: a load's TIME_WAIT sockets take a minute to go, and
    // while they do stackprobe walks them.
    let idle = if options.idle {
        idle(scale, &scripts)?
    } else {
        String::new()
    };
    let Options {
        rounds, seconds, ..
    } = *options;
    let connections = options
        .connections
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" and ");
    let mut md2 = format!(
        "\n## 2. Cost to the watched server\n\n\
         The lab (`cargo xtask lab up`: nginx → nginx → php-fpm → postgres) under wrk \
         (2 threads; {} connections), interleaved round by round: with nothing attached; with the \
         floor; under a bpftrace script measuring the same things as stackprobe (accept, clone and \
         connect latency histograms per process name, TCP connects' handshake latency, TCP state \
         transitions, postgres exits); under \
         `stackprobe watch nginx php-fpm postgres` (a report each second); and under \
         `stackprobe agent nginx php-fpm postgres`, as the service runs it (Prometheus metrics \
         brought up to date every 15 s; its drops as of its last update). The targets are \
         `watch`'s.\n\n\
         The floor is bpftrace running an empty program on each hook stackprobe attached on this \
         kernel (its report's hooks, checked against the perf-event links the kernel \
         lists for its process): {}. It is what these hooks cost this kernel whatever a tracer does in them, \
         which no tracer on them can beat: a program run per event and, for the syscall \
         tracepoints, more, since enabling any syscall tracepoint sends every syscall of every \
         task through the kernel's slow syscall path, traced or not.\n\n\
         Per request: the BPF programs' run time (from the kernel's run-time statistics, on in \
         every run, ≈ 20 ns per program run for every configuration alike), the tracer's own user \
         + system CPU during the load (from /proc; bpftrace's start-up compile is not counted; \
         stackprobe's socket iterator runs inside its read() and is counted once, as BPF time; a \
         round is long enough to hold one of its walks, spaced 30 s apart here), \
         and their sum; medians over the rounds. Targets for stackprobe: total CPU per request \
         ≤ bpftrace's; its userspace ≤ 1 % of a core under the static load; throughput within 2 \
         points of the floor's (points: hundredths of the throughput with nothing attached, per \
         round); its resident memory under 20 MB at the end of each round's load (VmRSS, which \
         includes the ring buffer's pages the kernel maps into it).\n\n",
        connections,
        scripts
            .floor_hooks
            .iter()
            .map(|h| format!("`{h}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut md5 = String::from(
        "\n## 5. Total CPU per probe run\n\n\
         During the runs of section 2 (whose tables give the totals per request): the probe runs \
         per request, and the BPF programs' run time and the total (BPF + the tracer's \
         userspace) divided by the probe runs. Medians over the rounds.\n\n\
         | load | configuration | probe runs/request | BPF ns/probe run | total ns/probe run |\n\
         |---|---|---:|---:|---:|\n",
    );
    let mut breakdown = String::from(BREAKDOWN_INTRO);
    for &connections in &options.connections {
        for &page in &options.pages {
            let load = LoadArgs {
                page,
                keepalive: false,
                seconds,
                connections,
            };
            // Warm up: php-fpm workers, postgres caches, TIME_WAIT steady
            // state.
            lab::wrk(&LoadArgs { seconds: 1, ..load })?;
            let mut runs: Vec<Round> = Vec::new();
            for round in 1..=rounds {
                let mut this = Round::default();
                for config in CONFIGS {
                    this.0[config as usize] = measure(config, &load, &scripts)?;
                }
                let per_s: Vec<String> = this.0.iter().map(|r| format!("{:.0}", r.per_s)).collect();
                eprintln!(
                    "server {page:?} {connections} connections round {round}: {} requests/s ({})",
                    per_s.join(" / "),
                    CONFIGS.map(Config::name).join(" / ")
                );
                runs.push(this);
            }
            let title = format!("{}, {connections} connections", page_title(page));
            md2.push_str(&server_report::page_table(&Page {
                title: &title,
                seconds,
                cpu_target: page == LabPage::Static,
                rounds: &runs,
            }));
            md5.push_str(&server_report::per_run_rows(
                &format!("{page:?}, {connections} connections"),
                &runs,
            ));
            breakdown.push_str(&server_report::breakdown_table(&title, &runs));
        }
    }
    md2.push_str(&idle);
    md2.push_str(&breakdown);
    Ok(md2 + &md5)
}

const BREAKDOWN_INTRO: &str = "\n### Per BPF program\n\n\
     Where the BPF ns/request of the tables above go, program by program, from the same \
     readings: for each group of hooks (the hooks the kernel lists for each program, from \
     `bpftool perf show` and the fdinfo of the tracer's BPF links; stackprobe's socket iterator, \
     linked only while it walks, is `iter:tcp`; hooks one program shares are one group), each \
     stackprobe program on it (`watch`) with its runs per request, ns per run and ns per request, \
     beside the floor's and bpftrace's programs on the same hooks (summed over their programs \
     there). Tracepoints are named without their category; stackprobe's tp_btf programs are \
     set beside the classic tracepoint of the same event, which the floor and bpftrace attach in \
     their place (a few ns dearer per run). Rows by stackprobe's ns/request, largest first. \
     Every cell is a median over the rounds (ns/run over the rounds with runs), so the rows need \
     not add up to the total row, whose cells are medians of each round's sum over all the \
     tracer's programs: the BPF ns/request of the tables above.\n\n";

/// TIME_WAIT sockets in this network namespace (/proc/net/sockstat's
/// `tw`).
fn time_wait_sockets() -> Result<u64> {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat")?;
    sockstat
        .lines()
        .find_map(|l| l.strip_prefix("TCP: "))
        .and_then(|l| {
            l.split_whitespace()
                .skip_while(|&w| w != "tw")
                .nth(1)?
                .parse()
                .ok()
        })
        .context("no TCP tw count in /proc/net/sockstat")
}

/// What each tracer costs while the lab is up and idle: what leaving it
/// running costs a machine with nothing to find.
fn idle(scale: &Scale, scripts: &Scripts) -> Result<String> {
    let seconds = scale.pick(3, 30);
    // At rest: the TIME_WAIT sockets of section 1's loopback loads gone
    // (they live 60 s), which a walk would otherwise still find.
    let deadline = Instant::now() + Duration::from_secs(75);
    while time_wait_sockets()? > 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
    }
    let mut md = format!(
        "\n**Idle**: the lab up with no load (measured before the loads above, once at most \
         100 TIME_WAIT sockets are left on the machine: a walk would count them all), each tracer for {seconds} s after it has \
         settled (3 s); its CPU from the scheduler's count (/proc/PID/task/*/schedstat, in ns), which \
         includes its socket iterator's time.\n\n\
         | configuration | CPU ms per second |\n|---|---:|\n"
    );
    for config in [Config::Bpftrace, Config::Stackprobe, Config::Agent] {
        let (tracer, _) = start(config, scripts)?;
        let tracer = tracer.context("a tracer")?;
        std::thread::sleep(Duration::from_secs(3));
        let before = tracer.exact_cpu_s()?;
        std::thread::sleep(Duration::from_secs(seconds));
        let ms_per_s = (tracer.exact_cpu_s()? - before) * 1e3 / seconds as f64;
        tracer.end()?;
        eprintln!("server idle: {} {ms_per_s:.2} ms/s", config.name());
        let _ = writeln!(md, "| {} | {ms_per_s:.2} |", config.name());
    }
    Ok(md)
}

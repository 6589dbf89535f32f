//! Command-line interface.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "stackprobe",
    // The crate version and the commit (cli/build.rs).
    version = env!("STACKPROBE_VERSION"),
    about = "eBPF latency profiler for nginx / php-fpm / postgres stacks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach the probes and report per watched process, each interval and at exit.
    Watch(WatchArgs),
    /// Run headless for days, serving Prometheus metrics (`watch` with no
    /// dashboard and no reports; logs to stderr, the journal under systemd).
    Agent(AgentArgs),
    /// Percentiles and histograms from a recording made with `watch --record`.
    Report(ReportArgs),
    /// Two recordings side by side: rates and percentiles before and after.
    Diff(DiffArgs),
    /// Check that this machine can run `watch` (privileges, lockdown, BTF,
    /// tracefs, every hook tried for real), with the fix for what fails.
    Doctor,
    /// See stackprobe work on two built-in servers, nothing to install (root).
    ///
    /// Starts two loopback servers, one forking a process per connection (like
    /// postgres without a pooler) and one handing connections to threads
    /// started in advance (like a pooler), gives both the same load and
    /// watches them: the dashboard on a terminal, text or JSON otherwise.
    Demo(DemoArgs),
    /// One of `demo`'s servers, in its own process so it can be watched by pid.
    #[command(hide = true)]
    DemoServer(DemoServerArgs),
    /// Print the completion script for bash, zsh or fish to stdout.
    ///
    /// The Debian package installs all three. Otherwise, for one user:
    /// `stackprobe completions bash > ~/.local/share/bash-completion/completions/stackprobe`,
    /// `stackprobe completions fish > ~/.config/fish/completions/stackprobe.fish`,
    /// or for zsh into a directory of $fpath as `_stackprobe`.
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write the man pages, stackprobe.1 and one per subcommand, into DIR
    /// (`cargo xtask dist` packs them).
    #[command(hide = true)]
    Manpages { dir: std::path::PathBuf },
}

/// The shells `stackprobe completions` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long the demo runs; the load stops one interval before the end,
    /// so the last report and the summary hold every connection.
    #[arg(long, default_value = "20s", value_parser = parse_demo_duration)]
    pub duration: Duration,

    /// New connections per second to each server.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rate: u32,

    #[command(flatten)]
    pub output: Output,
}

/// How `watch` (and `demo`) report: every interval, as the dashboard, text
/// or JSON.
#[derive(Clone, Copy, Debug, Args)]
pub struct Output {
    /// Report every interval.
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    pub interval: Duration,

    /// Print one JSON object per report instead of text.
    #[arg(long)]
    pub json: bool,

    /// Plain text reports even on a terminal (the default when stdout is
    /// not a terminal); without it a terminal gets the live dashboard.
    #[arg(long)]
    pub no_tui: bool,
}

#[derive(Debug, Args)]
pub struct DemoServerArgs {
    #[arg(value_enum)]
    pub kind: DemoServerKind,
    /// The stackprobe process that started it: the server ends with it.
    #[arg(long)]
    pub parent: u32,
    /// Ends after this long whatever happens.
    #[arg(long)]
    pub max_seconds: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoServerKind {
    Forking,
    Pooled,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    pub before: std::path::PathBuf,
    pub after: std::path::PathBuf,
    /// Only roles whose name contains this.
    #[arg(long)]
    pub role: Option<String>,
    /// Only this metric.
    #[arg(long, value_parser = metrics())]
    pub metric: Option<String>,
    /// One JSON object per role and metric instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compare per process name, merging its roles (a server that forks in
    /// one run and not in the other has different roles).
    #[arg(long)]
    pub by_process: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The recording (an HdrHistogram interval log).
    pub file: std::path::PathBuf,
    /// Only roles whose name contains this.
    #[arg(long)]
    pub role: Option<String>,
    /// Only this metric.
    #[arg(long, value_parser = metrics())]
    pub metric: Option<String>,
    /// Only intervals starting at or after this offset into the recording (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    pub from: Option<Duration>,
    /// Only intervals starting before this offset.
    #[arg(long, value_parser = parse_duration)]
    pub to: Option<Duration>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
    /// Also draw the distribution by percentile and p99 over time into this
    /// SVG or PNG file (chosen by the extension).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub plot: Option<std::path::PathBuf>,
    /// Overwrite an existing --plot file (never written through a symlink).
    #[arg(long)]
    pub force: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Text,
    Json,
    Csv,
}

/// Which processes to watch (at least one of them).
#[derive(Debug, Args, Default)]
pub struct Selection {
    /// Process names to watch: a process's comm or its executable's basename
    /// (a trailing version is ignored: `php-fpm` finds `php-fpm8.2`).
    /// Processes that start later, and children of watched processes, are watched too.
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,

    /// Watch this process (tgid) and its children; repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Watch everything in this running container (Docker, Podman,
    /// containerd, CRI-O; by name, or id or id prefix), including what
    /// starts there later; repeatable.
    #[arg(long = "container", value_name = "NAME|ID")]
    pub containers: Vec<String>,

    /// Watch everything in this cgroup v2 and below it (a path from the
    /// hierarchy's root, as /proc/PID/cgroup shows it, or a directory under
    /// its mount), including what starts there later; repeatable.
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub select: Selection,

    /// Stop after this long (e.g. 10s, 2m); default: until Ctrl-C.
    #[arg(long, value_parser = parse_run_duration)]
    pub duration: Option<Duration>,

    #[command(flatten)]
    pub output: Output,

    /// Serve Prometheus / OpenMetrics metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9464; port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,

    /// Guard the --listen endpoint as this web config file says (the format
    /// Prometheus exporters share): TLS with its certificate and key, and
    /// basic authentication against bcrypt hashes (docs/metrics.md).
    #[arg(long = "web.config.file", value_name = "PATH", requires = "listen")]
    pub web_config: Option<std::path::PathBuf>,

    /// Record every interval's histograms (per role and metric) to this file,
    /// as an HdrHistogram interval log; read it with `stackprobe report`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<std::path::PathBuf>,

    /// Overwrite an existing --record file (never written through a symlink).
    #[arg(long)]
    pub force: bool,

    /// Report each kernel program's run count and ns per run (turns on the
    /// kernel's BPF run-time statistics, which add ~20 ns to every BPF run).
    #[arg(long)]
    pub probe_cost: bool,

    /// Measure fork latency with this hook instead of the best this kernel
    /// offers (fentry, then kprobe, then tracepoint); fails if it cannot
    /// attach. `stackprobe doctor` shows which ones work.
    #[arg(long, value_enum, value_name = "HOOK")]
    pub fork_hook: Option<stackprobe_probes::rungs::ForkRung>,

    /// Find accepted sockets (for the accept-queue wait) with this hook
    /// instead of the best this kernel offers (fexit, then kretprobe, then
    /// the fd walk); fails if it cannot attach.
    #[arg(long, value_enum, value_name = "HOOK")]
    pub queue_hook: Option<stackprobe_probes::rungs::QueueRung>,

    /// Start a unix connection's queue wait with this hook instead of the
    /// best this kernel offers (fentry: the enqueue itself; then syscalls:
    /// the connect's start; data-ready, the enqueue from 6.3, only when
    /// asked for: it runs on every message); fails if it cannot attach.
    #[arg(long, value_enum, value_name = "HOOK")]
    pub unix_queue_hook: Option<stackprobe_probes::rungs::UnixQueueRung>,

    /// Also time how long servers hold unix connections and count their
    /// busy workers (a php-fpm pool on a unix socket) on a kernel without
    /// fentry, as TCP ones always are (with fentry they are, at one run per
    /// unix socket released). Off by default: without fentry it runs a
    /// probe on every close(2) on the host, which on a php-fpm stack costs
    /// more than the rest of stackprobe's probes together (BENCHMARKS.md).
    #[arg(long)]
    pub unix_service_time: bool,

    /// See unix connections' ends with this hook instead of the best this
    /// kernel offers (fentry on unix_release; close: the close and exit
    /// probes); fails if it cannot attach.
    #[arg(long, value_enum, value_name = "HOOK")]
    pub unix_service_hook: Option<stackprobe_probes::rungs::UnixServiceRung>,

    /// Also measure how long watched threads wait for a CPU (run-queue
    /// latency), their time on it and how often they are preempted. Off by
    /// default: it runs a program on every context switch and wakeup on the
    /// host, which raised stackprobe's CPU per request by 25-60 % on the
    /// lab's pages (BENCHMARKS.md, section 6).
    #[arg(long)]
    pub run_queue: bool,

    /// Print what the kernel probes log about what only the kernel sees
    /// (slot collisions, full maps, the listeners connections are
    /// attributed to) to stderr, at debug level; RUST_LOG filters it (e.g.
    /// RUST_LOG=probes::sock=debug). Best with --no-tui or --json.
    #[arg(long)]
    pub log_probes: bool,

    /// No reports on stdout, no dashboard: `stackprobe agent`.
    #[arg(skip)]
    pub headless: bool,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    #[command(flatten)]
    pub select: Selection,

    /// Serve Prometheus / OpenMetrics metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub listen: std::net::SocketAddr,

    /// Serve them over TLS, to the users it names, as this web config file
    /// says (the format Prometheus exporters share; docs/metrics.md).
    #[arg(long = "web.config.file", value_name = "PATH")]
    pub web_config: Option<std::path::PathBuf>,

    /// How often the metrics are brought up to date (as often as
    /// Prometheus scrapes is enough).
    #[arg(long, default_value = "15s", value_parser = parse_positive_duration)]
    pub interval: Duration,

    /// Serve each kernel program's runs and run time too (turns on the
    /// kernel's BPF run-time statistics, which add ~20 ns to every BPF run).
    #[arg(long)]
    pub probe_cost: bool,

    /// Also serve run-queue latency, on-CPU time and preemptions (see
    /// `watch --run-queue`: off by default for its cost, 25-60 % more CPU
    /// per request on the lab's pages).
    #[arg(long)]
    pub run_queue: bool,
}

impl AgentArgs {
    /// `watch` with no dashboard and no reports, serving metrics until
    /// SIGTERM or SIGINT.
    pub fn into_watch(self) -> WatchArgs {
        WatchArgs {
            select: self.select,
            duration: None,
            output: Output {
                interval: self.interval,
                json: false,
                no_tui: true,
            },
            listen: Some(self.listen),
            web_config: self.web_config,
            record: None,
            force: false,
            probe_cost: self.probe_cost,
            fork_hook: None,
            queue_hook: None,
            unix_queue_hook: None,
            unix_service_time: false,
            unix_service_hook: None,
            run_queue: self.run_queue,
            log_probes: false,
            headless: true,
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try 500ms, 10s or 2m)"))
}

/// The metrics a recording holds, for `--metric`: every declared latency
/// and count, and the gauges (busy rows, own times).
fn metrics() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        stackprobe_model::measure::names().chain(stackprobe_output::export::hlog::GAUGES),
    )
}

/// Longer runs and intervals are refused rather than overflowing a clock.
const LONGEST: Duration = Duration::from_secs(10 * 365 * 86_400);

fn parse_bounded(s: &str, min: Duration, min_text: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!("must be at least {min_text}"));
    }
    if d > LONGEST {
        return Err("must be at most 10 years".into());
    }
    Ok(d)
}

fn parse_run_duration(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::from_nanos(1), "1ns")
        .map_err(|e| format!("{e} (leave --duration out to run until Ctrl-C)"))
}

fn parse_demo_duration(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::from_secs(1), "1s")
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    parse_bounded(s, Duration::from_millis(10), "10ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_watch_line() {
        let cli = Cli::try_parse_from([
            "stackprobe",
            "watch",
            "nginx",
            "postgres",
            "--pid",
            "42",
            "--duration",
            "10s",
            "--interval",
            "500ms",
            "--json",
        ])
        .unwrap();
        let Command::Watch(w) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(w.select.names, ["nginx", "postgres"]);
        assert_eq!(w.select.pids, [42]);
        assert_eq!(w.duration, Some(Duration::from_secs(10)));
        assert_eq!(w.output.interval, Duration::from_millis(500));
        assert!(w.output.json);
    }

    #[test]
    fn parses_a_report_line() {
        let cli = Cli::try_parse_from([
            "stackprobe",
            "report",
            "run.hlog",
            "--role",
            "postgres",
            "--metric",
            "fork",
            "--from",
            "30s",
            "--format",
            "csv",
        ])
        .unwrap();
        let Command::Report(r) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(r.file, std::path::PathBuf::from("run.hlog"));
        assert_eq!(
            (r.role.as_deref(), r.metric.as_deref()),
            (Some("postgres"), Some("fork"))
        );
        assert_eq!(r.from, Some(Duration::from_secs(30)));
        assert_eq!(r.format, ReportFormat::Csv);
        assert!(Cli::try_parse_from(["stackprobe", "report", "x", "--format", "xml"]).is_err());
    }

    #[test]
    fn parses_a_demo_line_with_bounded_defaults() {
        let Command::Demo(d) = Cli::try_parse_from(["stackprobe", "demo"]).unwrap().command else {
            panic!("parsed as another command");
        };
        assert_eq!(d.duration, Duration::from_secs(20));
        assert_eq!((d.rate, d.output.interval), (50, Duration::from_secs(1)));
        assert!(!d.output.json && !d.output.no_tui);
        let Command::Demo(d) = Cli::try_parse_from([
            "stackprobe",
            "demo",
            "--duration",
            "4s",
            "--rate",
            "100",
            "--no-tui",
            "--json",
        ])
        .unwrap()
        .command
        else {
            panic!("parsed as another command");
        };
        assert_eq!((d.duration, d.rate), (Duration::from_secs(4), 100));
        assert!(d.output.json && d.output.no_tui);
        for bad in [
            ["--rate", "0"],
            ["--rate", "1001"],
            ["--duration", "500ms"],
            ["--interval", "1ms"],
        ] {
            assert!(
                Cli::try_parse_from(["stackprobe", "demo", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn rejects_bad_durations_and_unknown_options() {
        assert!(Cli::try_parse_from(["stackprobe", "watch", "x", "--interval", "0s"]).is_err());
        assert!(Cli::try_parse_from(["stackprobe", "watch", "x", "--duration", "soon"]).is_err());
        assert!(Cli::try_parse_from(["stackprobe", "watch", "x", "--frobnicate"]).is_err());
        assert!(Cli::try_parse_from(["stackprobe", "watch", "--pid", "abc"]).is_err());
    }
}

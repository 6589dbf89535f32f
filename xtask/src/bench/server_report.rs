//! Sections 2 and 5 from the lab's measured runs: for each page, every
//! configuration's throughput and what its tracer spends per request, and
//! stackprobe beside its targets, which are relative to bpftrace and to the
//! floor.

use std::{collections::BTreeSet, fmt::Write as _};

use super::spread;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Config {
    None,
    Floor,
    Bpftrace,
    Stackprobe,
    /// stackprobe as the service runs it: `agent`, metrics every 15 s.
    Agent,
}

/// Every round runs the configurations in this order; tables list them in it.
pub const CONFIGS: [Config; 5] = [
    Config::None,
    Config::Floor,
    Config::Bpftrace,
    Config::Stackprobe,
    Config::Agent,
];

impl Config {
    pub fn name(self) -> &'static str {
        match self {
            Config::None => "nothing attached",
            Config::Floor => "floor (empty programs)",
            Config::Bpftrace => "bpftrace",
            Config::Stackprobe => "stackprobe",
            Config::Agent => "stackprobe agent (15 s interval)",
        }
    }
}

/// What one BPF program of a tracer did during a run.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct ProgramRun {
    /// As bpftool names it (at most 15 characters).
    pub name: String,
    /// Where the kernel has it attached, sorted: `tracepoint:NAME` (perf
    /// events, raw_tp and tp_btf alike, so that stackprobe's tp_btf
    /// programs meet the floor's and bpftrace's classic tracepoints),
    /// `kprobe:F`, `kretprobe:F`, `kfunc:F`, `kretfunc:F`, `iter:TARGET`;
    /// `unknown` when the kernel did not say.
    pub hooks: Vec<String>,
    pub runs: u64,
    pub ns: u64,
}

/// One wrk run under one configuration.
#[derive(Default, Clone, Debug)]
pub struct Run {
    pub per_s: f64,
    pub requests: u64,
    /// Wall time between the two readings of the tracer's CPU, in seconds.
    pub wall_s: f64,
    /// BPF program runs and their run time (ns) during the load.
    pub bpf_runs: u64,
    pub bpf_ns: u64,
    /// The tracer's own user + system CPU during the load, in seconds.
    pub user_cpu_s: f64,
    /// Events stackprobe lost (ring buffer full): the agent's as of its
    /// last metrics update.
    pub drops: u64,
    /// stackprobe's resident memory at the end of the load, in KiB.
    pub rss_kib: u64,
    /// The tracer's programs one by one (their sums are `bpf_runs` and
    /// `bpf_ns`).
    pub programs: Vec<ProgramRun>,
}

impl Run {
    fn per_request(&self, x: f64) -> f64 {
        x / self.requests.max(1) as f64
    }

    fn bpf_ns_per_request(&self) -> f64 {
        self.per_request(self.bpf_ns as f64)
    }

    fn user_us_per_request(&self) -> f64 {
        self.per_request(self.user_cpu_s * 1e6)
    }

    /// BPF programs plus the tracer's userspace.
    fn total_us_per_request(&self) -> f64 {
        self.bpf_ns_per_request() / 1e3 + self.user_us_per_request()
    }

    /// The tracer's userspace CPU, 100 being one core busy all along.
    fn user_core_percent(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.user_cpu_s / self.wall_s * 100.0
        } else {
            0.0
        }
    }

    fn runs_per_request(&self) -> f64 {
        self.per_request(self.bpf_runs as f64)
    }

    fn per_run(&self, ns: f64) -> f64 {
        ns / self.bpf_runs.max(1) as f64
    }
}

/// A run of each configuration, in [`CONFIGS`] order.
#[derive(Default, Clone, Debug)]
pub struct Round(pub [Run; 5]);

impl Round {
    fn of(&self, config: Config) -> &Run {
        &self.0[config as usize]
    }

    /// Throughput under `config` over throughput with nothing attached.
    fn vs_nothing(&self, config: Config) -> f64 {
        self.of(config).per_s / self.of(Config::None).per_s
    }

    /// How far stackprobe's throughput is below the floor's, in points
    /// (hundredths of the throughput with nothing attached).
    fn points_below_floor(&self) -> f64 {
        (self.vs_nothing(Config::Floor) - self.vs_nothing(Config::Stackprobe)) * 100.0
    }

    /// stackprobe's total CPU per request over bpftrace's.
    fn total_vs_bpftrace(&self) -> f64 {
        self.of(Config::Stackprobe).total_us_per_request()
            / self.of(Config::Bpftrace).total_us_per_request()
    }
}

/// Median, min and max of `f` over non-empty `rounds`.
fn over(rounds: &[Round], f: impl Fn(&Round) -> f64) -> (f64, f64, f64) {
    spread(&rounds.iter().map(f).collect::<Vec<_>>())
}

fn median(rounds: &[Round], f: impl Fn(&Round) -> f64) -> f64 {
    over(rounds, f).0
}

/// `median [min–max]` with `decimals` decimals.
fn range((median, min, max): (f64, f64, f64), decimals: usize) -> String {
    format!("{median:.decimals$} [{min:.decimals$}–{max:.decimals$}]")
}

/// The targets for stackprobe on the lab.
const USERSPACE_PERCENT_MAX: f64 = 1.0;
const POINTS_BELOW_FLOOR_MAX: f64 = 2.0;
const RSS_MB_MAX: f64 = 20.0;

/// One page's rounds, as measured.
pub struct Page<'a> {
    pub title: &'a str,
    pub seconds: u64,
    /// Whether stackprobe's userspace has a CPU target under this load
    /// (it has under the static page's).
    pub cpu_target: bool,
    pub rounds: &'a [Round],
}

/// Section 2 for one page: a row per configuration, then stackprobe beside
/// its targets.
pub fn page_table(page: &Page) -> String {
    let rounds = page.rounds;
    let mut md = format!(
        "**{}** ({} rounds × {} s)\n\n\
         | configuration | requests/s median [min–max] | vs nothing attached, per round: median [min–max] \
         | BPF ns/request | tracer userspace, % of a core | tracer userspace µs/request \
         | total CPU µs/request | events dropped |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
        page.title,
        rounds.len(),
        page.seconds
    );
    for config in CONFIGS {
        let throughput = range(over(rounds, |r| r.of(config).per_s), 0);
        let ratio = if config == Config::None {
            "1".to_string()
        } else {
            range(over(rounds, |r| r.vs_nothing(config)), 3)
        };
        let bpf = median(rounds, |r| r.of(config).bpf_ns_per_request());
        // With nothing attached there is no tracer process to measure.
        let (core, user) = if config == Config::None {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!(
                    "{:.1}",
                    median(rounds, |r| r.of(config).user_core_percent())
                ),
                format!(
                    "{:.1}",
                    median(rounds, |r| r.of(config).user_us_per_request())
                ),
            )
        };
        let total = median(rounds, |r| r.of(config).total_us_per_request());
        let drops = if matches!(config, Config::Stackprobe | Config::Agent) {
            rounds
                .iter()
                .map(|r| r.of(config).drops)
                .sum::<u64>()
                .to_string()
        } else {
            "-".to_string()
        };
        let _ = writeln!(
            md,
            "| {} | {throughput} | {ratio} | {bpf:.0} | {core} | {user} | {total:.1} | {drops} |",
            config.name()
        );
    }
    md.push_str(
        "\n| stackprobe's target | measured, median [min–max] over rounds | met |\n|---|---|---|\n",
    );
    for (goal, measured, met) in targets(page) {
        let _ = writeln!(
            md,
            "| {goal} | {measured} | {} |",
            if met { "yes" } else { "no" }
        );
    }
    md.push('\n');
    md
}

/// (target, measured, met on the median) for stackprobe on one page.
fn targets(page: &Page) -> Vec<(String, String, bool)> {
    let rounds = page.rounds;
    let mut targets = Vec::new();
    let ratio = over(rounds, Round::total_vs_bpftrace);
    targets.push((
        "total CPU per request ≤ bpftrace's".to_string(),
        format!("stackprobe ÷ bpftrace: {}", range(ratio, 2)),
        ratio.0 <= 1.0,
    ));
    if page.cpu_target {
        let core = over(rounds, |r| r.of(Config::Stackprobe).user_core_percent());
        targets.push((
            format!("userspace ≤ {USERSPACE_PERCENT_MAX} % of a core"),
            format!("{} %", range(core, 1)),
            core.0 <= USERSPACE_PERCENT_MAX,
        ));
    }
    let points = over(rounds, Round::points_below_floor);
    targets.push((
        format!("throughput within {POINTS_BELOW_FLOOR_MAX} points of the floor"),
        format!("floor − stackprobe: {} points", range(points, 1)),
        points.0 <= POINTS_BELOW_FLOOR_MAX,
    ));
    // Met only if every round's is under the target: it is a ceiling.
    let rss = over(rounds, |r| {
        r.of(Config::Stackprobe).rss_kib as f64 * 1024.0 / 1e6
    });
    targets.push((
        format!("RSS < {RSS_MB_MAX} MB steady under the load"),
        format!("{} MB at the end of the load", range(rss, 1)),
        rss.2 < RSS_MB_MAX,
    ));
    targets
}

/// Section 5's rows for one page: each tracer's probe runs per request and
/// its cost per probe run (medians over rounds).
pub fn per_run_rows(load: &str, rounds: &[Round]) -> String {
    let mut md = String::new();
    for config in CONFIGS.into_iter().skip(1) {
        let runs = median(rounds, |r| r.of(config).runs_per_request());
        let bpf = median(rounds, |r| {
            let run = r.of(config);
            run.per_run(run.bpf_ns as f64)
        });
        let total = median(rounds, |r| {
            let run = r.of(config);
            run.per_run(run.bpf_ns as f64 + run.user_cpu_s * 1e9)
        });
        let _ = writeln!(
            md,
            "| {load} | {} | {runs:.1} | {bpf:.0} | {total:.0} |",
            config.name()
        );
    }
    md
}

/// The configurations the breakdown sets side by side.
const BROKEN_DOWN: [Config; 3] = [Config::Stackprobe, Config::Floor, Config::Bpftrace];

/// Hooks grouped so that every program of every tracer in `rounds` lies
/// within one group: hooks one program shares are in the same group (a
/// stackprobe program on the accept and accept4 tracepoints, and bpftrace's
/// one on each, are one group). Each group sorted; groups in no order.
fn hook_groups(rounds: &[Round]) -> Vec<BTreeSet<String>> {
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    let programs = rounds
        .iter()
        .flat_map(|r| BROKEN_DOWN.map(|c| r.of(c)))
        .flat_map(|run| &run.programs);
    for p in programs {
        let mut merged: BTreeSet<String> = p.hooks.iter().cloned().collect();
        groups.retain(|g| {
            let overlaps = !g.is_disjoint(&merged);
            if overlaps {
                merged.extend(g.iter().cloned());
            }
            !overlaps
        });
        groups.push(merged);
    }
    groups
}

/// (runs, ns) of `run`'s programs on `group`, and of those named `name`
/// if one is given.
fn on_group(run: &Run, group: &BTreeSet<String>, name: Option<&str>) -> (u64, u64) {
    run.programs
        .iter()
        .filter(|p| p.hooks.first().is_some_and(|h| group.contains(h)))
        .filter(|p| name.is_none_or(|n| p.name == n))
        .fold((0, 0), |(runs, ns), p| (runs + p.runs, ns + p.ns))
}

/// Medians over rounds of runs/request, ns/run and ns/request of what
/// `pick` takes from each round's run of `config` (ns/run over the rounds
/// with runs, `None` if none had any).
fn program_medians(
    rounds: &[Round],
    config: Config,
    pick: impl Fn(&Run) -> (u64, u64),
) -> (f64, Option<f64>, f64) {
    let runs = median(rounds, |r| {
        let run = r.of(config);
        run.per_request(pick(run).0 as f64)
    });
    let per_run: Vec<f64> = rounds
        .iter()
        .map(|r| pick(r.of(config)))
        .filter(|&(runs, _)| runs > 0)
        .map(|(runs, ns)| ns as f64 / runs as f64)
        .collect();
    let ns = median(rounds, |r| {
        let run = r.of(config);
        run.per_request(pick(run).1 as f64)
    });
    (runs, (!per_run.is_empty()).then(|| spread(&per_run).0), ns)
}

/// `runs/request | ns/run` (and `| ns/request` with `ns`) cells.
fn cells((runs, per_run, ns): (f64, Option<f64>, f64), with_ns: bool) -> String {
    let per_run = per_run.map_or("-".to_string(), |v| format!("{v:.0}"));
    let mut cells = format!("{runs:.2} | {per_run}");
    if with_ns {
        let _ = write!(cells, " | {ns:.0}");
    }
    cells
}

/// Hooks as a table cell: tracepoints by name alone.
fn hooks_cell(group: &BTreeSet<String>) -> String {
    group
        .iter()
        .map(|h| h.strip_prefix("tracepoint:").unwrap_or(h))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Section 2's per-program breakdown for one page: for each group of hooks,
/// a row per stackprobe program on it (runs per request, ns per run, ns per
/// request), beside what the floor's and bpftrace's programs on the same
/// hooks did (on its first row); then each tracer's total, which is section
/// 2's BPF ns/request. Medians over rounds, cell by cell.
pub fn breakdown_table(title: &str, rounds: &[Round]) -> String {
    let mut md = format!(
        "**{title}**: BPF programs, medians over {} rounds\n\n\
         | hooks | stackprobe program | runs/request | ns/run | ns/request \
         | floor runs/request | floor ns/run \
         | bpftrace runs/request | bpftrace ns/run | bpftrace ns/request |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        rounds.len()
    );
    let mut groups: Vec<(f64, f64, String)> = Vec::new();
    for group in hook_groups(rounds) {
        let mut names: Vec<&str> = rounds
            .iter()
            .flat_map(|r| &r.of(Config::Stackprobe).programs)
            .filter(|p| p.hooks.first().is_some_and(|h| group.contains(h)))
            .map(|p| p.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let floor = program_medians(rounds, Config::Floor, |r| on_group(r, &group, None));
        let bpftrace = program_medians(rounds, Config::Bpftrace, |r| on_group(r, &group, None));
        let stackprobe = program_medians(rounds, Config::Stackprobe, |r| on_group(r, &group, None));
        // Hooks nothing ran on during the loads (bpftrace's BEGIN) say
        // nothing.
        if names.is_empty() && floor.0 == 0.0 && bpftrace.0 == 0.0 {
            continue;
        }
        let mut rows = String::new();
        let others = format!("{} | {}", cells(floor, false), cells(bpftrace, true));
        let blank = [""; 5].join(" | ");
        if names.is_empty() {
            let _ = writeln!(rows, "| {} | - | | | | {others} |", hooks_cell(&group));
        }
        for (i, name) in names.iter().enumerate() {
            let own = program_medians(rounds, Config::Stackprobe, |r| {
                on_group(r, &group, Some(name))
            });
            let (hooks, others) = if i == 0 {
                (hooks_cell(&group), others.as_str())
            } else {
                (String::new(), blank.as_str())
            };
            let _ = writeln!(
                rows,
                "| {hooks} | {name} | {} | {others} |",
                cells(own, true)
            );
        }
        groups.push((stackprobe.2, bpftrace.2, rows));
    }
    // Where stackprobe spends most first, then bpftrace.
    groups.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
    for (_, _, rows) in groups {
        md.push_str(&rows);
    }
    let total = |config| {
        program_medians(rounds, config, |r| {
            r.programs
                .iter()
                .fold((0, 0), |(runs, ns), p| (runs + p.runs, ns + p.ns))
        })
    };
    let _ = writeln!(
        md,
        "| **total** | | {} | {} | {} |",
        cells(total(Config::Stackprobe), true),
        cells(total(Config::Floor), false),
        cells(total(Config::Bpftrace), true)
    );
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(per_s: f64, bpf_ns: u64, user_cpu_s: f64) -> Run {
        Run {
            per_s,
            requests: (per_s * 5.0) as u64,
            wall_s: 5.0,
            bpf_runs: (per_s * 5.0) as u64 * 10,
            bpf_ns,
            user_cpu_s,
            drops: 0,
            rss_kib: 15_000,
            programs: Vec::new(),
        }
    }

    /// 1000 requests/s for 5 s with nothing attached; the floor, bpftrace and
    /// stackprobe at `per_s`, with `cost` = (BPF ns, userspace s); the
    /// agent as stackprobe with a fifth of its userspace.
    fn round(per_s: [f64; 3], costs: [(u64, f64); 3]) -> Round {
        Round([
            run(1000.0, 0, 0.0),
            run(per_s[0], costs[0].0, costs[0].1),
            run(per_s[1], costs[1].0, costs[1].1),
            run(per_s[2], costs[2].0, costs[2].1),
            run(per_s[2], costs[2].0, costs[2].1 / 5.0),
        ])
    }

    #[test]
    fn a_run_splits_its_cost_per_request_between_bpf_and_userspace() {
        // 5000 requests; 10 ms of BPF, 40 ms of userspace over 5 s.
        let r = run(1000.0, 10_000_000, 0.04);
        assert_eq!(r.bpf_ns_per_request(), 2000.0);
        assert!((r.user_us_per_request() - 8.0).abs() < 1e-9);
        assert!((r.total_us_per_request() - 10.0).abs() < 1e-9);
        assert!((r.user_core_percent() - 0.8).abs() < 1e-9);
        assert_eq!(r.runs_per_request(), 10.0);
        assert_eq!(r.per_run(r.bpf_ns as f64), 200.0);
        assert_eq!(Run::default().user_core_percent(), 0.0);
    }

    #[test]
    fn rounds_compare_stackprobe_with_the_floor_and_with_bpftrace() {
        let r = round(
            [950.0, 900.0, 930.0],
            [(1_000_000, 0.0), (20_000_000, 0.0), (10_000_000, 0.02)],
        );
        assert!((r.vs_nothing(Config::Stackprobe) - 0.93).abs() < 1e-9);
        assert!((r.points_below_floor() - 2.0).abs() < 1e-9);
        // bpftrace: 20 ms over 4500 requests; stackprobe: 30 ms over 4650.
        let expected = (30e6 / 4650.0) / (20e6 / 4500.0);
        assert!((r.total_vs_bpftrace() - expected).abs() < 1e-9);
    }

    #[test]
    fn the_page_table_has_a_row_per_configuration_and_the_targets() {
        let rounds = [
            round(
                [950.0, 900.0, 940.0],
                [(1_000_000, 0.0), (100_000_000, 0.0), (10_000_000, 0.02)],
            ),
            round(
                [960.0, 910.0, 930.0],
                [(1_000_000, 0.0), (100_000_000, 0.0), (10_000_000, 0.1)],
            ),
            round(
                [970.0, 920.0, 900.0],
                [(1_000_000, 0.0), (100_000_000, 0.0), (10_000_000, 0.04)],
            ),
        ];
        let md = page_table(&Page {
            title: "static",
            seconds: 5,
            cpu_target: true,
            rounds: &rounds,
        });
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 1 + 5 + 1 + 4, "{md}");
        assert!(md.starts_with("**static** (3 rounds × 5 s)"));
        assert_eq!(
            rows[1],
            "| nothing attached | 1000 [1000–1000] | 1 | 0 | - | - | 0.0 | - |"
        );
        assert_eq!(
            rows[2],
            "| floor (empty programs) | 960 [950–970] | 0.960 [0.950–0.970] | 208 | 0.0 | 0.0 | 0.2 | - |"
        );
        // stackprobe's userspace: 0.4, 2.0 and 0.8 % of a core; 4.3, 21.5
        // and 8.9 µs per request.
        assert_eq!(
            rows[4],
            "| stackprobe | 930 [900–940] | 0.930 [0.900–0.940] | 2151 | 0.8 | 8.9 | 11.1 | 0 |"
        );
        assert_eq!(
            rows[5],
            "| stackprobe agent (15 s interval) | 930 [900–940] | 0.930 [0.900–0.940] | 2151 | 0.2 | 1.8 | 4.0 | 0 |"
        );
        assert_eq!(
            rows[8],
            "| userspace ≤ 1 % of a core | 0.8 [0.4–2.0] % | yes |"
        );
        // Points below the floor: 1, 3 and 7.
        assert_eq!(
            rows[9],
            "| throughput within 2 points of the floor | floor − stackprobe: 3.0 [1.0–7.0] points | no |"
        );
        // 15 000 KiB in every round.
        assert_eq!(
            rows[10],
            "| RSS < 20 MB steady under the load | 15.4 [15.4–15.4] MB at the end of the load | yes |"
        );
        // stackprobe ÷ bpftrace: 6.4 / 22.2, 23.7 / 22.0, 11.1 / 21.7 µs.
        assert_eq!(
            rows[7],
            "| total CPU per request ≤ bpftrace's | stackprobe ÷ bpftrace: 0.51 [0.29–1.08] | yes |"
        );
    }

    #[test]
    fn the_cpu_target_shows_only_where_it_applies() {
        let rounds = [round(
            [950.0, 900.0, 940.0],
            [(1_000_000, 0.0), (2_000_000, 0.0), (10_000_000, 0.5)],
        )];
        let md = page_table(&Page {
            title: "new",
            seconds: 5,
            cpu_target: false,
            rounds: &rounds,
        });
        assert!(!md.contains("| userspace ≤"));
        assert!(md.contains("| total CPU per request ≤ bpftrace's | stackprobe ÷ bpftrace: "));
        assert!(md.contains("| no |"));
    }

    #[test]
    fn section_5_has_a_row_per_tracer() {
        let rounds = [round(
            [950.0, 900.0, 940.0],
            [(1_000_000, 0.0), (2_000_000, 0.0), (10_000_000, 0.5)],
        )];
        let rows = per_run_rows("Static", &rounds);
        let rows: Vec<&str> = rows.lines().collect();
        assert_eq!(rows.len(), 4);
        // The floor: 47500 runs, 1 ms: 21 ns per run.
        assert_eq!(
            rows[0],
            "| Static | floor (empty programs) | 10.0 | 21 | 21 |"
        );
        // stackprobe: 47000 runs, 10 ms of BPF and 500 ms of userspace.
        assert_eq!(rows[2], "| Static | stackprobe | 10.0 | 213 | 10851 |");
    }
    fn program(name: &str, hooks: &[&str], runs: u64, ns: u64) -> ProgramRun {
        ProgramRun {
            name: name.to_string(),
            hooks: hooks.iter().map(|h| h.to_string()).collect(),
            runs,
            ns,
        }
    }

    /// A round of 1000 requests per configuration with these programs.
    fn programs_round(
        floor: Vec<ProgramRun>,
        bpftrace: Vec<ProgramRun>,
        stackprobe: Vec<ProgramRun>,
    ) -> Round {
        let mut round = Round::default();
        for (config, programs) in [
            (Config::Floor, floor),
            (Config::Bpftrace, bpftrace),
            (Config::Stackprobe, stackprobe),
        ] {
            round.0[config as usize] = Run {
                requests: 1000,
                bpf_runs: programs.iter().map(|p| p.runs).sum(),
                bpf_ns: programs.iter().map(|p| p.ns).sum(),
                programs,
                ..Run::default()
            };
        }
        round
    }

    #[test]
    fn the_breakdown_sets_each_stackprobe_program_beside_the_others_on_its_hooks() {
        const ACCEPT: &str = "tracepoint:sys_enter_accept";
        const ACCEPT4: &str = "tracepoint:sys_enter_accept4";
        const STATE: &str = "tracepoint:inet_sock_set_state";
        let round = |scale: u64| {
            programs_round(
                // One empty program per hook.
                vec![
                    program("sys_enter_accep", &[ACCEPT], 10, 200),
                    program("sys_enter_accep", &[ACCEPT4], 1000, 20_000),
                    program("inet_sock_set_s", &[STATE], 6000, 120_000),
                ],
                // One program on both accept tracepoints; its BEGIN, which
                // did not run; a program on a hook stackprobe leaves alone.
                vec![
                    program("tracepoint_sysc", &[ACCEPT, ACCEPT4], 1010, 101_000),
                    program("BEGIN", &["uprobe:/usr/bin/bpftrace:4096"], 0, 0),
                    program("inet_sock_set_s", &[STATE], 6000, 1_800_000),
                    program(
                        "sched_process_e",
                        &["tracepoint:sched_process_exit"],
                        10,
                        5000,
                    ),
                ],
                vec![
                    program("accept_enter", &[ACCEPT, ACCEPT4], 1010, 80_800 * scale),
                    program("tcp_state_btf", &[STATE], 6000, 600_000),
                    program("tcp_state_btf_n", &[STATE], 6000, 300_000),
                    program("sock_walk", &["iter:tcp"], 1, 2_000_000),
                ],
            )
        };
        let md = breakdown_table("static, 8 connections", &[round(1), round(2), round(3)]);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert!(md.starts_with("**static, 8 connections**: BPF programs, medians over 3 rounds"));
        assert_eq!(rows.len(), 1 + 5 + 1, "{md}");
        // Largest stackprobe ns/request first; the iterator alone.
        assert_eq!(
            rows[1],
            "| iter:tcp | sock_walk | 0.00 | 2000000 | 2000 | 0.00 | - | 0.00 | - | 0 |"
        );
        // Both programs on the state tracepoint, bpftrace's and the floor's
        // numbers on the first.
        assert_eq!(
            rows[2],
            "| inet_sock_set_state | tcp_state_btf | 6.00 | 100 | 600 | 6.00 | 20 | 6.00 | 300 | 1800 |"
        );
        assert_eq!(
            rows[3],
            "|  | tcp_state_btf_n | 6.00 | 50 | 300 |  |  |  |  |  |"
        );
        // The floor's two accept programs and bpftrace's one, as one group;
        // stackprobe's ns/run 80, 160, 240: medians.
        assert_eq!(
            rows[4],
            "| sys_enter_accept, sys_enter_accept4 | accept_enter | 1.01 | 160 | 162 | 1.01 | 20 | 1.01 | 100 | 101 |"
        );
        // What bpftrace ran on hooks stackprobe leaves alone; not its BEGIN.
        assert_eq!(
            rows[5],
            "| sched_process_exit | - | | | | 0.00 | - | 0.01 | 500 | 5 |"
        );
        // Each tracer's total is its BPF ns/request of section 2.
        let total = round(2);
        assert_eq!(
            rows[6],
            format!(
                "| **total** | | 13.01 | {:.0} | {:.0} | 7.01 | 20 | 7.02 | 272 | 1906 |",
                total
                    .of(Config::Stackprobe)
                    .per_run(total.of(Config::Stackprobe).bpf_ns as f64),
                total.of(Config::Stackprobe).bpf_ns_per_request()
            )
        );
        assert_eq!(
            rows[6],
            "| **total** | | 13.01 | 235 | 3062 | 7.01 | 20 | 7.02 | 272 | 1906 |"
        );
    }
}

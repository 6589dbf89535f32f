//! `cargo xtask bench`: what stackprobe costs the system it watches, beside
//! bpftrace measuring the same things, written to BENCHMARKS.md.
//!
//! 1. probe cost (ns per program run) under accept, fork and churn loads;
//! 2. requests/s of the lab's nginx and PHP pages with nothing attached,
//!    empty programs on stackprobe's hooks (the floor), bpftrace, and
//!    stackprobe, interleaved, with each one's CPU per request;
//! 3. the event rates stackprobe takes without dropping, and its CPU;
//! 4. footprint: RSS, kernel map memory and time to attach;
//! 5. total CPU per probe run (BPF + userspace);
//! 6. what `--run-queue` adds, beside libbpf-tools' runqlat.
//!
//! These machines are noisy: every comparison is a ratio within one run.

mod capacity;
mod floor;
mod footprint;
pub mod lines;
mod loopback;
pub mod pair;
pub mod probe_cost;
pub mod run_queue;
mod server;
mod server_report;
mod tracer;

use std::{fmt::Write as _, fs, process::Command, time::Instant};

use anyhow::{Result, ensure};

use crate::{lab, process, setup, tasks};

pub use probe_cost::{ACCEPT, CHURN, FORK};
pub use server::Options as ServerOptions;

/// bpftool reads every program's run count and run time, and map memory;
/// libbpf-tools has the runqlat section 6 compares with.
pub const PACKAGES: [&str; 2] = ["bpftool", run_queue::PACKAGES[0]];

/// Turns the kernel's BPF run-time statistics on and restores the old value
/// on drop.
pub struct BpfStats(String);

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub fn enable() -> Result<Self> {
        let old = fs::read_to_string(BPF_STATS)?.trim().to_string();
        fs::write(BPF_STATS, "1")?;
        Ok(Self(old))
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, &self.0);
    }
}

/// What every benchmark needs: root, bpftrace and bpftool, a release build.
pub fn prepare() -> Result<()> {
    ensure!(
        process::is_root(),
        "the benchmarks load kernel probes: run them as root"
    );
    setup::apt_packages(&["bpftrace", "bpftool"])?;
    tasks::build()
}

/// `--quick` shortens every run (for a smoke check, not for the record).
pub struct Scale {
    pub quick: bool,
}

impl Scale {
    fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick { quick } else { full }
    }
}

pub fn all(scale: &Scale) -> Result<()> {
    prepare()?;
    let started = Instant::now();
    let mut md = header(scale)?;

    md.push_str("## 1. Probe cost\n\n");
    md.push_str(
        "ns per run of each kernel program, from the kernel's BPF run-time statistics \
         (`kernel.bpf_stats_enabled`, restored afterwards), under a loopback load with a known \
         operation count; bpftrace's one-liner for the same hook in the same round. Targets: \
         ≤ 200 ns per accept or state event, ≤ 400 ns per fork event. Every stackprobe run must \
         count every operation with no drop, or the benchmark fails.\n\n",
    );
    let ops = scale.pick(3000, 20_000);
    let rounds = scale.pick(1, 3);
    // Forks are slower than accepts: a quarter as many keeps the rounds short.
    for (w, n) in [(&ACCEPT, ops), (&FORK, ops / 4), (&CHURN, ops)] {
        md.push_str(&probe_cost::run(w, n, rounds)?.markdown());
        md.push('\n');
    }

    // Sections 2 and 5 run on the lab; it is taken down even on failure.
    let lab_result = (|| -> Result<String> {
        lab::up()?;
        let md = server::run(scale)?;
        let length = run_queue::Length {
            rounds: scale.pick(1, 3),
            seconds: scale.pick(2, 31),
        };
        Ok(md + &run_queue::run(&length)?)
    })();
    let down = lab::down();
    md.push_str(&lab_result?);
    down?;

    md.push_str(&capacity::run(scale)?);
    md.push_str(&footprint::run(scale)?);
    let _ = writeln!(
        md,
        "\n---\nThe whole run took {:.0} s.",
        started.elapsed().as_secs_f64()
    );
    let path = process::workspace_root().join("BENCHMARKS.md");
    // The notes are written by hand (what was measured and tried): a run
    // keeps them.
    if let Some(notes) = fs::read_to_string(&path)
        .ok()
        .as_deref()
        .and_then(notes_section)
    {
        md.push('\n');
        md.push_str(notes);
    }
    fs::write(&path, &md)?;
    print!("{md}");
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// `cargo xtask bench server`: sections 2 and 5 with the breakdown, printed
/// (BENCHMARKS.md is left as it is). The lab is used as found if it is up,
/// else brought up for the run and taken down after.
pub fn server_standalone(options: &ServerOptions) -> Result<()> {
    on_lab(|| server::run_with(options, &Scale { quick: false }))
}

/// `cargo xtask bench pair`: see [`pair`]; the lab as for
/// [`server_standalone`].
pub fn pair_standalone(
    baseline: &std::path::Path,
    load: &lab::LoadArgs,
    rounds: u32,
) -> Result<()> {
    on_lab(|| pair::run(baseline, load, rounds))
}

/// Prints what `run` makes of the lab: used as found if it is up, else
/// brought up for the run and taken down after.
fn on_lab(run: impl FnOnce() -> Result<String>) -> Result<()> {
    prepare()?;
    let was_up = lab::is_up();
    let result = if was_up {
        run()
    } else {
        lab::up().and_then(|()| run())
    };
    let down = if was_up { Ok(()) } else { lab::down() };
    let md = result?;
    down?;
    print!("{md}");
    Ok(())
}

/// BENCHMARKS.md's hand-written part: from its notes heading to the end.
fn notes_section(md: &str) -> Option<&str> {
    md.find(NOTES_HEADING).map(|at| &md[at..])
}

const NOTES_HEADING: &str = "## Notes: what was measured and tried";

fn header(scale: &Scale) -> Result<String> {
    let kernel = process::capture(Command::new("uname").arg("-r"))?;
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_string();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let commit = process::capture(
        Command::new("git")
            .args(["-C"])
            .arg(process::workspace_root())
            .args(["rev-parse", "--short", "HEAD"]),
    )
    .unwrap_or_default();
    let date = process::capture(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?;
    Ok(format!(
        "# Benchmarks\n\n\
         Produced by `cargo xtask bench{}` (as root) on {}, commit {}.\n\
         Machine: {cpus} × {model}, {mem_gib:.0} GiB, kernel {}; bpftrace {}.\n\
         These VMs are noisy: compare the ratios within this run, not absolute numbers \
         across runs or machines.\n\n",
        if scale.quick { " --quick" } else { "" },
        date.trim(),
        commit.trim(),
        kernel.trim(),
        process::capture(Command::new("bpftrace").arg("--version"))
            .unwrap_or_default()
            .trim()
            .trim_start_matches("bpftrace ")
    ))
}

/// Median and (min, max) of a non-empty sample.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_keeps_the_hand_written_notes_and_only_them() {
        let old = format!(
            "# Benchmarks\n## 1. Probe cost\nold table\n{NOTES_HEADING}\n### Sockets\nkept\n"
        );
        assert_eq!(
            notes_section(&old),
            Some(&*format!("{NOTES_HEADING}\n### Sockets\nkept\n"))
        );
        assert_eq!(notes_section("# Benchmarks\nno notes\n"), None);
    }
}

//! `cargo xtask bench pair --baseline BIN`: another build of stackprobe
//! and this tree's release build watching the lab at once, under one load,
//! so that a change of a few percent in a program shows through this
//! machine's noise (runs of one build a minute apart differ by up to a
//! third).
//!
//! Both builds attach to the same hooks, and the program the kernel runs
//! second on a hook finds the lines the first just read (the socket's
//! fields, the task's): the same build watching twice measured its second
//! copy at 0.875 of the first's BPF time. So each round runs both orders,
//! and the ratio this/baseline is the geometric mean of the two orders'
//! ratios, in which that advantage cancels.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    path::Path,
    process::Command,
};

use anyhow::{Result, ensure};

use super::{
    server::STACKPROBE_ARGS,
    spread,
    tracer::{Tracer, new_programs, program_ids, program_runs},
};
use crate::{
    lab::{self, LoadArgs},
    process,
};

/// One build's programs over one load: name → (runs, run time ns).
type Runs = BTreeMap<String, (u64, u64)>;

/// What one order of one round measured.
struct Reading {
    requests: u64,
    baseline: Runs,
    this: Runs,
    /// Each build's userspace CPU during the load, in ns.
    baseline_cpu_ns: f64,
    this_cpu_ns: f64,
}

/// Runs `rounds` rounds of both orders under `load` and returns the
/// comparison as markdown. The lab must be up.
pub fn run(baseline: &Path, load: &LoadArgs, rounds: u32) -> Result<String> {
    ensure!(process::is_root(), "the probes need root: run it as root");
    ensure!(
        baseline.is_file(),
        "--baseline {}: no such file (a release build of stackprobe, e.g. a worktree's \
         target/release/stackprobe)",
        baseline.display()
    );
    let this = process::workspace_root().join("target/release/stackprobe");
    let _stats = super::BpfStats::enable()?;
    let mut base_first = Vec::new();
    let mut this_first = Vec::new();
    for round in 0..rounds {
        for first_is_base in [round % 2 == 0, round % 2 != 0] {
            let (first, second) = if first_is_base {
                (baseline, this.as_path())
            } else {
                (this.as_path(), baseline)
            };
            let r = measure(first, second, load, first_is_base)?;
            eprintln!(
                "bench pair: round {} ({} first): {} requests",
                round + 1,
                if first_is_base { "baseline" } else { "this" },
                r.requests
            );
            if first_is_base {
                base_first.push(r);
            } else {
                this_first.push(r);
            }
        }
    }
    Ok(markdown(baseline, load, &base_first, &this_first))
}

fn watch(bin: &Path) -> Result<Tracer> {
    let mut cmd = Command::new(bin);
    cmd.args(STACKPROBE_ARGS);
    Tracer::command(cmd, "probes attached")
}

/// Starts `first`, then `second`, runs the load, and reads what each
/// build's programs ran and its CPU.
fn measure(first: &Path, second: &Path, load: &LoadArgs, first_is_base: bool) -> Result<Reading> {
    let before = program_ids()?;
    let t1 = watch(first)?;
    // Whatever fails, both are stopped: no watch is left attached.
    let started = program_ids().and_then(|firsts| Ok((firsts, watch(second)?)));
    let (firsts, t2) = match started {
        Ok(s) => s,
        Err(e) => {
            t1.end()?;
            return Err(e);
        }
    };
    let measured = (|| {
        let p0 = new_programs(&before)?;
        let cpu0 = (t1.exact_cpu_s()?, t2.exact_cpu_s()?);
        let (_, _, wrk) = lab::wrk(load)?;
        let cpu1 = (t1.exact_cpu_s()?, t2.exact_cpu_s()?);
        let p1 = new_programs(&before)?;
        Ok::<_, anyhow::Error>((p0, p1, cpu0, cpu1, wrk))
    })();
    t1.end()?;
    t2.end()?;
    let (p0, p1, cpu0, cpu1, wrk) = measured?;
    wrk.ensure_clean("bench pair")?;
    // What the first build's programs ran (`first`), or the second's, by
    // name.
    let runs_of = |first: bool| {
        let after = p1
            .iter()
            .filter(|(id, _)| firsts.contains(id) == first)
            .map(|(id, p)| (*id, p.clone()))
            .collect();
        let mut by_name = Runs::new();
        for run in program_runs(&p0, &after, &HashMap::new()) {
            let e = by_name.entry(run.name).or_default();
            e.0 += run.runs;
            e.1 += run.ns;
        }
        by_name
    };
    let (r1, r2) = (runs_of(true), runs_of(false));
    let cpu = ((cpu1.0 - cpu0.0) * 1e9, (cpu1.1 - cpu0.1) * 1e9);
    let ((baseline, this), (baseline_cpu_ns, this_cpu_ns)) = if first_is_base {
        ((r1, r2), cpu)
    } else {
        ((r2, r1), (cpu.1, cpu.0))
    };
    Ok(Reading {
        requests: wrk.requests,
        baseline,
        this,
        baseline_cpu_ns,
        this_cpu_ns,
    })
}

/// this/baseline with the order's advantage taken out: `base_first` is the
/// ratio measured with the baseline attached first (this one then has the
/// advantage), `this_first` with this build first.
pub fn order_free(base_first: f64, this_first: f64) -> f64 {
    (base_first * this_first).sqrt()
}

/// ns per run of `name` in `runs`, if it ran.
fn per_run(runs: &Runs, name: &str) -> Option<f64> {
    runs.get(name)
        .filter(|r| r.0 > 0)
        .map(|&(n, ns)| ns as f64 / n as f64)
}

fn total_ns(runs: &Runs) -> f64 {
    runs.values().map(|r| r.1 as f64).sum()
}

/// Per round, the order-free ratio of `f(this) / f(baseline)`; rounds
/// where either reading has none are left out.
fn ratios(
    base_first: &[Reading],
    this_first: &[Reading],
    f: impl Fn(&Reading, bool) -> Option<f64>,
) -> Vec<f64> {
    base_first
        .iter()
        .zip(this_first)
        .filter_map(|(a, b)| {
            let ra = f(a, true)? / f(a, false)?;
            let rb = f(b, true)? / f(b, false)?;
            Some(order_free(ra, rb))
        })
        .collect()
}

fn markdown(
    baseline: &Path,
    load: &LoadArgs,
    base_first: &[Reading],
    this_first: &[Reading],
) -> String {
    let all: Vec<&Reading> = base_first.iter().chain(this_first).collect();
    let mut md = format!(
        "# This build against {}, watching the lab at once\n\n\
         `{}` by both builds on the lab's {:?} page, wrk with {} connections for {} s, {} \
         rounds of both orders ({} requests a load, median). ns/run: medians over every load \
         (the order's advantage left in); this/baseline: the median over rounds of the \
         geometric mean of both orders' ratios, which takes it out.\n\n\
         | program | runs/request | baseline ns/run | this ns/run | this/baseline |\n\
         |---|---:|---:|---:|---:|\n",
        baseline.display(),
        STACKPROBE_ARGS.join(" "),
        load.page,
        load.connections,
        load.seconds,
        base_first.len(),
        spread(&all.iter().map(|r| r.requests as f64).collect::<Vec<_>>()).0,
    );
    let names: HashSet<&String> = all
        .iter()
        .flat_map(|r| r.this.keys().chain(r.baseline.keys()))
        .collect();
    let mut names: Vec<&String> = names.into_iter().collect();
    let ns_per_request = |name: &String| {
        let v: Vec<f64> = all
            .iter()
            .filter_map(|r| r.this.get(name).map(|e| e.1 as f64 / r.requests as f64))
            .collect();
        if v.is_empty() { 0.0 } else { spread(&v).0 }
    };
    names.sort_by(|a, b| ns_per_request(b).total_cmp(&ns_per_request(a)));
    let cell = |v: Vec<f64>, digits: usize| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.*}", digits, spread(&v).0)
        }
    };
    for name in names {
        let runs: Vec<f64> = all
            .iter()
            .filter_map(|r| r.this.get(name).map(|e| e.0 as f64 / r.requests as f64))
            .collect();
        let base: Vec<f64> = all
            .iter()
            .filter_map(|r| per_run(&r.baseline, name))
            .collect();
        let this: Vec<f64> = all.iter().filter_map(|r| per_run(&r.this, name)).collect();
        let ratio = ratios(base_first, this_first, |r, this| {
            per_run(if this { &r.this } else { &r.baseline }, name)
        });
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            cell(runs, 2),
            cell(base, 0),
            cell(this, 0),
            cell(ratio, 3)
        );
    }
    let per_request = |r: &Reading, this: bool, bpf: bool| {
        let (runs, cpu) = if this {
            (&r.this, r.this_cpu_ns)
        } else {
            (&r.baseline, r.baseline_cpu_ns)
        };
        (if bpf { total_ns(runs) } else { cpu }) / r.requests as f64
    };
    for (what, bpf) in [("BPF", true), ("userspace", false)] {
        let of = |this: bool| {
            all.iter()
                .map(|r| per_request(r, this, bpf))
                .collect::<Vec<_>>()
        };
        let ratio = if bpf {
            ratios(base_first, this_first, |r, this| {
                Some(per_request(r, this, true))
            })
        } else {
            // Userspace runs on its own: no order to take out.
            all.iter()
                .map(|r| per_request(r, true, false) / per_request(r, false, false))
                .collect()
        };
        let _ = writeln!(
            md,
            "| **{what}, ns/request** | | {} | {} | {} |",
            cell(of(false), 0),
            cell(of(true), 0),
            cell(ratio, 3)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_free_ratio_cancels_the_second_programs_advantage() {
        // This build 5 % cheaper, the second attached 12 % cheaper than it
        // would be alone.
        let (this, base, advantage) = (95.0, 100.0, 0.88);
        let with_base_first = (this * advantage) / base;
        let with_this_first = this / (base * advantage);
        let r = order_free(with_base_first, with_this_first);
        assert!((r - 0.95).abs() < 1e-12, "{r}");
    }
}

//! Build, run and test: thin wrappers over cargo.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    install_test, layers, module_graph,
    process::{cargo, is_root, run_cmd, workspace_root},
    vm,
};

pub fn build() -> Result<()> {
    run_cmd(cargo().args(["build", "--release", "--locked", "--bins"]))
}

/// Runs stackprobe with `args`; with none, `demo`, which shows what it does
/// without any server to watch.
pub fn run(args: &[String]) -> Result<()> {
    build()?;
    let demo = ["demo".to_string()];
    let args = if args.is_empty() { &demo[..] } else { args };
    let binary = workspace_root().join("target/release/stackprobe");
    let mut cmd = if is_root() {
        Command::new(&binary)
    } else {
        eprintln!("xtask: stackprobe loads kernel probes; running it with sudo");
        let mut sudo = Command::new("sudo");
        sudo.arg(&binary);
        sudo
    };
    run_cmd(cmd.args(args))
}

/// `vm`: also run the probe tests inside the CI kernels under qemu, and
/// the packages' install test (a clean Debian guest, also under qemu).
pub fn test(vm: bool) -> Result<()> {
    if !is_root() {
        bail!(
            "the integration tests load kernel probes: run `sudo -E cargo xtask test` (CI runs as root)"
        );
    }
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    run_cmd(cargo().args([
        "clippy",
        "--locked",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    layers::check()?;
    module_graph::check(&workspace_root(), &module_graph::CHECKED)?;
    // The eBPF crate builds only for the BPF target, with nightly and
    // build-std (as aya-build does it), in a target dir of its own.
    run_cmd(
        Command::new("rustup")
            .current_dir(workspace_root())
            .args(["run", "nightly", "cargo", "clippy", "--locked", "--release"])
            .args(["-p", "probes-ebpf", "--bins", "--target=bpfel-unknown-none"])
            .args(["-Z", "build-std=core", "--target-dir=target/ebpf-clippy"])
            .args(["--", "-D", "warnings"]),
    )?;
    // Integration test binaries in one crate run one after another, and the
    // tests inside each take a lock before loading probes.
    let mut totals = run_tests(cargo().args(["test", "--locked"]))?;
    if vm {
        let (passed, failed) = vm::run(&vm::VmArgs::ci())?;
        totals.passed += passed;
        totals.failed += failed;
        // The packages, installed on a clean guest: counted as one test.
        install_test::run(&install_test::Args::default())?;
        totals.passed += 1;
    }
    // One closing line for the whole suite: cargo's own last line is the
    // doc-test run of the last crate, which says nothing about the rest.
    println!(
        "tests: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if totals.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

#[derive(Debug, Default, PartialEq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// Runs cargo test, passing its output through, and adds up its
/// `test result:` lines.
fn run_tests(cmd: &mut Command) -> Result<Totals> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut totals = Totals::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        add_result_line(&mut totals, &line);
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(totals)
}

/// `test result: ok. 34 passed; 0 failed; 1 ignored; 0 measured; ...`
fn add_result_line(totals: &mut Totals, line: &str) {
    let Some(rest) = line.strip_prefix("test result: ") else {
        return;
    };
    for part in rest.split(['.', ';']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(what)) = (
            words.next().and_then(|n| n.parse::<u64>().ok()),
            words.next(),
        ) {
            match what {
                "passed" => totals.passed += n,
                "failed" => totals.failed += n,
                "ignored" => totals.ignored += n,
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up_cargo_result_lines() {
        let mut t = Totals::default();
        add_result_line(
            &mut t,
            "test result: ok. 34 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.02s",
        );
        add_result_line(
            &mut t,
            "test result: FAILED. 5 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 4.57s",
        );
        add_result_line(&mut t, "running 3 tests");
        assert_eq!(
            t,
            Totals {
                passed: 39,
                failed: 2,
                ignored: 1
            }
        );
    }
}

//! Builds the eBPF object with aya-build so the binary can embed it.

use std::{env, path::PathBuf};

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // `cargo xtask setup` installs bpf-linker here; put it on the PATH so a
    // plain `cargo build` finds it too.
    println!("cargo:rerun-if-env-changed=PATH");
    if let Some(home) = env::var_os("HOME") {
        let linker_bin = PathBuf::from(home).join(".local/share/stackprobe-bpf-linker/bin");
        if linker_bin.join("bpf-linker").exists() {
            let path = env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![linker_bin];
            paths.extend(env::split_paths(&path));
            let joined = env::join_paths(paths).context("joining PATH")?;
            // SAFETY: build scripts are single-threaded here; nothing else reads the environment.
            unsafe { env::set_var("PATH", joined) };
        }
    }
    let manifest_dir = env::var("CARGO_MANIFEST_DIR")?;
    let root_dir = PathBuf::from(manifest_dir)
        .ancestors()
        .nth(2)
        .ok_or_else(|| anyhow!("cli/probes lies in no workspace"))?
        .join("probes-ebpf");
    let root_dir = root_dir.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    aya_build::build_ebpf(
        [Package {
            name: "probes-ebpf",
            root_dir,
            ..Default::default()
        }],
        Toolchain::Nightly,
    )
}

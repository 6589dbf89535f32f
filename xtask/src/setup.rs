//! Installs the build's prerequisites: nightly rust-src (for
//! `-Z build-std=core`), bpf-linker built against the nightly's own libLLVM
//! (only the Rust registry is reachable, so no prebuilt download), and the
//! Debian packages the tests call. Every step checks first, so a second run
//! does nothing slow.

use std::{
    env, fs,
    os::unix::fs::{PermissionsExt as _, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::process::{capture, run_cmd};

const BPF_LINKER_VERSION: &str = "0.13.0";
/// For `cargo xtask dist` only, so installed there and not by `setup`. Pinned
/// like bpf-linker, to a release that builds with the workspace's
/// rust-version (3.8.0 needs 1.85): an unpinned install takes the newest,
/// whatever rustc it needs.
const CARGO_DEB_VERSION: &str = "3.8.0";
/// Debian packages the tests use: setpriv (util-linux) drops privileges in the
/// "not root" test, ss (iproute2) checks TIME_WAIT counts, tmux drives the
/// dashboard in a real terminal, fonts-dejavu-core gives `report --plot` a
/// font to draw labels with; man-db, zsh and fish check what the package
/// ships (man pages rendered, completion scripts parsed:
/// cli/tests/install_artifacts.rs); openssl makes the certificates the
/// secured endpoint's test serves (cli/tests/prometheus_tls.rs).
const APT_PACKAGES: [&str; 9] = [
    "util-linux",
    "iproute2",
    "tmux",
    "fonts-dejavu-core",
    "prometheus",
    "man-db",
    "zsh",
    "fish",
    "openssl",
];

/// Where bpf-linker lives; cli/build.rs looks here too. It must persist: its
/// path to libLLVM is baked into the binary's rpath.
pub fn bpf_linker_prefix() -> Result<PathBuf> {
    let home = env::var_os("HOME").ok_or_else(|| anyhow!("HOME is not set"))?;
    Ok(PathBuf::from(home).join(".local/share/stackprobe-bpf-linker"))
}

pub fn run() -> Result<()> {
    nightly_rust_src()?;
    bpf_linker()?;
    apt_packages(&APT_PACKAGES)
}

fn nightly_rust_src() -> Result<()> {
    let installed = capture(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    match installed {
        Ok(list) if list.lines().any(|l| l.starts_with("rust-src")) => Ok(()),
        Ok(_) => run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"])),
        Err(_) => run_cmd(Command::new("rustup").args([
            "toolchain", "install", "nightly", "--profile", "minimal", "--component", "rust-src",
        ]))
        .context("no nightly toolchain and installing one failed; the eBPF build needs nightly with rust-src"),
    }
}

fn bpf_linker() -> Result<()> {
    let prefix = bpf_linker_prefix()?;
    let sysroot = capture(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let libllvm = fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        })
        .ok_or_else(|| {
            anyhow!(
                "the nightly toolchain in {} ships no libLLVM",
                lib_dir.display()
            )
        })?;
    let libllvm_name = libllvm.file_name().unwrap().to_string_lossy().into_owned();

    // The stamp names the libLLVM it was built against: a new nightly means a rebuild.
    let binary = prefix.join("bin/bpf-linker");
    let stamp = prefix.join("built-against");
    let wanted = format!("{BPF_LINKER_VERSION} {libllvm_name}");
    if binary.exists() && fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == wanted) {
        return Ok(());
    }
    if binary.exists() && !stamp.exists() && works(&binary) {
        // Built by hand with the same recipe before the stamp existed.
        fs::write(&stamp, &wanted)?;
        return Ok(());
    }

    let version = capture(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let llvm_major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .ok_or_else(|| anyhow!("rustc +nightly -vV names no LLVM version"))?
        .to_string();
    let llvm_lib = prefix.join("llvm/lib");
    fs::create_dir_all(&llvm_lib)?;
    for name in ["libLLVM.so", libllvm_name.as_str()] {
        let link = llvm_lib.join(name);
        let _ = fs::remove_file(&link);
        symlink(&libllvm, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {libllvm_name} (about a minute, once)"
    );
    run_cmd(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{llvm_major}"),
            ])
            .arg("--root")
            .arg(&prefix)
            .env("LLVM_PREFIX", prefix.join("llvm")),
    )?;
    if !works(&binary) {
        bail!(
            "bpf-linker was built but does not run: {}",
            binary.display()
        );
    }
    fs::write(&stamp, &wanted)?;
    Ok(())
}

/// cargo-deb into cargo's own bin directory, where `cargo deb` finds it;
/// reinstalled when another version is there.
pub fn cargo_deb() -> Result<()> {
    let installed = capture(Command::new("cargo").args(["deb", "--version"]));
    if installed.is_ok_and(|v| v.split_whitespace().any(|w| w == CARGO_DEB_VERSION)) {
        return Ok(());
    }
    eprintln!("xtask: building cargo-deb {CARGO_DEB_VERSION} (a few minutes, once)");
    run_cmd(Command::new("cargo").args([
        "install",
        "cargo-deb",
        "--version",
        CARGO_DEB_VERSION,
        "--locked",
        "--force",
    ]))
}

fn works(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs the Debian packages not installed yet.
pub fn apt_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !capture(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_ok_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run_cmd(Command::new("apt-get").arg("update").arg("-q"))?;
    // Packages like nginx and php-fpm start their system service on install;
    // a policy-rc.d that says no keeps the machine's ports and processes as
    // they were. One already in place is left alone.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        fs::write(
            policy,
            "#!/bin/sh\n# stackprobe setup: no service starts during install\nexit 101\n",
        )?;
        fs::set_permissions(policy, fs::Permissions::from_mode(0o755))?;
    }
    let installed = run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    if ours {
        fs::remove_file(policy)?;
    }
    installed
}

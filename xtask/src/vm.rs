//! `cargo xtask vm-test`: the integration tests, built on this host, run
//! inside Debian's own kernels booted under qemu (TCG: KVM does not work
//! here). Kernels are fetched with `apt-get download` and extracted under
//! target/vm (never installed into this machine's /boot); the guest gets a
//! busybox initramfs that loads the 9p modules and mounts this host's /usr and
//! /etc read-only, so it runs with the host's userland, and the workspace at
//! the same path, so the test binaries find the binaries they drive.
//!
//! `--arch aarch64` boots Debian's arm64 kernels under qemu-system-aarch64
//! (`-M virt`, TCG) instead: the test binaries are cross-built for
//! aarch64-unknown-linux-gnu, and the guest's userland is a small arm64
//! Debian root made with mmdebstrap (cached under target/vm), shared like
//! the workspace.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::{
    cache_key::fnv1a,
    cross,
    process::{capture, cargo, is_root, run_cmd, workspace_root},
    setup,
};

/// What qemu, the initramfs and the kernel's module tree need.
const PACKAGES: [&str; 5] = [
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
];

/// What an arm64 guest needs besides: its qemu and the arm64 root's maker
/// (the cross linker is [`cross::AARCH64_GNU`]'s).
const AARCH64_PACKAGES: [&str; 4] = ["qemu-system-arm", "mmdebstrap", "cpio", "kmod"];

/// The guest's architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// This host's: its own /usr is the guest's userland.
    #[value(name = "x86_64")]
    X86_64,
    /// Debian's arm64 kernels, cross-built tests, an arm64 root.
    Aarch64,
}

impl Arch {
    fn name(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64",
            Self::Aarch64 => "aarch64",
        }
    }
}

/// The packages of the arm64 guest's root (`mmdebstrap --variant=extract`:
/// unpacked with their dependencies, no maintainer script run, so no arm64
/// emulation on this host): glibc for the cross-built binaries, busybox for
/// the initramfs and the shell, iproute2 for the tests' `ip` and `ss`,
/// coreutils for the children the tests exec (`/bin/true`).
const AARCH64_ROOT_PACKAGES: [&str; 5] = [
    "libc6",
    "libgcc-s1",
    "busybox-static",
    "iproute2",
    "coreutils",
];
const AARCH64_ROOT_SUITE: &str = "bookworm";
/// Debian's arm64 kernels, bookworm's and its security updates'.
const ARM64_SOURCES: &str = "deb [arch=arm64] http://deb.debian.org/debian bookworm main\n\
     deb [arch=arm64] http://deb.debian.org/debian-security bookworm-security main";

/// The test binaries run in each guest by default: the probes' own tests
/// (the rest drive terminals, real services or long soaks).
pub const DEFAULT_TESTS: [&str; 6] = [
    "accept_probes",
    "connect_probes",
    "fork_probes",
    "request_path",
    "run_queue",
    "sock_probes",
];

/// A kernel of the matrix: how `--kernel` names it and which Debian package
/// holds it.
struct KernelSpec {
    name: &'static str,
    arch: Arch,
    /// Regex for `apt-cache search --names-only`; the newest match is used.
    package: &'static str,
    /// Extra apt source, for kernels this machine's sources do not carry.
    source: Option<&'static str>,
    /// The fork and accept-queue hooks that must work there (the tests
    /// fail otherwise).
    fork_hooks: &'static str,
    queue_hooks: &'static str,
}

const KERNELS: [KernelSpec; 6] = [
    KernelSpec {
        arch: Arch::X86_64,
        name: "5.10",
        package: r"^linux-image-5\.10\.0-[0-9]+-amd64-unsigned$",
        source: Some("deb http://deb.debian.org/debian bullseye main"),
        fork_hooks: "fentry,kprobe,tracepoint",
        queue_hooks: "fexit,kretprobe,fd-walk",
    },
    KernelSpec {
        arch: Arch::X86_64,
        name: "6.1",
        package: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
        source: None,
        fork_hooks: "fentry,kprobe,tracepoint",
        queue_hooks: "fexit,kretprobe,fd-walk",
    },
    KernelSpec {
        arch: Arch::X86_64,
        name: "6.12",
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$",
        source: None,
        fork_hooks: "fentry,kprobe,tracepoint",
        queue_hooks: "fexit,kretprobe,fd-walk",
    },
    KernelSpec {
        arch: Arch::X86_64,
        name: "7.3",
        package: r"^linux-binary-7\.3[.0-9]*\+deb13-amd64$",
        source: Some("deb http://deb.debian.org/debian trixie-backports main"),
        fork_hooks: "fentry,kprobe,tracepoint",
        queue_hooks: "fexit,kretprobe,fd-walk",
    },
    KernelSpec {
        arch: Arch::Aarch64,
        name: "6.1",
        package: r"^linux-image-6\.1\.0-[0-9]+-arm64-unsigned$",
        source: Some(ARM64_SOURCES),
        // arm64's BPF trampolines reach kernel functions only from 6.4
        // (ftrace direct calls): 6.1 refuses fentry and fexit with ENOTSUPP.
        fork_hooks: "kprobe,tracepoint",
        queue_hooks: "kretprobe,fd-walk",
    },
    KernelSpec {
        arch: Arch::Aarch64,
        name: "6.12",
        package: r"^linux-image-6\.12\.[0-9]+\+deb12-arm64-unsigned$",
        source: Some(ARM64_SOURCES),
        fork_hooks: "fentry,kprobe,tracepoint",
        queue_hooks: "fexit,kretprobe,fd-walk",
    },
];

impl KernelSpec {
    /// Its directory, log and share under target/vm: the x86_64 kernels keep
    /// their plain names.
    fn key(&self) -> String {
        match self.arch {
            Arch::X86_64 => self.name.to_string(),
            Arch::Aarch64 => format!("{}-{}", self.arch.name(), self.name),
        }
    }
}

#[derive(clap::Args)]
pub struct VmArgs {
    /// The guests' architecture: aarch64 cross-builds the tests and boots
    /// Debian's arm64 kernels (6.1, 6.12) under qemu-system-aarch64.
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    arch: Arch,
    /// 5.10, 6.1, 6.12, 7.3 (aarch64: 6.1, 6.12), or all; repeat for several.
    #[arg(long, default_values_t = ["6.1".to_string()])]
    kernel: Vec<String>,
    /// Test binaries (cli/tests/NAME.rs) to run in each guest.
    #[arg(long, default_values_t = DEFAULT_TESTS.map(String::from))]
    test: Vec<String>,
    /// Seconds each guest may run before it is stopped and counted failed
    /// (default 900; aarch64, whose emulation is slower: 2400).
    #[arg(long)]
    timeout: Option<u64>,
}

/// One guest's outcome.
struct Outcome {
    kernel: String,
    release: String,
    passed: bool,
    tests: (u64, u64),
    hooks: Vec<String>,
    /// ns per run of each fork and accept-queue rung's programs, as
    /// fork_probes and sock_probes measured them.
    costs: Vec<String>,
    log: PathBuf,
    took: Duration,
    /// The guest's kernel oopsed at an int3 (see [`INT3_OOPS`]).
    int3_oops: bool,
}

/// What a guest's console says when its kernel trapped on a breakpoint no
/// live code patch claimed: the kernel patches a tracepoint's call site
/// through a temporary int3 when a probe attaches or detaches, and
/// multi-threaded TCG can run a vCPU's stale copy of that byte after the
/// patch is done. Seen once in the 6.12 guest, in `__schedule` as the
/// run-queue tests attached their `sched_switch` program.
const INT3_OOPS: &str = "Oops: int3";

/// The kernels `cargo xtask test` runs besides the host's.
pub const CI_KERNELS: [&str; 2] = ["6.1", "6.12"];

impl VmArgs {
    pub fn ci() -> Self {
        Self {
            arch: Arch::X86_64,
            kernel: CI_KERNELS.map(String::from).to_vec(),
            test: DEFAULT_TESTS.map(String::from).to_vec(),
            timeout: None,
        }
    }
}

/// Runs the matrix, prints its table and returns the tests passed and
/// failed over every guest; fails if a guest did.
pub fn run(args: &VmArgs) -> Result<(u64, u64)> {
    if !is_root() {
        bail!("vm-test runs the probe tests as root inside the guests: run it with sudo");
    }
    let timeout = args.timeout.unwrap_or(match args.arch {
        Arch::X86_64 => 900,
        Arch::Aarch64 => 2400,
    });
    let specs = select(args.arch, &args.kernel)?;
    let vm_dir = workspace_root().join("target/vm");
    let (built, guest_root) = match args.arch {
        Arch::X86_64 => {
            setup::apt_packages(&PACKAGES)?;
            (build_tests(&args.test)?, None)
        }
        Arch::Aarch64 => {
            setup::apt_packages(&AARCH64_PACKAGES)?;
            let root = aarch64_root(&vm_dir)?;
            (
                cross_build_tests(&args.test, &cross::AARCH64_GNU)?,
                Some(root),
            )
        }
    };
    let mut outcomes = Vec::new();
    for spec in specs {
        let kernel = Kernel::fetch(spec, &vm_dir)?;
        let initrd = kernel.initramfs(guest_root.as_deref())?;
        let guest = Guest {
            kernel: &kernel,
            initrd: &initrd,
            built: &built,
            root: guest_root.as_deref(),
            vm_dir: &vm_dir,
            timeout,
        };
        let mut outcome = boot(&guest)?;
        if !outcome.passed && outcome.int3_oops {
            let kept = outcome.log.with_extension("oops.log");
            fs::rename(&outcome.log, &kept)?;
            eprintln!(
                "xtask: vm-test: the {} guest's kernel oopsed on a stale int3 of a live code \
                 patch (multi-threaded TCG; log: {}): booting it once more",
                outcome.kernel,
                kept.display()
            );
            outcome = boot(&guest)?;
        }
        outcomes.push(outcome);
    }
    let totals = outcomes
        .iter()
        .fold((0, 0), |(p, f), o| (p + o.tests.0, f + o.tests.1));
    println!(
        "\n| kernel | release | result | tests passed/failed | hooks (doctor) | rung costs | time |"
    );
    println!("|---|---|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {}/{} | {} | {} | {:.0} s |",
            o.kernel,
            o.release,
            if o.passed { "pass" } else { "FAIL" },
            o.tests.0,
            o.tests.1,
            o.hooks.join("; "),
            o.costs.join("; "),
            o.took.as_secs_f64()
        );
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed).collect();
    if !failed.is_empty() {
        for o in &failed {
            eprintln!(
                "xtask: vm-test on {} failed; log: {}",
                o.kernel,
                o.log.display()
            );
        }
        bail!("vm-test failed on {} kernel(s)", failed.len());
    }
    Ok(totals)
}

fn select(arch: Arch, names: &[String]) -> Result<Vec<&'static KernelSpec>> {
    let mut out: Vec<&'static KernelSpec> = Vec::new();
    let kernels = || KERNELS.iter().filter(move |k| k.arch == arch);
    for name in names {
        let picked: Vec<&'static KernelSpec> = if name == "all" {
            kernels().collect()
        } else {
            let spec = kernels().find(|k| k.name == name).ok_or_else(|| {
                let known: Vec<&str> = kernels().map(|k| k.name).collect();
                anyhow!(
                    "no {} kernel {name} in the matrix (known: {}, all)",
                    arch.name(),
                    known.join(", ")
                )
            })?;
            vec![spec]
        };
        for spec in picked {
            if !out.iter().any(|k| k.name == spec.name) {
                out.push(spec);
            }
        }
    }
    Ok(out)
}

/// What a guest runs: the test binaries and the stackprobe binary (for
/// `doctor`), built for the guest's architecture.
struct Built {
    tests: Vec<PathBuf>,
    stackprobe: PathBuf,
}

/// Builds the test binaries (and the binaries they drive) for this host.
fn build_tests(tests: &[String]) -> Result<Built> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--locked",
        "--no-run",
        "-p",
        "stackprobe",
    ]);
    built(cmd, tests)
}

/// Builds the test binaries (and the binaries they drive: stackprobe, the
/// loopback) for `target` ([`cross`]: nightly's `-Z build-std`, Debian's
/// cross gcc, target/cross-TRIPLE, so a cross build never waits on the
/// host's). The eBPF object is built again for the target: aya-build passes
/// the target's arch to the eBPF crate (`bpf_target_arch`), which is how
/// its kprobes read `pt_regs`.
fn cross_build_tests(tests: &[String], target: &cross::Target) -> Result<Built> {
    setup::apt_packages(target.packages)?;
    built(
        cross::cargo_command(target, &["test", "--no-run", "-p", "stackprobe"]),
        tests,
    )
}

/// Runs `cmd` (a `cargo test --no-run`) for `tests` and returns what it built.
fn built(mut cmd: Command, tests: &[String]) -> Result<Built> {
    cmd.args(["--message-format", "json"]);
    for t in tests {
        cmd.args(["--test", t]);
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("building the test binaries")?;
    if !out.status.success() {
        bail!("building the test binaries failed: {}", out.status);
    }
    let mut binaries = Vec::new();
    let mut stackprobe = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let kind_is = |kind: &str| {
            msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        if kind_is("test") {
            binaries.push(PathBuf::from(exe));
        } else if kind_is("bin") && msg["target"]["name"] == "stackprobe" {
            stackprobe = Some(PathBuf::from(exe));
        }
    }
    if binaries.len() != tests.len() {
        bail!(
            "expected {} test binaries, cargo built {binaries:?}",
            tests.len()
        );
    }
    Ok(Built {
        tests: binaries,
        stackprobe: stackprobe.ok_or_else(|| anyhow!("cargo built no stackprobe binary"))?,
    })
}

/// The arm64 guest's root: Debian's packages (and their dependencies)
/// unpacked by mmdebstrap, made once per package list.
fn aarch64_root(vm_dir: &Path) -> Result<PathBuf> {
    let list = format!("{AARCH64_ROOT_SUITE} {}", AARCH64_ROOT_PACKAGES.join(","));
    let root = vm_dir.join(format!("root-arm64-{:016x}", fnv1a(&list)));
    if root.join(".complete").exists() {
        return Ok(root);
    }
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(vm_dir)?;
    eprintln!("xtask: vm-test: making the arm64 root ({list})");
    run_cmd(
        Command::new("mmdebstrap")
            .args(["--variant=extract", "--architectures=arm64", "--quiet"])
            .arg(format!("--include={}", AARCH64_ROOT_PACKAGES.join(",")))
            .arg(AARCH64_ROOT_SUITE)
            .arg(&root)
            .arg("http://deb.debian.org/debian"),
    )?;
    // No maintainer script ran: the shell and /etc/hosts are ours to make.
    if !root.join("bin/sh").exists() {
        std::os::unix::fs::symlink("busybox", root.join("bin/sh"))?;
    }
    fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost\n",
    )?;
    fs::write(root.join(".complete"), &list)?;
    Ok(root)
}

struct Kernel {
    spec: &'static KernelSpec,
    /// e.g. 6.1.0-57-amd64
    release: String,
    /// The extracted package.
    root: PathBuf,
    vmlinuz: PathBuf,
    dir: PathBuf,
}

impl Kernel {
    /// Downloads and extracts the newest package of `spec`, unless a
    /// previous run left it under `vm_dir`.
    fn fetch(spec: &'static KernelSpec, vm_dir: &Path) -> Result<Self> {
        let dir = vm_dir.join(spec.key());
        let root = dir.join("root");
        if !root.join(".complete").exists() {
            fs::create_dir_all(&dir)?;
            let apt = Apt::new(spec, &dir)?;
            let package = apt.newest(spec.package)?;
            eprintln!("xtask: vm-test: fetching {package}");
            let _ = fs::remove_dir_all(&root);
            let debs = dir.join("debs");
            let _ = fs::remove_dir_all(&debs);
            fs::create_dir_all(&debs)?;
            // 7.x splits the kernel image and its modules in two packages.
            let mut packages = vec![package.clone()];
            if let Some(version) = package.strip_prefix("linux-binary-") {
                packages.push(format!("linux-modules-{version}"));
            }
            for p in &packages {
                run_cmd(apt.command(&debs).args(["download", p]))?;
            }
            for deb in fs::read_dir(&debs)? {
                run_cmd(
                    Command::new("dpkg-deb")
                        .arg("-x")
                        .arg(deb?.path())
                        .arg(&root),
                )?;
            }
            fs::write(root.join(".complete"), &package)?;
        }
        let modules = modules_dir(&root)?;
        let release = fs::read_dir(&modules)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .next()
            .ok_or_else(|| anyhow!("no kernel release under {}", modules.display()))?;
        let vmlinuz = [
            root.join(format!("boot/vmlinuz-{release}")),
            modules.join(&release).join("vmlinuz"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| anyhow!("no vmlinuz for {release} in {}", root.display()))?;
        Ok(Self {
            spec,
            release,
            root,
            vmlinuz,
            dir,
        })
    }

    /// A busybox initramfs with the modules that 9p needs (rebuilt each
    /// run: under a second, and /init follows the workspace's path). With
    /// `guest_root` (arm64), its busybox, and an /init that makes it the
    /// guest's userland.
    fn initramfs(&self, guest_root: Option<&Path>) -> Result<PathBuf> {
        let out = self.dir.join("initramfs.cpio");
        let staging = self.dir.join("initramfs");
        let _ = fs::remove_dir_all(&staging);
        for d in ["bin", "mods", "proc", "sys", "dev", "newroot"] {
            fs::create_dir_all(staging.join(d))?;
        }
        let busybox = guest_root.map_or_else(
            || PathBuf::from("/bin/busybox"),
            |root| root.join("bin/busybox"),
        );
        fs::copy(&busybox, staging.join("bin/busybox"))
            .with_context(|| format!("copying {} (busybox-static)", busybox.display()))?;
        let kernel_root = if self.root.join("lib/modules").is_dir() {
            self.root.clone()
        } else {
            self.root.join("usr")
        };
        run_cmd(
            Command::new("depmod")
                .arg("-b")
                .arg(&kernel_root)
                .arg(&self.release),
        )?;
        let mut order: Vec<String> = Vec::new();
        // unix_diag: the unix listeners' queues (sock_diag), which a real
        // host loads on demand and the guest cannot.
        for module in ["virtio_pci", "9pnet_virtio", "9p", "unix_diag"] {
            let deps = capture(Command::new("modprobe").arg("-d").arg(&kernel_root).args([
                "-S",
                &self.release,
                "--show-depends",
                module,
            ]));
            // This machine's modprobe cannot read every kernel's
            // modules.builtin index; a module with no file in the tree is
            // built in (were it missing, the guest's 9p mounts would fail).
            let deps = match deps {
                Err(_) if !has_module_file(&kernel_root, &self.release, module) => {
                    eprintln!("xtask: vm-test: {module}: no module file, taken as built in");
                    continue;
                }
                deps => deps.with_context(|| format!("finding what {module} needs"))?,
            };
            for line in deps.lines() {
                // "builtin NAME" needs nothing; "insmod PATH [params]" loads PATH.
                let Some(path) = line.strip_prefix("insmod ") else {
                    continue;
                };
                let path = path.split_whitespace().next().unwrap_or_default();
                let file = Path::new(path)
                    .file_name()
                    .and_then(|f| f.to_str())
                    .ok_or_else(|| anyhow!("odd module path {path}"))?;
                let name = file
                    .trim_end_matches(".xz")
                    .trim_end_matches(".zst")
                    .to_string();
                if order.contains(&name) {
                    continue;
                }
                let target = staging.join("mods").join(&name);
                // busybox insmod cannot read compressed modules.
                if file.ends_with(".xz") {
                    decompress("xz", path, &target)?;
                } else if file.ends_with(".zst") {
                    decompress("zstd", path, &target)?;
                } else {
                    fs::copy(path, &target)?;
                }
                order.push(name);
            }
        }
        let init = staging.join("init");
        fs::write(&init, init_script(&order, guest_root.is_some()))?;
        fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
        let list = capture(Command::new("sh").arg("-c").arg(format!(
            "cd '{}' && find . -print0 | cpio --null -o -H newc --quiet > '{}'",
            staging.display(),
            out.display()
        )));
        list.context("packing the initramfs")?;
        Ok(out)
    }
}

fn has_module_file(kernel_root: &Path, release: &str, module: &str) -> bool {
    let dep = kernel_root
        .join("lib/modules")
        .join(release)
        .join("modules.dep");
    fs::read_to_string(dep).is_ok_and(|deps| {
        deps.lines().any(|l| {
            let path = l.split(':').next().unwrap_or_default();
            Path::new(path)
                .file_name()
                .and_then(|f| f.to_str())
                .is_some_and(|f| f.split('.').next() == Some(module))
        })
    })
}

fn modules_dir(root: &Path) -> Result<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.is_dir())
        .ok_or_else(|| anyhow!("no lib/modules in {}", root.display()))
}

fn decompress(tool: &str, from: &str, to: &Path) -> Result<()> {
    let out = Command::new(tool)
        .args(["-dc", from])
        .output()
        .with_context(|| format!("running {tool}"))?;
    if !out.status.success() {
        bail!("{tool} -dc {from} failed");
    }
    fs::write(to, out.stdout)?;
    Ok(())
}

/// apt, with a state of its own when the kernel comes from a suite this
/// machine's sources do not list (the system's apt config is left alone).
struct Apt {
    options: Vec<String>,
}

impl Apt {
    fn new(spec: &KernelSpec, dir: &Path) -> Result<Self> {
        let Some(source) = spec.source else {
            return Ok(Self {
                options: Vec::new(),
            });
        };
        let state = dir.join("apt");
        fs::create_dir_all(state.join("lists/partial"))?;
        fs::create_dir_all(state.join("cache/archives/partial"))?;
        let list = state.join("sources.list");
        fs::write(&list, format!("{source}\n"))?;
        let mut options = vec![
            format!("-oDir::Etc::sourcelist={}", list.display()),
            "-oDir::Etc::sourceparts=/nonexistent".to_string(),
            format!("-oDir::State::Lists={}", state.join("lists").display()),
            format!("-oDir::Cache={}", state.join("cache").display()),
            "-oAPT::Get::List-Cleanup=0".to_string(),
        ];
        // Another architecture's packages, without `dpkg --add-architecture`
        // on this machine.
        if spec.arch == Arch::Aarch64 {
            options.push("-oAPT::Architecture=arm64".to_string());
            options.push("-oAPT::Architectures=arm64".to_string());
        }
        let apt = Self { options };
        run_cmd(apt.command(dir).args(["update", "-q"]))?;
        Ok(apt)
    }

    fn command(&self, cwd: &Path) -> Command {
        let mut cmd = Command::new("apt-get");
        cmd.current_dir(cwd).args(&self.options);
        cmd
    }

    fn newest(&self, pattern: &str) -> Result<String> {
        let found = capture(Command::new("apt-cache").args(&self.options).args([
            "search",
            "--names-only",
            pattern,
        ]))?;
        let mut names: Vec<&str> = found
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .collect();
        names.sort_by_key(|n| version_key(n));
        names
            .last()
            .map(|s| s.to_string())
            .ok_or_else(|| anyhow!("apt knows no package matching {pattern}"))
    }
}

/// Numbers in a package name, for "newest" (6.1.0-9 < 6.1.0-57).
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// /init: load the 9p modules, build a root of the host's /usr and /etc
/// (with `own_root`, of the guest's own root, shared as `sysroot`) plus the
/// workspace, and run the guest script there as PID 1.
fn init_script(modules: &[String], own_root: bool) -> String {
    let ws = workspace_root();
    let ws = ws.display();
    let insmods: String = modules
        .iter()
        .map(|m| format!("/bin/busybox insmod /mods/{m} || echo 'vm-init: insmod {m} failed'\n"))
        .collect();
    let userland = if own_root {
        "$B mkdir -p $R/sysroot
$B mount $P,ro sysroot $R/sysroot
for d in bin sbin lib usr etc var; do $B ln -s sysroot/$d $R/$d; done"
    } else {
        "$B mkdir -p $R/usr $R/etc
$B mount $P,ro usr $R/usr
$B mount $P,ro etc $R/etc
for d in bin sbin lib lib64; do [ -e $R/usr/$d ] && $B ln -s usr/$d $R/$d; done"
    };
    format!(
        r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
{insmods}R=/newroot
$B mount -t tmpfs -o size=1g tmpfs $R
$B mkdir -p $R/proc $R/sys $R/dev $R/tmp $R/run $R/root $R/vmshare
# /tmp and /run first: the workspace may live under /tmp (CI's clones do).
$B mount -t tmpfs tmpfs $R/tmp
$B mount -t tmpfs tmpfs $R/run
$B mkdir -p $R{ws}
P="-t 9p -o trans=virtio,version=9p2000.L,msize=512000"
{userland}
$B mount $P,ro ws $R{ws}
$B mount $P vmshare $R/vmshare
$B mount --move /proc $R/proc
$B mount --move /sys $R/sys
$B mount --move /dev $R/dev
exec $B switch_root $R /bin/sh /vmshare/guest.sh
"#
    )
}

/// The guest's PID 1 after switch_root: runs doctor and the tests, then
/// tells qemu the result: on x86_64 through the isa-debug-exit port (qemu
/// exits with `(code << 1) | 1`); arm64's virt machine has no such port, so
/// there it writes the result to the share and powers off.
fn guest_script(built: &Built, spec: &KernelSpec) -> String {
    let (fork_hooks, queue_hooks) = (spec.fork_hooks, spec.queue_hooks);
    let tests: String = built
        .tests
        .iter()
        .map(|b| {
            format!(
                "echo \"== test $(basename {0})\"; {0} --test-threads 1 --nocapture || rc=1\n",
                b.display()
            )
        })
        .collect();
    let report = match spec.arch {
        Arch::X86_64 => {
            "if [ $rc -eq 0 ]; then printf '\\000'; else printf '\\001'; fi | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
sleep 10"
        }
        Arch::Aarch64 => "echo $rc > /vmshare/result
sync
busybox poweroff -f",
    };
    // The arm64 root has busybox but not its applets' links (no maintainer
    // script ran): they go last on the PATH.
    let applets = match spec.arch {
        Arch::X86_64 => "",
        Arch::Aarch64 => {
            "busybox mkdir -p /run/applets && busybox --install -s /run/applets
export PATH=$PATH:/run/applets
"
        }
    };
    format!(
        r#"#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
{applets}ip link set lo up
export STACKPROBE_EXPECT_FORK_HOOKS={fork_hooks} STACKPROBE_EXPECT_QUEUE_HOOKS={queue_hooks}
echo "== kernel $(uname -r)"
rc=0
echo "== doctor"
{stackprobe} doctor
cd /tmp
{tests}echo "== result $rc"
{report}
"#,
        stackprobe = built.stackprobe.display()
    )
}

/// One boot: the kernel, its initramfs, what runs, and where.
struct Guest<'a> {
    kernel: &'a Kernel,
    initrd: &'a Path,
    built: &'a Built,
    /// The arm64 guest's own root; x86_64 guests share this host's /usr and /etc.
    root: Option<&'a Path>,
    vm_dir: &'a Path,
    timeout: u64,
}

fn boot(guest: &Guest) -> Result<Outcome> {
    let Guest {
        kernel,
        initrd,
        built,
        root,
        vm_dir,
        timeout,
    } = *guest;
    let key = kernel.spec.key();
    let share = vm_dir.join(format!("share-{key}"));
    let _ = fs::remove_dir_all(&share);
    fs::create_dir_all(&share)?;
    fs::write(share.join("guest.sh"), guest_script(built, kernel.spec))?;
    let log_path = vm_dir.join(format!("{key}.log"));
    let mut log = fs::File::create(&log_path)?;
    let virtfs = |path: &Path, tag: &str, ro: bool| {
        format!(
            "local,path={},mount_tag={tag},security_model=none{}",
            path.display(),
            if ro { ",readonly=on" } else { "" }
        )
    };
    eprintln!(
        "xtask: vm-test: booting {key} ({}) under qemu",
        kernel.release
    );
    let qemu = match kernel.spec.arch {
        Arch::X86_64 => "qemu-system-x86_64",
        Arch::Aarch64 => "qemu-system-aarch64",
    };
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=10", &timeout.to_string(), qemu])
        .args(["-accel", "tcg,thread=multi"]);
    match kernel.spec.arch {
        Arch::X86_64 => {
            cmd.args(["-cpu", "max"])
                .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"])
                .args(["-virtfs", &virtfs(Path::new("/usr"), "usr", true)])
                .args(["-virtfs", &virtfs(Path::new("/etc"), "etc", true)])
                .args(["-append", "console=ttyS0 panic=-1 quiet"]);
        }
        Arch::Aarch64 => {
            let root = root.ok_or_else(|| anyhow!("an arm64 guest needs its root"))?;
            // pauth-impdef: pointer authentication with QEMU's own cheap
            // hash rather than the architected one, which TCG emulates slowly.
            cmd.args(["-M", "virt", "-cpu", "max,pauth-impdef=on"])
                .args(["-virtfs", &virtfs(root, "sysroot", true)])
                .args(["-append", "console=ttyAMA0 panic=-1 quiet"]);
        }
    }
    let started = Instant::now();
    let mut child = cmd
        .args(["-m", "2048", "-smp", "2", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args(["-virtfs", &virtfs(&workspace_root(), "ws", true)])
        .args(["-virtfs", &virtfs(&share, "vmshare", false)])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {qemu}"))?;
    let (mut passed_tests, mut failed_tests) = (0, 0);
    let mut hooks = Vec::new();
    let mut costs = Vec::new();
    let mut in_doctor = false;
    let mut int3_oops = false;
    let mut release = kernel.release.clone();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let line = line.trim_end_matches('\r');
        println!("  [{key}] {line}");
        writeln!(log, "{line}")?;
        if let Some(r) = line.strip_prefix("== kernel ") {
            release = r.to_string();
        }
        int3_oops |= line.contains(INT3_OOPS);
        if line.starts_with("== ") {
            in_doctor = line == "== doctor";
        } else if in_doctor
            && let Some((verdict, rest)) = line.trim_start().split_once(char::is_whitespace)
        {
            // doctor: "ok    fork hook fentry/fexit on kernel_clone: attaches",
            // "note  kprobe: not available here …", "  fork latency   HOOK".
            let rest = rest.trim_start();
            if let Some(hook) = rest.strip_prefix("fork hook ") {
                let rung = hook.split(['/', ' ']).next().unwrap_or(hook);
                let rung = rung.trim_end_matches('s');
                hooks.push(format!(
                    "fork {rung} {}",
                    if verdict == "ok" { "yes" } else { "no" }
                ));
            } else if let Some(hook) = ["tp_btf", "fentry", "kprobe"]
                .into_iter()
                .find(|h| rest.starts_with(&format!("{h}:")))
            {
                hooks.push(format!(
                    "{hook} {}",
                    if verdict == "ok" { "yes" } else { "no" }
                ));
            } else if rest.starts_with("fork and vfork:") {
                hooks.push("no fork/vfork syscalls".to_string());
            } else if verdict == "fork" {
                hooks.push(format!(
                    "fork uses {}",
                    rest.trim_start_matches("latency").trim()
                ));
            }
        }
        // fork_probes prints what each fork rung cost per run here.
        // (after the test's own name, with --nocapture)
        for tag in ["fork hook cost ", "queue hook cost "] {
            if let Some(at) = line.find(tag) {
                costs.push(line[at + tag.len()..].to_string());
            }
        }
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(['.', ';']) {
                let mut words = part.split_whitespace();
                match (
                    words.next().and_then(|n| n.parse::<u64>().ok()),
                    words.next(),
                ) {
                    (Some(n), Some("passed")) => passed_tests += n,
                    (Some(n), Some("failed")) => failed_tests += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    let guest_passed = match kernel.spec.arch {
        // 1 = the guest wrote 0 (every test passed); 3 = it wrote 1; 0 = a
        // panic or no result; 124/137 = timeout.
        Arch::X86_64 => status.code() == Some(1),
        // The guest powered off (qemu exits 0, as after a panic) with its
        // result in the share.
        Arch::Aarch64 => {
            status.code() == Some(0)
                && fs::read_to_string(share.join("result")).is_ok_and(|r| r.trim() == "0")
        }
    };
    let passed = guest_passed && failed_tests == 0 && passed_tests > 0;
    if status.code() == Some(124) || status.code() == Some(137) {
        writeln!(log, "xtask: the guest ran past {timeout} s and was stopped")?;
    }
    Ok(Outcome {
        kernel: key,
        release,
        passed,
        tests: (passed_tests, failed_tests),
        hooks,
        costs,
        log: log_path,
        took: started.elapsed(),
        int3_oops,
    })
}

/// A kernel of the matrix (`name` as `--kernel` takes it), fetched if need
/// be, and its 9p initramfs, for guests that boot a root of their own
/// (the install test): the vmlinuz, the initramfs and the kernel's release.
pub(crate) fn kernel_and_initramfs(name: &str) -> Result<(PathBuf, PathBuf, String)> {
    setup::apt_packages(&PACKAGES)?;
    let spec = select(Arch::X86_64, &[name.to_string()])?
        .pop()
        .ok_or_else(|| anyhow!("no kernel {name}"))?;
    let kernel = Kernel::fetch(spec, &workspace_root().join("target/vm"))?;
    let initrd = kernel.initramfs(None)?;
    Ok((kernel.vmlinuz, initrd, kernel.release))
}

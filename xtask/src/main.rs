//! Orchestration: `cargo xtask setup | build | run | install | dist | test`, and
//! the checks and benchmarks around them.
//! The eBPF object itself is built by cli/probes/build.rs (aya-build); this only
//! makes sure the tools it needs are there, and drives cargo.

mod bench;
mod cache_key;
mod cross;
mod dist;
mod install;
mod install_test;
mod lab;
mod layers;
mod module_graph;
mod process;
mod setup;
mod tarball;
mod tasks;
mod vm;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build and tests need (idempotent: fast when done).
    Setup,
    /// Set up and build everything in release mode.
    Build,
    /// Set up, build and run stackprobe (as root, via sudo if needed):
    /// `cargo xtask run -- watch postgres`; with no arguments, `stackprobe demo`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build and install `stackprobe` into /usr/local/bin, and the
    /// agent's systemd unit (enabled only with --enable-agent).
    Install(install::InstallArgs),
    /// Build the release binary and a Debian package of it (binary, man
    /// pages, completions, docs, the agent's unit neither enabled nor
    /// started), and a static musl build in a tarball with the same files,
    /// into target/dist with SHA256SUMS, then check what each holds and
    /// what the package's scripts do; then the arm64 package, cross-built
    /// (no static arm64 build: Debian 12 has no aarch64 musl toolchain).
    /// Installs cargo-deb, musl-tools and the aarch64 cross gcc if needed.
    Dist {
        /// Leave the arm64 package out (its cross build takes minutes).
        #[arg(long)]
        no_arm64: bool,
    },
    /// Run `dist`, then install its .deb and its tarball on a clean Debian
    /// 12 under qemu (a root made by mmdebstrap, Debian's 6.1 kernel) and
    /// check each works there and leaves nothing behind (as root).
    InstallTest(install_test::Args),
    /// Set up, then run the whole test suite: formatting, clippy, the
    /// layers' dependencies (check-layers), module cycles (check-modules),
    /// unit tests, the root-only integration tests
    /// that load the real probes, and the probe tests again inside Debian's
    /// 6.1 and 6.12 kernels under qemu, and `install-test`.
    Test {
        /// Skip the qemu kernels (a quicker local run; CI runs them).
        #[arg(long)]
        no_vm: bool,
    },
    /// Fails if one of cli's layer crates depends on a crate it may not
    /// (one above it, or the kernel or a terminal for the model).
    CheckLayers,
    /// Fails if the modules of a crate depend on each other in a cycle.
    /// With no DIRS, the source roots `test` checks.
    CheckModules {
        /// The workspace whose source roots are checked (default: this one).
        #[arg(long)]
        root: Option<PathBuf>,
        /// Source roots relative to --root, e.g. cli/src.
        dirs: Vec<String>,
    },
    /// Benchmarks (as root). Without a subcommand: everything, written to
    /// BENCHMARKS.md; `accept`, `fork`, `churn`: one probe-cost table.
    Bench {
        #[command(subcommand)]
        which: Option<Bench>,
        /// Shorter runs, for a smoke check (not for the record).
        #[arg(long)]
        quick: bool,
    },
    /// The probe tests inside Debian's kernels under qemu (as root):
    /// `--kernel 5.10|6.1|6.12|7.3|all`.
    VmTest(vm::VmArgs),
    /// A real nginx → nginx → php-fpm → postgres stack on loopback (as root):
    /// `up`, `load`, `status`, `down`.
    Lab {
        #[command(subcommand)]
        which: Lab,
    },
}

#[derive(Subcommand)]
enum Lab {
    /// Install the packages and start the stack in /tmp/stackprobe-lab.
    Up,
    /// Drive it with wrk for a bounded time.
    Load(lab::LoadArgs),
    /// Which services are running.
    Status,
    /// Stop everything and remove the directory.
    Down,
}

#[derive(Subcommand)]
enum Bench {
    /// Accept probes: a server accepting loopback connections.
    Accept(BenchArgs),
    /// Fork and lifecycle probes: a server forking a child per connection.
    Fork(BenchArgs),
    /// TCP state probe: connections opened and closed (clients close first).
    Churn(BenchArgs),
    /// Sections 2 and 5 alone, with the per-program breakdown, printed and
    /// not written to BENCHMARKS.md (no idle measurement). Uses the lab as
    /// found if it is up; else brings it up and takes it down after.
    Server(ServerArgs),
    /// Section 6 alone: `--run-queue` on the lab, beside runqlat.
    RunQueue {
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Seconds of load per configuration and round.
        #[arg(long, default_value_t = 31)]
        seconds: u64,
    },
    /// Another build of stackprobe (`--baseline`) and this tree's watching
    /// the lab at once, both orders each round: each program's ns per run
    /// in both, and their ratio with the order's advantage taken out.
    Pair {
        /// The other build's binary (e.g. a worktree's
        /// target/release/stackprobe).
        #[arg(long)]
        baseline: std::path::PathBuf,
        #[command(flatten)]
        load: lab::LoadArgs,
        /// Rounds, each of both orders; medians are reported.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
    },
    /// Each program's time by source line under the lab's load (perf).
    Lines {
        #[command(flatten)]
        load: lab::LoadArgs,
        /// Source lines shown per program.
        #[arg(long, default_value_t = 12)]
        top: usize,
    },
}

#[derive(clap::Args)]
struct ServerArgs {
    /// Rounds; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Seconds of load per configuration and round (stackprobe walks
    /// TIME_WAIT sockets every 30 s: shorter rounds may leave a walk out).
    #[arg(long, default_value_t = 31, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// Lab pages to load (repeatable; default: static and new).
    #[arg(long, value_enum)]
    page: Vec<lab::Page>,
    /// wrk connections (repeatable; default: 8 and 32).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    connections: Vec<u32>,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Operations (accepts, forks) per measurement.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Rounds; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build => setup::run().and_then(|()| tasks::build()),
        Task::Run { args } => setup::run().and_then(|()| tasks::run(&args)),
        Task::Install(args) => setup::run().and_then(|()| install::run(&args)),
        Task::Dist { no_arm64 } => setup::run().and_then(|()| dist::run(!no_arm64)),
        Task::InstallTest(args) => setup::run().and_then(|()| install_test::run(&args)),
        // The lab tests run the real stack, so its packages come first.
        Task::Test { no_vm } => setup::run()
            .and_then(|()| setup::apt_packages(&lab::PACKAGES))
            .and_then(|()| tasks::test(!no_vm)),
        Task::CheckLayers => layers::check(),
        Task::CheckModules { root, dirs } => {
            let root = root.unwrap_or_else(process::workspace_root);
            if dirs.is_empty() {
                module_graph::check(&root, &module_graph::CHECKED)
            } else {
                module_graph::check(&root, &dirs)
            }
        }
        Task::VmTest(args) => setup::run().and_then(|()| vm::run(&args).map(|_| ())),
        Task::Lab { which } => match which {
            Lab::Up => lab::up(),
            Lab::Load(args) => lab::load(&args),
            Lab::Status => lab::status(),
            Lab::Down => lab::down(),
        },
        Task::Bench { which, quick } => setup::run()
            .and_then(|()| setup::apt_packages(&lab::PACKAGES))
            .and_then(|()| setup::apt_packages(&bench::PACKAGES))
            .and_then(|()| match &which {
                None => bench::all(&bench::Scale { quick }),
                Some(Bench::Server(args)) => bench::server_standalone(&bench::ServerOptions {
                    rounds: args.rounds,
                    seconds: args.seconds,
                    pages: if args.page.is_empty() {
                        vec![lab::Page::Static, lab::Page::New]
                    } else {
                        args.page.clone()
                    },
                    connections: if args.connections.is_empty() {
                        vec![8, 32]
                    } else {
                        args.connections.clone()
                    },
                    idle: false,
                }),
                Some(Bench::RunQueue { rounds, seconds }) => {
                    bench::run_queue::standalone(&bench::run_queue::Length {
                        rounds: *rounds,
                        seconds: *seconds,
                    })
                }
                Some(Bench::Pair {
                    baseline,
                    load,
                    rounds,
                }) => bench::pair_standalone(baseline, load, *rounds),
                Some(Bench::Lines { load, top }) => bench::prepare()
                    .and_then(|()| setup::apt_packages(&bench::lines::PACKAGES))
                    .and_then(|()| bench::lines::run(load, *top))
                    .map(|md| print!("{md}")),
                Some(which) => {
                    let (workload, args) = match which {
                        Bench::Accept(a) => (&bench::ACCEPT, a),
                        Bench::Fork(a) => (&bench::FORK, a),
                        Bench::Churn(a) => (&bench::CHURN, a),
                        Bench::Server(_)
                        | Bench::RunQueue { .. }
                        | Bench::Lines { .. }
                        | Bench::Pair { .. } => {
                            unreachable!("matched above")
                        }
                    };
                    bench::prepare()?;
                    let cost = bench::probe_cost::run(workload, args.ops, args.rounds)?;
                    print!("{}", cost.markdown());
                    Ok(())
                }
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

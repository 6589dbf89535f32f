//! Loads the embedded eBPF object, attaches every probe and owns them: dropping
//! [`Probes`] (normal exit, signal, or unwinding panic) detaches them all, and
//! the kernel does the same if the process dies outright, since nothing is
//! pinned.

use std::os::fd::{AsFd as _, OwnedFd};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    sys::{Stats, enable_stats},
};
use probes_common::{
    MAX_SLOTS, SLOT_MASK_GLOBAL, TASK_COMM_LEN,
    event::EVENTS_MAP,
    stats::{Counters, STATS_MAP, Stat},
    watch::WatchReason,
};

use super::{
    accept,
    attach::Setup,
    btf::KernelBtf,
    connect, fork,
    hist::KernelHists,
    kernel_log::{self, KernelLog},
    preflight, prog_info, run_queue,
    rungs::{ForkRung, QueueRung, StateRung, UnixQueueRung, UnixServiceRung},
    self_check, services, tcp,
    tracefs::Tracefs,
    unix_queue, watch,
    watch::WatchSet,
};
use crate::procfs;
use stackprobe_model::{
    event::Event,
    probe_stats::{Drops, LostEvents, ProbeKind, ProgramCost, RungInUse},
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probes"));

#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Turn on the kernel's BPF run-time statistics while loaded, to report
    /// what each probe costs (the kernel then adds ~20 ns to every BPF run).
    pub probe_cost: bool,
    /// Use this fork hook or fail, instead of the best one the kernel offers.
    pub fork_rung: Option<ForkRung>,
    /// Likewise for the accept-queue wait's hook.
    pub queue_rung: Option<QueueRung>,
    /// Likewise for the unix queue wait's start.
    pub unix_queue_rung: Option<UnixQueueRung>,
    /// Time unix connections' service and count their busy servers where
    /// the kernel lacks fentry too: a program on every close(2) on the
    /// host (see services). Where it has fentry they are served anyway.
    pub unix_service: bool,
    /// Use this hook for unix connections' ends or fail.
    pub unix_service_rung: Option<UnixServiceRung>,
    /// Time watched threads' waits for a CPU, their slices on it and their
    /// preemptions: a program on every context switch on the host (see
    /// run_queue).
    pub run_queue: bool,
    /// Print what the probes log about what only the kernel sees (see
    /// `kernel_log`) to stderr; off, the logging code is not even loaded.
    pub log_probes: bool,
}

pub struct Probes {
    // Unmapped before the maps close.
    watch_set: WatchSet,
    ebpf: Ebpf,
    hists: KernelHists,
    fork_rung: ForkRung,
    queue_rung: QueueRung,
    unix_queue_rung: UnixQueueRung,
    unix_service: Option<UnixServiceRung>,
    run_queue: bool,
    state_rung: StateRung,
    /// Why the state probe is not on tp_btf, if it is not.
    state_btf_refused: Option<String>,
    _stats: Option<OwnedFd>,
    // Last: it prints what the programs log until they are detached.
    _kernel_log: Option<KernelLog>,
}

impl Probes {
    pub fn load(options: Options) -> Result<Self> {
        preflight::check_privileges()?;
        preflight::check_lockdown()?;
        preflight::require_btf()?;
        let tracefs = Tracefs::open_or_mount()?;

        let slots = slot_count(procfs::pid_max());
        let kernel = KernelFacts::read(&tracefs, slots)?;
        // The kernel's BTF is big once aya has parsed it (~14 MB, ~23 MB while
        // parsing): only one copy at a time, or the load's peak memory is
        // their sum. aya 0.14's loader parses one of its own as it is made
        // (it has no constructor that does not), so that one serves the load
        // and is freed before the one for attaching is parsed.
        let chosen_btf = preflight::btf_override()?;
        let mut loader = EbpfLoader::new();
        if let Some(btf) = &chosen_btf {
            loader.btf(Some(btf));
        }
        let slot_mask = slots - 1;
        loader.override_global(SLOT_MASK_GLOBAL, &slot_mask, true);
        let logger = options.log_probes.then(kernel_log::logger);
        let log_level = kernel_log::kernel_level(logger.as_ref());
        loader.override_global(kernel_log::LEVEL_GLOBAL, &log_level, true);
        for setup in &kernel.setups {
            for (name, value) in &setup.globals {
                loader.override_global(name, value, true);
            }
            for &(name, size) in &setup.map_sizes {
                loader.map_max_entries(name, size);
            }
        }
        let ebpf = loader.load(OBJECT).context("loading the eBPF object");
        drop(loader);
        drop(chosen_btf);
        let mut ebpf = ebpf?;
        let btf = preflight::load_btf()?;
        // Before anything attaches, so a failing load still prints what the
        // probes logged on the way (the reader flushes when dropped).
        let kernel_log = logger
            .map(|logger| KernelLog::start(&mut ebpf, logger))
            .transpose()?;
        let watch_set = WatchSet::take(&mut ebpf)?;

        let stats = if options.probe_cost {
            Some(enable_stats(Stats::RunTime).context("enabling BPF run-time statistics")?)
        } else {
            None
        };
        // Watch-set programs first, so a watched process's children are
        // followed before any accept is timed.
        let unix_service = services::attach(
            &mut ebpf,
            &tracefs,
            &btf,
            options.unix_service_rung,
            options.unix_service,
        )?;
        watch::attach(&mut ebpf, &tracefs)?;
        let fork_rung = fork::attach(&mut ebpf, &tracefs, &btf, options.fork_rung)?;
        let queue_rung = accept::attach(
            &mut ebpf,
            &tracefs,
            &btf,
            &kernel.fexit_program,
            options.queue_rung,
        )?;
        connect::attach(&mut ebpf, &tracefs)?;
        let unix_queue_rung =
            unix_queue::attach(&mut ebpf, &tracefs, &btf, options.unix_queue_rung)?;
        tcp::load(&mut ebpf, &btf)?;
        let (state_rung, state_btf_refused) =
            tcp::attach(&mut ebpf, &tracefs, &btf, kernel.state_tp_btf)?;
        if options.run_queue {
            run_queue::attach(&mut ebpf, &btf)?;
        }
        // Nothing needs the kernel's BTF any more. Freed and handed back now,
        // before the self-check maps the ring (the kernel maps all its
        // pages at once, so they count as resident), the two do not add up.
        drop(btf);
        release_free_heap();
        self_check::run(&mut ebpf, &watch_set)?;
        // Attached tracepoints need tracefs no more: if stackprobe mounted
        // it, it is unmounted now, while the privilege to do so is at hand.
        drop(tracefs);
        Ok(Self {
            watch_set,
            ebpf,
            hists: KernelHists::default(),
            fork_rung,
            queue_rung,
            unix_queue_rung,
            unix_service,
            run_queue: options.run_queue,
            state_rung,
            state_btf_refused,
            _stats: stats,
            _kernel_log: kernel_log,
        })
    }

    /// The hook fork latency comes from on this kernel.
    pub fn fork_rung(&self) -> ForkRung {
        self.fork_rung
    }

    /// The rung of each hook ladder in use, for reports.
    pub fn rungs_in_use(&self) -> Vec<RungInUse> {
        vec![
            RungInUse {
                metric: "fork",
                hook: self.fork_rung.name(),
                description: self.fork_rung.describe(),
            },
            RungInUse {
                metric: "accept_queue",
                hook: self.queue_rung.name(),
                description: self.queue_rung.describe(),
            },
            RungInUse {
                metric: "unix_queue",
                hook: self.unix_queue_rung.name(),
                description: self.unix_queue_rung.describe(),
            },
            services::in_use(self.unix_service),
            run_queue::in_use(self.run_queue),
            RungInUse {
                metric: "tcp_state",
                hook: self.state_rung.name(),
                description: self.state_rung.describe(),
            },
        ]
    }

    /// The hook TCP state changes are counted from on this kernel.
    pub fn state_rung(&self) -> StateRung {
        self.state_rung
    }

    /// Why the state probe is on the classic tracepoint, if it is: this
    /// kernel's BTF cannot serve it, or its verifier refused the tp_btf
    /// programs (a defect of ours).
    pub fn state_btf_refused(&self) -> Option<&str> {
        self.state_btf_refused.as_deref()
    }

    /// How the accept probe finds an accepted socket on this kernel.
    pub fn queue_rung(&self) -> QueueRung {
        self.queue_rung
    }

    /// Where a unix connection's queue wait starts on this kernel.
    pub fn unix_queue_rung(&self) -> UnixQueueRung {
        self.unix_queue_rung
    }

    /// The hook unix connections' ends come from, if they are served.
    pub fn unix_service_rung(&self) -> Option<UnixServiceRung> {
        self.unix_service
    }

    /// Tells the kernel that `owner` listens on the unix socket with inode
    /// `inode`, so its queue is timed.
    pub fn watch_unix_listener(&mut self, inode: u64, owner: u32) -> Result<()> {
        unix_queue::watch_listener(&mut self.ebpf, inode, owner)
    }

    /// Forgets the unix listeners `keep` says no watched process holds.
    pub fn forget_unix_listeners(&mut self, keep: impl Fn(u64) -> bool) -> Result<()> {
        unix_queue::forget_listeners(&mut self.ebpf, keep)
    }

    /// Forgets the busy count of `server` (a process that exited holding
    /// nothing), so the kernel's table keeps room for new ones.
    pub fn forget_server(&mut self, server: u32) -> Result<()> {
        services::forget_server(&mut self.ebpf, server)
    }

    /// Each server's busy count and its most held since the last call.
    pub fn take_busy(&mut self) -> Result<Vec<(u32, probes_common::service::Busy, u64)>> {
        services::take_busy(&mut self.ebpf)
    }

    /// Unix connects a full queue refused since load, per destination id.
    pub fn unix_lost(&self) -> Result<Vec<(u64, u64)>> {
        unix_queue::lost(&self.ebpf)
    }

    /// The name of the destination the kernel ids `id` (see
    /// [`connect::destination_name`]): a unix path as the client gave it.
    pub fn destination_name(&self, id: u64) -> Option<String> {
        connect::destination_name(&self.ebpf, id)
    }

    /// Tries the optional hooks (tp_btf, fentry, kprobe) on this kernel.
    pub fn check_attach_types(&mut self) -> Result<Vec<super::attach_check::AttachCheck>> {
        let btf = preflight::load_btf()?;
        Ok(super::attach_check::check(&mut self.ebpf, &btf))
    }

    pub fn watch_names(&mut self, keys: &[[u8; TASK_COMM_LEN]]) -> Result<()> {
        watch::add_names(&mut self.ebpf, keys)
    }

    /// Watches what execs in these cgroups (v2 ids) from now on; returns
    /// how many were new.
    pub fn watch_cgroups(&mut self, ids: &[u64]) -> Result<usize> {
        watch::add_cgroups(&mut self.ebpf, ids)
    }

    pub fn watch_pid(&mut self, tgid: u32) -> Result<()> {
        self.watch_set.add(tgid)
    }

    pub fn watched(&self) -> Vec<(u32, Option<WatchReason>)> {
        self.watch_set.pids()
    }

    /// Every TCP socket on the machine now, from the iterator.
    pub fn tcp_sockets(&mut self) -> Result<Vec<stackprobe_model::tcp::sockets::TcpSock>> {
        tcp::snapshot(&mut self.ebpf)
    }

    /// Walks every TCP socket of stackprobe's network namespace and of
    /// the others in `elsewhere` ((inode number, a process there)), the
    /// kernel counting TIME_WAIT sockets per link (walk number
    /// `generation`) and writing only listeners.
    pub fn tcp_walk(&mut self, generation: u32, elsewhere: &[(u32, u32)]) -> Result<tcp::Walked> {
        tcp::walk(&mut self.ebpf, generation, elsewhere)
    }

    /// Every TCP link the kernel counts, with its totals since load.
    pub fn tcp_links(
        &mut self,
    ) -> Result<
        Vec<(
            stackprobe_model::tcp::key::KernelLink,
            stackprobe_model::tcp::counts::LinkTotals,
        )>,
    > {
        tcp::links(&mut self.ebpf)
    }

    /// Removes links from the kernel's count (their owners exited).
    pub fn forget_tcp_links(
        &mut self,
        links: &[stackprobe_model::tcp::key::KernelLink],
    ) -> Result<()> {
        tcp::forget_links(&mut self.ebpf, links)
    }

    /// Tells the kernel that `owner` listens on `port` in `netns`.
    pub fn set_listen_owner(
        &mut self,
        netns: stackprobe_model::tcp::sockets::Netns,
        port: u16,
        owner: u32,
    ) -> Result<()> {
        tcp::set_listen_owner(&mut self.ebpf, netns, port, owner)
    }

    /// The ring buffer every probe writes to; can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(EVENTS_MAP)
            .ok_or_else(|| anyhow!("the events ring buffer was already taken"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Hands `f` what the kernel's latency histograms gained since the last
    /// call (see probes_common::hist): every accept and clone sample.
    pub fn drain_histograms(
        &mut self,
        live: impl Fn(u32) -> bool,
        f: impl FnMut(Event),
    ) -> Result<()> {
        self.hists.drain(&mut self.ebpf, live, f)
    }

    /// The kernel's counters, summed over the CPUs.
    fn counters(&self) -> Result<Counters> {
        let map = self
            .ebpf
            .map(STATS_MAP)
            .context("the probes lack the STATS map")?;
        let stats: PerCpuArray<_, Counters> = PerCpuArray::try_from(map)?;
        let mut sum = Counters::default();
        for cpu in stats.get(&0, 0)?.iter() {
            sum.add(cpu);
        }
        Ok(sum)
    }

    pub fn drops(&self) -> Result<Drops> {
        let counters = self.counters()?;
        Ok(Drops::from_stats(
            |stat| counters.get(stat),
            self.skipped_runs(&counters)?,
        ))
    }

    /// Runs each program missed because a BPF program was already running
    /// on that CPU: the kernel's `recursion_misses` (5.12+; older kernels
    /// do not say, and it reads 0).
    fn skipped_runs(&self, counters: &Counters) -> Result<LostEvents> {
        let mut skipped = LostEvents::default();
        for (name, program) in self.loaded_programs() {
            let misses = prog_info::run_stats(program.fd()?.as_fd())
                .with_context(|| format!("reading the run statistics of {name}"))?
                .recursion_misses;
            if misses > 0
                && let Some(kind) = probe_kind_of(name)
                && name != probes_common::sock::STATE_BTF_NESTED_PROGRAM
            {
                *skipped.of_kind(kind) += misses;
            }
        }
        // The state probe's nested copy handled the changes its first copy
        // was skipped for (its own misses are changes the first handled).
        let nested = counters.get(Stat::TcpStateNested);
        let state = skipped.of_kind(ProbeKind::TcpState);
        *state = state.saturating_sub(nested);
        Ok(skipped)
    }

    /// Run counts and times per program; all zero unless loaded with
    /// `probe_cost`.
    pub fn costs(&self) -> Result<Vec<ProgramCost>> {
        let mut out = Vec::new();
        for (name, program) in self.loaded_programs() {
            let stats = prog_info::run_stats(program.fd()?.as_fd())
                .with_context(|| format!("reading the run statistics of {name}"))?;
            out.push(ProgramCost {
                program: name.to_string(),
                runs: stats.runs,
                run_time_ns: stats.run_time_ns,
            });
        }
        out.sort_by(|a, b| a.program.cmp(&b.program));
        Ok(out)
    }

    /// The object's programs that are in the kernel: all but the hook
    /// checks, which only `doctor` loads.
    fn loaded_programs(&self) -> impl Iterator<Item = (&str, &aya::programs::Program)> {
        self.ebpf.programs().filter(|(_, p)| p.fd().is_ok())
    }

    /// Kernel ids of every loaded program, so tests can check they go away.
    #[cfg(any(test, feature = "test-support"))]
    pub fn program_ids(&self) -> Result<Vec<u32>> {
        self.loaded_programs()
            .map(|(name, p)| {
                p.info()
                    .map(|i| i.id())
                    .with_context(|| format!("reading info of {name}"))
            })
            .collect()
    }
}

/// Hands the heap's free pages back to the kernel. glibc trims its main
/// heap only from the top, and aya's parse of the kernel's BTF leaves ~20 MB
/// free below live allocations: resident until reused.
fn release_free_heap() {
    // SAFETY: malloc_trim only releases memory that malloc holds free.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What the load needs from the kernel's BTF through stackprobe's own parser
/// (struct member offsets and a function's signature), gathered at once so
/// that parse is freed before aya parses its own.
struct KernelFacts {
    setups: [Setup; 8],
    fexit_program: Result<&'static str>,
    state_tp_btf: bool,
}

impl KernelFacts {
    fn read(tracefs: &Tracefs, slots: u32) -> Result<Self> {
        let btf = KernelBtf::from_file(&preflight::btf_path())?;
        Ok(Self {
            setups: [
                accept::setup(tracefs, &btf, slots)?,
                fork::setup(tracefs, &btf, slots)?,
                watch::setup(tracefs)?,
                tcp::setup(&btf, tracefs)?,
                connect::setup(tracefs, slots)?,
                unix_queue::setup(tracefs, &btf)?,
                services::setup(tracefs, &btf)?,
                run_queue::setup(&btf, slots)?,
            ],
            fexit_program: accept::fexit_program(&btf),
            state_tp_btf: tcp::tp_btf_readable(&btf),
        })
    }
}

/// What the program `name` records, or helps record (an enter half): a
/// skipped run loses one of those. None for programs that record nothing
/// of their own, like the TCP iterator.
fn probe_kind_of(name: &str) -> Option<ProbeKind> {
    use probes_common::{accept, connect, fork, sock, watch};
    let accept_programs = [
        accept::ENTER_PROGRAM,
        accept::EXIT_PROGRAM,
        accept::KRETPROBE_PROGRAM,
    ];
    let fork_programs = [
        fork::FENTRY_PROGRAM,
        fork::FEXIT_PROGRAM,
        fork::KPROBE_PROGRAM,
        fork::KRETPROBE_PROGRAM,
        fork::ENTER_CLONE_PROGRAM,
        fork::ENTER_CLONE3_PROGRAM,
        fork::ENTER_FORK_PROGRAM,
        fork::EXIT_PROGRAM,
    ];
    if accept_programs.contains(&name) || accept::FEXIT_PROGRAMS.iter().any(|&(_, p)| p == name) {
        Some(ProbeKind::Accept)
    } else if fork_programs.contains(&name) {
        Some(ProbeKind::Fork)
    } else {
        match name {
            watch::FORK_PROGRAM => Some(ProbeKind::Spawn),
            watch::EXEC_PROGRAM => Some(ProbeKind::Exec),
            watch::EXIT_PROGRAM => Some(ProbeKind::Exit),
            sock::STATE_PROGRAM | sock::STATE_BTF_PROGRAM | sock::STATE_BTF_NESTED_PROGRAM => {
                Some(ProbeKind::TcpState)
            }
            connect::ENTER_PROGRAM | connect::EXIT_PROGRAM => Some(ProbeKind::Connect),
            probes_common::run_queue::WAKEUP_PROGRAM
            | probes_common::run_queue::WAKEUP_NEW_PROGRAM
            | probes_common::run_queue::SWITCH_PROGRAM => Some(ProbeKind::RunQueue),
            probes_common::unix::DATA_READY_PROGRAM
            | probes_common::service::CLOSE_PROGRAM
            | probes_common::service::EXIT_PROGRAM => Some(ProbeKind::Accept),
            _ => None,
        }
    }
}

/// Per-thread slots for syscalls in flight: enough for every thread id when
/// `pid_max` allows (MAX_SLOTS, 2^18); beyond that a shared slot is counted
/// as a drop.
pub fn slot_count(pid_max: u32) -> u32 {
    pid_max
        .max(2)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX)
        .min(MAX_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_recording_program_has_a_kind() {
        let mut l = LostEvents::default();
        for name in [
            "accept_enter",
            "accept_exit",
            "inet_csk_accept_fexit4",
            "clone_enter",
            "clone3_enter",
            "fork_enter",
            "clone_exit",
            "kernel_clone_kretprobe",
            "watch_fork",
            "watch_exec",
            "watch_exit",
            "tcp_state",
        ] {
            *l.of_kind(probe_kind_of(name).unwrap_or_else(|| panic!("{name}"))) += 1;
        }
        assert_eq!(
            (l.accept, l.fork, l.spawn, l.exec, l.exit, l.tcp_state),
            (3, 5, 1, 1, 1, 1)
        );
        assert!(probe_kind_of("tcp_sockets").is_none());
    }

    #[test]
    fn the_run_queue_programs_record_run_queue_samples() {
        for name in probes_common::run_queue::PROGRAMS.map(|(p, _)| p) {
            assert_eq!(probe_kind_of(name), Some(ProbeKind::RunQueue), "{name}");
        }
    }

    #[test]
    fn both_state_programs_record_tcp_state_changes() {
        for name in ["tcp_state", "tcp_state_btf"] {
            assert_eq!(probe_kind_of(name), Some(ProbeKind::TcpState), "{name}");
        }
    }

    #[test]
    fn slots_cover_pid_max_up_to_the_cap() {
        assert_eq!(slot_count(32768), 32768);
        assert_eq!(slot_count(100_000), 131072);
        assert_eq!(slot_count(4_194_304), MAX_SLOTS);
        assert_eq!(slot_count(0), 2);
    }
}

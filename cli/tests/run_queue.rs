//! Run-queue latency against the kernel's own account of the same threads
//! (`/proc/PID/task/TID/schedstat`: time on CPU, time waiting on a run
//! queue, times run; `status`: involuntary switches). Root only: loads the
//! real probes.

mod support;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use probes_common::stats::Stat;
use stackprobe_model::measure::{Count, Latency};
use stackprobe_probes::Options;
use support::*;

/// What the kernel accounts for a process's threads, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Account {
    on_cpu_ns: u64,
    waited_ns: u64,
    /// Times a thread went on a CPU: its switches off one (`status`'s
    /// voluntary and involuntary context switches), each of which follows
    /// one, for threads asleep when the account is read.
    runs: u64,
    involuntary: u64,
    /// The probes' only: slices on a CPU, one per run seen (its wait too,
    /// for threads asleep when watched).
    slices: u64,
    /// schedstat's count of runs after a wait (the kernel's only; shown,
    /// not compared): on 6.18 it counted 1–3 runs in ~240 more than the
    /// `sched_switch` events that switched the threads in, for bpftrace
    /// too, and more than their context switches.
    pcount: u64,
}

/// The sum over `pid`'s threads, once every one of them is asleep and the
/// sum held still over two reads (bounded): a thread still running would
/// add a switch after the read.
fn quiet_account(pid: u32) -> Account {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = None;
    loop {
        let (now, all_asleep) = account(pid);
        if all_asleep && last == Some(now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{pid}'s threads never held still"
        );
        last = Some(now);
        thread::sleep(Duration::from_millis(100));
    }
}

/// A thread's schedstat (its /proc/PID/task/TID directory): time on a CPU,
/// time waiting on a run queue, runs after a wait.
fn schedstat(task: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(task.join("schedstat"))
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

fn account(pid: u32) -> (Account, bool) {
    let mut sum = Account::default();
    let mut all_asleep = true;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let f = schedstat(&dir);
        sum.on_cpu_ns += f[0];
        sum.waited_ns += f[1];
        sum.pcount += f[2];
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("nonvoluntary_ctxt_switches:") {
                let n = v.trim().parse::<u64>().unwrap();
                sum.involuntary += n;
                sum.runs += n;
            }
            if let Some(v) = line.strip_prefix("voluntary_ctxt_switches:") {
                sum.runs += v.trim().parse::<u64>().unwrap();
            }
            if let Some(state) = line.strip_prefix("State:") {
                all_asleep &= state.trim().starts_with('S');
            }
        }
    }
    (sum, all_asleep)
}

/// The kernel's account of `pid` and the probes' (`seen`) at one instant:
/// the kernel's read again after the probes' were drained, until nothing
/// ran in between (bounded), so that neither counts a run the other missed.
fn both_accounts(
    s: &mut Session,
    pid: u32,
    seen: impl Fn(&Session) -> Account,
) -> (Account, Account) {
    for _ in 0..50 {
        let kernel = quiet_account(pid);
        s.collect();
        let probes = seen(s);
        if account(pid).0 == kernel {
            return (kernel, probes);
        }
    }
    panic!("{pid}'s threads kept running while the probes were read");
}

/// What the probes saw of `pid`, in the same terms.
fn seen(s: &Session, pid: u32) -> Account {
    let a = &s.collector.table().get(pid).unwrap().activity;
    let waited = &a.latency[Latency::RunQueue].total;
    let on_cpu = &a.latency[Latency::OnCpu].total;
    Account {
        slices: on_cpu.count(),
        on_cpu_ns: on_cpu.sum_ns() as u64,
        waited_ns: waited.sum_ns() as u64,
        runs: waited.count(),
        involuntary: a.counts[Count::Preempted].total,
        pcount: 0,
    }
}

fn minus(after: Account, before: Account) -> Account {
    Account {
        on_cpu_ns: after.on_cpu_ns - before.on_cpu_ns,
        waited_ns: after.waited_ns - before.waited_ns,
        runs: after.runs - before.runs,
        pcount: after.pcount - before.pcount,
        slices: after.slices - before.slices,
        involuntary: after.involuntary - before.involuntary,
    }
}

/// Each of `pid`'s threads' time on a CPU and waiting for one, by tid.
fn thread_times(pid: u32) -> HashMap<String, u64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|task| {
            let dir = task.unwrap().path();
            let f = schedstat(&dir);
            let tid = dir.file_name().unwrap().to_string_lossy().into_owned();
            (tid, f[0] + f[1])
        })
        .collect()
}

/// One measured stretch: the kernel's account and the probes', how late
/// the workers' sleeps ended (summed), the stretch's length by the test's
/// clock, and the most any one thread ran and waited in it by the kernel's
/// account, which no clock allows to exceed the stretch.
#[derive(Debug)]
struct Window {
    kernel: Account,
    probes: Account,
    late_ns: u64,
    wall_ns: u64,
    longest_ns: u64,
}

/// The start of a [`Window`] on `pid`: both accounts read while its
/// threads are quiet, the test's clock read before the threads' times.
struct Started {
    pid: u32,
    kernel: Account,
    probes: Account,
    at: Instant,
    times: HashMap<String, u64>,
}

impl Started {
    fn now(s: &mut Session, pid: u32, seen: impl Fn(&Session) -> Account) -> Self {
        let (kernel, probes) = both_accounts(s, pid, seen);
        let at = Instant::now();
        Self {
            pid,
            kernel,
            probes,
            at,
            times: thread_times(pid),
        }
    }

    /// The window to now, the clock read after the threads' times.
    fn end(self, s: &mut Session, seen: impl Fn(&Session) -> Account, late_ns: u64) -> Window {
        let (kernel, probes) = both_accounts(s, self.pid, seen);
        let times = thread_times(self.pid);
        let wall_ns = self.at.elapsed().as_nanos() as u64;
        let longest_ns = times
            .iter()
            .map(|(tid, t)| t - self.times.get(tid).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        Window {
            kernel: minus(kernel, self.kernel),
            probes: minus(probes, self.probes),
            late_ns,
            wall_ns,
            longest_ns,
        }
    }
}

/// The scheduler's `DELAY_DEQUEUE` feature turned off while this lives,
/// where it is on and the kernel lets it be changed (debugfs's
/// `sched/features`, mounted for the while if it was not), and back on
/// after. The 6.12 guest's schedstat counts some sleeps of a task whose
/// dequeue was delayed as waits for a CPU: a worker that slept 200 times
/// 1 ms in a 486 ms window, 140 ms on a CPU, was given 372 ms of waits,
/// which the window cannot hold, while its own clock put every wakeup's
/// wait together at 87 ms at most, and the probes at 11 ms; its runs,
/// preemptions and CPU time matched the probes' exactly. Off, the kernel's
/// account is an oracle again. The host (6.18, delayed dequeue on, its
/// features not writable) tests the probes with it on.
struct ExactSchedstat {
    features: Option<std::path::PathBuf>,
    mounted: bool,
}

impl ExactSchedstat {
    const DEBUGFS: &str = "/sys/kernel/debug";

    fn start() -> Self {
        let features = std::path::Path::new(Self::DEBUGFS).join("sched/features");
        let mut guard = Self {
            features: None,
            mounted: false,
        };
        if !features.exists() {
            guard.mounted = std::process::Command::new("mount")
                .args(["-t", "debugfs", "none", Self::DEBUGFS])
                .status()
                .is_ok_and(|s| s.success());
        }
        let on = std::fs::read_to_string(&features)
            .is_ok_and(|f| f.split_whitespace().any(|x| x == "DELAY_DEQUEUE"));
        if on && std::fs::write(&features, "NO_DELAY_DEQUEUE").is_ok() {
            eprintln!("DELAY_DEQUEUE off for the measurement (schedstat's waits)");
            guard.features = Some(features);
        }
        guard
    }
}

impl Drop for ExactSchedstat {
    fn drop(&mut self) {
        if let Some(features) = &self.features {
            std::fs::write(features, "DELAY_DEQUEUE").expect("turning DELAY_DEQUEUE back on");
        }
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg(Self::DEBUGFS)
                .status();
        }
    }
}

/// Threads of the test (unwatched) spinning on `cpu` until dropped
/// (bounded: 60 s at most).
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(n: usize, cpu: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    // SAFETY: as in the loopback binary's pin_to.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu, &mut set);
                        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
                    }
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The probes with the run-queue probe, watching a loopback server that
/// was asleep when watched: a thread runnable then would run without a
/// wait the probes saw start.
fn watched_server() -> (Session, Server) {
    let mut s = Session::try_start(Options {
        run_queue: true,
        ..Options::default()
    })
    .expect("loading the probes with the run-queue probe");
    let server = Server::start(None);
    quiet_account(server.pid);
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    (s, server)
}

/// A watched server's `workers` (pinned to `cpu`) do `work` while `hogs`
/// unwatched threads spin on the same CPU; returns what the kernel
/// accounted for the server's threads over the work, what the probes saw,
/// and how late the workers' sleeps ended, summed (their own clock's
/// account of what their wakeups took).
fn measure(workers: usize, cpu: &str, hogs: usize, work: &str) -> Window {
    let _lock = probe_lock();
    let _exact = ExactSchedstat::start();
    let (mut s, mut server) = watched_server();
    let pid = server.pid;
    server.send(&format!("workers {workers} {cpu}"));
    assert!(server.line().starts_with("workers "));
    let started = Started::now(&mut s, pid, |s| seen(s, pid));
    let late = {
        let _hogs = Hogs::start(hogs, 0);
        server.send(work);
        let reply = server.line();
        reply
            .strip_prefix("worked ")
            .and_then(|late| late.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("reply to {work:?}: {reply:?}"))
    };
    let w = started.end(&mut s, |s| seen(s, pid), late);
    server.stop();
    let skipped = s.collector.probes().drops().unwrap().skipped.run_queue;
    assert_eq!(skipped, 0, "wakeups or switches the kernel skipped");
    w
}

/// The probes' account against the kernel's: the same runs and
/// preemptions; waits (and waits and runs together) within 2 % (or
/// `floor_ns`), plus up to `late_ns` the kernel leaves out of a wait. A
/// wakeup onto an idle CPU is where the kernel's clock lags the probes':
/// the switch that follows it skips its clock update
/// (`rq_clock_skip_update`), so the kernel's wait ends at the wakeup and
/// the CPU's way out of its idle loop counts as running, or not at all
/// where the idle CPU's clock itself lagged (seen in the 6.1 guest); the
/// probes read the clock at the switch, as runqlat does. That way out is
/// part of how late the sleeper found itself running, which its own clock
/// tells (`late_ns`): about 10 µs a run on the host, 30 in a slow guest.
/// Never fewer waits than the kernel's.
fn assert_matches(kernel: Account, probes: Account, floor_ns: u64, late_ns: u64) {
    let what = format!("kernel {kernel:?}, probes {probes:?}, sleeps late by {late_ns} ns");
    eprintln!("{what}");
    assert_eq!(probes.runs, kernel.runs, "times run: {what}");
    assert_eq!(
        probes.slices, probes.runs,
        "every slice seen began with a wait seen: {what}"
    );
    assert_eq!(
        probes.involuntary, kernel.involuntary,
        "involuntary switches: {what}"
    );
    let slack = |of: u64| ((of as f64 * 0.02) as u64).max(floor_ns);
    let (ours, theirs) = (probes.waited_ns, kernel.waited_ns);
    assert!(
        ours + slack(theirs) >= theirs && ours <= theirs + slack(theirs) + late_ns,
        "run-queue wait not within 2 % (or {floor_ns} ns) and the sleeps' lateness: {what}"
    );
    let (ours, theirs) = (
        probes.waited_ns + probes.on_cpu_ns,
        kernel.waited_ns + kernel.on_cpu_ns,
    );
    assert!(
        ours + slack(theirs) >= theirs && ours <= theirs + slack(theirs) + late_ns,
        "waiting and running together not within 2 % (or {floor_ns} ns) and the sleeps' \
         lateness: {what}"
    );
}

/// `measure` run again, up to 5 times, while the kernel switched the
/// threads in more often than any BPF program saw, or a slice seen began
/// without the wakeup that made it: now and then (1–3 in
/// ~240 runs under load, 2 in 204 once on a quiet host) a switch-in
/// counted in the threads' context switches and schedstat has no
/// `sched_switch` run of ours, nor of bpftrace's (130 switch-ins of a
/// thread whose counts said 131). Not understood yet; the probes never saw
/// more than ran. Again too while the kernel's account is one no clock
/// allows, a thread running and waiting for longer than the window lasted:
/// the 6.12 guest once gave a forked child 569 ms of waits where its
/// runs, preemptions and time on a CPU matched the probes' (131 ms of
/// waits). A window with every run seen, by a possible account, is
/// compared exactly.
fn with_every_run_seen(measure: impl Fn() -> Window) -> Window {
    for _ in 1..5 {
        let w = measure();
        let all_seen = w.probes.runs >= w.kernel.runs && w.probes.slices == w.probes.runs;
        if all_seen && w.longest_ns <= w.wall_ns {
            eprintln!(
                "window {} ns, its busiest thread ran and waited {} ns",
                w.wall_ns, w.longest_ns
            );
            return w;
        }
        eprintln!(
            "switches or wakeups no program of ours saw, or a thread's time longer than the \
             window ({w:?}): measuring again"
        );
    }
    let w = measure();
    assert!(
        w.longest_ns <= w.wall_ns,
        "the kernel's account has a thread running and waiting for longer than the window \
         lasted: {w:?}"
    );
    w
}

#[test]
fn contended_workers_wait_as_long_as_the_kernel_says() {
    // Two workers and two hogs on CPU 0: each worker waits for the others'
    // slices, so the run queue holds milliseconds per run.
    let Window { kernel, probes, .. } =
        with_every_run_seen(|| measure(2, "0", 2, "work 100 3000 1000"));
    assert!(
        kernel.waited_ns > 100_000_000,
        "the test made too little contention to measure: {kernel:?}"
    );
    assert_matches(kernel, probes, 0, 0);
}

#[test]
fn without_contention_no_wait_is_invented() {
    // One worker alone on CPU 0, nothing competing on purpose.
    let Window {
        kernel,
        probes,
        late_ns: late,
        ..
    } = with_every_run_seen(|| measure(1, "0", 0, "work 200 200 1000"));
    assert!(kernel.runs >= 200, "{kernel:?}");
    assert_matches(kernel, probes, 1_000_000, late);
}

/// What the probes saw of `child`'s role: the kernel keeps the samples of
/// a process forked after the probes attached under its parent, and they go
/// to the role of the parent's children.
fn seen_in_role(s: &Session, child: u32) -> Account {
    let table = s.collector.table();
    let role = table.get(child).unwrap().role();
    let roles = table.roles(stackprobe_model::process::Span::Whole);
    let a = &roles[&role].1;
    Account {
        on_cpu_ns: a.latency[Latency::OnCpu].total.sum_ns() as u64,
        waited_ns: a.latency[Latency::RunQueue].total.sum_ns() as u64,
        runs: a.latency[Latency::RunQueue].total.count(),
        involuntary: a.counts[Count::Preempted].total,
        pcount: 0,
        slices: a.latency[Latency::OnCpu].total.count(),
    }
}

/// A child forked after the probes attached does `work` with two hogs
/// beside it: the kernel's account of it and what its role got, with its
/// own row and its parent's checked to hold none of it. Two hogs, not one:
/// each switch-in moves a fixed few µs from the kernel's run to the
/// probes' wait (the kernel's wait ends at the switch's clock update, the
/// probes' at the tracepoint after the pick), 32 µs a run in the 6.1
/// guest, which 1.4 ms waits a run (one hog) held to 2.2 %; the 2 % bound
/// is for waits of milliseconds.
fn measure_child() -> Window {
    let _lock = probe_lock();
    let _exact = ExactSchedstat::start();
    let (mut s, mut server) = watched_server();
    let parent = server.pid;
    // Forked now, it is watched as the parent's child: the kernel keeps its
    // samples under the parent, with no histogram of its own to allocate.
    let child = server.fork();
    server.send("workers 1 0");
    assert!(server.line().starts_with("workers "));
    let started = Started::now(&mut s, child, |s| seen_in_role(s, child));
    let parent_before = own(&s, parent);
    {
        let _hogs = Hogs::start(2, 0);
        server.send("work 100 2000 1000");
        let reply = server.line();
        assert!(reply.starts_with("worked "), "{reply}");
    }
    let w = started.end(&mut s, |s| seen_in_role(s, child), 0);
    server.stop();
    let drops = s.collector.probes().drops().unwrap();
    assert_eq!(
        drops.skipped.run_queue, 0,
        "wakeups or switches the kernel skipped"
    );
    assert_eq!(
        drops.stat(Stat::HistFull),
        0,
        "samples the kernel could not record"
    );
    assert_eq!(
        (own(&s, parent), own(&s, child)),
        (parent_before, 0),
        "the parent, blocked in waitpid, waited for nothing meanwhile, and the child has no \
         histogram of its own"
    );
    w
}

#[test]
fn a_process_forked_after_the_start_waits_as_long_as_the_kernel_says_in_its_role() {
    let Window { kernel, probes, .. } = with_every_run_seen(measure_child);
    assert!(
        kernel.waited_ns > 150_000_000,
        "the test made too little contention to measure: {kernel:?}"
    );
    assert_matches(kernel, probes, 0, 0);
}

/// The run-queue samples in `pid`'s own histogram.
fn own(s: &Session, pid: u32) -> u64 {
    s.collector.table().get(pid).unwrap().activity.latency[Latency::RunQueue]
        .total
        .count()
}

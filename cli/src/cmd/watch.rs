//! `stackprobe watch`: attach, follow the selected processes, report each
//! interval and once more at exit.

use std::{
    collections::{HashMap, HashSet},
    io::{self, IsTerminal as _, Write},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use ratatui::crossterm::event::{self as crossterm_event, KeyEvent, KeyEventKind};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    time::{self, MissedTickBehavior},
};

use crate::{
    cli::WatchArgs,
    model::{
        event::Event,
        links::{KernelCounters, Listener},
        process::{LiveProcess, ProcessTable},
        report::{Report, ReportKind},
        selector::Selector,
        sockets::TcpState,
    },
    probes::{
        Options, Probes,
        events::{DRAIN_PERIOD, EventStream},
    },
    procfs, view,
    view::tui::{self, Action, Dashboard, Status, terminal::TerminalGuard},
};

pub fn run(args: WatchArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(watch(args))
}

async fn watch(args: WatchArgs) -> Result<()> {
    let selector = Selector::new(args.names.clone(), args.pids.clone())?;
    for &pid in selector.pids() {
        match procfs::read(pid) {
            Some(p) if p.is_process() => {}
            Some(p) => bail!(
                "{pid} is a thread of process {}; pass the process id",
                p.tgid
            ),
            None => bail!("no process with pid {pid}"),
        }
    }

    let mut probes = Probes::load(Options {
        probe_cost: args.probe_cost,
    })?;
    probes.watch_names(&selector.kernel_comm_keys())?;
    for &pid in selector.pids() {
        probes.watch_pid(pid)?;
    }
    let mut table = ProcessTable::default();
    let live = refresh_watch_set(&selector, &mut probes, &table)?;
    table.sync_watched(&live);
    observe_sockets(&mut probes, &mut table)?;
    let mut events = EventStream::new(probes.take_events()?).context("polling the ring buffer")?;

    let mut ui = if !args.json && !args.no_tui && io::stdout().is_terminal() {
        Some(DashboardUi::start()?)
    } else {
        None
    };
    let mut waiting = live.is_empty();
    if ui.is_some() {
        // The dashboard says it all; stderr would scribble over it.
    } else if waiting {
        eprintln!(
            "stackprobe: probes attached; no {} running yet, waiting for it (Ctrl-C to stop)",
            selector.names().join(" or ")
        );
    } else {
        eprintln!(
            "stackprobe: probes attached; watching {} (Ctrl-C to stop)",
            list(&live)
        );
    }

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let start = Instant::now();
    let deadline = args.duration.map(|d| time::Instant::from_std(start + d));
    let mut drain_tick = time::interval(DRAIN_PERIOD);
    drain_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut report_tick = time::interval_at(
        time::Instant::from_std(start + args.interval),
        args.interval,
    );
    report_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_report = start;
    let mut out = io::stdout().lock();
    let mut frame_tick = time::interval(FRAME_PERIOD);
    frame_tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut events_seen = 0usize;
    let mut own = OwnCost::new(&probes, args.probe_cost);

    let apply = |table: &mut ProcessTable, event: Event| table.apply(&event);

    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            _ = until(deadline) => break,
            ready = events.readable() => {
                ready.context("waiting on the ring buffer")?;
                events_seen += events.drain(|e| apply(&mut table, e));
            }
            _ = drain_tick.tick() => {
                events_seen += events.drain(|e| apply(&mut table, e));
            }
            Some(key) = next_key(&mut ui) => {
                let Some(dash) = ui.as_mut() else { continue };
                match dash.dashboard.key(key) {
                    Action::Quit => break,
                    Action::Reset => table = ProcessTable::default(),
                    Action::None => {}
                }
                dash.draw()?;
            }
            _ = frame_tick.tick(), if ui.is_some() => {
                if let Some(dash) = ui.as_mut() {
                    dash.draw()?;
                }
            }
            _ = report_tick.tick() => {
                events_seen += events.drain(|e| apply(&mut table, e));
                let live = refresh_watch_set(&selector, &mut probes, &table)?;
                table.sync_watched(&live);
                observe_sockets(&mut probes, &mut table)?;
                if waiting && !live.is_empty() {
                    waiting = false;
                    if ui.is_none() {
                        eprintln!("stackprobe: now watching {}", list(&live));
                    }
                }
                let now = Instant::now();
                let period = now - last_report;
                let report = build_report(ReportKind::Interval, &table, &probes, period, now - start, args.probe_cost)?;
                last_report = now;
                table.reset_interval();
                match ui.as_mut() {
                    Some(dash) => {
                        let status = Status {
                            elapsed_s: (now - start).as_secs_f64(),
                            interval_s: args.interval.as_secs_f64(),
                            events_per_s: events_seen as f64 / period.as_secs_f64(),
                            drops: report.drops,
                            ns_per_event: own.ns_per_run(&probes),
                            cpu_percent: own.cpu_percent(),
                        };
                        events_seen = 0;
                        dash.dashboard.update(report, status);
                    }
                    None => {
                        if !emit(&mut out, &report, args.json)? {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
    // Back to the normal screen before the summary is printed.
    drop(ui);

    events.drain(|e| apply(&mut table, e));
    let live = refresh_watch_set(&selector, &mut probes, &table)?;
    table.sync_watched(&live);
    observe_sockets(&mut probes, &mut table)?;
    let elapsed = start.elapsed();
    let summary = build_report(
        ReportKind::Summary,
        &table,
        &probes,
        elapsed,
        elapsed,
        args.probe_cost,
    )?;
    emit(&mut out, &summary, args.json)?;
    if events.undecodable() > 0 {
        eprintln!(
            "stackprobe: warning: {} ring buffer records had an unknown layout (probe/userspace mismatch)",
            events.undecodable()
        );
    }
    Ok(())
}

/// The dashboard redraws at this fixed, low rate; collection never waits on it.
const FRAME_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The dashboard, its terminal, and a thread reading keys (crossterm's reads
/// block) that hands them over a channel.
struct DashboardUi {
    dashboard: Dashboard,
    guard: TerminalGuard,
    keys: mpsc::Receiver<KeyEvent>,
    stop: Arc<AtomicBool>,
}

impl DashboardUi {
    fn start() -> Result<Self> {
        let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let guard = TerminalGuard::enter()?;
        let (tx, keys) = mpsc::channel(64);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match crossterm_event::poll(std::time::Duration::from_millis(100)) {
                    Ok(true) => match crossterm_event::read() {
                        Ok(crossterm_event::Event::Key(k)) if k.kind == KeyEventKind::Press => {
                            if tx.blocking_send(k).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    },
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        });
        Ok(Self {
            dashboard: Dashboard::new(color),
            guard,
            keys,
            stop,
        })
    }

    fn draw(&mut self) -> Result<()> {
        let dashboard = &self.dashboard;
        self.guard
            .terminal
            .draw(|f| tui::render(f, dashboard))
            .context("drawing the dashboard")?;
        Ok(())
    }
}

impl Drop for DashboardUi {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn next_key(ui: &mut Option<DashboardUi>) -> Option<KeyEvent> {
    match ui {
        Some(dash) => dash.keys.recv().await,
        None => std::future::pending().await,
    }
}

/// stackprobe's own cost: BPF run time per program run over the last interval
/// (with --probe-cost) and its CPU use.
struct OwnCost {
    runs_and_ns: Option<(u64, u64)>,
    cpu: (std::time::Duration, Instant),
}

fn cpu_time() -> std::time::Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

impl OwnCost {
    fn new(probes: &Probes, measured: bool) -> Self {
        let runs_and_ns = measured.then(|| totals(probes)).flatten();
        Self {
            runs_and_ns,
            cpu: (cpu_time(), Instant::now()),
        }
    }

    fn ns_per_run(&mut self, probes: &Probes) -> Option<f64> {
        let (runs0, ns0) = self.runs_and_ns?;
        let (runs, ns) = totals(probes)?;
        self.runs_and_ns = Some((runs, ns));
        (runs > runs0).then(|| (ns - ns0) as f64 / (runs - runs0) as f64)
    }

    fn cpu_percent(&mut self) -> f64 {
        let (cpu, at) = (cpu_time(), Instant::now());
        let used = cpu.saturating_sub(self.cpu.0).as_secs_f64();
        let wall = (at - self.cpu.1).as_secs_f64();
        self.cpu = (cpu, at);
        if wall > 0.0 { 100.0 * used / wall } else { 0.0 }
    }
}

fn totals(probes: &Probes) -> Option<(u64, u64)> {
    let costs = probes.costs().ok()?;
    Some(
        costs
            .iter()
            .fold((0, 0), |(r, n), c| (r + c.runs, n + c.run_time_ns)),
    )
}

async fn until(deadline: Option<time::Instant>) {
    match deadline {
        Some(d) => time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn build_report(
    kind: ReportKind,
    table: &ProcessTable,
    probes: &Probes,
    period: std::time::Duration,
    elapsed: std::time::Duration,
    probe_cost: bool,
) -> Result<Report> {
    let mut report = Report::build(kind, table, period, elapsed, probes.drops()?);
    if probe_cost {
        report.probe_cost = probes.costs()?;
    }
    Ok(report)
}

/// Snapshots every TCP socket: finds which watched process owns each
/// listening socket (by inode, as `ss -p` does), tells the kernel, and counts
/// TIME_WAIT sockets per link.
pub fn observe_sockets(probes: &mut Probes, table: &mut ProcessTable) -> Result<()> {
    let started = Instant::now();
    let sockets = probes.tcp_sockets()?;
    let listening: HashMap<u64, u16> = sockets
        .iter()
        .filter(|s| s.state == TcpState::Listen && s.ino != 0)
        .map(|s| (s.ino, s.local.port()))
        .collect();
    let mut listeners: HashMap<u16, u32> = HashMap::new();
    if !listening.is_empty() {
        // Lowest pid first: a master and its workers share the listening
        // socket, and the master is named its owner.
        let mut pids: Vec<u32> = probes
            .watched()
            .into_iter()
            .map(|(pid, _)| pid)
            .filter(|&pid| procfs::read(pid).is_some_and(|p| p.is_process()))
            .collect();
        pids.sort_unstable();
        for pid in pids {
            for ino in procfs::socket_inodes(pid) {
                if let Some(&port) = listening.get(&ino) {
                    listeners.entry(port).or_insert(pid);
                }
            }
        }
    }
    for (&port, &owner) in &listeners {
        probes.set_listen_owner(port, owner)?;
    }
    table.links.listening = sockets
        .iter()
        .filter(|s| s.state == TcpState::Listen)
        .filter_map(|s| {
            Some(Listener {
                owner: *listeners.get(&s.local.port())?,
                local: s.local,
                backlog: s.backlog,
                max_backlog: s.max_backlog,
            })
        })
        .collect();
    table.links.set_listeners(listeners);
    table.links.observe(&sockets);
    let c = procfs::tcp_ext_counters();
    let get = |name: &str| c.get(name).copied().unwrap_or(0);
    table.links.set_counters(KernelCounters {
        listen_overflows: get("ListenOverflows"),
        listen_drops: get("ListenDrops"),
        time_wait_overflows: get("TCPTimeWaitOverflow"),
    });
    table.links.ephemeral_ports =
        procfs::local_port_range().map(|(lo, hi)| u32::from(hi.saturating_sub(lo)) + 1);
    table.links.last_snapshot = (sockets.len(), started.elapsed().as_micros() as u64);
    Ok(())
}

/// Writes one report; `false` once stdout is gone (e.g. `| head`), which ends
/// the run quietly.
fn emit(out: &mut impl Write, report: &Report, json: bool) -> Result<bool> {
    let text = if json {
        view::json::render(report) + "\n"
    } else {
        view::text::render(report) + "\n"
    };
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("writing the report"),
    }
}

/// Adds to the kernel's watch set every running process selected by name and
/// every child of a watched process (those forked before the fork probe was
/// attached); returns the watched processes now alive. Titles are read only
/// for processes `table` has none for: they are set once, after fork or exec.
fn refresh_watch_set(
    selector: &Selector,
    probes: &mut Probes,
    table: &ProcessTable,
) -> Result<Vec<LiveProcess>> {
    let procs = procfs::processes();
    let mut watched: HashSet<u32> = probes.watched().into_iter().map(|(pid, _)| pid).collect();
    for p in &procs {
        if selector.matches_name(&p.comm, p.exe_basename.as_deref()) && watched.insert(p.pid) {
            probes.watch_pid(p.pid)?;
        }
    }
    loop {
        let orphans: Vec<u32> = procs
            .iter()
            .filter(|p| !watched.contains(&p.pid) && watched.contains(&p.ppid))
            .map(|p| p.pid)
            .collect();
        if orphans.is_empty() {
            break;
        }
        for pid in orphans {
            probes.watch_pid(pid)?;
            watched.insert(pid);
        }
    }
    let names: HashMap<u32, &str> = procs.iter().map(|p| (p.pid, p.comm.as_str())).collect();
    Ok(procs
        .iter()
        .filter(|p| watched.contains(&p.pid))
        .map(|p| LiveProcess {
            pid: p.pid,
            name: p.comm.clone(),
            title: match table.get(p.pid) {
                Some(known) if known.title.is_some() => None,
                _ => procfs::cmdline(p.pid),
            },
            parent: names.get(&p.ppid).map(|name| (p.ppid, name.to_string())),
        })
        .collect())
}

fn list(procs: &[LiveProcess]) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> = procs
        .iter()
        .take(SHOWN)
        .map(|p| format!("{}[{}]", p.name, p.pid))
        .collect();
    if procs.len() > SHOWN {
        names.push(format!("and {} more", procs.len() - SHOWN));
    }
    names.join(", ")
}

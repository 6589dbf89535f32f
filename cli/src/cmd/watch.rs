//! `stackprobe watch`: attach, follow the selected processes, report each
//! interval and once more at exit.

use std::{
    collections::{HashMap, HashSet},
    io::{self, IsTerminal as _, Write},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use ratatui::crossterm::event::{self as crossterm_event, KeyEventKind};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot},
    time::{self, MissedTickBehavior},
};

use crate::{
    cli::WatchArgs,
    export::{
        hlog::{Interval, Recorder},
        prometheus::{Endpoint, Snapshot},
    },
    model::{
        event::Event,
        links::{KernelCounters, Listener},
        process::{Counter, LiveProcess, ProcessTable, Span},
        report::{CountRow, Report, ReportKind},
        selector::Selector,
        sockets::TcpState,
    },
    probes::{
        Options, Probes,
        events::{DRAIN_PERIOD, EventStream},
        privileges,
    },
    procfs, view,
    view::tui::{self, Action, Dashboard, Status, terminal::TerminalGuard},
};

pub fn run(args: WatchArgs) -> Result<()> {
    run_with(args, Hooks::default())
}

/// What a command built on `watch` plugs into the run: `demo` starts its
/// load only once the probes count everything, and ends the run once the
/// load is done. The default plugs in nothing.
#[derive(Default)]
pub struct Hooks {
    /// Called once the probes are attached and the selected processes and
    /// their listeners are watched: from then on, whatever they do is counted.
    pub on_attached: Option<Box<dyn FnOnce()>>,
    /// Ends the run, with its summary, when a value arrives or the sender
    /// is dropped.
    pub stop: Option<oneshot::Receiver<()>>,
}

pub fn run_with(args: WatchArgs, hooks: Hooks) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(watch(args, hooks))
}

async fn watch(args: WatchArgs, hooks: Hooks) -> Result<()> {
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
        fork_hook: args.fork_hook,
        queue_hook: args.queue_hook,
    })?;
    probes.watch_names(&selector.kernel_comm_keys())?;
    for &pid in selector.pids() {
        probes.watch_pid(pid)?;
    }
    // Loading parsed the kernel's BTF (aya's parse and our offsets' one):
    // some 25 MB now free that malloc would otherwise keep for the whole run.
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    let recorder = args
        .record
        .as_deref()
        .map(|path| Recorder::create(path, args.force))
        .transpose()?;
    let endpoint = match args.listen {
        Some(addr) => {
            let endpoint = Endpoint::start(addr).await?;
            eprintln!("stackprobe: metrics on http://{}/metrics", endpoint.addr);
            Some(endpoint)
        }
        None => None,
    };
    let mut record_error_shown = false;
    let mut table = ProcessTable::default();
    let live = refresh_watch_set(&selector, &mut probes, &table)?;
    table.sync_watched(&live);
    observe_sockets(&mut probes, &mut table)?;
    let mut events = EventStream::new(probes.take_events()?).context("polling the ring buffer")?;
    // Everything that needs more than reading /proc and the probes' maps is
    // done; before any thread starts, so none keeps more.
    privileges::drop_unneeded()?;

    // Before saying the probes are attached: whoever waits for that line may
    // send SIGINT next, and it must end the run with its summary.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut ui = if !args.output.json && !args.output.no_tui && io::stdout().is_terminal() {
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

    let start = Instant::now();
    // The parser caps --duration at 10 years; past the clock's range, no end.
    let deadline = args
        .duration
        .and_then(|d| start.checked_add(d))
        .map(time::Instant::from_std);
    let mut drain_tick = time::interval(DRAIN_PERIOD);
    drain_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut report_tick = time::interval_at(
        time::Instant::from_std(start + args.output.interval),
        args.output.interval,
    );
    report_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_report = start;
    // Not locked for the whole run: the dashboard thread writes to stdout too.
    let mut out = io::stdout();
    // Events received: this interval (also the dashboard's events/s) and
    // since the start.
    let mut received = Counter::default();
    let mut own = OwnCost::new(&probes, args.probe_cost);

    let apply = |table: &mut ProcessTable, event: Event| table.apply(&event);

    let mut stop = hooks.stop;
    if let Some(attached) = hooks.on_attached {
        attached();
    }
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            _ = until(deadline) => break,
            _ = stopped(&mut stop) => break,
            ready = events.readable() => {
                ready.context("waiting on the ring buffer")?;
                received.add(events.drain(|e| apply(&mut table, e)) as u64);
            }
            _ = drain_tick.tick() => {
                received.add(events.drain(|e| apply(&mut table, e)) as u64);
            }
            action = next_action(&mut ui) => match action {
                // None: the dashboard thread ended (it could not draw).
                Some(Action::Quit) | None => break,
                Some(Action::Reset) => table = ProcessTable::default(),
                Some(Action::None) => {}
            },
            _ = report_tick.tick() => {
                received.add(events.drain(|e| apply(&mut table, e)) as u64);
                probes.drain_histograms(|e| apply(&mut table, e))?;
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
                if let Some(recorder) = &recorder {
                    recorder.record(interval_histograms(&table, last_report - start, period));
                    if let Some(e) = recorder.error()
                        && !record_error_shown
                    {
                        record_error_shown = true;
                        eprintln!("stackprobe: warning: {e}; the recording keeps what was written before");
                    }
                }
                let report = build_report(ReportKind::Interval, &table, &probes, period, now - start, args.probe_cost, received)?;
                received.interval = 0;
                if let Some(endpoint) = &endpoint {
                    endpoint.publish(Snapshot::take(&table, &report));
                }
                last_report = now;
                table.reset_interval();
                match ui.as_mut() {
                    Some(dash) => {
                        let status = Status {
                            elapsed_s: (now - start).as_secs_f64(),
                            interval_s: args.output.interval.as_secs_f64(),
                            events_per_s: report.events.count as f64 / period.as_secs_f64(),
                            drops: report.drops,
                            uncounted: report.drops_by_cause.uncounted(),
                            ns_per_event: own.ns_per_run(&probes),
                            cpu_percent: own.cpu_percent(),
                        };
                        dash.update(report, status);
                    }
                    None => {
                        if !emit(&mut out, &report, args.output.json)? {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
    // Back to the normal screen before the summary is printed.
    drop(ui);

    received.add(events.drain(|e| apply(&mut table, e)) as u64);
    probes.drain_histograms(|e| apply(&mut table, e))?;
    let live = refresh_watch_set(&selector, &mut probes, &table)?;
    table.sync_watched(&live);
    observe_sockets(&mut probes, &mut table)?;
    if let Some(recorder) = &recorder {
        recorder.record(interval_histograms(
            &table,
            last_report - start,
            last_report.elapsed(),
        ));
    }
    let elapsed = start.elapsed();
    let summary = build_report(
        ReportKind::Summary,
        &table,
        &probes,
        elapsed,
        elapsed,
        args.probe_cost,
        received,
    )?;
    emit(&mut out, &summary, args.output.json)?;
    if let Some(recorder) = recorder {
        let path = recorder.finish()?;
        eprintln!("stackprobe: recorded {}", path.display());
    }
    if events.undecodable() > 0 {
        eprintln!(
            "stackprobe: warning: {} ring buffer records had an unknown layout (probe/userspace mismatch)",
            events.undecodable()
        );
    }
    Ok(())
}

/// The dashboard redraws at this fixed, low rate.
const FRAME_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The dashboard runs in its own thread: it owns the terminal, reads keys and
/// draws at a fixed rate, so collection never waits on drawing. It gets each
/// interval's report over a channel and sends back what keys ask for.
struct DashboardUi {
    reports: std::sync::mpsc::Sender<(Report, Status)>,
    actions: mpsc::UnboundedReceiver<Action>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl DashboardUi {
    fn start() -> Result<Self> {
        let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let (reports, incoming) = std::sync::mpsc::channel::<(Report, Status)>();
        let (actions_tx, actions) = mpsc::unbounded_channel();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread =
            std::thread::Builder::new()
                .name("dashboard".into())
                .spawn(move || -> Result<()> {
                    let mut guard = match TerminalGuard::enter() {
                        Ok(guard) => {
                            let _ = ready_tx.send(Ok(()));
                            guard
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return Ok(());
                        }
                    };
                    let mut dashboard = Dashboard::new(color);
                    loop {
                        loop {
                            match incoming.try_recv() {
                                Ok((report, status)) => dashboard.update(report, status),
                                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                                // The collector is done: leave, restoring the terminal.
                                Err(std::sync::mpsc::TryRecvError::Disconnected) => return Ok(()),
                            }
                        }
                        guard
                            .terminal
                            .draw(|f| tui::render(f, &dashboard))
                            .context("drawing the dashboard")?;
                        // Wait for a key until the next frame is due.
                        if crossterm_event::poll(FRAME_PERIOD)?
                            && let crossterm_event::Event::Key(k) = crossterm_event::read()?
                            && k.kind == KeyEventKind::Press
                        {
                            let action = dashboard.key(k);
                            if action != Action::None && actions_tx.send(action).is_err() {
                                return Ok(());
                            }
                        }
                    }
                })?;
        ready.recv().context("starting the dashboard")??;
        Ok(Self {
            reports,
            actions,
            thread: Some(thread),
        })
    }

    fn update(&self, report: Report, status: Status) {
        let _ = self.reports.send((report, status));
    }
}

impl Drop for DashboardUi {
    fn drop(&mut self) {
        // Closing the channel tells the thread to restore the terminal and end.
        let (closed, _) = std::sync::mpsc::channel();
        drop(std::mem::replace(&mut self.reports, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn next_action(ui: &mut Option<DashboardUi>) -> Option<Action> {
    match ui {
        Some(dash) => dash.actions.recv().await,
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

/// This interval's histograms of every role and metric that has samples.
fn interval_histograms(
    table: &ProcessTable,
    start: std::time::Duration,
    duration: std::time::Duration,
) -> Interval {
    let mut histograms = Vec::new();
    for (role, (_, activity)) in table.roles(Span::Interval) {
        for (metric, m) in activity.metrics() {
            if let Some(h) = m.interval.hdr().filter(|h| !h.is_empty()) {
                histograms.push((role.clone(), metric, h.clone()));
            }
        }
    }
    Interval {
        start,
        duration,
        histograms,
    }
}

async fn stopped(stop: &mut Option<oneshot::Receiver<()>>) {
    match stop {
        Some(stop) => {
            let _ = stop.await;
        }
        None => std::future::pending().await,
    }
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
    received: Counter,
) -> Result<Report> {
    let mut report = Report::build(kind, table, period, elapsed, probes.drops()?);
    report.events = CountRow {
        count: match kind {
            ReportKind::Interval => received.interval,
            ReportKind::Summary => received.total,
        },
        total: received.total,
    };
    if probe_cost {
        report.probe_cost = probes.costs()?;
    }
    report.hooks = probes.hooks_in_use();
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
        // The watched processes the last sync found in /proc. Lowest pid
        // first: a master and its workers share the listening socket, and
        // the master is named its owner.
        let mut pids: Vec<u32> = table.iter().filter(|p| p.watched).map(|p| p.pid).collect();
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

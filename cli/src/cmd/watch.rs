//! `stackprobe watch`: wires the arguments to the collector and the sinks,
//! and runs until a signal, the deadline, the dashboard or the caller says
//! stop.

use std::{
    io::{self, IsTerminal as _},
    time::Instant,
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::oneshot,
    time::{self, MissedTickBehavior},
};

use crate::cli::{Selection, WatchArgs};
use stackprobe_collector::{Collector, cgroups, containers::Containers};
use stackprobe_model::selector::Selector;
use stackprobe_output::{
    export::prometheus::WebConfig,
    sink::{
        Flow, Sink as _, Sinks,
        dashboard::{Actions, DashboardSink},
        metrics::Metrics,
        recording::Recording,
        stdout::Stdout,
    },
    view::{self, tui::Action},
};
use stackprobe_probes::{Options, privileges};

pub fn run(args: WatchArgs) -> Result<()> {
    run_with(args, Control::default())
}

/// What a command built on `watch` plugs into the run: `demo` starts its
/// load only once the probes count everything, and ends the run once the
/// load is done. The default plugs in nothing.
#[derive(Default)]
pub struct Control {
    /// Called once the probes are attached and the selected processes and
    /// their listeners are watched: from then on, whatever they do is counted.
    pub on_attached: Option<Box<dyn FnOnce()>>,
    /// Ends the run, with its summary, when a value arrives or the sender
    /// is dropped.
    pub stop: Option<oneshot::Receiver<()>>,
}

pub fn run_with(args: WatchArgs, control: Control) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(watch(args, control))
}

/// What the arguments select; containers and cgroups resolved to cgroup
/// paths now (a container must be running).
fn selector(args: &Selection) -> Result<Selector> {
    if args.containers.is_empty() && args.cgroups.is_empty() {
        return Selector::new(args.names.clone(), args.pids.clone());
    }
    let mount = cgroups::mount()?;
    let mut paths = Vec::new();
    for arg in &args.cgroups {
        paths.push(cgroups::resolve(&mount, arg)?);
    }
    let mut containers = Containers::default();
    for wanted in &args.containers {
        paths.extend(cgroups::of_container(&mut containers, wanted)?);
    }
    Selector::with_cgroups(args.names.clone(), args.pids.clone(), paths)
}

async fn watch(args: WatchArgs, control: Control) -> Result<()> {
    // Before the probes load: a mistake in it should cost nothing.
    let web = args
        .web_config
        .as_deref()
        .map(WebConfig::load)
        .transpose()?;
    let selector = selector(&args.select)?;
    let names = selector.names().join(" or ");
    let mut collector = Collector::start(
        selector,
        Options {
            probe_cost: args.probe_cost,
            fork_rung: args.fork_hook,
            queue_rung: args.queue_hook,
            unix_queue_rung: args.unix_queue_hook,
            unix_service: args.unix_service_time,
            unix_service_rung: args.unix_service_hook,
            run_queue: args.run_queue,
            log_probes: args.log_probes,
        },
    )?;
    let mut sinks = Sinks::default();
    let tui =
        !args.headless && !args.output.json && !args.output.no_tui && io::stdout().is_terminal();
    let metrics = match args.listen {
        Some(addr) => Some(Metrics::start(addr, web).await?),
        None => None,
    };
    let recording = args
        .record
        .as_deref()
        .map(|path| Recording::create(path, args.force))
        .transpose()?;
    // Everything that needs more than reading /proc and the probes' maps is
    // done; before any thread starts, so none keeps more.
    privileges::drop_unneeded()?;

    // Before saying the probes are attached: whoever waits for that line may
    // send SIGINT next, and it must end the run with its summary.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut actions = None;
    if tui {
        let (dashboard, keys) = DashboardSink::start(args.output.interval)?;
        sinks.push(dashboard);
        actions = Some(keys);
    }
    if let Some(metrics) = metrics {
        sinks.push(metrics);
    }
    // An agent's reports are its metrics; its stderr (the journal) says
    // only what it watches and what goes wrong.
    if !args.headless {
        sinks.push(Stdout::new(args.output.json, tui));
    }
    if let Some(recording) = recording {
        sinks.push(recording);
    }
    let mut waiting = collector.watching().is_empty();
    if tui {
        // The dashboard says it all; stderr would scribble over it.
    } else if waiting {
        eprintln!(
            "stackprobe: probes attached; no {names} running yet, waiting for it (Ctrl-C to stop)"
        );
    } else {
        eprintln!(
            "stackprobe: probes attached; watching {} (Ctrl-C to stop)",
            view::text::process_list(collector.watching())
        );
    }

    let start = Instant::now();
    // The parser caps --duration at 10 years; past the clock's range, no end.
    let deadline = args
        .duration
        .and_then(|d| start.checked_add(d))
        .map(time::Instant::from_std);
    let mut report_tick = time::interval_at(
        time::Instant::from_std(start + args.output.interval),
        args.output.interval,
    );
    report_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut stop = control.stop;
    if let Some(attached) = control.on_attached {
        attached();
    }
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            _ = until(deadline) => break,
            _ = stopped(&mut stop) => break,
            pumped = collector.pump() => pumped?,
            action = next_action(&mut actions) => match action {
                Some(Action::Quit) | None => break,
                Some(Action::Reset) => collector.reset(),
                Some(Action::None) => {}
            },
            _ = report_tick.tick() => {
                let flow = collector.tick(|frame| {
                    if waiting && !frame.watching.is_empty() {
                        waiting = false;
                        if !tui {
                            eprintln!("stackprobe: now watching {}", view::text::process_list(frame.watching));
                        }
                    }
                    sinks.interval(frame)
                })?;
                if flow == Flow::Stop {
                    return Ok(());
                }
            }
        }
    }
    collector.finish(|frame| sinks.summary(frame))?;
    if collector.undecodable() > 0 {
        eprintln!(
            "stackprobe: warning: {} ring buffer records had an unknown layout (probe/userspace mismatch)",
            collector.undecodable()
        );
    }
    Ok(())
}

async fn next_action(actions: &mut Option<Actions>) -> Option<Action> {
    match actions {
        Some(actions) => actions.next().await,
        None => std::future::pending().await,
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

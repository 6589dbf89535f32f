//! The live dashboard as a sink. It runs in a thread of its own: it owns the
//! terminal, reads keys and draws at a fixed, low rate, so collection never
//! waits on drawing. It gets each interval's report over a channel and sends
//! back what keys ask for.

use std::{sync::mpsc as std_mpsc, thread, time::Duration};

use anyhow::{Context as _, Result};
use ratatui::crossterm::event::{self as crossterm_event, KeyEventKind};
use tokio::sync::mpsc;

use super::{Flow, Sink};
use crate::view::tui::{self, Action, Dashboard, Status, terminal::TerminalGuard};
use stackprobe_model::{frame::Frame, report::Report};

/// The dashboard redraws at this rate.
const FRAME_PERIOD: Duration = Duration::from_millis(100);

pub struct DashboardSink {
    /// None once the run ended and the terminal was restored.
    reports: Option<std_mpsc::Sender<(Report, Status)>>,
    thread: Option<thread::JoinHandle<Result<()>>>,
    interval_s: f64,
}

/// What the dashboard's keys ask of the run.
pub struct Actions(mpsc::UnboundedReceiver<Action>);

impl Actions {
    /// The next key's action; None once the dashboard thread ended (it
    /// could not draw).
    pub async fn next(&mut self) -> Option<Action> {
        self.0.recv().await
    }
}

impl DashboardSink {
    /// Takes over the terminal; `interval` is the report interval shown.
    pub fn start(interval: Duration) -> Result<(Self, Actions)> {
        let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let (reports, incoming) = std_mpsc::channel::<(Report, Status)>();
        let (actions_tx, actions) = mpsc::unbounded_channel();
        let (ready_tx, ready) = std_mpsc::channel();
        let thread =
            thread::Builder::new()
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
                                Err(std_mpsc::TryRecvError::Empty) => break,
                                // The run is done: leave, restoring the terminal.
                                Err(std_mpsc::TryRecvError::Disconnected) => return Ok(()),
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
        let sink = Self {
            reports: Some(reports),
            thread: Some(thread),
            interval_s: interval.as_secs_f64(),
        };
        Ok((sink, Actions(actions)))
    }

    /// Closing the channel tells the thread to restore the terminal and end.
    fn stop(&mut self) {
        self.reports.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Sink for DashboardSink {
    fn interval(&mut self, frame: &Frame) -> Result<Flow> {
        let report = &frame.report;
        let status = Status {
            elapsed_s: report.elapsed_s,
            interval_s: self.interval_s,
            events_per_s: report.events.count as f64 / frame.interval.as_secs_f64(),
            drops: report.drops,
            ns_per_event: frame.cost.ns_per_run,
            cpu_percent: frame.cost.cpu_percent,
        };
        if let Some(reports) = &self.reports {
            let _ = reports.send((report.clone(), status));
        }
        Ok(Flow::Continue)
    }

    /// Back to the normal screen before the summary is printed.
    fn summary(&mut self, _: &Frame) -> Result<()> {
        self.stop();
        Ok(())
    }
}

impl Drop for DashboardSink {
    fn drop(&mut self) {
        self.stop();
    }
}

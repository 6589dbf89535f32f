//! Reports on standard output, as text or one JSON object per line.

use std::io::{self, Write as _};

use anyhow::{Context as _, Result};

use super::{Flow, Sink};
use crate::view;
use stackprobe_model::{frame::Frame, report::Report};

pub struct Stdout {
    json: bool,
    /// Only the summary: the dashboard shows the intervals.
    summary_only: bool,
}

impl Stdout {
    pub fn new(json: bool, summary_only: bool) -> Self {
        Self { json, summary_only }
    }

    /// Writes one report; `Stop` once stdout is gone.
    fn emit(&self, report: &Report) -> Result<Flow> {
        let text = if self.json {
            view::json::render(report) + "\n"
        } else {
            view::text::render(report) + "\n"
        };
        // Not locked for the whole run: the dashboard thread writes to
        // stdout too.
        let mut out = io::stdout();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => Ok(Flow::Continue),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Flow::Stop),
            Err(e) => Err(e).context("writing the report"),
        }
    }
}

impl Sink for Stdout {
    fn interval(&mut self, frame: &Frame) -> Result<Flow> {
        if self.summary_only {
            return Ok(Flow::Continue);
        }
        self.emit(&frame.report)
    }

    fn summary(&mut self, frame: &Frame) -> Result<()> {
        self.emit(&frame.report).map(|_| ())
    }
}

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
    /// The report being written, kept for the next.
    buf: Vec<u8>,
}

impl Stdout {
    pub fn new(json: bool, summary_only: bool) -> Self {
        Self {
            json,
            summary_only,
            buf: Vec::new(),
        }
    }

    /// Writes one report; `Stop` once stdout is gone.
    fn emit(&mut self, report: &Report) -> Result<Flow> {
        self.buf.clear();
        if self.json {
            view::json::render_into(report, &mut self.buf);
        } else {
            self.buf
                .extend_from_slice(view::text::render(report).as_bytes());
        }
        self.buf.push(b'\n');
        // Not locked for the whole run: the dashboard thread writes to
        // stdout too.
        let mut out = io::stdout();
        match out.write_all(&self.buf).and_then(|()| out.flush()) {
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

//! `--record`: every interval's histograms to an HdrHistogram interval log,
//! with its counts and its report's gauges (busy rows, own times).

use std::path::Path;

use anyhow::Result;

use super::{Flow, Sink};
use crate::export::hlog::{Interval, Recorder};
use stackprobe_model::frame::Frame;

pub struct Recording {
    recorder: Option<Recorder>,
    error_shown: bool,
}

impl Recording {
    pub fn create(path: &Path, force: bool) -> Result<Self> {
        Ok(Self {
            recorder: Some(Recorder::create(path, force)?),
            error_shown: false,
        })
    }

    fn record(&mut self, frame: &Frame) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        recorder.record(
            Interval::of(frame.table, frame.interval_start, frame.interval)
                .with_report(&frame.report),
        );
        if let Some(e) = recorder.error()
            && !self.error_shown
        {
            self.error_shown = true;
            eprintln!("stackprobe: warning: {e}; the recording keeps what was written before");
        }
    }
}

impl Sink for Recording {
    fn interval(&mut self, frame: &Frame) -> Result<Flow> {
        self.record(frame);
        Ok(Flow::Continue)
    }

    /// Records the last interval and closes the file; an error that stopped
    /// the recording fails the run (after the summary is out).
    fn summary(&mut self, frame: &Frame) -> Result<()> {
        self.record(frame);
        if let Some(recorder) = self.recorder.take() {
            let path = recorder.finish()?;
            eprintln!("stackprobe: recorded {}", path.display());
        }
        Ok(())
    }
}

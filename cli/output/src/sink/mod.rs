//! Where reports go: standard output (text or JSON), the dashboard, a
//! recording, the metrics endpoint. Each takes the collector's frames
//! through one interface; `watch` picks which ones a run has.

pub mod dashboard;
pub mod metrics;
pub mod recording;
pub mod stdout;

use anyhow::Result;

use stackprobe_model::frame::Frame;

/// Whether the run goes on after a sink took an interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The sink's reader is gone (stdout closed, as under `| head`): the run
    /// ends quietly, without a summary.
    Stop,
}

pub trait Sink {
    /// An interval ended.
    fn interval(&mut self, frame: &Frame) -> Result<Flow>;
    /// The run ended: `frame.report` is the summary since the start.
    fn summary(&mut self, frame: &Frame) -> Result<()>;
}

/// Every sink of a run, fed in order.
#[derive(Default)]
pub struct Sinks(Vec<Box<dyn Sink>>);

impl Sinks {
    pub fn push(&mut self, sink: impl Sink + 'static) {
        self.0.push(Box::new(sink));
    }
}

impl Sink for Sinks {
    fn interval(&mut self, frame: &Frame) -> Result<Flow> {
        for sink in &mut self.0 {
            if sink.interval(frame)? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Every sink gets the summary even if one fails; the first error is
    /// returned after.
    fn summary(&mut self, frame: &Frame) -> Result<()> {
        let mut first_error = None;
        for sink in &mut self.0 {
            if let Err(e) = sink.summary(frame) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

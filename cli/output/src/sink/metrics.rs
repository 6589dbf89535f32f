//! `--listen`: the metrics endpoint serves what the last interval published.

use std::net::SocketAddr;

use anyhow::Result;

use super::{Flow, Sink};
use crate::export::prometheus::{Endpoint, Snapshot};
use stackprobe_model::frame::Frame;

pub struct Metrics(Endpoint);

impl Metrics {
    /// Binds `addr` on the current tokio runtime.
    pub async fn start(addr: SocketAddr) -> Result<Self> {
        let endpoint = Endpoint::start(addr).await?;
        eprintln!("stackprobe: metrics on http://{}/metrics", endpoint.addr);
        Ok(Self(endpoint))
    }
}

impl Sink for Metrics {
    fn interval(&mut self, frame: &Frame) -> Result<Flow> {
        self.0
            .publish(Snapshot::take(frame.table, &frame.report, frame.cost));
        Ok(Flow::Continue)
    }

    fn summary(&mut self, _: &Frame) -> Result<()> {
        Ok(())
    }
}

//! `--listen`: the metrics endpoint serves what the last interval published.

use std::net::SocketAddr;

use anyhow::Result;

use super::{Flow, Sink};
use crate::export::prometheus::{Endpoint, Snapshot, WebConfig};
use stackprobe_model::frame::Frame;

pub struct Metrics(Endpoint);

impl Metrics {
    /// Binds `addr` on the current tokio runtime; TLS and basic
    /// authentication as `web` says.
    pub async fn start(addr: SocketAddr, web: Option<WebConfig>) -> Result<Self> {
        let scheme = if web.as_ref().is_some_and(WebConfig::tls) {
            "https"
        } else {
            "http"
        };
        let endpoint = Endpoint::start(addr, web).await?;
        eprintln!(
            "stackprobe: metrics on {scheme}://{}/metrics",
            endpoint.addr
        );
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

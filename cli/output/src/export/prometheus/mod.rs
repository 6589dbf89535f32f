//! `watch --listen ADDR` and `agent`: a Prometheus / OpenMetrics endpoint.
//! Histograms per role and metric (never one series per short-lived pid),
//! each both a native histogram (sparse exponential buckets about 1 % wide,
//! as fine as stackprobe's own) and classic power-of-two buckets for
//! servers without native histograms, and gauges for processes, TIME_WAIT
//! and drops. OpenMetrics text by default; Prometheus' protobuf format, the
//! one that carries native histograms, when the scraper asks for it. The
//! collector publishes a snapshot each interval; scrapes read it.
//!
//! - `snapshot`: what a scrape serves, taken from the model each interval
//! - `buckets`: a histogram's classic and native buckets
//! - `encoder`: the snapshot as metric families (names, labels, help)
//! - `endpoint`: the HTTP server and the format a scrape asks for
//! - `web_config`: `--web.config.file`, TLS and basic authentication
//! - `auth`: basic authentication against bcrypt hashes

mod auth;
mod buckets;
mod encoder;
mod endpoint;
mod snapshot;
mod web_config;

pub use endpoint::Endpoint;
pub use snapshot::Snapshot;
pub use web_config::WebConfig;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use prometheus_client::registry::Registry;
    use stackprobe_model::{frame::OwnCost, process::ProcessTable};

    use super::{Snapshot, encoder::Published};

    /// A registry serving the snapshot of `table`, as a scrape sees it.
    pub fn registry(table: &ProcessTable) -> Registry {
        let report = stackprobe_model::fixtures::interval_report(table);
        let snapshot = Snapshot::take(table, &report, OwnCost::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Published(Arc::new(Mutex::new(snapshot)))));
        registry
    }
}

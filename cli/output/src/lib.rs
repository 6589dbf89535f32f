//! Where the model's reports go: views render them (text, JSON, the
//! dashboard) and compute nothing of their own; exporters write them out
//! (recordings, plots, Prometheus); sinks take each interval's frame to one
//! of those.

pub mod export;
pub mod sink;
pub mod view;

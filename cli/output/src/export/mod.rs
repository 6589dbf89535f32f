//! Exporters: the model's histograms written out for later analysis.

pub mod file;
pub mod hlog;
pub mod plot;
pub mod prometheus;

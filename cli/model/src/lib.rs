//! The pure model: histograms, the process table and the reports views
//! render. It knows nothing of the kernel or the terminal, so it is
//! unit-tested without root.

pub mod busy;
pub mod containers;
pub mod counter;
pub mod event;
#[cfg(any(test, feature = "test-support"))]
pub mod fixtures;
pub mod frame;
pub mod histogram;
pub mod host;
pub mod insights;
pub mod kernel_hist;
pub mod measure;
pub mod probe_stats;
pub mod process;
pub mod report;
pub mod roles;
pub mod selector;
pub mod tcp;

//! What only the kernel sees, logged by the probes at debug level through
//! aya-log (slot collisions, a map with no room, a pid beyond the watch set,
//! a failed fd → socket walk, the listeners connections are attributed to):
//! shown on stderr with `watch --log-probes`, filtered by RUST_LOG when set.
//!
//! Off, it costs nothing: the programs test a level global that userspace
//! sets at load, read-only from then on, so the verifier knows the test's
//! outcome and removes the logging code; no thread reads the log buffer.
//! On, the level is the filter's most verbose one, so the kernel writes only
//! what will be shown.

use std::{
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, Result};
use aya::Ebpf;
use aya_log::EbpfLogger;
use log::LevelFilter;

use super::privileges;

/// The global the programs test before they log, and what it holds:
/// aya-log's levels (1 error … 5 trace), 0 for nothing.
pub use aya_log::LEVEL as LEVEL_GLOBAL;

/// How often the reader looks at its stop flag while no log line comes.
const POLL_MS: i32 = 100;

/// The logger kernel lines go to: stderr, RUST_LOG's filter if set, else
/// everything down to debug.
pub fn logger() -> env_logger::Logger {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("debug")).build()
}

/// The value of [`LEVEL_GLOBAL`] for `logger` (None: logging off).
pub fn kernel_level(logger: Option<&env_logger::Logger>) -> u8 {
    match logger.map_or(LevelFilter::Off, env_logger::Logger::filter) {
        LevelFilter::Off => 0,
        LevelFilter::Error => 1,
        LevelFilter::Warn => 2,
        LevelFilter::Info => 3,
        LevelFilter::Debug => 4,
        LevelFilter::Trace => 5,
    }
}

/// Reads the probes' log buffer on a thread of its own until dropped.
pub struct KernelLog {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl KernelLog {
    /// Takes the probes' log buffer out of `ebpf` and starts reading it.
    pub fn start(ebpf: &mut Ebpf, logger: env_logger::Logger) -> Result<Self> {
        let mut buffer =
            EbpfLogger::init_with_logger(ebpf, logger).context("opening the probes' log buffer")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let reader = std::thread::Builder::new()
            .name("probe-log".into())
            .spawn(move || {
                // Started while loading, before `watch` drops root's other
                // capabilities for the run (privileges.rs): this thread
                // drops them itself, as reading the buffer needs none.
                if let Err(e) = privileges::drop_unneeded() {
                    eprintln!("stackprobe: not printing the probes' log: {e:#}");
                    return;
                }
                while !stopped.load(Ordering::Relaxed) {
                    let mut ready = libc::pollfd {
                        fd: buffer.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd for the call's duration; the
                    // buffer owns the fd. An error or timeout just leads
                    // to the flush below and a look at the stop flag.
                    unsafe { libc::poll(&mut ready, 1, POLL_MS) };
                    buffer.flush();
                }
                // What the programs logged before the probes were dropped.
                buffer.flush();
            })
            .context("starting the probe log reader")?;
        Ok(Self {
            stop,
            reader: Some(reader),
        })
    }
}

impl Drop for KernelLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            // A reader that panicked on a malformed record has nothing left
            // to print.
            let _ = reader.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_logs_nothing_when_off_and_down_to_the_filters_level_when_on() {
        assert_eq!(kernel_level(None), 0);
        let debug = env_logger::Builder::new()
            .filter_level(LevelFilter::Debug)
            .build();
        assert_eq!(kernel_level(Some(&debug)), 4);
        let per_module = env_logger::Builder::new()
            .parse_filters("warn,probes::sock=trace")
            .build();
        assert_eq!(kernel_level(Some(&per_module)), 5);
        let off = env_logger::Builder::new()
            .filter_level(LevelFilter::Off)
            .build();
        assert_eq!(kernel_level(Some(&off)), 0);
    }
}

//! Shared by the root-only integration tests: a session of the real probes
//! and a lock so the tests in one binary load probes one at a time; the
//! loopback server and its clients (`server`), the binary run as a user
//! (`cli`), the programs loaded (`programs`), the machine's TCP settings
//! (`system`), a real Prometheus (`prometheus`).

#![allow(dead_code)]

mod cli;
mod netns;
mod programs;
mod prometheus;
mod server;
mod system;
mod tls;

// Each test binary uses its own part of these.
#[allow(unused_imports)]
pub use cli::*;
#[allow(unused_imports)]
pub use netns::*;
#[allow(unused_imports)]
pub use programs::*;
#[allow(unused_imports)]
pub use prometheus::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use system::*;
#[allow(unused_imports)]
pub use tls::*;

use stackprobe_model::measure::Latency;
use std::sync::{Mutex, MutexGuard};

use probes_common::{event::EVENTS_RING_BYTES, lifecycle::ExitEvent};

use stackprobe_collector::Collector;
use stackprobe_model::{process::LiveProcess, selector::Selector};
use stackprobe_probes::Options;
use stackprobe_probes::procfs;

/// 20% more accepts than the ring buffer could hold had each sent even the
/// smallest record the probes send (an exit event, behind the ring's 8-byte
/// header): with nobody reading, any accept that crossed the ring would
/// overflow it.
pub fn accepts_past_the_ring() -> u64 {
    let record = (size_of::<ExitEvent>() as u64 + 8).next_multiple_of(8);
    u64::from(EVENTS_RING_BYTES) / record * 6 / 5
}

/// The collector `stackprobe watch` runs, selecting nothing by itself: each
/// test tells its probes which processes to watch.
pub struct Session {
    pub collector: Collector,
    _runtime: tokio::runtime::Runtime,
}

impl Session {
    pub fn start() -> Self {
        Self::try_start(Options::default()).expect("loading the probes")
    }

    pub fn try_start(options: Options) -> anyhow::Result<Self> {
        require_root();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = runtime.enter();
        let collector = Collector::start(Selector::default(), options)?;
        Ok(Self {
            collector,
            _runtime: runtime,
        })
    }

    /// Moves every event waiting in the ring buffer into the table. The
    /// clients have read each server's byte, so every accept has returned
    /// and its event is already in the ring.
    /// What the kernel's histograms gained (every accept and clone) is
    /// merged too; the count returned is of ring buffer events only.
    pub fn collect(&mut self) -> usize {
        self.collector.drain().expect("draining the probes' events")
    }

    /// Mirrors the kernel's watch set into the table, as `stackprobe watch`
    /// does each interval (without reading titles or parents).
    pub fn sync(&mut self) {
        let live: Vec<LiveProcess> = self
            .collector
            .probes()
            .watched()
            .into_iter()
            .filter_map(|(pid, _)| procfs::read(pid))
            .filter(|p| p.is_process())
            .map(|p| LiveProcess {
                pid: p.pid,
                name: p.comm,
                title: None,
                parent: None,
                container: None,
                ns_pid: p.ns_pid,
            })
            .collect();
        self.collector.table_mut().sync_watched(&live);
    }

    pub fn accepts(&self, pid: u32) -> u64 {
        self.collector
            .table()
            .get(pid)
            .map_or(0, |p| p.activity.latency[Latency::Accept].total.count())
    }
}

/// Snapshots sockets into the session's table until `done` holds (bounded):
/// the last FINs may still be in flight.
pub fn observe_until(s: &mut Session, done: impl Fn(&Session) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        s.collect();
        s.sync();
        s.collector.observe_sockets().unwrap();
        if done(s) || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub const LOOPBACK: &str = env!("CARGO_BIN_EXE_stackprobe-loopback");
pub const STACKPROBE: &str = env!("CARGO_BIN_EXE_stackprobe");

static PROBE_LOCK: Mutex<()> = Mutex::new(());

/// Serialises tests that load probes, so "nothing stays loaded" checks see
/// only their own programs.
pub fn probe_lock() -> MutexGuard<'static, ()> {
    PROBE_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests load kernel probes and must run as root (cargo xtask test does)"
    );
}

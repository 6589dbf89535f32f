//! The ring buffer's reader: drains it and turns each record into a model
//! event (see `decode`). The probes do not wake us per event, so the
//! collector drains at each report as well as when the kernel signals a
//! filling ring.

use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::decode::decode;
use stackprobe_model::event::Event;

pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
    undecodable: u64,
}

impl EventStream {
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the RingBuf owns its fd and lives inside the AsyncFd, so the
        // fd stays open for as long as it is registered.
        let ring = unsafe { AsyncFd::register(ring) }?;
        Ok(Self {
            ring,
            undecodable: 0,
        })
    }

    /// Waits until the kernel forces a wakeup: the probes force one once a
    /// quarter of the ring (1 MiB: ≥ ~11.9k records of ≤ 88 bytes) is
    /// waiting.
    pub async fn readable(&mut self) -> io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Hands every waiting event to `f`; returns how many there were.
    pub fn drain(&mut self, mut f: impl FnMut(Event)) -> usize {
        let ring = self.ring.get_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            match decode(&item) {
                Some(event) => f(event),
                None => self.undecodable += 1,
            }
            n += 1;
        }
        n
    }

    /// Records that matched no known event type: a probe/userspace mismatch.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }
}

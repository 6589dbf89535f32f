//! Userspace side of the overflow histograms (kernel side:
//! probes-ebpf/src/overflow.rs): each read turns what every (process, metric,
//! bucket) gained since the last read into a model event, so samples the
//! full ring buffer could not take are still counted.

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuHashMap},
};
use probes_common::overflow::{OVERFLOW_MAP, OverflowKey, OverflowMetric, bucket_value};

use crate::{
    model::event::{Event, FoldedMetric, FoldedSamples},
    procfs,
};

/// What has been merged so far.
#[derive(Debug, Default)]
pub struct Overflow {
    /// Per key, the count already turned into events.
    seen: HashMap<OverflowKey, u64>,
    /// Accept and fork samples merged since the start (for the drop report).
    pub folded_accepts: u64,
    pub folded_forks: u64,
}

impl Overflow {
    /// Hands `f` every sample folded since the last call. Entries of
    /// processes that have exited are read one last time and removed (they
    /// can gain nothing more), which keeps the map from filling up.
    pub fn drain(&mut self, ebpf: &mut Ebpf, mut f: impl FnMut(Event)) -> Result<()> {
        let map = ebpf
            .map_mut(OVERFLOW_MAP)
            .context("the probes lack the OVERFLOW map")?;
        let mut hist: PerCpuHashMap<&mut MapData, OverflowKey, u64> = PerCpuHashMap::try_from(map)?;
        let keys: Vec<OverflowKey> = hist.keys().filter_map(Result::ok).collect();
        let mut exited: HashMap<u32, bool> = HashMap::new();
        for key in keys {
            // Asked before the read: once exited, the read below is final.
            let gone = *exited
                .entry(key.tgid)
                .or_insert_with(|| procfs::has_exited(key.tgid));
            let Ok(values) = hist.get(&key, 0) else {
                continue;
            };
            let total: u64 = values.iter().sum();
            let before = if gone {
                // Removing is safe: a process that has exited adds nothing.
                let _ = hist.remove(&key);
                self.seen.remove(&key)
            } else {
                self.seen.insert(key, total)
            }
            .unwrap_or(0);
            let count = total.saturating_sub(before);
            let Some(metric) = OverflowMetric::from_u16(key.metric).filter(|_| count > 0) else {
                continue;
            };
            let metric = match metric {
                OverflowMetric::Accept => FoldedMetric::Accept,
                OverflowMetric::AcceptQueue => FoldedMetric::AcceptQueue,
                OverflowMetric::Fork => FoldedMetric::Fork,
                OverflowMetric::Thread => FoldedMetric::Thread,
                OverflowMetric::ForkUnknown => FoldedMetric::ForkUnknown,
                OverflowMetric::ForkFailed => FoldedMetric::ForkFailed,
            };
            match metric {
                FoldedMetric::Accept => self.folded_accepts += count,
                FoldedMetric::AcceptQueue => {}
                _ => self.folded_forks += count,
            }
            f(Event::Folded(FoldedSamples {
                tgid: key.tgid,
                comm: (!gone)
                    .then(|| procfs::read(key.tgid).map(|p| p.comm))
                    .flatten(),
                metric,
                value_ns: bucket_value(key.bucket),
                count,
            }));
        }
        Ok(())
    }
}

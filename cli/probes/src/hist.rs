//! Userspace side of the kernel's latency histograms (kernel side:
//! probes-ebpf/src/hist.rs): each read turns what every (process, metric)
//! histogram gained since the last read into a model event.

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuHashMap},
};
use probes_common::{
    connect::DESTINATIONS_MAX_ENTRIES,
    hist::{HISTS_MAP, HISTS_SPARE_MAP, HistKey, HistMetric, HistValue, LISTENER_NESTED},
};

use super::{batch, connect};
use crate::procfs;
use stackprobe_model::{
    event::Event,
    kernel_hist::{HistReads, Totals},
};

/// The kernel's maps of histograms: most keys live in the first; the
/// preallocated second takes those the first could not allocate at once.
const MAPS: [&str; 2] = [HISTS_MAP, HISTS_SPARE_MAP];

/// What has been read so far, per map and histogram.
#[derive(Clone, Debug, Default)]
pub struct KernelHists {
    reads: HistReads,
    /// Listeners named so far (None: the fd was no listener when asked),
    /// by (process, fd + 1): each is asked once.
    listeners: HashMap<(u32, u64), Option<String>>,
    /// Connect destinations named so far, by id.
    destinations: HashMap<u64, String>,
    scratch: batch::Scratch,
}

impl KernelHists {
    /// Hands `f` what every histogram gained since the last call. Entries
    /// of processes that have exited are read one last time and removed
    /// (they can gain nothing more), which keeps the maps small. `live`
    /// says which processes the caller knows are alive: only the others
    /// are looked up in /proc (whether they exited, and their name).
    pub fn drain(
        &mut self,
        ebpf: &mut Ebpf,
        live: impl Fn(u32) -> bool,
        mut f: impl FnMut(Event),
    ) -> Result<()> {
        let mut exited: HashMap<u32, bool> = HashMap::new();
        let mut gained = Vec::new();
        let mut scratch = std::mem::take(&mut self.scratch);
        for (index, name) in MAPS.into_iter().enumerate() {
            let map = ebpf
                .map_mut(name)
                .with_context(|| format!("the probes lack the {name} map"))?;
            let mut hists: PerCpuHashMap<&mut MapData, HistKey, HistValue> =
                PerCpuHashMap::try_from(map)?;
            let mut gone = Vec::new();
            batch::for_each(&hists, &mut scratch, |key, values| {
                let live = live(key.tgid);
                if !live
                    && *exited
                        .entry(key.tgid)
                        .or_insert_with(|| procfs::has_exited(key.tgid))
                {
                    // Read again below: this read may predate the exit.
                    gone.push(key);
                    return;
                }
                let comm = || {
                    (!live)
                        .then(|| procfs::read(key.tgid).map(|p| p.comm))
                        .flatten()
                };
                if let Some(d) = self.reads.read_in(index, key, values, false, comm) {
                    gained.push((key, false, d));
                }
            })
            .with_context(|| format!("reading the {name} map"))?;
            for key in gone {
                // Final: the process had exited before this read, and adds
                // nothing more; so its entry can go.
                let Ok(values) = hists.get(&key, 0) else {
                    continue;
                };
                let _ = hists.remove(&key);
                if let Some(d) = self.reads.read_in(index, key, values.iter(), true, || None) {
                    gained.push((key, true, d));
                }
            }
        }
        self.scratch = scratch;
        // Named once the maps of histograms are read: a destination's
        // name is in another map.
        for (key, gone, mut d) in gained {
            d.path = if d.metric.is_connect() {
                self.destination(ebpf, key.path)
            } else if d.metric.is_run_queue() {
                None
            } else {
                self.listener(key, gone)
            };
            f(Event::Hist(d));
        }
        self.listeners
            .retain(|(tgid, _), _| !exited.get(tgid).is_some_and(|&gone| gone));
        Ok(())
    }

    /// The name of the listener `key` counts accepts from, asked of the
    /// process's fd table the first time (a process that is gone can no
    /// longer say).
    fn listener(&mut self, key: HistKey, gone: bool) -> Option<String> {
        let path = key.path & !LISTENER_NESTED;
        if path == 0 {
            return None;
        }
        if let Some(name) = self.listeners.get(&(key.tgid, path)) {
            return name.clone();
        }
        let fd = u32::try_from(path - 1).ok()?;
        if gone {
            return None;
        }
        let name = procfs::listener_name(key.tgid, fd);
        self.listeners.insert((key.tgid, path), name.clone());
        name
    }

    /// The name of the destination `id`, asked of the kernel's table until
    /// it has one.
    fn destination(&mut self, ebpf: &Ebpf, id: u64) -> Option<String> {
        if let Some(name) = self.destinations.get(&(id | 1)) {
            return Some(name.clone());
        }
        let name = connect::destination_name(ebpf, id)?;
        // Bounded like the kernel's table it caches: past that, asked anew.
        if self.destinations.len() >= DESTINATIONS_MAX_ENTRIES as usize {
            self.destinations.clear();
        }
        self.destinations.insert(id | 1, name.clone());
        Some(name)
    }
}

/// How many samples of `metric` process `tgid`'s histograms hold (from any
/// listener), after which its histograms are removed (for stackprobe's own
/// self-check).
pub fn take(ebpf: &mut Ebpf, tgid: u32, metric: HistMetric) -> Result<u64> {
    let mut count = 0;
    for name in MAPS {
        let map = ebpf
            .map_mut(name)
            .with_context(|| format!("the probes lack the {name} map"))?;
        let mut hists: PerCpuHashMap<&mut MapData, HistKey, HistValue> =
            PerCpuHashMap::try_from(map)?;
        let keys: Vec<HistKey> = hists
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.tgid == tgid)
            .collect();
        for key in keys {
            if key.metric == metric as u32 {
                count += hists
                    .get(&key, 0)
                    .map_or(0, |values| Totals::of_cpus(values.iter()).count);
            }
            let _ = hists.remove(&key);
        }
    }
    Ok(count)
}

//! Userspace side of the kernel's latency histograms (kernel side:
//! probes-ebpf/src/hist.rs): each read turns what every (process, metric)
//! histogram gained since the last read into a model event.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::{
    Ebpf,
    maps::{MapData, MapError, PerCpuHashMap, PerCpuValues},
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

/// The spare map's index in [`MAPS`].
const SPARE: usize = 1;

/// How long a key moved out of the spare map keeps its old entry there
/// before the last read: longer than any program run that looked the key up
/// in the spare map before the move, and may still be adding to it.
const SPARE_RETIRE_AFTER: Duration = Duration::from_millis(100);

/// bpf(2)'s update flag: only if the key has no entry yet.
const BPF_NOEXIST: u64 = 1;

/// What has been read so far, per map and histogram.
#[derive(Clone, Debug, Default)]
pub struct KernelHists {
    reads: HistReads,
    /// Listeners named so far (None: the fd was no listener when asked),
    /// by (process, fd + 1): each is asked once.
    listeners: HashMap<(u32, u64), Option<String>>,
    /// Connect destinations named so far, by id.
    destinations: HashMap<u64, String>,
    /// Keys of the spare map given an entry of their own in the first map,
    /// and when: the kernel looks in the first map first, so it records
    /// there from then on, and their spare entries are read a last time
    /// and removed. A key in the spare map costs each of its samples a
    /// failed lookup in the first map and a second lookup.
    moved: HashMap<HistKey, Instant>,
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
            let mut retired = Vec::new();
            let mut stay = Vec::new();
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
                if index == SPARE {
                    match self.moved.get(&key) {
                        Some(at) if at.elapsed() >= SPARE_RETIRE_AFTER => {
                            retired.push(key);
                            return;
                        }
                        Some(_) => {}
                        None => stay.push(key),
                    }
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
            for key in gone.iter().chain(&retired) {
                // Final: the process had exited before this read, or the
                // kernel records the key in the first map now; so its entry
                // can go.
                self.moved.remove(key);
                let Ok(values) = hists.get(key, 0) else {
                    continue;
                };
                let _ = hists.remove(key);
                let process_gone = !retired.contains(key);
                if let Some(d) = self
                    .reads
                    .read_in(index, *key, values.iter(), true, || None)
                {
                    gained.push((*key, process_gone, d));
                }
            }
            if !stay.is_empty() {
                self.move_out_of_spare(ebpf, &stay);
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

    /// Gives each of `keys`, in the spare map, a zeroed entry in the first
    /// map. An insert from userspace draws on the same per-CPU cache of
    /// values as the kernel's, refilled a moment later: the first that finds
    /// it empty (ENOMEM) ends this interval's moves, and the rest wait for
    /// the next. A key the first map has no room for stays where it is.
    fn move_out_of_spare(&mut self, ebpf: &mut Ebpf, keys: &[HistKey]) {
        let Ok(cpus) = aya::util::nr_cpus() else {
            return;
        };
        let Some(map) = ebpf.map_mut(HISTS_MAP) else {
            return;
        };
        let Ok(mut hists) = PerCpuHashMap::<&mut MapData, HistKey, HistValue>::try_from(map) else {
            return;
        };
        for key in keys {
            let Ok(zero) = PerCpuValues::try_from(vec![HistValue::ZERO; cpus]) else {
                return;
            };
            // BPF_NOEXIST: should the kernel have made the entry meanwhile,
            // it is kept, and the key counts as moved all the same.
            match hists.insert(key, zero, BPF_NOEXIST) {
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOMEM) =>
                {
                    return;
                }
                Err(_) if hists.get(key, 0).is_err() => {}
                _ => {
                    self.moved.insert(*key, Instant::now());
                }
            }
        }
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

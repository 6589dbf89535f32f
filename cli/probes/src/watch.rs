//! Userspace side of the watch set (kernel side: probes-ebpf/src/watch.rs):
//! sizing it, attaching the fork/exec/exit programs, and reading and seeding
//! the set through a shared mapping of the kernel's array.

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
    sync::atomic::{AtomicU8, AtomicU64, Ordering},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{HashMap, Map, MapData},
};
use probes_common::{
    TASK_COMM_LEN,
    watch::{
        EXEC_PROGRAM, EXIT_PROGRAM, FORK_CHILD_PID_OFFSET_GLOBAL, FORK_PROGRAM, PIDS_PER_CHUNK,
        WATCHED_CGROUPS_MAP, WATCHED_CGROUPS_MAX_ENTRIES, WATCHED_MAP, WATCHED_MAX_CHUNKS,
        WATCHED_NAMES_MAP, WatchReason,
    },
};

use super::{
    attach::{Setup, attach_tracepoints},
    tracefs::Tracefs,
};
use crate::procfs;

pub fn setup(tracefs: &Tracefs) -> Result<Setup> {
    let child_pid = tracefs.offset("sched", "sched_process_fork", "child_pid", 4)?;
    Ok(Setup {
        globals: vec![(FORK_CHILD_PID_OFFSET_GLOBAL, child_pid)],
        map_sizes: vec![(WATCHED_MAP, chunk_count(procfs::pid_max()))],
    })
}

/// One byte per possible pid: pid_max bytes, 4 MiB at the kernel's ceiling.
pub fn chunk_count(pid_max: u32) -> u32 {
    pid_max
        .div_ceil(PIDS_PER_CHUNK as u32)
        .clamp(1, WATCHED_MAX_CHUNKS)
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        FORK_PROGRAM,
        "sched",
        &["sched_process_fork"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        EXEC_PROGRAM,
        "sched",
        &["sched_process_exec"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        EXIT_PROGRAM,
        "sched",
        &["sched_process_exit"],
    )
}

pub fn add_names(ebpf: &mut Ebpf, keys: &[[u8; TASK_COMM_LEN]]) -> Result<()> {
    let map = ebpf
        .map_mut(WATCHED_NAMES_MAP)
        .context("the probes lack the WATCHED_NAMES map")?;
    let mut names: HashMap<_, [u8; TASK_COMM_LEN], u32> = HashMap::try_from(map)?;
    for key in keys {
        names
            .insert(key, 1, 0)
            .context("adding a name to the watch set")?;
    }
    Ok(())
}

/// Processes that exec in one of these cgroups (v2 ids) are watched from
/// then on; returns how many of them were new to the map.
pub fn add_cgroups(ebpf: &mut Ebpf, ids: &[u64]) -> Result<usize> {
    let map = ebpf
        .map_mut(WATCHED_CGROUPS_MAP)
        .with_context(|| format!("the probes lack the {WATCHED_CGROUPS_MAP} map"))?;
    let mut cgroups: HashMap<_, u64, u32> = HashMap::try_from(map)?;
    let mut added = 0;
    for id in ids {
        if cgroups.get(id, 0).is_err() {
            cgroups.insert(id, 1, 0).with_context(|| {
                format!(
                    "adding cgroup {id} to the watch set (at most {WATCHED_CGROUPS_MAX_ENTRIES} \
                     cgroups)"
                )
            })?;
            added += 1;
        }
    }
    Ok(added)
}

/// The kernel's watch-set array, mapped into this process. The kernel and
/// userspace each write whole single bytes, so neither overwrites the
/// other's change to a neighbouring pid.
pub struct WatchSet {
    bytes: NonNull<u8>,
    len: usize,
    mapped_len: usize,
    _map: MapData,
}

impl WatchSet {
    pub fn take(ebpf: &mut Ebpf) -> Result<Self> {
        let Some(Map::Array(map)) = ebpf.take_map(WATCHED_MAP) else {
            bail!("the probes lack the {WATCHED_MAP} array");
        };
        let chunks = map.info()?.max_entries() as usize;
        let len = chunks * PIDS_PER_CHUNK;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mapped_len = len.div_ceil(page) * page;
        // SAFETY: mapping a BPF_F_MMAPABLE array map's fd at offset 0 for at
        // most its (page-rounded) size, as the kernel allows.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping the watch set");
        }
        let bytes = NonNull::new(ptr.cast()).ok_or_else(|| anyhow!("mmap returned null"))?;
        Ok(Self {
            bytes,
            len,
            mapped_len,
            _map: map,
        })
    }

    fn byte(&self, pid: u32) -> Option<&AtomicU8> {
        let i = pid as usize;
        // SAFETY: in bounds of the live mapping; AtomicU8 has u8's layout.
        // Every store to the shared bytes, the kernel's and these, is a
        // single byte; loads take a byte or a whole word (see `set_bytes`).
        (i < self.len).then(|| unsafe { AtomicU8::from_ptr(self.bytes.as_ptr().add(i)) })
    }

    /// Watches `pid` unless it is already watched (keeping how it got there).
    pub fn add(&self, pid: u32) -> Result<()> {
        let byte = self
            .byte(pid)
            .with_context(|| format!("pid {pid} is beyond the watch set ({} pids)", self.len))?;
        if byte.load(Ordering::Relaxed) == 0 {
            byte.store(WatchReason::Selected as u8, Ordering::Relaxed);
            // Had it exited between the /proc read and the store, the kernel's
            // exit probe has already run: clear the byte so a recycled pid is
            // not watched.
            if procfs::has_exited(pid) {
                byte.store(0, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Stops watching `pid` (its children stay watched, as ever).
    pub fn remove(&self, pid: u32) {
        if let Some(byte) = self.byte(pid) {
            byte.store(0, Ordering::Relaxed);
        }
    }

    /// Every watched pid: processes, and threads started by watched processes
    /// while they live.
    pub fn pids(&self) -> Vec<(u32, Option<WatchReason>)> {
        // SAFETY: the mapping is page-aligned and `len` (whole chunks of
        // PIDS_PER_CHUNK bytes) is a multiple of 8, so the words cover the
        // live mapping exactly; AtomicU64 has u64's layout.
        let words = unsafe {
            std::slice::from_raw_parts(self.bytes.as_ptr().cast::<AtomicU64>(), self.len / 8)
        };
        set_bytes(words)
            .into_iter()
            .map(|(pid, v)| (pid, WatchReason::from_u8(v)))
            .collect()
    }
}

const _: () = assert!(PIDS_PER_CHUNK.is_multiple_of(8));

/// The pids whose byte is set in the watch set's bytes `words`, with those
/// bytes. The set is as long as pid_max and almost all zeros, so it is read
/// a word at a time: where systemd raises pid_max to 4M, reading it a byte
/// at a time was two thirds of an idle stackprobe's CPU (3.4 ms a
/// second). The kernel writes whole bytes, so a word read while it writes
/// one holds each byte either before or after.
pub fn set_bytes(words: &[AtomicU64]) -> Vec<(u32, u8)> {
    let mut set = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let word = word.load(Ordering::Relaxed);
        if word == 0 {
            continue;
        }
        for (j, byte) in word.to_ne_bytes().into_iter().enumerate() {
            if byte != 0 {
                set.push(((i * 8 + j) as u32, byte));
            }
        }
    }
    set
}

impl Drop for WatchSet {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what take() mapped.
        unsafe { libc::munmap(self.bytes.as_ptr().cast(), self.mapped_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_bytes_names_each_set_pid_once_in_order() {
        let bytes = [
            0u8, 0, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
        ];
        let words: Vec<AtomicU64> = bytes
            .chunks(8)
            .map(|c| AtomicU64::new(u64::from_ne_bytes(c.try_into().unwrap())))
            .collect();
        assert_eq!(set_bytes(&words), [(2, 3), (7, 1), (16, 2)]);
        assert!(set_bytes(&[AtomicU64::new(0)]).is_empty());
    }

    #[test]
    fn one_byte_per_pid_up_to_the_kernel_ceiling() {
        assert_eq!(chunk_count(32768), 512);
        assert_eq!(chunk_count(32769), 513);
        assert_eq!(chunk_count(1 << 22), WATCHED_MAX_CHUNKS);
        assert_eq!(chunk_count(u32::MAX), WATCHED_MAX_CHUNKS);
        assert_eq!(chunk_count(0), 1);
    }
}

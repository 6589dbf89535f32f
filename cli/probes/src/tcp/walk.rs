//! Walks of every TCP socket through the `iter/tcp` iterator, in each
//! network namespace asked for.

use std::io::Read as _;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{Array, HashMap, MapError},
    programs::Iter,
};
use probes_common::sock::{
    ITER_AGGREGATE, ITER_CONFIG_MAP, ITER_EVERY_SOCKET, ITER_PROGRAM, IterConfig, LinkKey,
    TCP_LISTEN, TW_COUNTS_MAP, TcpSocket, TwCount,
};

use crate::{decode, privileges};
use stackprobe_model::tcp::{
    key::KernelLink,
    snapshot::Unwalked,
    sockets::{ListenDrops, TcpSock},
};

fn set_config(ebpf: &mut Ebpf, config: IterConfig) -> Result<()> {
    let map = ebpf
        .map_mut(ITER_CONFIG_MAP)
        .with_context(|| format!("the probes lack {ITER_CONFIG_MAP}"))?;
    let mut array: Array<_, IterConfig> = Array::try_from(map)?;
    Ok(array.set(0, config, 0)?)
}

/// A new walk of the TCP sockets of the network namespace this thread is
/// in (the kernel takes it when the file is made).
fn iterator_file(ebpf: &mut Ebpf) -> Result<std::fs::File> {
    let iter: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .context("the eBPF object has no TCP iterator")?
        .try_into()?;
    let link = iter.attach().context("attaching the TCP iterator")?;
    Ok(iter.take_link(link)?.into_file()?)
}

/// A walk of the namespace process `pid` lives in: this thread enters it
/// for as long as the kernel takes to make the file, then comes back. The
/// inner error says why that namespace cannot be walked; the outer one
/// that this thread could not come back, which ends the run (staying
/// there would make every later walk wrong).
fn iterator_file_in(ebpf: &mut Ebpf, pid: u32) -> Result<Result<std::fs::File>> {
    let home = std::fs::File::open("/proc/thread-self/ns/net")
        .context("opening stackprobe's own network namespace")?;
    let there = match std::fs::File::open(format!("/proc/{pid}/ns/net")) {
        Ok(f) => f,
        Err(e) => {
            return Ok(Err(anyhow!(
                "opening process {pid}'s network namespace: {e}"
            )));
        }
    };
    let mut entered = false;
    let file = privileges::entering_namespaces(|| {
        enter(&there).with_context(|| format!("entering process {pid}'s network namespace"))?;
        entered = true;
        let file = iterator_file(ebpf);
        enter(&home).context("returning to stackprobe's own network namespace")?;
        Ok(file)
    });
    match file {
        Ok(file) => Ok(file),
        Err(e) if entered => Err(e),
        Err(e) => Ok(Err(e)),
    }
}

fn enter(ns: &std::fs::File) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a plain syscall on a namespace file we hold open.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Reads a walk to its end: its sockets, and its listeners' drops.
fn read_walk(mut file: std::fs::File) -> Result<(Vec<TcpSock>, Vec<ListenDrops>)> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .context("reading the TCP iterator")?;
    Ok((decode::tcp_sockets(&bytes), listen_drops(&bytes)))
}

/// Each listener's `sk_drops` in a walk's records.
fn listen_drops(bytes: &[u8]) -> Vec<ListenDrops> {
    bytes
        .chunks_exact(size_of::<TcpSocket>())
        .filter_map(|chunk| {
            // SAFETY: `chunk` holds size_of::<TcpSocket>() bytes, read
            // unaligned; TcpSocket is plain data (probes-common asserts its
            // layout), valid for any bytes.
            let s: TcpSocket = unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast()) };
            (s.state == TCP_LISTEN).then(|| ListenDrops {
                netns: decode::netns(s.netns),
                ino: s.ino,
                drops: s.drops,
            })
        })
        .collect()
}

/// Runs the iterator once in stackprobe's own namespace.
fn run_iterator(ebpf: &mut Ebpf) -> Result<(Vec<TcpSock>, Vec<ListenDrops>)> {
    read_walk(iterator_file(ebpf)?)
}

/// Every TCP socket on the machine now.
pub fn snapshot(ebpf: &mut Ebpf) -> Result<Vec<TcpSock>> {
    set_config(
        ebpf,
        IterConfig {
            mode: ITER_EVERY_SOCKET,
            ..IterConfig::default()
        },
    )?;
    Ok(run_iterator(ebpf)?.0)
}

/// What a walk in aggregate mode found.
pub struct Walked {
    pub listeners: Vec<TcpSock>,
    pub time_wait: Vec<(KernelLink, u64)>,
    pub sockets: usize,
    /// Namespaces that could not be walked, and why.
    pub unwalked: Vec<Unwalked>,
    /// Every listener's drops (`sk_drops`), in every namespace walked.
    pub listen_drops: Vec<ListenDrops>,
}

/// Walks every TCP socket of stackprobe's network namespace and of each
/// other one in `elsewhere` (its inode number, and a process living
/// there), the kernel counting TIME_WAIT sockets per link and writing only
/// listeners; `generation` numbers the walk.
pub fn walk(ebpf: &mut Ebpf, generation: u32, elsewhere: &[(u32, u32)]) -> Result<Walked> {
    set_config(
        ebpf,
        IterConfig {
            mode: ITER_AGGREGATE,
            generation,
            walked: 0,
        },
    )?;
    let (mut listeners, mut listen_drops) = run_iterator(ebpf)?;
    let mut unwalked = Vec::new();
    for &(netns, pid) in elsewhere {
        match iterator_file_in(ebpf, pid)? {
            Ok(file) => {
                let (there, drops) = read_walk(file)?;
                listeners.extend(there);
                listen_drops.extend(drops);
            }
            Err(e) => unwalked.push(Unwalked {
                netns,
                pid,
                reason: format!("{e:#}"),
            }),
        }
    }
    let sockets = {
        let map = ebpf
            .map(ITER_CONFIG_MAP)
            .with_context(|| format!("the probes lack {ITER_CONFIG_MAP}"))?;
        let array: Array<_, IterConfig> = Array::try_from(map)?;
        array.get(&0, 0)?.walked as usize
    };
    let map = ebpf
        .map_mut(TW_COUNTS_MAP)
        .with_context(|| format!("the probes lack {TW_COUNTS_MAP}"))?;
    let mut counts: HashMap<_, LinkKey, TwCount> = HashMap::try_from(map)?;
    let mut time_wait = Vec::new();
    let mut stale = Vec::new();
    for entry in counts.iter() {
        let (key, count) = entry?;
        if count.generation != u64::from(generation) {
            stale.push(key);
        } else if let Some(link) = decode::kernel_link(&key) {
            time_wait.push((link, count.count));
        }
    }
    // Links with no TIME_WAIT socket any more: their entries go, so the map
    // holds only links that have some.
    for key in stale {
        match counts.remove(&key) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Walked {
        listeners,
        time_wait,
        sockets,
        unwalked,
        listen_drops,
    })
}

//! Userspace side of the TCP probes (kernel side: probes-ebpf/src/sock.rs,
//! tcp_state.rs, tcp_links.rs): struct offsets from BTF, the choice of hook
//! for state changes, the kernel's per-link counts, and walks of every TCP
//! socket through the `iter/tcp` iterator (decoded in `decode`).

use std::io::Read as _;

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    maps::{Array, HashMap, MapError, PerCpuHashMap},
    programs::{BtfTracePoint, Iter},
};
use probes_common::sock::{
    AF_INET, AF_INET6, CLOSE_MEMBERS, ITER_AGGREGATE, ITER_CONFIG_MAP, ITER_EVERY_SOCKET,
    ITER_MEMBERS, ITER_PROGRAM, IterConfig, LINKS_MAP, LISTEN_OWNERS_MAP, LinkCounts, LinkKey,
    ListenOwner, NET_MEMBERS, PROTOCOL_MEMBER, RECORD_WINDOW, SIDE_ACTIVE, SIDE_PASSIVE,
    SOCK_COMMON_MEMBERS, SOCK_COMMON_SIZES, SOCK_WINDOW, STATE_BTF_EVENT, STATE_BTF_NESTED_PROGRAM,
    STATE_BTF_PROGRAM, STATE_FIELD_SIZES, STATE_FIELDS, STATE_PROGRAM, TW_COUNTS_MAP, TwCount,
    listen_key,
};

use super::{
    attach::{Setup, attach_tracepoints, program},
    btf::KernelBtf,
    decode, privileges,
    rungs::StateRung,
    tracefs::Tracefs,
};
use stackprobe_model::{
    links::{KernelLink, LinkTotals, Side, Unwalked},
    sockets::{Netns, TcpSock},
};

pub fn setup(btf: &KernelBtf, tracefs: &Tracefs) -> Result<Setup> {
    let mut globals = btf.offsets(ITER_MEMBERS)?;
    for ((name, offset), size) in globals
        .iter()
        .take(SOCK_COMMON_MEMBERS.len())
        .zip(SOCK_COMMON_SIZES)
    {
        if (offset + size) as usize > SOCK_WINDOW {
            bail!(
                "{name} lies at byte {offset} of struct sock here, past the {SOCK_WINDOW} bytes \
                 stackprobe copies"
            );
        }
    }
    let net = btf.offsets(NET_MEMBERS)?;
    if let Some((name, offset)) = net.first()
        && *offset as usize + size_of::<u64>() > SOCK_WINDOW
    {
        bail!(
            "{name} lies at byte {offset} of struct sock here, past the {SOCK_WINDOW} bytes \
             stackprobe copies"
        );
    }
    globals.extend(net);
    globals.extend(btf.offsets(CLOSE_MEMBERS)?);
    // Without it (a bitfield before 5.6) the tp_btf program is not used.
    globals.extend(btf.offsets(PROTOCOL_MEMBER).unwrap_or_default());
    for (f, size) in STATE_FIELDS.iter().zip(STATE_FIELD_SIZES) {
        let offset = tracefs
            .field("sock", "inet_sock_set_state", f.field)?
            .offset;
        if (offset + size) as usize > RECORD_WINDOW {
            bail!(
                "inet_sock_set_state's {} lies at byte {offset} of its record here, past the \
                 {RECORD_WINDOW} bytes stackprobe copies",
                f.field
            );
        }
        globals.push((f.global, offset));
    }
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

/// Whether the tp_btf state program can read what it needs here (it reads
/// `sk_protocol` directly, which was a bitfield before 5.6).
pub fn tp_btf_readable(btf: &KernelBtf) -> bool {
    btf.offsets(PROTOCOL_MEMBER).is_ok()
}

/// Attaches the state probe to the best hook this kernel offers.
pub fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Tracefs,
    btf: &Btf,
    tp_btf_readable: bool,
) -> Result<StateRung> {
    let btf_tracepoint = if tp_btf_readable {
        attach_btf_tracepoint(ebpf, btf)
    } else {
        Err(anyhow!("sock.sk_protocol is a bitfield here"))
    };
    match btf_tracepoint {
        Ok(()) => Ok(StateRung::BtfTracepoint),
        Err(_) => {
            for name in [STATE_BTF_PROGRAM, STATE_BTF_NESTED_PROGRAM] {
                if let Ok(p) = program::<BtfTracePoint>(ebpf, name) {
                    let _ = p.unload();
                }
            }
            attach_tracepoints(
                ebpf,
                tracefs,
                STATE_PROGRAM,
                "sock",
                &["inet_sock_set_state"],
            )?;
            Ok(StateRung::Tracepoint)
        }
    }
}

/// The probe, then its nested copy, which must run after it on each change.
fn attach_btf_tracepoint(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    for name in [STATE_BTF_PROGRAM, STATE_BTF_NESTED_PROGRAM] {
        let p: &mut BtfTracePoint = program(ebpf, name)?;
        p.load(STATE_BTF_EVENT, btf)
            .with_context(|| format!("loading tp_btf {name}"))?;
        p.attach()
            .with_context(|| format!("attaching tp_btf {name}"))?;
    }
    Ok(())
}

/// Tells the kernel who owns a listening port, so connections arriving there
/// (whose handshake completes in softirq) are attributed to it; unless the
/// accept probe found who accepts there, which it keeps.
pub fn set_listen_owner(ebpf: &mut Ebpf, netns: Netns, port: u16, owner: u32) -> Result<()> {
    let key = listen_key(netns.unwrap_or_else(decode::home_netns), port);
    let mut owners = listen_owners(ebpf)?;
    match owners.get(&key, 0) {
        Ok(current) if current.owner == owner || current.accepted != 0 => Ok(()),
        Ok(_) | Err(MapError::KeyNotFound) => {
            let value = ListenOwner { owner, accepted: 0 };
            Ok(owners.insert(key, value, 0)?)
        }
        Err(e) => Err(e.into()),
    }
}

/// Forgets who owns `port` in stackprobe's own namespace.
pub fn forget_listen_owner(ebpf: &mut Ebpf, port: u16) -> Result<()> {
    match listen_owners(ebpf)?.remove(&listen_key(decode::home_netns(), port)) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn listen_owners(ebpf: &mut Ebpf) -> Result<HashMap<&mut aya::maps::MapData, u64, ListenOwner>> {
    let map = ebpf
        .map_mut(LISTEN_OWNERS_MAP)
        .with_context(|| format!("the probes lack {LISTEN_OWNERS_MAP}"))?;
    Ok(HashMap::try_from(map)?)
}

pub fn load(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let iter: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .context("the eBPF object has no TCP iterator")?
        .try_into()?;
    iter.load("tcp", btf)
        .context("loading the iter/tcp program (the kernel's verifier refused it)")
}

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

/// Reads a walk to its end.
fn read_walk(mut file: std::fs::File) -> Result<Vec<TcpSock>> {
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .context("reading the TCP iterator")?;
    Ok(decode::tcp_sockets(&bytes))
}

/// Runs the iterator once in stackprobe's own namespace.
fn run_iterator(ebpf: &mut Ebpf) -> Result<Vec<TcpSock>> {
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
    run_iterator(ebpf)
}

/// What a walk in aggregate mode found.
pub struct Walked {
    pub listeners: Vec<TcpSock>,
    pub time_wait: Vec<(KernelLink, u64)>,
    pub sockets: usize,
    /// Namespaces that could not be walked, and why.
    pub unwalked: Vec<Unwalked>,
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
    let mut listeners = run_iterator(ebpf)?;
    let mut unwalked = Vec::new();
    for &(netns, pid) in elsewhere {
        match iterator_file_in(ebpf, pid)? {
            Ok(file) => listeners.extend(read_walk(file)?),
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
    })
}

fn links_map(
    ebpf: &mut Ebpf,
) -> Result<PerCpuHashMap<&mut aya::maps::MapData, LinkKey, LinkCounts>> {
    let map = ebpf
        .map_mut(LINKS_MAP)
        .with_context(|| format!("the probes lack {LINKS_MAP}"))?;
    Ok(PerCpuHashMap::try_from(map)?)
}

/// Every link the kernel counts, with its totals since load.
pub fn links(ebpf: &mut Ebpf) -> Result<Vec<(KernelLink, LinkTotals)>> {
    let map = links_map(ebpf)?;
    let mut out = Vec::new();
    for entry in map.iter() {
        let (key, per_cpu) = entry?;
        if let Some(link) = decode::kernel_link(&key) {
            out.push((link, decode::link_totals(per_cpu.iter())));
        }
    }
    Ok(out)
}

/// Removes `owner`'s links from the kernel's map (the self-check's own).
pub fn forget_owner(ebpf: &mut Ebpf, owner: u32) -> Result<()> {
    let mine: Vec<KernelLink> = links(ebpf)?
        .into_iter()
        .filter(|(l, _)| l.owner == owner)
        .map(|(l, _)| l)
        .collect();
    forget_links(ebpf, &mine)
}

/// Removes links from the kernel's map.
pub fn forget_links(ebpf: &mut Ebpf, links: &[KernelLink]) -> Result<()> {
    let mut map = links_map(ebpf)?;
    for link in links {
        match map.remove(&link_key(link)) {
            Ok(()) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The kernel's key for `link` (the inverse of decode::kernel_link).
fn link_key(link: &KernelLink) -> LinkKey {
    let bytes = |ip: std::net::IpAddr| match ip {
        std::net::IpAddr::V4(v4) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&v4.octets());
            b
        }
        std::net::IpAddr::V6(v6) => v6.octets(),
    };
    let p = &link.peer;
    LinkKey {
        owner: link.owner,
        side: match p.side {
            Side::Active => SIDE_ACTIVE,
            Side::Passive => SIDE_PASSIVE,
        },
        _pad: 0,
        family: if p.addr.is_ipv4() { AF_INET } else { AF_INET6 },
        port: p.addr.port(),
        _pad2: 0,
        addr: bytes(p.addr.ip()),
        peer_ip: p.peer_ip.map_or([0; 16], bytes),
        netns: p.netns.unwrap_or_else(decode::home_netns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_key_decodes_back_to_itself() {
        for link in [
            KernelLink {
                owner: 7,
                peer: stackprobe_model::links::Peer {
                    side: Side::Passive,
                    addr: "[::1]:80".parse().unwrap(),
                    peer_ip: Some("::1".parse().unwrap()),
                    netns: None,
                },
            },
            KernelLink {
                owner: 0,
                peer: stackprobe_model::links::Peer {
                    side: Side::Active,
                    addr: "10.1.2.3:5432".parse().unwrap(),
                    peer_ip: None,
                    netns: Some(4026532001),
                },
            },
        ] {
            assert_eq!(decode::kernel_link(&link_key(&link)), Some(link));
        }
    }
}

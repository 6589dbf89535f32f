//! Userspace side of the TCP socket probes (kernel side:
//! probes-ebpf/src/sock.rs): struct offsets from BTF, and snapshots of every
//! TCP socket through the `iter/tcp` iterator (decoded in `decode`).

use std::io::Read as _;

use anyhow::{Context as _, Result};
use aya::{
    Btf, Ebpf,
    maps::{HashMap, MapError},
    programs::Iter,
};
use probes_common::sock::{
    ITER_MEMBERS, ITER_PROGRAM, LISTEN_OWNERS_MAP, STATE_FIELDS, STATE_PROGRAM,
};

use super::{
    attach::{Setup, attach_tracepoints},
    btf::KernelBtf,
    decode,
    tracefs::Tracefs,
};
use crate::model::sockets::TcpSock;

pub fn setup(btf: &KernelBtf, tracefs: &Tracefs) -> Result<Setup> {
    let mut globals = btf.offsets(ITER_MEMBERS)?;
    for f in STATE_FIELDS {
        let offset = tracefs
            .field("sock", "inet_sock_set_state", f.field)?
            .offset;
        globals.push((f.global, offset));
    }
    Ok(Setup {
        globals,
        map_sizes: Vec::new(),
    })
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        STATE_PROGRAM,
        "sock",
        &["inet_sock_set_state"],
    )
}

/// Tells the kernel who owns a listening port, so connections arriving there
/// (whose handshake completes in softirq) are attributed to it.
pub fn set_listen_owner(ebpf: &mut Ebpf, port: u16, owner: u32) -> Result<()> {
    let map = ebpf
        .map_mut(LISTEN_OWNERS_MAP)
        .context("the probes lack the LISTEN_OWNERS map")?;
    let mut owners: HashMap<_, u32, u32> = HashMap::try_from(map)?;
    match owners.get(&u32::from(port), 0) {
        Ok(current) if current == owner => Ok(()),
        Ok(_) | Err(MapError::KeyNotFound) => Ok(owners.insert(u32::from(port), owner, 0)?),
        Err(e) => Err(e.into()),
    }
}

pub fn load(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let iter: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .context("the eBPF object has no TCP iterator")?
        .try_into()?;
    iter.load("tcp", btf)
        .context("loading the iter/tcp program (the kernel's verifier refused it)")
}

/// Every TCP socket on the machine now.
pub fn snapshot(ebpf: &mut Ebpf) -> Result<Vec<TcpSock>> {
    let iter: &mut Iter = ebpf
        .program_mut(ITER_PROGRAM)
        .context("the eBPF object has no TCP iterator")?
        .try_into()?;
    let link = iter.attach().context("attaching the TCP iterator")?;
    let mut file = iter.take_link(link)?.into_file()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .context("reading the TCP iterator")?;
    Ok(decode::tcp_sockets(&bytes))
}

//! Userspace side of the TCP socket probes (kernel side:
//! probes-ebpf/src/sock.rs): struct offsets from BTF, and snapshots of every
//! TCP socket through the `iter/tcp` iterator.

use std::io::Read as _;

use anyhow::{Context as _, Result};
use aya::{Btf, Ebpf, programs::Iter};
use probes_common::sock::{AF_INET6, ITER_PROGRAM, OFFSET_GLOBALS, TcpSocket};

use super::{btf::KernelBtf, events::read_record, loader::Setup};
use crate::model::sockets::{TcpSock, TcpState, address};

pub fn setup(btf: &KernelBtf) -> Result<Setup> {
    let sock = |path: &[&str]| btf.path_offset("sock", path);
    let offsets = [
        sock(&["__sk_common", "skc_daddr"])?,
        sock(&["__sk_common", "skc_rcv_saddr"])?,
        sock(&["__sk_common", "skc_dport"])?,
        sock(&["__sk_common", "skc_num"])?,
        sock(&["__sk_common", "skc_family"])?,
        sock(&["__sk_common", "skc_state"])?,
        sock(&["__sk_common", "skc_v6_daddr"])?,
        sock(&["__sk_common", "skc_v6_rcv_saddr"])?,
        sock(&["sk_ack_backlog"])?,
        sock(&["sk_max_ack_backlog"])?,
        sock(&["sk_socket"])?,
        btf.member_offset("socket", "file")?,
        btf.member_offset("file", "f_inode")?,
        btf.member_offset("inode", "i_ino")?,
    ];
    Ok(Setup {
        globals: OFFSET_GLOBALS.iter().copied().zip(offsets).collect(),
        map_sizes: Vec::new(),
    })
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
    Ok(bytes
        .chunks_exact(size_of::<TcpSocket>())
        .filter_map(|chunk| decode(&read_record(chunk)?))
        .collect())
}

fn decode(s: &TcpSocket) -> Option<TcpSock> {
    let v6 = s.family == AF_INET6;
    Some(TcpSock {
        state: TcpState::from_kernel(s.state)?,
        local: address(v6, s.laddr, s.lport),
        remote: address(v6, s.raddr, u16::from_be(s.rport_be)),
        ino: s.ino,
        backlog: s.ack_backlog,
        max_backlog: s.max_ack_backlog,
    })
}

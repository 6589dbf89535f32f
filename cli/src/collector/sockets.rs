//! One look at the machine's TCP sockets: the iterator's snapshot, which
//! watched process owns each listening socket (by inode, as `ss -p` finds
//! it), and the kernel's TCP counters. Owners are told to the kernel, which
//! needs them to attribute connections whose handshake completes in softirq.

use std::{collections::HashMap, time::Instant};

use anyhow::Result;

use crate::{
    model::{
        links::{KernelCounters, SocketSnapshot},
        process::ProcessTable,
        sockets::TcpState,
    },
    probes::Probes,
    procfs,
};

pub fn snapshot(probes: &mut Probes, table: &ProcessTable) -> Result<SocketSnapshot> {
    let started = Instant::now();
    let sockets = probes.tcp_sockets()?;
    let listening: HashMap<u64, u16> = sockets
        .iter()
        .filter(|s| s.state == TcpState::Listen && s.ino != 0)
        .map(|s| (s.ino, s.local.port()))
        .collect();
    let mut owners: HashMap<u16, u32> = HashMap::new();
    if !listening.is_empty() {
        // Lowest pid first: a master and its workers share the listening
        // socket, and the master is named its owner.
        let mut pids: Vec<u32> = table.iter().filter(|p| p.watched).map(|p| p.pid).collect();
        pids.sort_unstable();
        for pid in pids {
            for ino in procfs::socket_inodes(pid) {
                if let Some(&port) = listening.get(&ino) {
                    owners.entry(port).or_insert(pid);
                }
            }
        }
    }
    for (&port, &owner) in &owners {
        probes.set_listen_owner(port, owner)?;
    }
    let c = procfs::tcp_ext_counters();
    let get = |name: &str| c.get(name).copied().unwrap_or(0);
    Ok(SocketSnapshot {
        sockets,
        owners,
        counters: KernelCounters {
            listen_overflows: get("ListenOverflows"),
            listen_drops: get("ListenDrops"),
            time_wait_overflows: get("TCPTimeWaitOverflow"),
        },
        ephemeral_ports: procfs::local_port_range()
            .map(|(lo, hi)| u32::from(hi.saturating_sub(lo)) + 1),
        took_us: started.elapsed().as_micros() as u64,
    })
}

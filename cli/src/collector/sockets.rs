//! One look at the machine's TCP connections: the links' counts the kernel
//! keeps, a walk of every socket (listeners, which watched process owns
//! each listening socket by inode as `ss -p` finds it, and TIME_WAIT
//! sockets per link counted by the iterator), and the kernel's TCP
//! counters. Owners are told to the kernel, which needs them to attribute
//! connections whose handshake completes in softirq.

use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use anyhow::Result;

use crate::{
    model::{
        links::{KernelCounters, SocketSnapshot, Walk},
        process::ProcessTable,
        sockets::TcpState,
    },
    probes::Probes,
    procfs,
};

/// Walks with up to this many sockets run every interval; beyond, one walk
/// per this many sockets more, up to [`MAX_WALK_PERIOD`] intervals apart.
/// A TIME_WAIT socket lives 60 s, so the count now changes slowly; new
/// TIME_WAIT is counted exactly from the state changes.
const SOCKETS_PER_INTERVAL: usize = 5000;
const MAX_WALK_PERIOD: u64 = 10;

/// When the sockets were last walked, and how many there were.
#[derive(Debug, Default)]
pub struct Walks {
    generation: u32,
    looks_since: u64,
    last_sockets: usize,
}

impl Walks {
    /// Whether this look walks the sockets: always when `forced` or when
    /// they were few, else every few looks.
    fn due(&mut self, forced: bool) -> bool {
        self.looks_since += 1;
        let period = (self.last_sockets / SOCKETS_PER_INTERVAL + 1) as u64;
        let due = forced || self.generation == 0 || self.looks_since >= period.min(MAX_WALK_PERIOD);
        if due {
            self.looks_since = 0;
        }
        due
    }
}

pub fn snapshot(
    probes: &mut Probes,
    table: &ProcessTable,
    walks: &mut Walks,
    force_walk: bool,
) -> Result<SocketSnapshot> {
    let started = Instant::now();
    let links = probes.tcp_links()?;
    let walk = if walks.due(force_walk) {
        walks.generation = walks.generation.wrapping_add(1).max(1);
        let walked = probes.tcp_walk(walks.generation)?;
        walks.last_sockets = walked.sockets;
        let owners = listen_owners(probes, table, &walked.listeners)?;
        Some(Walk {
            listeners: walked.listeners,
            owners,
            time_wait: walked.time_wait,
            sockets: walked.sockets,
        })
    } else {
        None
    };
    let mut owners: HashSet<u32> = links.iter().map(|(l, _)| l.owner).collect();
    if let Some(w) = &walk {
        owners.extend(w.time_wait.iter().map(|(l, _)| l.owner));
    }
    let roles = owners
        .into_iter()
        .filter_map(|pid| Some((pid, table.get(pid)?.role())))
        .collect();
    let c = procfs::tcp_ext_counters();
    let get = |name: &str| c.get(name).copied().unwrap_or(0);
    Ok(SocketSnapshot {
        links,
        walk,
        roles,
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

/// Which watched process owns each listening port, told to the kernel too.
fn listen_owners(
    probes: &mut Probes,
    table: &ProcessTable,
    listeners: &[crate::model::sockets::TcpSock],
) -> Result<HashMap<u16, u32>> {
    let listening: HashMap<u64, u16> = listeners
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
    Ok(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_sockets_are_walked_less_often_but_a_forced_walk_always_runs() {
        let mut w = Walks::default();
        assert!(w.due(false), "the first look walks");
        w.generation = 1;
        w.last_sockets = 100;
        assert!(w.due(false) && w.due(false));
        // 15000 sockets: one walk in four looks.
        w.last_sockets = 3 * SOCKETS_PER_INTERVAL;
        let walked: Vec<bool> = (0..8).map(|_| w.due(false)).collect();
        assert_eq!(
            walked,
            [false, false, false, true, false, false, false, true]
        );
        assert!(w.due(true));
        w.last_sockets = 1_000_000;
        assert_eq!((0..MAX_WALK_PERIOD).filter(|_| w.due(false)).count(), 1);
    }
}

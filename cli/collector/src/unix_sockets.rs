//! The watched processes' listening unix sockets: told to the kernel, which
//! stamps only their queues (see probes_common::unix), and their backlogs
//! now, as `ss -xl` shows them.
//!
//! Owners are found as for TCP listeners (sockets.rs): /proc/PID/fd is read
//! only when a listener appears that was not seen before, or for processes
//! new to the watch set.

use std::collections::{HashMap, HashSet};

use anyhow::Result;

use stackprobe_model::process::ProcessTable;
use stackprobe_probes::{
    Probes, procfs,
    unix_listeners::{UnixListener, unix_listeners},
};

#[derive(Default)]
pub struct UnixSockets {
    /// Listener inode → the lowest watched pid holding it, None if none.
    owner_of: HashMap<u64, Option<u32>>,
    /// Watched pids whose fds were read.
    scanned: HashSet<u32>,
    /// The watched listeners as last listed, with their owner.
    watched: Vec<(u32, UnixListener)>,
}

impl UnixSockets {
    /// Lists the listening unix sockets, finds which watched processes hold
    /// them, and tells the kernel of new ones and forgets gone ones.
    pub fn refresh(&mut self, probes: &mut Probes, table: &ProcessTable) -> Result<()> {
        let listeners = unix_listeners()?;
        let mut pids: Vec<u32> = table.iter().filter(|p| p.watched).map(|p| p.pid).collect();
        pids.sort_unstable();
        let watched: HashSet<u32> = pids.iter().copied().collect();
        let now: HashSet<u64> = listeners.iter().map(|l| l.inode).collect();
        self.owner_of.retain(|ino, owner| {
            now.contains(ino) && owner.is_none_or(|pid| watched.contains(&pid))
        });
        let unseen = now.iter().any(|ino| !self.owner_of.contains_key(ino));
        let readers: Vec<u32> = if unseen {
            pids.clone()
        } else {
            pids.iter()
                .copied()
                .filter(|pid| !self.scanned.contains(pid))
                .collect()
        };
        for &ino in &now {
            self.owner_of.entry(ino).or_insert(None);
        }
        for pid in readers {
            for ino in procfs::socket_inodes(pid) {
                if let Some(owner) = self.owner_of.get_mut(&ino) {
                    *owner = Some(owner.map_or(pid, |o| o.min(pid)));
                }
            }
        }
        self.scanned = watched;
        let owner_of = &self.owner_of;
        probes.forget_unix_listeners(|ino| owner_of.get(&ino).is_some_and(Option::is_some))?;
        self.watched.clear();
        for l in listeners {
            if let Some(Some(owner)) = self.owner_of.get(&l.inode) {
                probes.watch_unix_listener(l.inode, *owner)?;
                self.watched.push((*owner, l));
            }
        }
        Ok(())
    }

    /// The watched listeners at the last refresh, each with its owner.
    pub fn listeners(&self) -> &[(u32, UnixListener)] {
        &self.watched
    }
}

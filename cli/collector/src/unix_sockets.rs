//! The watched processes' listening unix sockets: told to the kernel, which
//! stamps only their queues (see probes_common::unix), and their backlogs
//! now, as `ss -xl` shows them.
//!
//! Owners are found as for TCP listeners (sockets.rs): /proc/PID/fd is read
//! only when a listener appears that was not seen before, or for processes
//! new to the watch set that are no copy of a parent read before (fds.rs).
//!
//! Connects a full queue refused: the kernel counts them per destination
//! path for every process on the host, since the probes loaded; each path
//! that gained is matched to the watched listener it names, by the socket
//! file (its device and inode), not the string, so `/var/run/x.sock` finds
//! `/run/x.sock`, and a symlink its target; an abstract name (`@name`) by
//! the name.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::Path,
};

use anyhow::Result;

use super::{busy::probes_clock_ns, fds};
use stackprobe_model::{counter::Counter, process::ProcessTable, tcp::lost::Gains};
use stackprobe_probes::{
    Probes, procfs,
    unix_listeners::{UnixListener, from_proc_net_unix, unix_listeners},
};

#[derive(Default)]
pub struct UnixSockets {
    /// Listener inode → the lowest watched pid holding it, None if none.
    owner_of: HashMap<u64, Option<u32>>,
    /// Watched pids whose fds were read (or copied from a parent's), and
    /// when.
    scanned: fds::Known,
    /// The watched listeners as last listed, with their owner.
    watched: Vec<(u32, UnixListener)>,
    /// The kernel's count of refused connects per destination id, at the
    /// last look.
    lost_seen: Gains<u64>,
    /// Destination id → the path the clients gave, as the kernel named it.
    names: HashMap<u64, String>,
    /// Watched listener inode → the connects its full queue refused.
    lost: HashMap<u64, Counter>,
    queues_known: bool,
}

impl UnixSockets {
    /// Lists the listening unix sockets, finds which watched processes hold
    /// them, and tells the kernel of new ones and forgets gone ones.
    pub fn refresh(&mut self, probes: &mut Probes, table: &ProcessTable) -> Result<()> {
        // Without the kernel's unix_diag, /proc/net/unix still names the
        // listeners, but not their queues.
        let listeners = match unix_listeners() {
            Ok(l) => {
                self.queues_known = true;
                l
            }
            Err(_) => {
                self.queues_known = false;
                from_proc_net_unix()?
                    .into_iter()
                    .map(|(inode, path)| UnixListener {
                        inode,
                        path,
                        queued: 0,
                        max_backlog: 0,
                    })
                    .collect()
            }
        };
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
                .filter(|pid| !self.scanned.contains_key(pid))
                .collect()
        };
        for &ino in &now {
            self.owner_of.entry(ino).or_insert(None);
        }
        let mut copied = fds::Known::new();
        for pid in readers {
            // A copy of a parent read before holds no listener it did not.
            if !unseen && let Some(at) = fds::inherited(fds::forked(table, pid), &self.scanned) {
                copied.insert(pid, at);
                continue;
            }
            for ino in procfs::socket_inodes(pid) {
                if let Some(owner) = self.owner_of.get_mut(&ino) {
                    *owner = Some(owner.map_or(pid, |o| {
                        fds::first_holder(o, pid, |p| fds::parent(table, p))
                    }));
                }
            }
        }
        let read_at = probes_clock_ns();
        self.scanned = fds::after_scan(&pids, &copied, unseen, &self.scanned, read_at);
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

    /// Whether the last refresh knew the listeners' queues (the kernel's
    /// sock_diag has its unix part).
    pub fn queues_known(&self) -> bool {
        self.queues_known
    }

    /// The watched listeners at the last refresh, each with its owner.
    pub fn listeners(&self) -> &[(u32, UnixListener)] {
        &self.watched
    }

    /// Adds the connects each destination's full queue refused since the
    /// last look to the watched listener its path names (a listener not
    /// watched then counts none of them).
    pub fn observe_lost(&mut self, probes: &Probes) -> Result<()> {
        let totals = probes.unix_lost()?;
        let ids: HashSet<u64> = totals.iter().map(|&(id, _)| id).collect();
        self.lost_seen.retain(|id| ids.contains(id));
        self.names.retain(|id, _| ids.contains(id));
        // Each listener's socket file, looked up once per look.
        let mut nodes: HashMap<u64, Option<Node>> = HashMap::new();
        for (id, total) in totals {
            let gained = self.lost_seen.gained(id, total);
            if gained == 0 {
                continue;
            }
            let name = match self.names.get(&id) {
                Some(name) => name.clone(),
                // Not named: the kernel's table of names was full.
                None => match probes.destination_name(id) {
                    Some(name) => self.names.entry(id).or_insert(name).clone(),
                    None => continue,
                },
            };
            if let Some(inode) = listener_named(&self.watched, &name, &mut nodes) {
                self.lost.entry(inode).or_default().add(gained);
            }
        }
        let watched: HashSet<u64> = self.watched.iter().map(|(_, l)| l.inode).collect();
        self.lost.retain(|inode, _| watched.contains(inode));
        Ok(())
    }

    /// The connects the listener with socket inode `inode` lost at its
    /// full queue, in this interval and since the start.
    pub fn lost(&self, inode: u64) -> Counter {
        self.lost.get(&inode).copied().unwrap_or_default()
    }

    /// Forgets the connects counted so far (those the kernel counted are
    /// not counted again).
    pub fn forget_lost(&mut self) {
        self.lost.clear();
    }

    /// Starts a new interval.
    pub fn reset_interval(&mut self) {
        for c in self.lost.values_mut() {
            c.interval = 0;
        }
    }
}

/// A file's device and inode.
type Node = (u64, u64);

/// The file at `path` as process `pid` sees it: an absolute path under its
/// root (a container's files), a relative one from its working directory.
fn node_of(pid: u32, path: &str) -> Option<Node> {
    let at = if path.starts_with('/') {
        format!("/proc/{pid}/root{path}")
    } else {
        format!("/proc/{pid}/cwd/{path}")
    };
    let m = std::fs::metadata(at).ok()?;
    Some((m.dev(), m.ino()))
}

/// The inode of the watched listener a client's `name` for it names: an
/// abstract name (`@name`) the same; an absolute path, the same socket
/// file, looked up where the listener's owner sees files; a relative path
/// (from the client's working directory, which the kernel does not keep),
/// the only listener whose path ends with it.
fn listener_named(
    watched: &[(u32, UnixListener)],
    name: &str,
    nodes: &mut HashMap<u64, Option<Node>>,
) -> Option<u64> {
    if name.starts_with('@') {
        return watched
            .iter()
            .find(|(_, l)| l.path == name)
            .map(|(_, l)| l.inode);
    }
    let files = watched
        .iter()
        .filter(|(_, l)| !l.path.is_empty() && !l.path.starts_with('@'));
    if name.starts_with('/') {
        return files
            .filter(|(owner, l)| {
                let node = *nodes
                    .entry(l.inode)
                    .or_insert_with(|| node_of(*owner, &l.path));
                node.is_some() && node == node_of(*owner, name)
            })
            .map(|(_, l)| l.inode)
            .next();
    }
    let relative = name.trim_start_matches("./");
    if relative.is_empty() || relative.split('/').any(|c| c == "..") {
        return None;
    }
    let mut ending: Vec<u64> = files
        .filter(|(_, l)| Path::new(&l.path).ends_with(relative))
        .map(|(_, l)| l.inode)
        .collect();
    ending.dedup();
    (ending.len() == 1).then(|| ending[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(inode: u64, path: &str) -> (u32, UnixListener) {
        (
            std::process::id(),
            UnixListener {
                inode,
                path: path.into(),
                queued: 0,
                max_backlog: 2,
            },
        )
    }

    #[test]
    fn a_clients_name_finds_its_listener_by_the_socket_file() {
        let dir =
            std::env::temp_dir().join(format!("stackprobe-unix-named-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let sock = dir.join("sub/x.sock");
        let _bound = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::symlink(&sock, dir.join("link.sock")).unwrap();
        let watched = [
            listener(1, sock.to_str().unwrap()),
            listener(2, "@abstract"),
            listener(3, "/run/elsewhere/y.sock"),
        ];
        let mut nodes = HashMap::new();
        let mut named = |name: &str| listener_named(&watched, name, &mut nodes);
        assert_eq!(named(sock.to_str().unwrap()), Some(1));
        // Another spelling of the same file, and a symlink to it.
        assert_eq!(
            named(&format!("{}/sub/../sub//x.sock", dir.display())),
            Some(1)
        );
        assert_eq!(named(dir.join("link.sock").to_str().unwrap()), Some(1));
        assert_eq!(named("@abstract"), Some(2));
        assert_eq!(named("@abstrac"), None);
        // Relative: the only listener whose path ends with it.
        assert_eq!(named("x.sock"), Some(1));
        assert_eq!(named("./sub/x.sock"), Some(1));
        assert_eq!(named("y.sock"), Some(3));
        assert_eq!(named("z.sock"), None);
        assert_eq!(named("../x.sock"), None);
        assert_eq!(named(dir.join("gone.sock").to_str().unwrap()), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

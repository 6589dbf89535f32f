//! Which watched processes' socket fds are known, and since when: the
//! owner scans of TCP and unix listeners (sockets.rs, unix_sockets.rs) read
//! /proc/PID/fd once per process new to the watch set, to find listeners no
//! watched process was seen holding.
//!
//! A process forked while watched needs no read of its own when its parent's
//! fds were known before the fork: its fd table is a copy of its parent's,
//! and a copy holds no listener its parent was not seen holding, but one
//! the parent got after its read. A new listening socket is a new inode, and
//! a new inode makes every watched process be read again; so only a
//! listener handed over through a unix socket (SCM_RIGHTS, which no probe
//! sees) would be missed, as it is for any process read before it got it.
//! The fork must come well after the parent's read (the fork event is
//! stamped after the copy). The copy's pid may be below its parent's (pids
//! wrap): a listener's owner is chosen by descent, not by pid alone
//! ([`first_holder`]), so a copy never owns what its parent holds, read or
//! not. (Choosing the lowest pid made every backend forked below its
//! postmaster's pid be read: under a fork per request on a machine whose
//! pid_max is 32768, pids wrap every minute or two.)

use std::collections::HashMap;

use stackprobe_model::process::ProcessTable;

/// How long after its parent's read a fork must come for its child to go
/// unread: the spawn event's stamp comes a little after the fd table's copy.
const FORK_MARGIN_NS: u64 = 10_000_000;

/// Watched pid → when its socket fds were last known (CLOCK_MONOTONIC ns,
/// the probes' clock): read then, or copied from a parent known earlier.
pub type Known = HashMap<u32, u64>;

/// The parent and fork time of `pid` if the table saw it forked (while the
/// probes watched).
pub fn forked(table: &ProcessTable, pid: u32) -> Option<(u32, u64)> {
    Some((parent(table, pid)?, table.get(pid)?.born_ns?))
}

/// `pid`'s parent, if the table knows it.
pub fn parent(table: &ProcessTable, pid: u32) -> Option<u32> {
    Some(table.get(pid)?.parent.as_ref()?.0)
}

/// When a process's fds became known without a read of its own: at its
/// fork, if `forked` (its parent and fork time) says it is a copy of a
/// parent whose fds were known before.
pub fn inherited(forked: Option<(u32, u64)>, known: &Known) -> Option<u64> {
    let (parent, born) = forked?;
    let at = *known.get(&parent)?;
    (at.saturating_add(FORK_MARGIN_NS) < born).then_some(born)
}

/// Which of `a` and `b`, two watched processes holding the same listening
/// socket, owns it: the one the other descends from (a master, not the
/// workers it handed the socket down to), else the lower pid (two holders
/// of no known kinship: the same answer for every look).
pub fn first_holder(a: u32, b: u32, parent_of: impl Fn(u32) -> Option<u32>) -> u32 {
    if descends(a, b, &parent_of) {
        b
    } else if descends(b, a, &parent_of) {
        a
    } else {
        a.min(b)
    }
}

/// Generations [`descends`] climbs: deeper kin counts as none.
const MAX_GENERATIONS: usize = 16;

/// Whether `pid` descends from `ancestor`, by the parents the table knows.
fn descends(pid: u32, ancestor: u32, parent_of: impl Fn(u32) -> Option<u32>) -> bool {
    std::iter::successors(parent_of(pid), |&p| parent_of(p))
        .take(MAX_GENERATIONS)
        .any(|p| p == ancestor)
}

/// What is known of `pids` after a scan at `read_at` that read those not
/// in `copied` (whose fds are known from their fork): all of them now, if
/// it looked for something (`read`); else each since its last read, or
/// from now if never read.
pub fn after_scan(pids: &[u32], copied: &Known, read: bool, before: &Known, read_at: u64) -> Known {
    pids.iter()
        .map(|&pid| {
            let at = match copied.get(&pid) {
                Some(&at) => at,
                None if read => read_at,
                None => before.get(&pid).copied().unwrap_or(read_at),
            };
            (pid, at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_forked_after_its_parents_read_inherits_what_was_read() {
        let known = Known::from([(10, 1_000_000_000)]);
        let later = 1_000_000_000 + FORK_MARGIN_NS + 1;
        assert_eq!(inherited(Some((10, later)), &known), Some(later));
        // Forked before, or too close to, its parent's read: read it.
        assert_eq!(inherited(Some((10, 1_000_000_000)), &known), None);
        assert_eq!(inherited(Some((10, 900_000_000)), &known), None);
        // A parent not read, a child not seen forked.
        assert_eq!(inherited(Some((20, later)), &known), None);
        assert_eq!(inherited(None, &known), None);
    }

    #[test]
    fn a_listener_belongs_to_the_holder_the_others_descend_from_whatever_the_pids() {
        // 30000 forked 100 (pids wrapped), which forked 50; 7 is no kin.
        let parent_of = |pid| match pid {
            100 => Some(30_000),
            50 => Some(100),
            30_000 => Some(1),
            _ => None,
        };
        assert_eq!(first_holder(30_000, 100, parent_of), 30_000);
        assert_eq!(first_holder(100, 30_000, parent_of), 30_000);
        assert_eq!(first_holder(50, 30_000, parent_of), 30_000);
        assert_eq!(first_holder(50, 100, parent_of), 100);
        // No kinship: the lower pid, in either order.
        assert_eq!(first_holder(7, 30_000, parent_of), 7);
        assert_eq!(first_holder(30_000, 7, parent_of), 7);
        // A cycle in stale parents ends.
        let cycle = |pid| Some(if pid == 2 { 3 } else { 2 });
        assert_eq!(first_holder(2, 5, cycle), 2);
    }
}

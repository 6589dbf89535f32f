//! A unix connection's wait in a watched listener's queue (see
//! probes_common::unix): its start from the enqueue probe (fentry), the
//! data-ready probe (6.3 and later) or the connect probe, its end from the
//! accept probe, paired here by the connection's server-side socket,
//! `newsk`.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use probes_common::{
    hist::HistMetric,
    sock::TCP_LISTEN,
    unix::{
        RUNG_DATA_READY, RUNG_FENTRY, RUNG_SYSCALLS, UNIX_LISTENERS_MAX_ENTRIES,
        UNIX_LOST_MAX_ENTRIES, UNIX_QUEUED_MAX_ENTRIES, UnixQueued,
    },
};

use crate::{
    atomic, hist,
    offsets::offset_globals,
    tcp_sock::{self, SKC_STATE},
};

probes_common::unix_queue_members!(offset_globals);

/// Watched listeners' socket inodes, from userspace.
#[map]
static UNIX_LISTENERS: HashMap<u64, u32> = HashMap::with_max_entries(UNIX_LISTENERS_MAX_ENTRIES, 0);

/// LRU: on the syscall rung every unix connect on the host leaves its
/// start here, and those to unwatched listeners are never taken.
#[map]
static UNIX_QUEUED: LruHashMap<u64, UnixQueued> =
    LruHashMap::with_max_entries(UNIX_QUEUED_MAX_ENTRIES, 0);

#[map]
static UNIX_CONFIG: Array<u32> = Array::with_max_entries(1, 0);

/// Connects a full queue refused, by destination id, from every process.
#[map]
static UNIX_LOST: LruHashMap<u64, u64> = LruHashMap::with_max_entries(UNIX_LOST_MAX_ENTRIES, 0);

#[inline(always)]
fn rung() -> u32 {
    UNIX_CONFIG.get(0).copied().unwrap_or(0)
}

/// Whether the syscall rung is on: the connect probe then follows every
/// unix connect's start.
#[inline(always)]
pub fn pairs_syscalls() -> bool {
    rung() == RUNG_SYSCALLS
}

/// `sock:sk_data_ready` for the unix socket `sk`, in the client's connect
/// if `sk` listens: stamps the connection at its queue's tail, and the one
/// before it if no stamp of its own is there yet (two connects to one
/// listener on two CPUs can both queue before either's data-ready runs,
/// which then both see the second at the tail).
#[inline(always)]
pub fn enqueued(sk: u64, now: u64) {
    if rung() != RUNG_DATA_READY || tcp_sock::read::<u8>(sk, &SKC_STATE) != Some(TCP_LISTEN) {
        return;
    }
    if !watched(sk) {
        return;
    }
    let head = sk + u64::from(SK_RECEIVE_QUEUE.load());
    let Some(tail) = tcp_sock::read::<u64>(sk, &SK_RECEIVE_QUEUE_PREV).filter(|&t| t != head)
    else {
        return;
    };
    if let Some(newsk) = tcp_sock::read::<u64>(tail, &SKB_SK) {
        stamp(newsk, now, 0);
    }
    if let Some(before) = tcp_sock::read::<u64>(tail, &SKB_PREV).filter(|&b| b != head)
        && let Some(newsk) = tcp_sock::read::<u64>(before, &SKB_SK)
    {
        stamp(newsk, now, u64::from(BPF_NOEXIST));
    }
}

/// On the fentry rung: a unix connect to `listener` is about to queue
/// `newsk` there (its full-queue check passed).
#[inline(always)]
pub fn connecting(listener: u64, newsk: u64, now: u64) {
    if rung() == RUNG_FENTRY && watched(listener) {
        stamp(newsk, now, 0);
    }
}

/// Whether the listening socket `listener` is one a watched process holds
/// (by its inode, which userspace tells the kernel).
#[inline(always)]
fn watched(listener: u64) -> bool {
    tcp_sock::inode(listener).is_some_and(|ino| UNIX_LISTENERS.get_ptr(ino).is_some())
}

/// Stamps the connection `newsk` queued at `now`. With `flags` 0 it
/// replaces any stamp already there: a freed socket's, whose address this
/// one reuses.
#[inline(always)]
fn stamp(newsk: u64, now: u64, flags: u64) {
    let start = UnixQueued {
        ns: now,
        ..UnixQueued::default()
    };
    let _ = UNIX_QUEUED.insert(newsk, start, flags);
}

/// `tgid` accepted the unix connection `newsk` from `listener` (its fd
/// plus one) at `now`: records its queue wait if its start is known, or,
/// on the syscall rung, leaves the accept for the connect's exit to pair.
#[inline(always)]
pub fn accepted(newsk: u64, tgid: u32, listener: u32, now: u64) {
    match rung() {
        RUNG_FENTRY | RUNG_DATA_READY => {
            if let Some(q) = UNIX_QUEUED.get_ptr(newsk) {
                // SAFETY: a live map value, copied out at once.
                let start = unsafe { (*q).ns };
                let _ = UNIX_QUEUED.remove(newsk);
                record(tgid, listener, now, start);
            }
        }
        RUNG_SYSCALLS => {
            let peer = tcp_sock::read::<u64>(newsk, &UNIX_PEER).unwrap_or(0);
            let accept = UnixQueued {
                ns: now,
                peer,
                tgid,
                listener,
            };
            pair(newsk, accept);
        }
        _ => {}
    }
}

/// On the syscall rung: the unix connect on `client` (its socket) that
/// started at `start` succeeded.
#[inline(always)]
pub fn connected(client: u64, start: u64) {
    let Some(newsk) = tcp_sock::read::<u64>(client, &UNIX_PEER).filter(|&s| s != 0) else {
        return;
    };
    let connect = UnixQueued {
        ns: start,
        peer: client,
        tgid: 0,
        listener: 0,
    };
    pair(newsk, connect);
}

/// Leaves one end of `newsk`'s wait, or, if the other end is there, records
/// the wait. Two ends arriving at once on two CPUs: the insert that finds
/// the other's entry there fails, and takes it.
#[inline(always)]
fn pair(newsk: u64, end: UnixQueued) {
    for _ in 0..2 {
        if let Some(q) = UNIX_QUEUED.get_ptr(newsk) {
            // SAFETY: a live map value, copied out at once.
            let other = unsafe { *q };
            // A connect's entry names its client, an accept's the client its
            // socket's peer is: a stale entry of a freed `newsk` differs.
            if other.peer == end.peer && (other.tgid == 0) != (end.tgid == 0) {
                let _ = UNIX_QUEUED.remove(newsk);
                let (accept, start) = if end.tgid != 0 {
                    (end, other.ns)
                } else {
                    (other, end.ns)
                };
                record(accept.tgid, accept.listener, accept.ns, start);
                return;
            }
            let _ = UNIX_QUEUED.insert(newsk, end, 0);
            return;
        }
        if UNIX_QUEUED
            .insert(newsk, end, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            return;
        }
    }
}

/// A unix connect to the destination `id` found its listener's queue full.
#[inline(always)]
pub fn lost(id: u64) {
    match UNIX_LOST.get_ptr_mut(id) {
        // SAFETY: a live map value; every writer only adds to it atomically.
        Some(n) => unsafe { atomic::add(n, 1) },
        None => {
            // Another CPU may insert it meanwhile: then add to theirs.
            if UNIX_LOST.insert(id, 1, u64::from(BPF_NOEXIST)).is_err()
                && let Some(n) = UNIX_LOST.get_ptr_mut(id)
            {
                // SAFETY: as above.
                unsafe { atomic::add(n, 1) };
            }
        }
    }
}

#[inline(always)]
fn record(tgid: u32, listener: u32, accepted: u64, start: u64) {
    hist::record(
        tgid,
        HistMetric::AcceptQueue,
        u64::from(listener),
        accepted.saturating_sub(start),
    );
}

//! Service time and busy servers (see probes_common::service): a connection
//! starts at its accept (the accept probe) and ends, TCP, at the server's
//! first FIN or a reset (the state probe), unix, at the close that drops
//! its file's last reference (the close probe) or at the exit of the
//! process holding it (the exit probe), whoever holds it by then.
//!
//! A TCP connection that arrived at a watched listener keeps its service
//! in its tracked record (see tracked), which the state probe reads at its
//! end anyway; the others (unix ones, TCP ones older than the probes) in
//! [`SERVICES`].

use core::ptr::NonNull;

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use probes_common::{
    hist::{HistMetric, LISTENER_NESTED},
    service::{
        BUSY_MAX_ENTRIES, Busy, EXIT_SCAN_FDS, SERVICES_MAX_ENTRIES, Service, UNIX_HELD_MAX_ENTRIES,
    },
    sock::{SIDE_ACTIVE, TrackedSocket},
};

use crate::{atomic, clock::now, fds, hist, memory, tracked, watch_set::is_watched};

#[map]
static SERVICES: HashMap<u64, Service> = HashMap::with_max_entries(SERVICES_MAX_ENTRIES, 0);

#[map]
static BUSY: HashMap<u32, Busy> = HashMap::with_max_entries(BUSY_MAX_ENTRIES, 0);

#[map]
static BUSY_MAX: HashMap<u32, u64> = HashMap::with_max_entries(BUSY_MAX_ENTRIES, 0);

/// How many of [`SERVICES`]' connections are TCP ([`TCP`]) and unix
/// ([`UNIX`]): while none, a TCP socket's end, or a close or an exit,
/// costs no lookup there.
#[map]
static SERVICES_OPEN: Array<u64> = Array::with_max_entries(2, 0);

const TCP: u32 = 0;
const UNIX: u32 = 1;

/// Unix connections being served, by acceptor ([`process_key`]) and by
/// the acceptor's fd ([`fd_key`]): a close walks the fd table only for an
/// fd its process, or its parent (the postmaster of a backend), accepted
/// one at, and an exit only in a process that holds one or whose parent
/// does. LRU: an fd's count left at 0 stays until pushed out.
#[map]
static UNIX_HELD: LruHashMap<u64, u64> = LruHashMap::with_max_entries(UNIX_HELD_MAX_ENTRIES, 0);

/// 1 when a hook that sees a unix connection's end is attached (the
/// release fentry, or the close and exit probes): only then does a unix
/// accept start a service.
#[map]
static SERVICE_CONFIG: Array<u32> = Array::with_max_entries(1, 0);

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static FILE_REFS: Global<u32> = Global::new(0);

// SAFETY: as above.
#[unsafe(no_mangle)]
static FILE_ONE_REF: Global<u32> = Global::new(1);

#[inline(always)]
fn fd_key(tgid: u32, fd: u32) -> u64 {
    u64::from(tgid) << 32 | u64::from(fd)
}

/// No fd is u32::MAX.
#[inline(always)]
fn process_key(tgid: u32) -> u64 {
    fd_key(tgid, u32::MAX)
}

#[inline(always)]
fn open_count(kind: u32, n: u64) {
    if let Some(p) = SERVICES_OPEN.get_ptr_mut(kind) {
        // SAFETY: a live array value, only ever added to atomically.
        unsafe { atomic::add(p, n) };
    }
}

#[inline(always)]
fn any_open(kind: u32) -> bool {
    SERVICES_OPEN.get(kind).is_some_and(|n| *n != 0)
}

/// The server `tgid` works for: its parent if watched (a master whose
/// workers accept), else itself.
#[inline(always)]
fn server_of(tgid: u32) -> u32 {
    match fds::parent_tgid() {
        Some(parent) if parent != 0 && is_watched(parent) => parent,
        _ => tgid,
    }
}

/// `tgid` accepted the TCP connection whose tracked record is `p`, from
/// `listener` (its fd plus one), at `at`; the accept has taken the
/// record's `since_ns`.
#[inline(always)]
pub fn started_tracked(p: NonNull<TrackedSocket>, tgid: u32, listener: u32, at: u64) {
    let server = server_of(tgid);
    let p = p.as_ptr();
    // SAFETY: see tracked::get; `served_tgid`, written last, says the rest
    // is set.
    unsafe {
        (*p).since_ns = at;
        (*p).served_listener = listener;
        (*p).served_server = server;
        (*p).served_tgid = tgid;
    }
    busy_started(server, at);
}

/// `tgid` accepted the connection `sk` from `listener` (its fd plus one),
/// at `unix_fd` if a unix connection.
#[inline(always)]
pub fn started(sk: u64, tgid: u32, listener: u32, at: u64, unix_fd: Option<u32>) {
    if unix_fd.is_some() && SERVICE_CONFIG.get(0).copied().unwrap_or(0) == 0 {
        return;
    }
    let kind = if unix_fd.is_some() { UNIX } else { TCP };
    // A socket address still here is a freed socket's whose end no hook
    // saw (its holder exited with it past the fds an exit looks through):
    // it no longer counts as held.
    if any_open(kind) {
        forget(sk);
    }
    let server = server_of(tgid);
    let service = Service {
        start_ns: at,
        tgid,
        listener,
        server,
        unix_fd: unix_fd.map_or(0, |fd| fd.saturating_add(1)),
    };
    if SERVICES.insert(sk, service, 0).is_err() {
        return;
    }
    open_count(kind, 1);
    if let Some(fd) = unix_fd {
        hold(process_key(tgid));
        hold(fd_key(tgid, fd));
    }
    busy_started(server, at);
}

/// `server` holds one more connection, from `at`.
#[inline(always)]
fn busy_started(server: u32, at: u64) {
    let busy = match BUSY.get_ptr_mut(server) {
        Some(b) => b,
        None => {
            let _ = BUSY.insert(server, Busy::default(), u64::from(BPF_NOEXIST));
            let Some(b) = BUSY.get_ptr_mut(server) else {
                return;
            };
            b
        }
    };
    // SAFETY: a live map value; its counters are only added to atomically.
    let open = unsafe {
        atomic::add(&raw mut (*busy).open, 1);
        atomic::add(&raw mut (*busy).open_start_ns, at);
        (*busy).open
    };
    // Raised here only, and set by userspace to what is held when it reads:
    // two CPUs raising it at once may leave the lower of their two counts.
    match BUSY_MAX.get_ptr_mut(server) {
        // SAFETY: a live map value.
        Some(max) => unsafe {
            if open > *max {
                *max = open;
            }
        },
        None => {
            let _ = BUSY_MAX.insert(server, open, u64::from(BPF_NOEXIST));
        }
    }
}

/// One more unix connection held under `key`.
#[inline(always)]
fn hold(key: u64) {
    match UNIX_HELD.get_ptr_mut(key) {
        // SAFETY: a live map value, only ever added to atomically.
        Some(p) => unsafe { atomic::add(p, 1) },
        None => {
            // Another CPU may insert it meanwhile: then add to theirs.
            if UNIX_HELD.insert(key, 1, u64::from(BPF_NOEXIST)).is_err()
                && let Some(p) = UNIX_HELD.get_ptr_mut(key)
            {
                // SAFETY: as above.
                unsafe { atomic::add(p, 1) };
            }
        }
    }
}

/// One unix connection fewer held under `key` (gone if its acceptor
/// exited).
#[inline(always)]
fn unhold(key: u64) {
    if let Some(n) = UNIX_HELD.get_ptr_mut(key) {
        // SAFETY: as in `hold`.
        unsafe { atomic::add(n, u64::MAX) };
    }
}

/// Whether a unix connection is held under `key`.
#[inline(always)]
fn holds(key: u64) -> bool {
    // SAFETY: a live map value, read once.
    UNIX_HELD.get_ptr(key).is_some_and(|n| unsafe { *n } != 0)
}

/// Whether the current process `tgid`, or its parent, holds a unix
/// connection under the key `key_of` makes of it: only then may its close
/// (of that fd) or exit end one.
#[inline(always)]
fn may_hold_unix(tgid: u32, key_of: impl Fn(u32) -> u64) -> bool {
    holds(key_of(tgid)) || fds::parent_tgid().is_some_and(|p| holds(key_of(p)))
}

/// Takes `sk`'s service out of [`SERVICES`], if it has one.
#[inline(always)]
fn take(sk: u64) -> Option<Service> {
    let p = SERVICES.get_ptr(sk)?;
    // SAFETY: a live map value, copied out at once.
    let service = unsafe { *p };
    SERVICES.remove(sk).ok()?;
    match service.unix_fd.checked_sub(1) {
        Some(fd) => {
            open_count(UNIX, u64::MAX);
            unhold(process_key(service.tgid));
            unhold(fd_key(service.tgid, fd));
        }
        None => open_count(TCP, u64::MAX),
    }
    Some(service)
}

/// Whether the busy count of the server `service` is kept under gives it
/// back, ended at `at` (`None`: ended unseen, no service time).
#[inline(always)]
fn release(service: &Service, at: Option<u64>) {
    if let Some(busy) = BUSY.get_ptr_mut(service.server) {
        // SAFETY: as in `busy_started`; adding u64::MAX takes one away, and
        // the start's two's complement takes the start away.
        unsafe {
            atomic::add(&raw mut (*busy).open, u64::MAX);
            atomic::add(
                &raw mut (*busy).open_start_ns,
                service.start_ns.wrapping_neg(),
            );
            // An end unseen adds its wait up to now: it was held until some
            // time no hook saw, no later than now.
            let end = at.unwrap_or_else(now);
            atomic::add(
                &raw mut (*busy).ended_ns,
                end.saturating_sub(service.start_ns),
            );
        }
    }
}

#[inline(always)]
fn forget(sk: u64) {
    if let Some(service) = take(sk) {
        release(&service, None);
    }
}

/// `service` ended at `at`; `nested`: in the state probe's nested copy,
/// whose samples keep apart (see LISTENER_NESTED).
#[inline(always)]
fn finish(service: &Service, at: u64, nested: bool) {
    let path = u64::from(service.listener);
    hist::record(
        service.tgid,
        HistMetric::Service,
        if nested { path | LISTENER_NESTED } else { path },
        at.saturating_sub(service.start_ns),
    );
    release(service, Some(at));
}

/// The watched client `owner`'s TCP connection, whose record is `p`, was
/// answered; it sent its SYN at `at`: it is held from then until its end.
#[inline(always)]
pub fn connected(p: NonNull<TrackedSocket>, owner: u32, at: u64) {
    let p = p.as_ptr();
    // SAFETY: see tracked::get.
    unsafe {
        (*p).since_ns = at;
        (*p).served_tgid = owner;
    }
}

/// The TCP socket `sk` (its tracked record, if followed) sent its first
/// FIN (its close or shutdown) or was reset: the service of an accepted
/// connection ends, and a client's hold on one it opened. `nested`: in
/// the state probe's nested copy, whose samples keep apart: a listener's
/// under LISTENER_NESTED, a destination's under the path
/// `destination_path` gives it.
// A call of its own: inlined, its branches multiplied the state probe's
// paths past the 1M instructions 6.1's verifier explores.
#[inline(never)]
pub fn tcp_ended(sk: u64, nested: bool, destination_path: impl Fn(u64) -> u64) {
    if let Some(p) = tracked::get(sk) {
        let p = p.as_ptr();
        // SAFETY: see tracked::get; the first to clear `served_tgid` ends
        // the service, or the hold.
        let (tgid, start) = unsafe {
            let tgid = core::mem::replace(&mut (*p).served_tgid, 0);
            (tgid, core::mem::replace(&mut (*p).since_ns, 0))
        };
        if tgid != 0 {
            // SAFETY: as above.
            let (side, destination, listener, server) = unsafe {
                (
                    (*p).side,
                    (*p).destination,
                    (*p).served_listener,
                    (*p).served_server,
                )
            };
            let at = now();
            if side == SIDE_ACTIVE {
                hist::record(
                    tgid,
                    HistMetric::Held,
                    destination_path(destination),
                    at.saturating_sub(start),
                );
            } else {
                let service = Service {
                    start_ns: start,
                    tgid,
                    listener,
                    server,
                    unix_fd: 0,
                };
                finish(&service, at, nested);
            }
            return;
        }
    }
    if any_open(TCP)
        && let Some(service) = take(sk)
    {
        finish(&service, now(), nested);
    }
}

/// Whether `file` holds its last reference.
#[inline(always)]
fn last_reference(file: u64) -> bool {
    memory::kernel::<u64>(file + u64::from(FILE_REFS.load()))
        .is_some_and(|refs| refs == u64::from(FILE_ONE_REF.load()))
}

/// `sk`'s unix service, if it has one, ends if `file` holds its last
/// reference (a postmaster closing its copy after forking the backend that
/// serves it does not).
#[inline(always)]
fn unix_closed(sk: u64, file: u64, at: u64) {
    if SERVICES.get_ptr(sk).is_some()
        && last_reference(file)
        && let Some(service) = take(sk)
    {
        finish(&service, at, false);
    }
}

/// The watched process `tgid` closes `fd`: a unix connection being served
/// may end.
#[inline(always)]
pub fn closing(tgid: u32, fd: u32) {
    if !any_open(UNIX) || !may_hold_unix(tgid, |t| fd_key(t, fd)) {
        return;
    }
    let Some(fds) = fds::open_files() else {
        return;
    };
    let Some(file) = fds::file_at(fds, fd).filter(|&f| f != 0) else {
        return;
    };
    if let Some(sk) = fds::sock_of_file(file) {
        unix_closed(sk, file, now());
    }
}

/// The unix socket `socket` (a `struct socket`) is released, its file's
/// last reference gone (a close, or its holder's exit): its service, if
/// it has one, ends.
#[inline(always)]
pub fn released(socket: u64) {
    if !any_open(UNIX) {
        return;
    }
    if let Some(sk) = fds::sk_of_socket(socket)
        && let Some(service) = take(sk)
    {
        finish(&service, now(), false);
    }
}

/// A watched process exits: the unix connections whose last reference it
/// holds end (its files close after this tracepoint), among its first
/// [`EXIT_SCAN_FDS`] fds; its own count of them goes.
#[inline(always)]
pub fn exiting() {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if any_open(UNIX) && may_hold_unix(tgid, process_key) {
        scan_exiting();
    }
    if UNIX_HELD.get_ptr(process_key(tgid)).is_some() {
        let _ = UNIX_HELD.remove(process_key(tgid));
    }
}

#[inline(always)]
fn scan_exiting() {
    let (Some(fds), Some(max)) = (fds::open_files(), fds::max_fds()) else {
        return;
    };
    let at = now();
    for fd in 0..EXIT_SCAN_FDS {
        if fd >= max {
            break;
        }
        let Some(file) = fds::file_at(fds, fd).filter(|&f| f != 0) else {
            continue;
        };
        if let Some(sk) = fds::sock_of_file(file) {
            unix_closed(sk, file, at);
        }
    }
}

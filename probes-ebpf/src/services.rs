//! Service time and busy servers (see probes_common::service): a connection
//! starts at its accept (the accept probe) and ends at the close that drops
//! its file's last reference (the close probe) or at the exit of the
//! process holding it (the lifecycle probe), whoever holds it by then.

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{Array, HashMap},
};
use probes_common::{
    hist::HistMetric,
    service::{BUSY_MAX_ENTRIES, Busy, EXIT_SCAN_FDS, SERVICES_MAX_ENTRIES, Service},
};

use crate::{atomic, clock::now, fds, hist, memory, watch_set::is_watched};

#[map]
static SERVICES: HashMap<u64, Service> = HashMap::with_max_entries(SERVICES_MAX_ENTRIES, 0);

#[map]
static BUSY: HashMap<u32, Busy> = HashMap::with_max_entries(BUSY_MAX_ENTRIES, 0);

#[map]
static BUSY_MAX: HashMap<u32, u64> = HashMap::with_max_entries(BUSY_MAX_ENTRIES, 0);

/// Connections being served: while none, a close or an exit costs no fd
/// walk.
#[map]
static SERVICES_OPEN: Array<u64> = Array::with_max_entries(1, 0);

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static FILE_REFS: Global<u32> = Global::new(0);

// SAFETY: as above.
#[unsafe(no_mangle)]
static FILE_ONE_REF: Global<u32> = Global::new(1);

#[inline(always)]
fn open_count(n: u64) {
    if let Some(p) = SERVICES_OPEN.get_ptr_mut(0) {
        // SAFETY: a live array value, only ever added to atomically.
        unsafe { atomic::add(p, n) };
    }
}

#[inline(always)]
fn any_open() -> bool {
    SERVICES_OPEN.get(0).is_some_and(|n| *n != 0)
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

/// `tgid` accepted the connection `sk` from `listener` (its fd plus one).
#[inline(always)]
pub fn started(sk: u64, tgid: u32, listener: u32, at: u64) {
    // A socket address still here is a freed socket's whose end no hook
    // saw (its holder exited with it past the fds an exit looks through):
    // it no longer counts as held.
    forget(sk);
    let server = server_of(tgid);
    let service = Service {
        start_ns: at,
        tgid,
        listener,
        server,
        _pad: 0,
    };
    if SERVICES.insert(sk, service, 0).is_err() {
        return;
    }
    open_count(1);
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

/// Takes `sk`'s service out, if it has one.
#[inline(always)]
fn take(sk: u64) -> Option<Service> {
    let p = SERVICES.get_ptr(sk)?;
    // SAFETY: a live map value, copied out at once.
    let service = unsafe { *p };
    SERVICES.remove(sk).ok()?;
    open_count(u64::MAX);
    Some(service)
}

/// Whether the busy count of the server `service` is kept under gives it
/// back, ended at `at` (`None`: ended unseen, no service time).
#[inline(always)]
fn release(service: &Service, at: Option<u64>) {
    if let Some(busy) = BUSY.get_ptr_mut(service.server) {
        // SAFETY: as in `started`; adding u64::MAX takes one away, and the
        // start's two's complement takes the start away.
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

#[inline(always)]
fn ended(sk: u64, at: u64) {
    if let Some(service) = take(sk) {
        hist::record(
            service.tgid,
            HistMetric::Service,
            u64::from(service.listener),
            at.saturating_sub(service.start_ns),
        );
        release(&service, Some(at));
    }
}

/// Whether `file` holds its last reference.
#[inline(always)]
fn last_reference(file: u64) -> bool {
    memory::kernel::<u64>(file + u64::from(FILE_REFS.load()))
        .is_some_and(|refs| refs == u64::from(FILE_ONE_REF.load()))
}

/// A watched process closes `fd`: a connection being served ends if this
/// drops its file's last reference (a postmaster closing its copy after
/// forking the backend that serves it does not).
#[inline(always)]
pub fn closing(fd: u32) {
    if !any_open() {
        return;
    }
    let Some(fds) = fds::open_files() else {
        return;
    };
    let Some(file) = fds::file_at(fds, fd).filter(|&f| f != 0) else {
        return;
    };
    let Some(sk) = fds::sock_of_file(file) else {
        return;
    };
    if SERVICES.get_ptr(sk).is_some() && last_reference(file) {
        ended(sk, now());
    }
}

/// A watched process exits: the connections whose last reference it holds
/// end (its files close after this tracepoint), among its first
/// [`EXIT_SCAN_FDS`] fds.
#[inline(always)]
pub fn exiting() {
    if !any_open() {
        return;
    }
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
        if let Some(sk) = fds::sock_of_file(file)
            && SERVICES.get_ptr(sk).is_some()
            && last_reference(file)
        {
            ended(sk, at);
        }
    }
}

//! TCP state changes of watched processes' sockets, counted per link in the
//! kernel (tcp_links): opens, closes, aborts and sockets going into
//! TIME_WAIT. Only a listener opening or closing goes through the ring
//! buffer. Two hooks on `inet_sock_set_state`, the loader attaching one:
//! `tcp_state_btf` (tp_btf: its arguments are plain loads, and it has a
//! recursion guard of its own) and `tcp_state` (the classic tracepoint, for
//! kernels without the BTF one; its record copied once and read from the
//! copy).

use core::ptr::NonNull;

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{btf_tracepoint, map, tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::debug;
use probes_common::{
    connect::ECONNREFUSED,
    event::EventKind,
    hist::HistMetric,
    sock::{
        LinkCounts, LinkKey, RECORD_WINDOW, SIDE_ACTIVE, SIDE_PASSIVE, TCP_CLOSE, TCP_CLOSE_WAIT,
        TCP_CLOSING, TCP_ESTABLISHED, TCP_FIN_WAIT1, TCP_FIN_WAIT2, TCP_LAST_ACK, TCP_LISTEN,
        TCP_SYN_RECV, TCP_SYN_SENT, TcpStateEvent, TrackedSocket,
    },
    stats::Stat,
};

use crate::{
    clock::now,
    closers, destinations, events, hist, memory,
    offsets::offset_globals,
    services, slots, tcp_links,
    tcp_sock::{self, Ends, Sock, SockAt, SockBtf},
    tracked,
    watch_set::is_watched,
};

probes_common::sock_state_fields!(offset_globals);
probes_common::sock_protocol_member!(offset_globals);
probes_common::sock_close_members!(offset_globals);

const IPPROTO_TCP: u16 = 6;

/// Changes only the owner's own syscalls make (connect, listen, close,
/// shutdown): the current task is the socket's owner. Everything else may run
/// in softirq, where the current task is whoever happened to be running (the
/// record's `common_flags` do not tell reliably: 6.18 sets the softirq bit for
/// listen()).
#[inline(always)]
fn by_owner(old: u8, new: u8) -> bool {
    matches!(
        (old, new),
        (TCP_CLOSE, TCP_SYN_SENT)
            | (TCP_CLOSE, TCP_LISTEN)
            | (TCP_ESTABLISHED | TCP_SYN_RECV, TCP_FIN_WAIT1)
            | (TCP_CLOSE_WAIT, TCP_LAST_ACK)
    )
}

/// Who closed first, when the owner's close sends the first FIN: the
/// socket's TIME_WAIT will be on this side, and belongs to the process that
/// closed (a forking server's child), whoever opened it.
#[inline(always)]
fn closer(in_owner: bool, tgid: u32, owner: u32) -> u32 {
    if in_owner { tgid } else { owner }
}

/// The end of an accepted connection's service, or of a client's hold on
/// one it opened (see services): its first FIN, or a reset before it.
#[inline(always)]
fn ends_service(old: u8, new: u8) -> bool {
    matches!(
        (old, new),
        (TCP_ESTABLISHED | TCP_SYN_RECV, TCP_FIN_WAIT1)
            | (TCP_CLOSE_WAIT, TCP_LAST_ACK)
            | (TCP_ESTABLISHED | TCP_SYN_RECV | TCP_CLOSE_WAIT, TCP_CLOSE)
    )
}

/// A close without the FIN handshake: reset, refused, aborted.
#[inline(always)]
fn is_abort(old: u8) -> bool {
    matches!(
        old,
        TCP_ESTABLISHED | TCP_SYN_SENT | TCP_SYN_RECV | TCP_CLOSE_WAIT | TCP_FIN_WAIT1
    )
}

/// How many of its latest changes `tcp_state_btf` keeps per CPU for its
/// nested copy: more than a softirq's burst can push out while that copy
/// starts.
const TAKEN: usize = 16;

/// One state change, as the hook's arguments give it.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
struct Change {
    sk: u64,
    /// `old << 8 | new`.
    states: u64,
}

/// The changes `tcp_state_btf` ran for on this CPU that its nested copy has
/// not yet seen, the newest at `next - 1` (modulo [`TAKEN`]).
#[repr(C)]
struct Taken {
    next: u64,
    /// `next` when the nested copy started: kept here, not on its stack,
    /// which 6.1's verifier holds to 512 bytes with its calls' frames
    /// (each rounded up to 32); at 544 it refused the copy, and the state
    /// probe fell back to the classic tracepoint.
    nested_start: u64,
    changes: [Change; TAKEN],
}

#[map]
static STATE_BTF_TAKEN: PerCpuArray<Taken> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn tcp_state_btf(ctx: BtfTracePointContext) -> u32 {
    let (sk, old, new) = btf_args(&ctx);
    let mut address = None;
    if let Some(t) = STATE_BTF_TAKEN.get_ptr_mut(0) {
        // SAFETY: this CPU's value of a one-entry array, which lives as
        // long as the map; the nested copy only clears the address of a
        // slot it matched. The index is masked into the array.
        unsafe {
            // The slot is taken before it is written: a run of this program
            // nested in this one (kernels whose tp_btf programs have no
            // guard of their own) then writes the next slot, never the one
            // read back below. One nested between the read of `next` and
            // its store ends before this run writes anything.
            let i = (*t).next;
            (*t).next = i.wrapping_add(1);
            if let Some(slot) = (*t).changes.get_mut(i as usize % TAKEN) {
                *slot = change(sk, old, new);
                // Read back from the map, the verifier's pointer is a plain
                // number (see `on_btf_change`), without a helper call.
                address = Some(core::ptr::read_volatile(&raw const slot.sk));
            }
        }
    }
    on_btf_change(&ctx, address, old, new, Instance::First);
    0
}

/// Which copy of the state probe runs: the kernel's histograms take a
/// sample as plain stores into this CPU's value, which the nested copy,
/// interrupting the first on its CPU, must not share. So its connect
/// samples go under the destination's id with the lowest bit cleared (ids
/// have it set), which userspace names alike.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Instance {
    First,
    Nested,
}

impl Instance {
    #[inline(always)]
    fn hist_path(self, destination: u64) -> u64 {
        match self {
            Instance::First => destination,
            Instance::Nested => destination & !1,
        }
    }
}

/// Attached after `tcp_state_btf`, it handles the changes that one did not
/// run for: the kernel skips a program for a change that comes while it
/// runs on that CPU (a softirq's, interrupting it in process context,
/// even in the instants around its code), but runs this copy. Asking
/// whether the change is among those the first copy ran for, rather than
/// whether it is running now, leaves no instant uncovered.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn tcp_state_btf_nested(ctx: BtfTracePointContext) -> u32 {
    let Some(t) = STATE_BTF_TAKEN.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's value of a one-entry array, which lives as long as
    // the map; the first copy, interrupting, writes only its newest slot
    // and `next`, and this copy does not nest in itself.
    unsafe {
        let start = core::ptr::read_volatile(&raw const (*t).next);
        core::ptr::write_volatile(&raw mut (*t).nested_start, start);
    }
    nested_change(&ctx, t);
    // Looked up again: the pointer kept across the call would take stack.
    let Some(t) = STATE_BTF_TAKEN.get_ptr_mut(0) else {
        return 0;
    };
    // Notes the first copy took while this copy ran are of changes that
    // interrupted it, for which the kernel skipped this copy: no run uses
    // them up, and a later socket at the same address with the same change
    // (a closed socket's memory is reused at once) would pass for one the
    // first copy ran for, and go uncounted (the first copy's skipped run
    // then shows as a skipped change). Left open: a note taken in the few
    // instructions between the kernel's guard and this copy's reads.
    // SAFETY: as above.
    unsafe {
        let start = core::ptr::read_volatile(&raw const (*t).nested_start);
        let end = core::ptr::read_volatile(&raw const (*t).next);
        for k in 0..TAKEN as u64 {
            if start.wrapping_add(k) == end {
                break;
            }
            if let Some(c) = (*t).changes.get_mut(start.wrapping_add(k) as usize % TAKEN) {
                c.sk = 0;
            }
        }
    }
    0
}

/// The nested copy's work for one change: acted on unless the first copy
/// noted it in `t`, whose note it then uses up.
#[inline(always)]
fn nested_change(ctx: &BtfTracePointContext, t: *mut Taken) {
    let (sk, old, new) = btf_args(ctx);
    let this = change(sk, old, new);
    if use_up_note(t, this.sk, this.states) {
        return;
    }
    events::count(Stat::TcpStateNested);
    on_btf_change(ctx, None, old, new, Instance::Nested);
}

/// Whether the first copy noted the change (`sk`, `states`) in `t`; the
/// note is used up. A call of its own: its search's stack is then not in
/// the nested copy's frame, which 6.1's verifier holds, with its calls',
/// to 512 bytes.
#[inline(never)]
fn use_up_note(t: *mut Taken, sk: u64, states: u64) -> bool {
    let this = Change { sk, states };
    // SAFETY: see `tcp_state_btf_nested`.
    let (next, changes) = unsafe { ((*t).next, &mut (*t).changes) };
    // The first copy's newest note, unless a change in between took its
    // place: asked first, it is the one in all but those rare cases.
    let newest = next.wrapping_sub(1) as usize % TAKEN;
    let found = match changes.get_mut(newest) {
        Some(c) if *c == this => Some(c),
        _ => changes.iter_mut().find(|c| **c == this),
    };
    match found {
        Some(taken) => {
            // Used up: the kernel reuses a closed socket's memory at once,
            // so the next connection's same change (say, its close) may
            // come with the same address and states, and must not pass
            // for this one.
            taken.sk = 0;
            true
        }
        None => false,
    }
}

#[inline(always)]
fn change(sk: u64, old: u8, new: u8) -> Change {
    Change {
        sk,
        states: u64::from(old) << 8 | u64::from(new),
    }
}

/// (const struct sock *sk, int oldstate, int newstate); TCP states fit a
/// byte.
#[inline(always)]
fn btf_args(ctx: &BtfTracePointContext) -> (u64, u8, u8) {
    (ctx.arg(0), ctx.arg::<i32>(1) as u8, ctx.arg::<i32>(2) as u8)
}

/// The change, with the socket's address as a plain number: the verifier
/// types the argument as a pointer to the sock, which it lets no program
/// shift or mix (the tracked module picks a slot from it), so it is read
/// again as plain bytes, through a helper unless `address` has it. The
/// pointer itself reads the socket's members.
#[inline(always)]
fn on_btf_change(
    ctx: &BtfTracePointContext,
    address: Option<u64>,
    old: u8,
    new: u8,
    instance: Instance,
) {
    let Some(sk) = address.or_else(|| memory::kernel::<u64>(ctx.as_ptr() as u64)) else {
        return;
    };
    let sock = SockBtf(ctx.arg(0));
    on_change(sk, sock, old, new, instance, || {
        sock.member::<u16>(&SK_PROTOCOL) == Some(IPPROTO_TCP)
    });
}

#[tracepoint]
pub fn tcp_state(ctx: TracePointContext) -> u32 {
    let Some(record) = memory::kernel::<[u8; RECORD_WINDOW]>(ctx.as_ptr() as u64) else {
        return 0;
    };
    if tcp_sock::at::<u16, RECORD_WINDOW>(&record, &TP_PROTOCOL) != IPPROTO_TCP {
        return 0;
    }
    let sk: u64 = tcp_sock::at(&record, &TP_SKADDR);
    let old = tcp_sock::at::<i32, RECORD_WINDOW>(&record, &TP_OLDSTATE) as u8;
    let new = tcp_sock::at::<i32, RECORD_WINDOW>(&record, &TP_NEWSTATE) as u8;
    // Classic tracepoints do not nest on a CPU: one copy.
    on_change(sk, SockAt(sk), old, new, Instance::First, || true);
    0
}

/// What a change means for its socket, from its states alone.
#[derive(Clone, Copy)]
struct Class {
    /// It counts on the socket's link: an open (CLOSE → SYN_SENT,
    /// SYN_RECV → ESTABLISHED) or a close (anything → CLOSE).
    counted: bool,
    /// A listener's: it starts listening, or stops (LISTEN → CLOSE). LISTEN
    /// → SYN_RECV is not the listener's: it is a connection's new socket,
    /// cloned from the listener with its state (it counts nothing).
    listen: bool,
    /// Made by the owner's own syscall (see [`by_owner`]).
    by_owner: bool,
}

impl Class {
    /// LISTEN → SYN_RECV, FIN_WAIT1 → FIN_WAIT2, ESTABLISHED → CLOSE_WAIT:
    /// three of a connection's ten changes count nothing and note nothing,
    /// tracked socket or not.
    #[inline(always)]
    fn is_idle(self) -> bool {
        !self.counted && !self.listen && !self.by_owner
    }
}

/// Classifies the change `old` → `new`.
#[inline(always)]
fn classify(old: u8, new: u8) -> Class {
    Class {
        counted: matches!(
            (old, new),
            (TCP_CLOSE, TCP_SYN_SENT) | (TCP_SYN_RECV, TCP_ESTABLISHED) | (_, TCP_CLOSE)
        ),
        listen: new == TCP_LISTEN || (old == TCP_LISTEN && new == TCP_CLOSE),
        by_owner: by_owner(old, new),
    }
}

/// A connection arriving at a listener completed its handshake (SYN_RECV →
/// ESTABLISHED): it is its listener's owner's, whatever task runs.
#[inline(always)]
fn is_arriving(old: u8, new: u8) -> bool {
    old == TCP_SYN_RECV && new == TCP_ESTABLISHED
}

/// FIN_WAIT2 or CLOSING → CLOSE of a socket whose owner closed first: the
/// kernel has just made its timewait twin (tcp_time_wait, then tcp_done).
#[inline(always)]
fn into_time_wait(old: u8, new: u8) -> bool {
    new == TCP_CLOSE && (old == TCP_FIN_WAIT2 || old == TCP_CLOSING)
}

/// The current task's pid_tgid when the owner's own syscall made the
/// change, else 0: only then does the current task mean something.
#[inline(always)]
fn owner_task(by_owner: bool) -> u64 {
    if by_owner {
        bpf_get_current_pid_tgid()
    } else {
        0
    }
}

/// One state change of the socket at `sk`, read through `sock`; `is_tcp`
/// says whether it is a TCP socket, asked only of a socket about to be
/// tracked.
#[inline(always)]
fn on_change(
    sk: u64,
    sock: impl Sock,
    old: u8,
    new: u8,
    instance: Instance,
    is_tcp: impl FnOnce() -> bool,
) {
    if ends_service(old, new) {
        // First, with nothing of this function's live yet: the call's paths
        // then do not multiply the rest's for the verifier.
        services::tcp_ended(sk, instance == Instance::Nested, |d| instance.hist_path(d));
    }
    if old == TCP_SYN_SENT && new == TCP_ESTABLISHED {
        connected(sk, instance);
        return;
    }
    let class = classify(old, new);
    let pid_tgid = owner_task(class.by_owner);
    if old == TCP_CLOSE && new == TCP_SYN_SENT {
        // In the connect syscall of the socket's thread.
        slots::connect_went_tcp(pid_tgid as u32);
    }
    if class.is_idle() {
        return;
    }
    let tgid = (pid_tgid >> 32) as u32;
    let in_owner = class.by_owner && is_watched(tgid);
    // Whose socket is it? One we track; else, for changes made by a watched
    // owner's own syscalls, the caller's; else a connection arriving at a
    // watched listener.
    let tracked = tracked_record(sk, old);
    let arriving = is_arriving(old, new);
    if tracked.is_none() && !in_owner && !arriving {
        return;
    }
    if let Some(p) = tracked
        && !class.counted
        && !class.listen
    {
        note_tracked_fin(p, new, in_owner, tgid);
        return;
    }
    let Some(mut ends) = sock.ends() else {
        return;
    };
    let mut entry = match tracked {
        Some(p) => tracked_copy(p, &mut ends),
        None => match take_owner(sock, &mut ends, in_owner, tgid, is_tcp) {
            Some(owner) => new_record(&ends, owner, new, in_owner, tgid),
            None => return,
        },
    };
    if releases_port(old, new, &entry) {
        ends.lport = released_port(sk, &entry, tracked.is_some());
    }
    if class.listen {
        listener(sk, old, new, class, entry, &ends, tracked);
        return;
    }
    if class.by_owner && new == TCP_FIN_WAIT1 {
        // Only an untracked socket gets here (a tracked one took the
        // shortcut above).
        entry.closer = closer(in_owner, tgid, entry.owner);
    }
    // One key on the stack, its owner changed in place.
    let mut key = ends.link(entry.owner, entry.side);
    if new == TCP_CLOSE {
        closed(sock, old, &entry, &ends, &mut key, instance);
        if tracked.is_some() {
            tracked::remove(sk);
        }
        return;
    }
    if class.counted {
        opened(&key, &mut entry, &ends, new, arriving);
    }
    if tracked.is_none() {
        tracked::insert(sk, &entry);
    }
}

/// The record of the socket at `sk`, if it is tracked. A change from CLOSE
/// starts a socket's life (every change to CLOSE ends its tracking):
/// nothing to look up.
#[inline(always)]
fn tracked_record(sk: u64, old: u8) -> Option<NonNull<TrackedSocket>> {
    if old == TCP_CLOSE {
        None
    } else {
        tracked::get(sk)
    }
}

/// A tracked socket's change made by its owner's syscall that counts
/// nothing: no ends to read, no link to touch. One that sends the first FIN
/// notes who closed.
#[inline(always)]
fn note_tracked_fin(p: NonNull<TrackedSocket>, new: u8, in_owner: bool, tgid: u32) {
    if new == TCP_FIN_WAIT1 {
        // SAFETY: see `tracked_copy`; one u32 store into the value.
        unsafe { (*p.as_ptr()).closer = closer(in_owner, tgid, (*p.as_ptr()).owner) };
    }
}

/// A copy of the tracked socket's record, `ends` completed with the network
/// namespace it keeps.
#[inline(always)]
fn tracked_copy(p: NonNull<TrackedSocket>, ends: &mut Ends) -> TrackedSocket {
    // SAFETY: copied out at once (see tracked::get): at worst this one
    // change counts on another watched socket's link.
    let entry = unsafe { *p.as_ptr() };
    ends.netns = entry.netns;
    entry
}

/// Whose socket not tracked yet this is, `ends` completed with its network
/// namespace: the watched caller's, when its own syscall made the change
/// (`in_owner`), else the watched owner of the listener the connection
/// arrived at. None: neither, or not a TCP socket.
#[inline(always)]
fn take_owner(
    sock: impl Sock,
    ends: &mut Ends,
    in_owner: bool,
    tgid: u32,
    is_tcp: impl FnOnce() -> bool,
) -> Option<u32> {
    ends.netns = sock.netns();
    let owner = if in_owner {
        tgid
    } else {
        tcp_links::listen_owner(ends.netns, ends.lport)?
    };
    is_tcp().then_some(owner)
}

/// The record of `owner`'s socket not tracked yet, with the side it is on:
/// passive when it arrived at a watched listener, or when the owner's own
/// change other than a connect is on a port the owner listens on (a
/// connection it accepted before the probes attached); else active.
#[inline(always)]
fn new_record(ends: &Ends, owner: u32, new: u8, in_owner: bool, tgid: u32) -> TrackedSocket {
    let passive = !in_owner
        || (new != TCP_SYN_SENT && tcp_links::listen_owner(ends.netns, ends.lport) == Some(tgid));
    TrackedSocket {
        owner,
        closer: 0,
        side: if passive { SIDE_PASSIVE } else { SIDE_ACTIVE },
        _pad: 0,
        lport: ends.lport,
        netns: ends.netns,
        since_ns: 0,
        destination: 0,
        served_tgid: 0,
        served_listener: 0,
        served_server: 0,
        _pad2: 0,
    }
}

/// Whether this close needs the socket's local port, which the kernel has
/// released (skc_num zeroed) before it reports the change: the port is in
/// the link (passive), the 4-tuple (a closer's note) or the map of
/// listeners.
#[inline(always)]
fn releases_port(old: u8, new: u8, entry: &TrackedSocket) -> bool {
    new == TCP_CLOSE
        && (old == TCP_LISTEN
            || entry.side == SIDE_PASSIVE
            || (into_time_wait(old, new) && entry.closer != 0))
}

/// The local port of a socket closing (see [`releases_port`]): a followed
/// passive socket's record has it, and inet_sport keeps it.
#[inline(always)]
fn released_port(sk: u64, entry: &TrackedSocket, tracked: bool) -> u16 {
    if tracked && entry.side == SIDE_PASSIVE && entry.lport != 0 {
        entry.lport
    } else {
        u16::from_be(tcp_sock::read(sk, &INET_SPORT).unwrap_or(0))
    }
}

/// A socket closed (not a listener): its link counts the close (an abort,
/// a TIME_WAIT of the owner's own), the TIME_WAIT it leaves goes to whoever
/// closed first, and a connect whose SYN got no answer is counted as
/// refused or failed.
#[inline(always)]
fn closed(
    sock: impl Sock,
    old: u8,
    entry: &TrackedSocket,
    ends: &Ends,
    key: &mut LinkKey,
    instance: Instance,
) {
    let time_wait = into_time_wait(old, TCP_CLOSE);
    let own_time_wait = time_wait && entry.closer == entry.owner;
    tcp_links::add(
        key,
        LinkCounts {
            closes: 1,
            aborts: u64::from(is_abort(old)),
            new_time_wait: u64::from(own_time_wait),
            ..LinkCounts::default()
        },
    );
    if time_wait && entry.closer != 0 {
        note_time_wait_closer(key, ends, entry, own_time_wait);
    }
    if old == TCP_SYN_SENT && entry.destination != 0 {
        connect_failed(sock, entry, instance);
    }
}

/// The TIME_WAIT a socket whose owner closed first leaves: counted on the
/// closer's link when that is not the owner's (the owner's counted it with
/// the close), and the closer noted for the socket iterator, which finds
/// the timewait socket by the same ends.
#[inline(always)]
fn note_time_wait_closer(key: &mut LinkKey, ends: &Ends, entry: &TrackedSocket, own: bool) {
    if !own {
        key.owner = entry.closer;
        tcp_links::add(
            key,
            LinkCounts {
                new_time_wait: 1,
                ..LinkCounts::default()
            },
        );
    }
    closers::note_closer(ends, entry.closer, entry.side);
}

/// A connect closed before its SYN was answered: a sample of 0 under its
/// destination, as refused (ECONNREFUSED) or failed.
#[inline(always)]
fn connect_failed(sock: impl Sock, entry: &TrackedSocket, instance: Instance) {
    let refused = sock.member::<i32>(&SK_ERR) == Some(ECONNREFUSED);
    let metric = if refused {
        HistMetric::ConnectRefused
    } else {
        HistMetric::ConnectFailed
    };
    hist::record(
        entry.owner,
        metric,
        instance.hist_path(entry.destination),
        0,
    );
}

/// A socket opened (CLOSE → SYN_SENT, SYN_RECV → ESTABLISHED): its link
/// counts it, and its record starts the clock of what comes next.
#[inline(always)]
fn opened(key: &LinkKey, entry: &mut TrackedSocket, ends: &Ends, new: u8, arriving: bool) {
    tcp_links::add(
        key,
        LinkCounts {
            opens: 1,
            ..LinkCounts::default()
        },
    );
    if arriving {
        // It enters its listener's accept queue now.
        entry.since_ns = now();
    } else if new == TCP_SYN_SENT && entry.side == SIDE_ACTIVE {
        // A connect: timed until the answer to its SYN.
        let (id, d) = ends.destination();
        destinations::name_tcp(id, &d);
        entry.destination = id;
        entry.since_ns = now();
    }
}

/// A watched socket's SYN was answered: its connect's latency, from the
/// SYN. Not one of ours, or one whose SYN went before the probes attached:
/// nothing.
#[inline(always)]
fn connected(sk: u64, instance: Instance) {
    let Some(p) = tracked::get(sk) else {
        return;
    };
    // SAFETY: see tracked::get; copied out at once.
    let (owner, destination) = unsafe { ((*p.as_ptr()).owner, (*p.as_ptr()).destination) };
    if destination == 0 {
        return;
    }
    if let Some(at) = tracked::take_since(p) {
        hist::record(
            owner,
            HistMetric::Connect,
            instance.hist_path(destination),
            now().saturating_sub(at),
        );
        services::connected(p, owner, at);
    }
}

/// A watched listener opened or closed: the kernel's map of listeners
/// follows, and userspace hears of it through the ring buffer.
#[inline(always)]
fn listener(
    sk: u64,
    old: u8,
    new: u8,
    class: Class,
    entry: TrackedSocket,
    e: &Ends,
    tracked: Option<NonNull<TrackedSocket>>,
) {
    if new == TCP_CLOSE {
        tracked::remove(sk);
        tcp_links::forget_listener(e.netns, e.lport);
    } else {
        if tracked.is_none() {
            tracked::insert(sk, &entry);
        }
        if new == TCP_LISTEN {
            if tcp_links::set_listen_owner(e.netns, e.lport, entry.owner) {
                debug!(
                    &(),
                    "port {} listened on by {}: connections arriving there are its",
                    e.lport,
                    entry.owner
                );
            } else {
                debug!(
                    &(),
                    "LISTEN_OWNERS full: port {} of {} not recorded", e.lport, entry.owner
                );
            }
        }
    }
    report_listener(
        e,
        entry.owner,
        u32::from(old) << 8 | u32::from(new) | u32::from(class.by_owner) << 16,
    );
}

/// Sends a listener's change to userspace: `change` is `old << 8 | new`,
/// bit 16 set when the owner's own syscall made it. Not inlined: the record
/// is built on the stack, which the state probe's own frame has no room
/// for on 6.1 (512 bytes over the call chain).
#[inline(never)]
fn report_listener(e: &Ends, owner: u32, change: u32) {
    let by_owner = change >> 16 & 1 != 0;
    let Some(mut slot) = events::reserve::<TcpStateEvent>(Stat::LostTcpState) else {
        return;
    };
    slot.write(TcpStateEvent {
        kind: EventKind::TcpState as u32,
        owner,
        oldstate: (change >> 8) as u8,
        newstate: change as u8,
        by_owner: by_owner as u8,
        _pad: 0,
        family: e.family,
        lport: e.lport,
        rport: u16::from_be(e.rport_be),
        _pad2: 0,
        laddr: e.laddr,
        raddr: e.raddr,
        netns: e.netns,
        ts_ns: now(),
        comm: if by_owner {
            bpf_get_current_comm().unwrap_or([0; 16])
        } else {
            [0; 16]
        },
    });
    events::submit(slot);
}

//! stackprobe's kernel programs. Each probe lives in its own module; this file
//! holds only what every probe shares.
#![no_std]
#![no_main]
// The BPF target's core lacks atomic read-modify-write; its intrinsic
// compiles to the BPF atomic add (tcp_links.rs).
#![feature(core_intrinsics)]
#![allow(internal_features)]

// The probes, one module each; they use only the modules below them, never
// each other.
mod accept;
mod attach_check;
mod connect;
mod data_ready;
mod fork;
mod run_queue;
mod service_end;
mod sock;
mod tcp_state;
mod unix_enqueue;
mod watch;

// What the probes share: state that crosses probes (slots, watch_set,
// tracked sockets), the latency histograms, the ring buffer and counters, and
// helpers.
mod atomic;
mod clock;
mod closers;
mod destinations;
mod events;
mod fds;
mod hist;
mod memory;
mod offsets;
mod services;
mod slots;
mod tcp_links;
mod tcp_sock;
mod tracked;
mod unix_queue;
mod watch_set;

// SAFETY: the loader reads the object's license, a NUL-terminated string,
// from this section; no other symbol is named LICENSE.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

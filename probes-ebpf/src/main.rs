//! stackprobe's kernel programs. Each probe lives in its own module; this file
//! holds only what every probe shares.
#![no_std]
#![no_main]

mod accept;
mod events;
mod fork;
mod hist;
mod hooks;
mod offsets;
mod slots;
mod sock;
mod watch;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

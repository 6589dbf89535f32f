//! `sock:sk_data_ready` (6.3 and later), for the unix queue wait: inside a
//! unix connect it fires right after the connection is queued, with the
//! listener as its socket (see unix_queue). It fires for every TCP segment
//! and unix message on the host too: the family in its record is all they
//! cost.

use aya_ebpf::{Global, macros::tracepoint, programs::TracePointContext};
use probes_common::connect::AF_UNIX;

use crate::{clock::now, memory, unix_queue};

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static DATA_READY_SK_OFFSET: Global<u32> = Global::new(8);

// SAFETY: as above.
#[unsafe(no_mangle)]
static DATA_READY_FAMILY_OFFSET: Global<u32> = Global::new(16);

#[tracepoint]
pub fn unix_data_ready(ctx: TracePointContext) -> u32 {
    if memory::field::<u16>(&ctx, &DATA_READY_FAMILY_OFFSET) != Some(AF_UNIX) {
        return 0;
    }
    if let Some(sk) = memory::field::<u64>(&ctx, &DATA_READY_SK_OFFSET) {
        unix_queue::enqueued(sk, now());
    }
    0
}

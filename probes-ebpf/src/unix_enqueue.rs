//! fentry on `security_unix_stream_connect(sk, other, newsk)`, for the unix
//! queue wait where the kernel takes fentry: the LSM hook runs inside the
//! client's connect once the listener (`other`) has room, just before
//! `newsk`'s skb is queued on it. The exact enqueue, at one run per unix
//! connect on the host instead of data-ready's run per message.

use aya_ebpf::{macros::fentry, programs::FEntryContext};

use crate::{clock::now, unix_queue};

#[fentry(function = "security_unix_stream_connect")]
pub fn unix_enqueue(ctx: FEntryContext) -> u32 {
    let listener: u64 = ctx.arg(1);
    let newsk: u64 = ctx.arg(2);
    unix_queue::connecting(listener, newsk, now());
    0
}

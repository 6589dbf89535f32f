//! Programs that do nothing: `stackprobe doctor` loads and attaches each one
//! to learn whether this kernel offers the attach type (kernels differ: some
//! are built without kprobes, some refuse fentry), then detaches it.

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe},
    programs::{BtfTracePointContext, FEntryContext, ProbeContext},
};

#[fentry(function = "tcp_v4_connect")]
pub fn hook_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[btf_tracepoint(function = "sched_process_fork")]
pub fn hook_tp_btf(_ctx: BtfTracePointContext) -> u32 {
    0
}

#[kprobe]
pub fn hook_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

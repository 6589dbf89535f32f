//! The `u32` globals userspace fills with kernel offsets at load, declared
//! from the lists in probes-common (see probes_common::offsets) so each
//! global is named once for both sides.

/// One global per `GLOBAL: struct.member` or `GLOBAL: field` line of an
/// offsets list, 0 until userspace sets it. A `Global`, not a plain
/// `static`: the compiler would fold a plain static's initial value into
/// the code, and the value userspace writes would never be read.
macro_rules! offset_globals {
    ($($global:ident: $first:ident $(. $rest:ident)*),+ $(,)?) => {
        $(
            // SAFETY: each list names a global once, and no other symbol
            // has its name; userspace sets the global by it.
            #[unsafe(no_mangle)]
            pub(crate) static $global: aya_ebpf::Global<u32> = aya_ebpf::Global::new(0);
        )+
    };
}
pub(crate) use offset_globals;

//! Offsets the probes read kernel memory at, which differ between kernels:
//! struct members from the kernel's BTF (rustc emits no CO-RE relocations)
//! and tracepoint record fields from tracefs. Userspace finds them at load
//! and passes each in a `u32` global of the eBPF object.
//!
//! Each probe's offsets are one list, a macro such as [`crate::sock_members!`]
//! that hands `GLOBAL: struct.member.member` (or `GLOBAL: field`) lines to
//! the macro it is given: probes-common builds the loader's table from it
//! ([`member_table!`](crate::member_table), [`field_table!`](crate::field_table))
//! and probes-ebpf declares its globals from it, so a global is named once
//! and cannot be paired with the wrong member.

/// A kernel struct member a probe reads at the offset in the global `global`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberOffset {
    pub global: &'static str,
    /// The struct, as the kernel's BTF names it (`sock` for `struct sock`).
    pub btf_struct: &'static str,
    /// Members from `btf_struct` down to the one read, looking through
    /// anonymous unions and structs on the way.
    pub path: &'static [&'static str],
}

/// A tracepoint record field a probe reads at the offset in the global `global`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldOffset {
    pub global: &'static str,
    /// The field as the event's tracefs `format` file names it.
    pub field: &'static str,
}

/// `[MemberOffset; N]` from `GLOBAL: struct.member...` lines.
#[macro_export]
macro_rules! member_table {
    ($($global:ident: $st:ident $(. $member:ident)+),+ $(,)?) => {
        [$($crate::offsets::MemberOffset {
            global: stringify!($global),
            btf_struct: stringify!($st),
            path: &[$(stringify!($member)),+],
        }),+]
    };
}

/// `[FieldOffset; N]` from `GLOBAL: field` lines.
#[macro_export]
macro_rules! field_table {
    ($($global:ident: $field:ident),+ $(,)?) => {
        [$($crate::offsets::FieldOffset {
            global: stringify!($global),
            field: stringify!($field),
        }),+]
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! two_members {
        ($($then:ident)::+) => {
            $($then)::+! {
                OUTER_B: outer.__anon.b,
                INNER_X: inner.x,
            }
        };
    }

    #[test]
    fn a_list_becomes_one_entry_per_global_in_order() {
        let table: [MemberOffset; 2] = two_members!(crate::member_table);
        assert_eq!(
            table,
            [
                MemberOffset {
                    global: "OUTER_B",
                    btf_struct: "outer",
                    path: &["__anon", "b"],
                },
                MemberOffset {
                    global: "INNER_X",
                    btf_struct: "inner",
                    path: &["x"],
                },
            ]
        );
        let fields = crate::field_table!(TP_A: a, TP_B: b);
        assert_eq!(
            fields[1],
            FieldOffset {
                global: "TP_B",
                field: "b",
            }
        );
    }
}

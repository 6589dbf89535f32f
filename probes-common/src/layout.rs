//! Compile-time proof that a record shared with the kernel has the layout
//! both sides expect: [`assert_layout!`] names every field with its offset,
//! and fails the build if a field moved, a gap (implicit padding, whose bytes
//! are undefined) appeared, or the size changed.

/// The size of what `f` returns: the size of a field, given a function that
/// projects a struct onto it (`|t: T| t.field`), in a const context.
#[doc(hidden)]
pub const fn size_of_return<T, F>(_f: fn(T) -> F) -> usize {
    core::mem::size_of::<F>()
}

/// `assert_layout!(Type, size, { field: offset, ... })`, with every field in
/// declaration order: each sits at its offset, right after the previous one,
/// and the last ends at `size`, which is `size_of::<Type>()`.
///
/// ```
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// struct Explicit { a: u32, _pad: u32, b: u64 }
/// probes_common::assert_layout!(Explicit, 16, { a: 0, _pad: 4, b: 8 });
/// ```
///
/// The same record without its padding field does not build:
///
/// ```compile_fail
/// #[repr(C)]
/// #[derive(Clone, Copy)]
/// struct Implicit { a: u32, b: u64 }
/// probes_common::assert_layout!(Implicit, 16, { a: 0, b: 8 });
/// ```
#[macro_export]
macro_rules! assert_layout {
    ($t:ty, $size:expr, { $($field:ident: $offset:expr),+ $(,)? }) => {
        const _: () = {
            let mut end = 0;
            $(
                assert!(
                    core::mem::offset_of!($t, $field) == $offset,
                    concat!(stringify!($t), ".", stringify!($field), " moved")
                );
                assert!(
                    $offset == end,
                    concat!("implicit padding before ", stringify!($t), ".", stringify!($field))
                );
                end += $crate::layout::size_of_return(|t: $t| t.$field);
            )+
            assert!(end == $size, concat!("implicit padding at the end of ", stringify!($t)));
            assert!(core::mem::size_of::<$t>() == $size, concat!(stringify!($t), " changed size"));
        };
    };
}

#[cfg(test)]
mod tests {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Packed {
        a: u32,
        c: u64,
        d: [u8; 3],
    }

    #[test]
    fn field_sizes_are_read_through_the_projection() {
        assert_eq!(super::size_of_return(|p: Packed| p.a), 4);
        assert_eq!(super::size_of_return(|p: Packed| p.c), 8);
        assert_eq!(super::size_of_return(|p: Packed| p.d), 3);
    }
}

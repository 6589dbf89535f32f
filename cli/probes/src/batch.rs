//! Whole per-CPU hash maps read in batches (BPF_MAP_LOOKUP_BATCH, Linux
//! 5.6): aya reads a map a key at a time, two syscalls and an allocation
//! per key (its next key, then its values); a batch takes one syscall. The
//! kernel still visits every bucket of the map, which is most of what
//! reading a large, sparse map costs.

use std::{
    io,
    mem::{align_of, size_of},
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Pod,
    maps::{IterableMap, PerCpuHashMap, PerCpuValues},
};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Bytes of values one batch may carry: a few histograms' worth on a small
/// machine; on a large one a batch holds fewer keys, never fewer than
/// [`MIN_KEYS`].
const BATCH_BYTES: usize = 256 * 1024;
/// A batch never ends inside a hash bucket: one too small for its bucket
/// fails with ENOSPC and is retried twice the size.
const MIN_KEYS: usize = 4;
/// No bucket of a map that follows its hash's spread holds this many.
const MAX_KEYS: usize = 1 << 16;

/// Reusable buffers for [`for_each`].
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    keys: Vec<u8>,
    /// u64s: the kernel writes each CPU's value 8-byte aligned.
    values: Vec<u64>,
}

/// Hands `f` every key of `map` with its value on each possible CPU.
/// Entries added or removed meanwhile may or may not be seen, as with any
/// walk of a map that changes under it.
pub fn for_each<T, K, V>(
    map: &PerCpuHashMap<T, K, V>,
    scratch: &mut Scratch,
    mut f: impl FnMut(K, &[V]),
) -> io::Result<()>
where
    PerCpuHashMap<T, K, V>: IterableMap<K, PerCpuValues<V>>,
    K: Pod,
    V: Pod,
{
    // The values are handed out as slices of the u64 buffer, in place.
    const {
        assert!(align_of::<V>() <= 8 && size_of::<V>().is_multiple_of(8));
    }
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    let per_key = size_of::<V>() * cpus;
    let mut capacity = (BATCH_BYTES / per_key).max(MIN_KEYS);
    let fd = map.map().fd().as_fd().as_raw_fd();
    // The position to go on from: a bucket index, for hash maps.
    let mut token: u32 = 0;
    let mut first = true;
    loop {
        scratch.keys.resize(capacity * size_of::<K>(), 0);
        scratch.values.resize(capacity * per_key / 8, 0);
        let mut next: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token as u64 },
            out_batch: &raw mut next as u64,
            keys: scratch.keys.as_mut_ptr() as u64,
            values: scratch.values.as_mut_ptr() as u64,
            count: capacity as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the buffers hold `count` keys and `count` × cpus values
        // of the map's sizes, and outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>(),
            )
        };
        let err = (ret < 0).then(io::Error::last_os_error);
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None | Some(libc::ENOENT) => {}
            Some(libc::ENOSPC) if attr.count == 0 && capacity < MAX_KEYS => {
                capacity *= 2;
                continue;
            }
            _ => return Err(err.expect("an errno")),
        }
        for i in 0..attr.count as usize {
            // SAFETY: the kernel filled `count` keys; read unaligned, as the
            // byte buffer need not suit K.
            let key = unsafe {
                scratch
                    .keys
                    .as_ptr()
                    .add(i * size_of::<K>())
                    .cast::<K>()
                    .read_unaligned()
            };
            // SAFETY: key i's values are `cpus` consecutive Vs (8-aligned,
            // a multiple of 8 long: checked above) at i × per_key bytes
            // into the filled buffer; V is Pod, so any bytes are a value.
            let values = unsafe {
                std::slice::from_raw_parts(
                    scratch
                        .values
                        .as_ptr()
                        .cast::<u8>()
                        .add(i * per_key)
                        .cast::<V>(),
                    cpus,
                )
            };
            f(key, values);
        }
        if err.is_some() {
            // ENOENT: that was the last batch.
            return Ok(());
        }
        token = next;
        first = false;
    }
}

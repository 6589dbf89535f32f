//! The current task's files, and its parent. From a file descriptor to
//! what it holds:
//! current->files->fdt->fd[fd] (a struct file), its private_data (a struct
//! socket) and that socket's sk. The accept probe finds the accepted
//! socket this way where no hook hands it over, and the unix queue and
//! service probes the sockets of connect and close.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_task, generated},
};

use crate::{memory, offsets::offset_globals};

probes_common::accept_fd_walk_members!(offset_globals);
probes_common::service_members!(offset_globals);

// SAFETY: no other symbol has this name; userspace sets the global by it. 1 where the kernel has bpf_get_current_task_btf: a
// read-only global, so the verifier sees it as a constant and never meets
// the helper on the kernels that lack it.
#[unsafe(no_mangle)]
static ACCEPT_TASK_BTF: Global<u32> = Global::new(0);

/// The pointer in the member at `offset` of the struct at `base`.
#[inline(always)]
fn deref(base: u64, offset: &Global<u32>) -> Option<u64> {
    if base == 0 {
        return None;
    }
    memory::kernel(base + u64::from(offset.load()))
}

/// The pointer in the member at `offset` of the struct at `base`, typed by
/// BTF (see `memory::btf`).
#[inline(always)]
fn load_btf(base: *const u8, offset: &Global<u32>) -> Option<*const u8> {
    if base.is_null() {
        return None;
    }
    Some(memory::btf::<u64>(base, offset) as *const u8)
}

/// The caller's array of open files, current->files->fdt->fd.
#[inline(always)]
pub fn open_files() -> Option<u64> {
    if ACCEPT_TASK_BTF.load() != 0 {
        // SAFETY: the helper takes no arguments and returns the current
        // task, typed by BTF: the loads below are checked against it.
        let task = unsafe { generated::bpf_get_current_task_btf() }.cast::<u8>();
        let files = load_btf(task, &TASK_FILES)?;
        let fdt = load_btf(files, &FILES_FDT)?;
        // A pointer to pointers: the verifier types it as a plain number.
        return load_btf(fdt, &FDTABLE_FD).map(|fds| fds as u64);
    }
    // SAFETY: the helper takes no arguments; the task's address it returns
    // is only read through `memory::kernel`.
    let task = unsafe { bpf_get_current_task() };
    let files = deref(task, &TASK_FILES)?;
    let fdt = deref(files, &FILES_FDT)?;
    deref(fdt, &FDTABLE_FD)
}

/// The current task, through the BTF helper where the kernel has it.
#[inline(always)]
fn task() -> Task {
    if ACCEPT_TASK_BTF.load() != 0 {
        // SAFETY: the helper takes no arguments and returns the current
        // task, typed by BTF: loads through it are checked against it.
        Task::Btf(unsafe { generated::bpf_get_current_task_btf() }.cast::<u8>())
    } else {
        // SAFETY: the helper takes no arguments; the address it returns is
        // only read through `memory::kernel`.
        Task::Plain(unsafe { bpf_get_current_task() })
    }
}

enum Task {
    Btf(*const u8),
    Plain(u64),
}

/// The tgid of the current task's parent.
#[inline(always)]
pub fn parent_tgid() -> Option<u32> {
    match task() {
        Task::Btf(t) => {
            let parent = load_btf(t, &TASK_REAL_PARENT)?;
            (!parent.is_null()).then(|| memory::btf::<u32>(parent, &TASK_TGID))
        }
        Task::Plain(t) => {
            let parent = deref(t, &TASK_REAL_PARENT)?;
            memory::kernel(parent + u64::from(TASK_TGID.load()))
        }
    }
}

/// The caller's fd table's size, `current->files->fdt->max_fds`.
#[inline(always)]
pub fn max_fds() -> Option<u32> {
    let fdt = match task() {
        Task::Btf(t) => load_btf(load_btf(t, &TASK_FILES)?, &FILES_FDT)? as u64,
        Task::Plain(t) => deref(deref(t, &TASK_FILES)?, &FILES_FDT)?,
    };
    if fdt == 0 {
        return None;
    }
    memory::kernel(fdt + u64::from(FDTABLE_MAX_FDS.load()))
}

/// The `struct file` at `fd` of the fd array `fds` (0: none).
#[inline(always)]
pub fn file_at(fds: u64, fd: u32) -> Option<u64> {
    memory::kernel(fds + u64::from(fd) * 8)
}

/// The `struct sock` of a socket's file (garbage, never dereferenced here,
/// for another kind of file: a lookup by it finds nothing).
#[inline(always)]
pub fn sock_of_file(file: u64) -> Option<u64> {
    sk_of_socket(deref(file, &FILE_PRIVATE_DATA)?)
}

/// A `struct socket`'s `struct sock`.
#[inline(always)]
pub fn sk_of_socket(socket: u64) -> Option<u64> {
    deref(socket, &SOCKET_SK)
}

/// The `struct sock` behind the caller's file descriptor `fd`:
/// current->files->fdt->fd[fd]->private_data (a struct socket)->sk.
#[inline(always)]
pub fn sock_of_fd(fd: u32) -> Option<u64> {
    let fds = open_files()?;
    let file = memory::kernel(fds + u64::from(fd) * 8)?;
    let socket = deref(file, &FILE_PRIVATE_DATA)?;
    deref(socket, &SOCKET_SK)
}

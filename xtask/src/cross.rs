//! Building `stackprobe` for a target other than the host's: rustup here has
//! only the host's std, so std is built from nightly's rust-src
//! (`-Z build-std`) and linked with a C toolchain from Debian's packages.
//! A target is data ([`Target`]); adding one (aarch64, say) is adding a
//! constant with its packages, linker and flags.
//!
//! The eBPF object needs nothing here: cli/probes/build.rs (aya-build)
//! builds it for bpfel (both targets are little endian), with its own
//! rustflags and target dir, and with `bpf_target_arch` set to the host
//! crate's target arch (`CARGO_CFG_TARGET_ARCH`), which is how its kprobes
//! read that architecture's `pt_regs`: an aarch64 binary embeds an object
//! built for aarch64.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    cache_key::fnv1a,
    process::{capture, run_cmd, workspace_root},
    setup,
};

/// A target `stackprobe` is built for with build-std.
pub struct Target {
    /// Rust's target triple.
    pub triple: &'static str,
    /// Debian packages that give its linker and C library.
    pub packages: &'static [&'static str],
    /// What links it (also the C compiler of any C a crate builds).
    pub linker: &'static str,
    /// rustc flags for this target only (not the build scripts').
    pub rustflags: &'static [&'static str],
    /// The binary must have no ELF interpreter and no shared libraries.
    pub static_binary: bool,
    /// std links `-lunwind` here (musl), a libunwind.a that Rust's own
    /// rust-std brings and Debian does not: the linker's libgcc_eh.a, with
    /// the same `_Unwind_*` functions, stands in for it, with
    /// [`LIBGCC_EH_SHIM`] for what it expects of glibc.
    pub libgcc_eh_as_libunwind: bool,
}

/// A binary for any x86_64 Linux: musl linked in, no loader needed.
pub const X86_64_MUSL: Target = Target {
    triple: "x86_64-unknown-linux-musl",
    packages: &["musl-tools"],
    linker: "musl-gcc",
    // Rust's own musl start files and libc come with its rust-std, which
    // rustup cannot fetch here: Debian's musl (through musl-gcc) gives them.
    // Not position-independent: musl-gcc's specs link a static PIE with a
    // loader (ld-musl) named, as a dynamic binary; `-static` they honour.
    rustflags: &["-Clink-self-contained=no", "-Crelocation-model=static"],
    static_binary: true,
    libgcc_eh_as_libunwind: true,
};

/// arm64 with glibc, linked by Debian's cross gcc: what `cargo xtask
/// vm-test --arch aarch64` runs in Debian's arm64 kernels, with the
/// guest's own glibc.
pub const AARCH64_GNU: Target = Target {
    triple: "aarch64-unknown-linux-gnu",
    packages: &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"],
    linker: "aarch64-linux-gnu-gcc",
    rustflags: &[],
    static_binary: false,
    libgcc_eh_as_libunwind: false,
};

/// `CARGO_TARGET_<TRIPLE>_…`'s middle part: x86_64-unknown-linux-musl →
/// X86_64_UNKNOWN_LINUX_MUSL.
fn env_triple(triple: &str) -> String {
    triple.to_ascii_uppercase().replace(['-', '.'], "_")
}

/// Where a target is built: a cargo target dir of its own, as nightly's
/// build-std artifacts share nothing with the host's stable build, and
/// one target's build then never waits on another's lock.
pub fn target_dir(target: &Target) -> PathBuf {
    workspace_root()
        .join("target")
        .join(format!("cross-{}", target.triple))
}

/// Where `-lunwind` finds libgcc_eh.a, for a target that needs it: named
/// by the shim, so that a changed shim changes the rustflags and cargo
/// links again (it does not watch the archive).
fn unwind_dir(target: &Target) -> PathBuf {
    target_dir(target).join(format!("unwind-{:016x}", fnv1a(LIBGCC_EH_SHIM)))
}

/// What GCC 12's libgcc_eh.a, built for glibc, needs that a static musl
/// link does not give it:
/// - glibc's `_dl_find_object` (2.35), which it calls to find the
///   `.eh_frame_hdr` of the code at an address, made here of
///   `dl_iterate_phdr`, which musl has, static binaries included (the
///   struct's layout is glibc's, for x86_64 and aarch64 alike);
/// - the pthread functions it calls through weak references, which take
///   nothing out of a static libc.a: unreferenced, they are null, and the
///   first unwind (any panic) jumps to 0. Named here, they are linked in.
const LIBGCC_EH_SHIM: &str = r#"#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdint.h>

void *const stackprobe_libgcc_eh_pthread[] = {
    (void *)pthread_once,
    (void *)pthread_mutex_lock,
    (void *)pthread_mutex_unlock,
    (void *)pthread_key_create,
    (void *)pthread_getspecific,
    (void *)pthread_setspecific,
};

struct dl_find_object {
    unsigned long long dlfo_flags;
    void *dlfo_map_start;
    void *dlfo_map_end;
    void *dlfo_link_map;
    void *dlfo_eh_frame;
    unsigned long long reserved[7];
};

struct query {
    uintptr_t pc;
    struct dl_find_object *out;
    int found;
};

static int visit(struct dl_phdr_info *info, size_t size, void *data) {
    struct query *q = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    void *eh_frame = 0;
    int hit = 0;
    (void)size;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + p->p_vaddr;
        if (p->p_type == PT_LOAD) {
            if (start < lo) lo = start;
            if (start + p->p_memsz > hi) hi = start + p->p_memsz;
            if (q->pc >= start && q->pc < start + p->p_memsz) hit = 1;
        } else if (p->p_type == PT_GNU_EH_FRAME) {
            eh_frame = (void *)start;
        }
    }
    if (!hit) return 0;
    q->out->dlfo_flags = 0;
    q->out->dlfo_map_start = (void *)lo;
    q->out->dlfo_map_end = (void *)hi;
    q->out->dlfo_link_map = 0;
    q->out->dlfo_eh_frame = eh_frame;
    q->found = 1;
    return 1;
}

int _dl_find_object(void *pc, struct dl_find_object *out) {
    struct query q = { (uintptr_t)pc, out, 0 };
    dl_iterate_phdr(visit, &q);
    return q.found ? 0 : -1;
}
"#;

/// libunwind.a: the linker's libgcc_eh.a with the shim added.
fn make_libunwind(target: &Target) -> Result<()> {
    let found = capture(Command::new(target.linker).arg("-print-file-name=libgcc_eh.a"))?;
    let libgcc_eh = PathBuf::from(found.trim());
    ensure!(
        libgcc_eh.is_absolute() && libgcc_eh.exists(),
        "{} has no libgcc_eh.a (it printed {found:?})",
        target.linker
    );
    let dir = unwind_dir(target);
    fs::create_dir_all(&dir)?;
    let source = dir.join("libgcc_eh_shim.c");
    let object = dir.join("libgcc_eh_shim.o");
    let archive = dir.join("libunwind.a");
    fs::write(&source, LIBGCC_EH_SHIM)?;
    run_cmd(
        Command::new(target.linker)
            .args(["-O2", "-fPIC", "-Wall", "-Werror", "-c"])
            .arg(&source)
            .arg("-o")
            .arg(&object),
    )?;
    let _ = fs::remove_file(&archive);
    fs::copy(&libgcc_eh, &archive).with_context(|| format!("copying {}", libgcc_eh.display()))?;
    run_cmd(Command::new("ar").arg("rs").arg(&archive).arg(&object))
}

/// The release build's command: nightly cargo with build-std, the
/// target's linker and flags set for that target alone, so the build
/// scripts (and aya-build's eBPF build) stay as they are.
pub fn build_command(target: &Target) -> Command {
    cargo_command(
        target,
        &["build", "-p", "stackprobe", "--bin", "stackprobe"],
    )
}

/// `cargo SUBCOMMAND [ARGS] --release --locked` for `target`, as
/// [`build_command`] builds (vm-test's `test --no-run` of the test binaries
/// too); the target's packages and libunwind are the caller's to set up.
pub fn cargo_command(target: &Target, subcommand: &[&str]) -> Command {
    let env = env_triple(target.triple);
    let mut rustflags: Vec<String> = target.rustflags.iter().map(|f| f.to_string()).collect();
    if target.libgcc_eh_as_libunwind {
        rustflags.push(format!("-Lnative={}", unwind_dir(target).display()));
    }
    let mut cmd = Command::new("rustup");
    cmd.current_dir(workspace_root())
        .args(["run", "nightly", "cargo"])
        .args(subcommand)
        .args(["--release", "--locked", "--target", target.triple])
        .arg("--target-dir")
        .arg(target_dir(target))
        // build-std's documented pair; std brings panic_unwind itself,
        // which the release profile uses.
        .args(["-Z", "build-std=std,panic_abort"])
        .env(format!("CARGO_TARGET_{env}_LINKER"), target.linker)
        .env(format!("CARGO_TARGET_{env}_RUSTFLAGS"), rustflags.join(" "))
        .env(
            format!("CC_{}", target.triple.replace('-', "_")),
            target.linker,
        );
    cmd
}

/// Builds `stackprobe` for `target` (installing its packages first) and
/// returns the binary, checked static if it must be.
pub fn build(target: &Target) -> Result<PathBuf> {
    setup::apt_packages(target.packages)?;
    if target.libgcc_eh_as_libunwind {
        make_libunwind(target)?;
    }
    run_cmd(&mut build_command(target))
        .with_context(|| format!("building stackprobe for {}", target.triple))?;
    let binary = target_dir(target)
        .join(target.triple)
        .join("release/stackprobe");
    ensure!(binary.exists(), "the build wrote no {}", binary.display());
    if target.static_binary {
        check_static(&binary)?;
    }
    if target.libgcc_eh_as_libunwind {
        let symbols = capture(Command::new("nm").arg(&binary))
            .with_context(|| format!("listing {}'s symbols", binary.display()))?;
        shim_linked(&symbols).with_context(|| format!("{}", binary.display()))?;
    }
    Ok(binary)
}

/// What the shim gave libgcc_eh, in the binary: `_dl_find_object` defined,
/// and no pthread function left a weak reference with nothing behind it
/// (`w`, no address): that is a call to 0 at the first panic. (Those the
/// unwinder does not use may be absent altogether.)
fn shim_linked(nm: &str) -> Result<()> {
    let defined = nm.lines().any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        matches!(fields.as_slice(), [_, "T" | "t", "_dl_find_object"])
    });
    ensure!(defined, "_dl_find_object is not defined in it");
    let unresolved: Vec<&str> = nm
        .lines()
        .filter_map(
            |l| match l.split_whitespace().collect::<Vec<_>>().as_slice() {
                [kind, name] if matches!(*kind, "w" | "U" | "v") => Some(*name),
                _ => None,
            },
        )
        .filter(|name| name.trim_start_matches('_').starts_with("pthread_"))
        .collect();
    ensure!(
        unresolved.is_empty(),
        "{unresolved:?} are referenced and not linked in: its unwinder would call 0 at the \
         first panic"
    );
    Ok(())
}

/// No ELF interpreter (the kernel runs it with no loader) and no shared
/// library, as the program headers and dynamic section say; and `file`
/// agrees.
pub fn check_static(binary: &Path) -> Result<()> {
    let headers = capture(Command::new("readelf").args(["-l", "-d", "-W"]).arg(binary))
        .with_context(|| format!("reading {}'s ELF headers", binary.display()))?;
    let described = capture(Command::new("file").arg("-b").arg(binary))?;
    static_verdict(&headers, &described).with_context(|| format!("{}", binary.display()))
}

fn static_verdict(readelf: &str, file: &str) -> Result<()> {
    if let Some(line) = readelf
        .lines()
        .find(|l| l.contains("Requesting program interpreter"))
    {
        bail!("has an ELF interpreter: {}", line.trim());
    }
    let needed: Vec<&str> = readelf.lines().filter(|l| l.contains("(NEEDED)")).collect();
    ensure!(needed.is_empty(), "needs shared libraries: {needed:?}");
    ensure!(
        file.starts_with("ELF 64-bit") && file.contains("static"),
        "`file` does not call it a static ELF: {}",
        file.trim()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_follow_cargos_spelling() {
        assert_eq!(
            env_triple("x86_64-unknown-linux-musl"),
            "X86_64_UNKNOWN_LINUX_MUSL"
        );
        let cmd = build_command(&X86_64_MUSL);
        let envs: Vec<(String, String)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.unwrap_or_default().to_string_lossy().into_owned(),
                )
            })
            .collect();
        assert!(envs.contains(&(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER".into(),
            "musl-gcc".into()
        )));
        assert!(envs.contains(&("CC_x86_64_unknown_linux_musl".into(), "musl-gcc".into())));
        let cmd = cargo_command(&AARCH64_GNU, &["test", "--no-run"]);
        assert!(cmd.get_envs().any(|(k, v)| {
            k == "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
                && v.is_some_and(|v| v == "aarch64-linux-gnu-gcc")
        }));
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(&args[..5], ["run", "nightly", "cargo", "test", "--no-run"]);
        assert!(target_dir(&AARCH64_GNU).ends_with("target/cross-aarch64-unknown-linux-gnu"));
    }

    #[test]
    fn an_unresolved_weak_pthread_function_is_caught() {
        let linked = "0000000000443720 T _dl_find_object\n\
                      00000000009396b0 W pthread_once\n\
                      0000000000938c70 T __pthread_key_create\n";
        shim_linked(linked).unwrap();
        let err = shim_linked(&format!("{linked}                 w pthread_once\n")).unwrap_err();
        assert!(format!("{err}").contains("pthread_once"), "{err}");
        assert!(
            shim_linked(&format!(
                "{linked}                 w __pthread_key_create\n"
            ))
            .is_err()
        );
        // Other weak references are not the shim's business.
        shim_linked(&format!("{linked}                 w __gmon_start__\n")).unwrap();
        assert!(shim_linked("00000000009396b0 W pthread_once\n").is_err());
    }

    #[test]
    fn a_dynamic_binary_is_not_taken_for_static() {
        let dynamic = "  INTERP  0x000318 ...\n      [Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]\n \
                       0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n";
        let file = "ELF 64-bit LSB pie executable, x86-64, dynamically linked";
        assert!(static_verdict(dynamic, file).is_err());
        let no_interp_but_needed = " 0x0000000000000001 (NEEDED)  Shared library: [libc.so.6]\n";
        assert!(static_verdict(no_interp_but_needed, file).is_err());
        let static_pie = "There is no dynamic section in this file.\n";
        assert!(
            static_verdict(
                static_pie,
                "ELF 64-bit LSB pie executable, x86-64, static-pie linked"
            )
            .is_ok()
        );
        assert!(
            static_verdict(
                static_pie,
                "ELF 64-bit LSB executable, x86-64, statically linked"
            )
            .is_ok()
        );
        assert!(static_verdict("", "ELF 64-bit LSB pie executable, dynamically linked").is_err());
    }
}

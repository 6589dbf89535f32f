//! Checks made before loading anything, so a missing privilege or kernel
//! feature is a clear sentence rather than an EPERM from deep inside aya.

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result, bail};
use aya::Btf;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Where the kernel's BTF is read from; `STACKPROBE_BTF` overrides it (tests
/// use that to check the message for a kernel without BTF).
pub fn btf_path() -> PathBuf {
    std::env::var_os("STACKPROBE_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

pub fn check_privileges() -> Result<()> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let caps = effective_caps(&status).context("no CapEff line in /proc/self/status")?;
    missing_privileges(caps).map_or(Ok(()), |msg| bail!(msg))
}

/// Kernel lockdown in "confidentiality" mode forbids BPF from reading kernel
/// memory, which every probe does.
pub fn check_lockdown() -> Result<()> {
    lockdown_problem(&fs::read_to_string(LOCKDOWN).unwrap_or_default())
        .map_or(Ok(()), |msg| bail!(msg))
}

fn lockdown_problem(mode: &str) -> Option<String> {
    mode.contains("[confidentiality]").then(|| {
        format!(
            "the kernel is locked down (confidentiality, {LOCKDOWN}), which forbids BPF programs \
             from reading kernel memory; boot with lockdown=integrity or none to use stackprobe"
        )
    })
}

pub const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

pub fn require_btf() -> Result<()> {
    let path = btf_path();
    if !path.exists() {
        bail!(
            "this kernel exposes no BTF ({} is missing); stackprobe needs a kernel built with \
             CONFIG_DEBUG_INFO_BTF=y (Debian's kernels since 5.10 have it)",
            path.display()
        );
    }
    Ok(())
}

pub fn load_btf() -> Result<Btf> {
    require_btf()?;
    let path = btf_path();
    Btf::parse_file(&path, aya::Endianness::default())
        .with_context(|| format!("reading the kernel's BTF from {}", path.display()))
}

/// The BTF `STACKPROBE_BTF` names, parsed; None when it is not set, where
/// aya's loader reads the kernel's itself.
pub fn btf_override() -> Result<Option<Btf>> {
    std::env::var_os("STACKPROBE_BTF")
        .map(|_| load_btf())
        .transpose()
}

fn effective_caps(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

fn missing_privileges(caps: u64) -> Option<String> {
    let has = |cap: u32| caps & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return None;
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|&(cap, _)| !has(cap))
        .map(|(_, name)| name)
        .collect();
    Some(format!(
        "stackprobe loads kernel probes and needs root (missing {}); run it with sudo",
        missing.join(" and ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_confidentiality_lockdown_stops_the_probes() {
        assert_eq!(lockdown_problem("[none] integrity confidentiality\n"), None);
        assert_eq!(lockdown_problem("none [integrity] confidentiality\n"), None);
        assert_eq!(lockdown_problem(""), None);
        let msg = lockdown_problem("none integrity [confidentiality]\n").unwrap();
        assert!(msg.contains("lockdown=integrity"), "{msg}");
    }

    #[test]
    fn root_has_everything() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert_eq!(missing_privileges(effective_caps(status).unwrap()), None);
    }

    #[test]
    fn bpf_and_perfmon_suffice_without_sys_admin() {
        assert_eq!(
            missing_privileges((1 << CAP_BPF) | (1 << CAP_PERFMON)),
            None
        );
    }

    #[test]
    fn an_unprivileged_user_is_told_what_is_missing() {
        let msg =
            missing_privileges(effective_caps("CapEff:\t0000000000000000\n").unwrap()).unwrap();
        assert!(msg.contains("missing CAP_BPF and CAP_PERFMON"), "{msg}");
        assert!(msg.contains("sudo"));
        let msg = missing_privileges(1 << CAP_BPF).unwrap();
        assert!(msg.contains("missing CAP_PERFMON"), "{msg}");
    }
}
